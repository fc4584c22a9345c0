// Tokenizers against llama.cpp's reference vectors in ../shared/testdata/tokenizers:
// every .inp/.out case, every tokens.jsonl line (ids, pieces, detokenization) in both
// parse_special modes, the resolved special ids, and round trips over ../shared/data.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/testdata.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {

using tandem::testing::data_path;
using tandem::testing::read_file;
using tandem::testing::testdata_path;

struct LoadedVocab {
  std::unique_ptr<GgufFile> file;
  std::unique_ptr<Tokenizer> tok;
};

const LoadedVocab& vocab(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, LoadedVocab> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  LoadedVocab v;
  v.file = GgufFile::open(testdata_path("tokenizers/ggml-vocab-" + name + ".gguf"));
  const auto t0 = std::chrono::steady_clock::now();
  v.tok = Tokenizer::from_gguf(*v.file);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[%s] tokenizer loaded: %d tokens, model %s, pre '%s' (%.1f ms)\n", name.c_str(),
              v.tok->n_vocab(), std::string(v.tok->model_name()).c_str(),
              std::string(v.tok->pre_name()).c_str(), ms);
  return cache.emplace(name, std::move(v)).first->second;
}

std::string hex(std::string_view s) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out += d[c >> 4];
    out += d[c & 15];
  }
  return out;
}

std::string ids_str(const std::vector<TokenId>& ids) {
  std::string s;
  // Two appends, not " " + to_string: GCC 12 warns (-Wrestrict) on the inlined temporary.
  for (TokenId id : ids) {
    s += ' ';
    s += std::to_string(id);
  }
  return s;
}

class VocabTest : public ::testing::TestWithParam<std::string> {};

TEST_P(VocabTest, InpOutCases) {
  const std::string name = GetParam();
  const Tokenizer& tok = *vocab(name).tok;
  const std::string base = "tokenizers/ggml-vocab-" + name + ".gguf";
  const std::string inp = read_file(testdata_path(base + ".inp"));
  const std::string outf = read_file(testdata_path(base + ".out"));
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  for (size_t pos = 0;;) {
    const size_t next = inp.find(sep, pos);
    if (next == std::string::npos) break;
    texts.push_back(inp.substr(pos, next - pos));
    pos = next + sep.size();
  }
  std::vector<std::vector<TokenId>> expected;
  std::istringstream lines(outf);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream ls(line);
    std::vector<TokenId> ids;
    for (TokenId id; ls >> id;) ids.push_back(id);
    expected.push_back(ids);
  }
  ASSERT_EQ(texts.size(), expected.size()) << base;
  int pass = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const auto got = tok.encode(texts[i], false, false);
    if (got == expected[i]) {
      ++pass;
    } else {
      ADD_FAILURE() << name << " case " << i << " text hex " << hex(texts[i]) << "\n expected"
                    << ids_str(expected[i]) << "\n got     " << ids_str(got);
    }
  }
  std::printf("[%s] .inp/.out: %d/%zu pass\n", name.c_str(), pass, texts.size());
  EXPECT_EQ(pass, static_cast<int>(texts.size()));
}

TEST_P(VocabTest, TokensJsonl) {
  const std::string name = GetParam();
  const Tokenizer& tok = *vocab(name).tok;
  const std::string data =
      read_file(testdata_path("tokenizers/ggml-vocab-" + name + ".tokens.jsonl"));
  std::istringstream lines(data);
  int total[2] = {0, 0}, pass_ids[2] = {0, 0}, pass_pieces[2] = {0, 0}, pass_detok[2] = {0, 0};
  int failures_shown = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line);
    const std::string text = j["text"].get<std::string>();
    const bool add_special = j["add_special"].get<bool>();
    const bool parse_special = j["parse_special"].get<bool>();
    const auto expected = j["ids"].get<std::vector<TokenId>>();
    const int m = parse_special ? 1 : 0;
    ++total[m];
    const auto got = tok.encode(text, add_special, parse_special);
    if (got == expected) {
      ++pass_ids[m];
    } else if (failures_shown++ < 10) {
      ADD_FAILURE() << name << " corpus id " << j["id"] << " parse_special=" << parse_special
                    << " text hex " << hex(text) << "\n expected" << ids_str(expected)
                    << "\n got     " << ids_str(got);
    }
    // Pieces and detokenization are checked on the reference ids, independently of encode.
    const auto pieces_hex = j["pieces_hex"].get<std::vector<std::string>>();
    bool pieces_ok = pieces_hex.size() == expected.size();
    for (size_t k = 0; pieces_ok && k < expected.size(); ++k)
      pieces_ok = hex(tok.token_to_piece(expected[k], true)) == pieces_hex[k];
    if (pieces_ok) {
      ++pass_pieces[m];
    } else if (failures_shown++ < 10) {
      ADD_FAILURE() << name << " corpus id " << j["id"] << ": pieces differ";
    }
    const std::string detok = hex(tok.decode(expected, false, true));
    if (detok == j["detok_hex"].get<std::string>()) {
      ++pass_detok[m];
    } else if (failures_shown++ < 10) {
      ADD_FAILURE() << name << " corpus id " << j["id"] << ": detok differs\n expected "
                    << j["detok_hex"].get<std::string>() << "\n got      " << detok;
    }
  }
  for (int m = 0; m < 2; ++m) {
    std::printf("[%s] tokens.jsonl parse_special=%d: ids %d/%d, pieces %d/%d, detok %d/%d\n",
                name.c_str(), m, pass_ids[m], total[m], pass_pieces[m], total[m], pass_detok[m],
                total[m]);
    EXPECT_EQ(pass_ids[m], total[m]);
    EXPECT_EQ(pass_pieces[m], total[m]);
    EXPECT_EQ(pass_detok[m], total[m]);
  }
  EXPECT_GT(total[0], 0);
}

