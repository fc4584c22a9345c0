// libFuzzer target for the tokenizers: arbitrary bytes through encode / token_to_piece /
// decode / StreamDecoder with real vocabularies loaded once.
//
// Vocabularies: TANDEM_FUZZ_VOCAB (one path, or several separated by ':'), else the qwen3,
// llama-spm, gpt-2 and llama-bpe vocabs under TANDEM_SHARED_DIR (default
// TANDEM_SOURCE_DIR/../shared)/testdata/tokenizers. The first input byte picks the vocabulary
// and the flags; the rest is the text.
//
// Checked invariants: nothing throws or crashes; ids are in range; StreamDecoder output is
// always valid UTF-8; with parse_special=false and valid UTF-8 text the pieces concatenate
// back to the text (SPM: after the added space prefix) and decode() agrees where no clean-up
// pass applies.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace {

struct Vocab {
  std::unique_ptr<tandem::GgufFile> file;
  std::unique_ptr<tandem::Tokenizer> tok;
};

std::vector<Vocab>& vocabs() {
  static std::vector<Vocab> v = [] {
    std::vector<std::string> paths;
    if (const char* env = std::getenv("TANDEM_FUZZ_VOCAB"); env && *env) {
      std::string s = env;
      for (size_t pos = 0; pos <= s.size();) {
        const size_t end = std::min(s.find(':', pos), s.size());
        if (end > pos) paths.push_back(s.substr(pos, end - pos));
        pos = end + 1;
      }
    } else {
      std::filesystem::path shared;
      if (const char* sd = std::getenv("TANDEM_SHARED_DIR"); sd && *sd) {
        shared = sd;
      } else {
#ifdef TANDEM_SOURCE_DIR
        shared = std::filesystem::path(TANDEM_SOURCE_DIR) / ".." / "shared";
#else
        shared = "../shared";
#endif
      }
      for (const char* name : {"qwen3", "llama-spm", "gpt-2", "llama-bpe"})
        paths.push_back(
            (shared / "testdata" / "tokenizers" / (std::string("ggml-vocab-") + name + ".gguf"))
                .string());
    }
    std::vector<Vocab> out;
    for (const auto& p : paths) {
      if (!std::filesystem::exists(p)) continue;
      Vocab voc;
      voc.file = tandem::GgufFile::open(p);
      voc.tok = tandem::Tokenizer::from_gguf(*voc.file);
      out.push_back(std::move(voc));
    }
    if (out.empty()) {
      std::fprintf(stderr, "fuzz_tokenizer: no vocabulary found (set TANDEM_FUZZ_VOCAB)\n");
      std::abort();
    }
    return out;
  }();
  return v;
}

bool strictly_valid_utf8(std::string_view s) {
  std::string out;
  return tandem::utf8_sanitize_append(s, out, true) == 0 && out == s;
}

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_tokenizer: invariant violated: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  auto& vs = vocabs();
  const uint8_t sel = data[0];
  const tandem::Tokenizer& tok = *vs[sel % vs.size()].tok;
  const bool parse_special = sel & 0x40;
  const bool add_special = sel & 0x80;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);

  const std::vector<tandem::TokenId> ids = tok.encode(text, add_special, parse_special);
  std::string concat;
  tandem::StreamDecoder sd(tok);
  std::string streamed;
  for (tandem::TokenId id : ids) {
    check(id >= 0 && id < tok.n_vocab(), "token id out of range");
    concat += tok.token_to_piece(id, true);
    const std::string chunk = sd.push(id);
    check(strictly_valid_utf8(chunk), "StreamDecoder emitted invalid UTF-8");
    streamed += chunk;
  }
  const std::string rest = sd.flush();
  check(strictly_valid_utf8(rest), "StreamDecoder flush emitted invalid UTF-8");
  streamed += rest;
  if (strictly_valid_utf8(concat)) check(streamed == concat, "stream != pieces");
  const std::string decoded = tok.decode(ids, false, true);
  (void)tok.decode(ids, true, false);

  if (parse_special || add_special) return 0;
  // Round trips hold for valid UTF-8 (invalid bytes: BPE replaces them by U+FFFD like
  // llama.cpp; SPM groups bytes by lead byte, which can split an escaped space). SPM also maps
  // a literal U+2581 in the text to a space, so such texts are left out.
  if (!strictly_valid_utf8(text)) return 0;
  if (tok.model_name() == "llama") {
    if (text.find("\xE2\x96\x81") != std::string_view::npos) return 0;
    const std::string expected =
        (tok.add_space_prefix() && !text.empty()) ? " " + std::string(text) : std::string(text);
    check(concat == expected, "SPM pieces do not round-trip");
  } else {
    check(concat == text, "BPE pieces do not round-trip valid UTF-8");
  }
  if (!tok.clean_spaces()) check(decoded == text, "decode(encode(x)) != x");
  return 0;
}