TEST_P(VocabTest, VocabInfo) {
  const std::string name = GetParam();
  const Tokenizer& tok = *vocab(name).tok;
  const auto j = nlohmann::json::parse(
      read_file(testdata_path("tokenizers/ggml-vocab-" + name + ".vocabinfo.json")));
  EXPECT_EQ(tok.n_vocab(), j["n_tokens"].get<int>());
  EXPECT_EQ(tok.bos(), j["bos"].get<int>());
  EXPECT_EQ(tok.eos(), j["eos"].get<int>());
  EXPECT_EQ(tok.eot(), j["eot"].get<int>());
  EXPECT_EQ(tok.pad(), j["pad"].get<int>());
  EXPECT_EQ(tok.add_bos(), j["add_bos"].get<bool>());
  EXPECT_EQ(tok.add_eos(), j["add_eos"].get<bool>());
  EXPECT_TRUE(tok.is_eog(tok.eos()));
  if (tok.eot() >= 0) {
    EXPECT_TRUE(tok.is_eog(tok.eot()));
  }
  EXPECT_FALSE(tok.is_eog(-1));
  // The fingerprint is stable across loads and differs between vocabularies.
  auto again = Tokenizer::from_gguf(*vocab(name).file);
  EXPECT_EQ(again->fingerprint(), tok.fingerprint());
  for (const char* other : {"llama-spm", "phi-3", "llama-bpe", "gpt-2", "qwen3"})
    if (name != other) {
      EXPECT_NE(vocab(other).tok->fingerprint(), tok.fingerprint()) << other;
    }
}

// Texts from ../shared/data: every line of every .jsonl/.txt/.lst file, plus whole files.
std::vector<std::string> shared_texts() {
  std::vector<std::string> out;
  const auto root = tandem::testing::shared_dir() / "data";
  if (!std::filesystem::exists(root)) return out;
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::recursive_directory_iterator(root))
    if (e.is_regular_file()) {
      const auto ext = e.path().extension().string();
      if (ext == ".jsonl" || ext == ".txt" || ext == ".lst" || ext == ".md")
        files.push_back(e.path());
    }
  std::sort(files.begin(), files.end());
  for (const auto& p : files) {
    const std::string content = read_file(p.string());
    // Whole file in chunks of ~64 KiB cut at line ends, so that long texts are covered too.
    for (size_t pos = 0; pos < content.size();) {
      size_t end = std::min(content.size(), pos + 65536);
      const size_t nl = content.find('\n', end);
      end = nl == std::string::npos ? content.size() : nl + 1;
      out.push_back(content.substr(pos, end - pos));
      pos = end;
    }
  }
  return out;
}

TEST_P(VocabTest, RoundTripSharedData) {
  const std::string name = GetParam();
  const Tokenizer& tok = *vocab(name).tok;
  const auto texts = shared_texts();
  ASSERT_FALSE(texts.empty()) << "no files under ../shared/data";
  size_t bytes = 0, n_tokens = 0, ok_pieces = 0, ok_decode = 0;
  for (const auto& text : texts) {
    bytes += text.size();
    const auto ids = tok.encode(text, false, false);
    n_tokens += ids.size();
    std::string concat;
    for (TokenId id : ids) concat += tok.token_to_piece(id, true);
    // SPM with add_space_prefix: the first piece carries the added space.
    const std::string expected_concat =
        (tok.add_space_prefix() && !text.empty()) ? " " + text : text;
    if (concat == expected_concat)
      ++ok_pieces;
    else
      ADD_FAILURE() << name << ": pieces do not concatenate back to the text (" << text.size()
                    << " bytes)";
    // decode() removes that space again; vocabs with clean_spaces (gpt-2, llama-bpe) rewrite
    // " ." etc. as llama.cpp does, so there only the piece concatenation must round-trip.
    if (!tok.clean_spaces()) {
      if (tok.decode(ids, false, false) == text)
        ++ok_decode;
      else
        ADD_FAILURE() << name << ": decode(encode(x)) != x (" << text.size() << " bytes)";
    }
  }
  std::printf(
      "[%s] round trip over ../shared/data: %zu texts, %zu bytes, %zu tokens; pieces "
      "%zu/%zu, decode %s\n",
      name.c_str(), texts.size(), bytes, n_tokens, ok_pieces, texts.size(),
      tok.clean_spaces()
          ? "n/a (clean_spaces)"
          : (std::to_string(ok_decode) + "/" + std::to_string(texts.size())).c_str());
}

INSTANTIATE_TEST_SUITE_P(Vocabs, VocabTest,
                         ::testing::Values("llama-spm", "phi-3", "llama-bpe", "gpt-2", "qwen3"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s)
                             if (c == '-') c = '_';
                           return s;
                         });

}  // namespace
}  // namespace tandem
