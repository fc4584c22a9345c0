#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "common/error.h"
#include "tokenizer/unicode.h"

namespace tandem {

namespace {

// Unicode White_Space (what llama.cpp's unicode tables call whitespace).
#define TANDEM_WS                                                                                \
  "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}" \
  "\\x{3000}"
#define TANDEM_S "[" TANDEM_WS "]"
#define TANDEM_NS "[^" TANDEM_WS "]"

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// (llama.cpp's custom gpt2 matcher includes the final \s+ alternative.)
constexpr const char* kGpt2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" TANDEM_WS
                              "\\p{L}\\p{N}]+|" TANDEM_S "+(?!" TANDEM_NS ")|" TANDEM_S "+";

// (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
#define TANDEM_LLAMA3_LIKE(NUM)                                                              \
  "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|" \
  "\\p{N}" NUM "| ?[^" TANDEM_WS "\\p{L}\\p{N}]+[\\r\\n]*|" TANDEM_S "*[\\r\\n]+|" TANDEM_S  \
  "+(?!" TANDEM_NS ")|" TANDEM_S "+"

constexpr const char* kLlama3 = TANDEM_LLAMA3_LIKE("{1,3}");
constexpr const char* kQwen2 = TANDEM_LLAMA3_LIKE("");

}  // namespace

PreType pre_type_from_name(std::string_view name) {
  if (name.empty() || name == "default") return PreType::DEFAULT;
  if (name == "gpt-2" || name == "phi-2" || name == "gpt2") return PreType::GPT2;
  if (name == "llama-bpe" || name == "llama3" || name == "llama-v3" || name == "falcon3" ||
      name == "pixtral")
    return PreType::LLAMA3;
  if (name == "qwen2" || name == "deepseek-r1-qwen") return PreType::QWEN2;
  throw Error("tokenizer: unknown pre-tokenizer tokenizer.ggml.pre = '" + std::string(name) +
              "' (supported: default, gpt-2, phi-2, llama-bpe, llama3, llama-v3, falcon3, "
              "pixtral, qwen2, deepseek-r1-qwen)");
}

struct PreTokenizer::Regex {
  pcre2_code* code = nullptr;
  ~Regex() {
    if (code) pcre2_code_free(code);
  }
};

PreTokenizer::PreTokenizer(PreType type) {
  std::vector<std::string> exprs;
  switch (type) {
    case PreType::DEFAULT:
      exprs = {"[\\p{P}\\$\\+<=>\\^~\\|]+", kGpt2, "\\p{N}+", "[0-9][0-9][0-9]"};
      break;
    case PreType::GPT2:
      exprs = {kGpt2};
      break;
    case PreType::LLAMA3:
      exprs = {kLlama3};
      break;
    case PreType::QWEN2:
      exprs = {kQwen2};
      break;
  }
  for (const auto& e : exprs) {
    int err = 0;
    PCRE2_SIZE erroff = 0;
    auto r = std::make_unique<Regex>();
    r->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(e.c_str()), e.size(),
                            PCRE2_UTF | PCRE2_UCP, &err, &erroff, nullptr);
    if (!r->code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw Error("tokenizer: cannot compile pre-tokenizer regex at offset " +
                  std::to_string(erroff) + ": " + reinterpret_cast<const char*>(msg));
    }
    pcre2_jit_compile(r->code, PCRE2_JIT_COMPLETE);  // optional; falls back to the interpreter
    regexes_.push_back(std::move(r));
  }
}

PreTokenizer::~PreTokenizer() = default;

std::vector<std::string> PreTokenizer::split(std::string_view text) const {
  const std::vector<uint32_t> cpts = unicode::cpts_from_utf8(text);
  // Subject for PCRE2: valid UTF-8 of the code points, with surrogates (which llama.cpp accepts
  // and classifies as "other") replaced by a private-use code point of the same regex class.
  std::string subject;
  subject.reserve(text.size() + 8);
  std::vector<size_t> byte_of(cpts.size() + 1);  // byte offset of each code point
  for (size_t i = 0; i < cpts.size(); ++i) {
    byte_of[i] = subject.size();
    const uint32_t c = cpts[i];
    unicode::append_utf8(subject, (c >= 0xD800 && c <= 0xDFFF) ? 0xE000 : c);
  }
  byte_of[cpts.size()] = subject.size();
  // code point index of a byte offset (only ever asked at code point boundaries)
  std::vector<uint32_t> cpt_of(subject.size() + 1, 0);
  for (size_t i = 0; i <= cpts.size(); ++i) cpt_of[byte_of[i]] = static_cast<uint32_t>(i);

  std::vector<size_t> offsets = {cpts.size()};  // lengths of the segments, in code points
  for (const auto& re : regexes_) {
    std::vector<size_t> next;
    next.reserve(offsets.size());
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(re->code, nullptr);
    if (!md) throw Error("tokenizer: out of memory for regex match data");
    size_t start = 0;
    for (size_t seg_len : offsets) {
      const size_t b0 = byte_of[start];
      const size_t b1 = byte_of[start + seg_len];
      const auto* subj = reinterpret_cast<PCRE2_SPTR>(subject.data() + b0);
      const size_t len = b1 - b0;
      size_t pos = 0;       // byte offset within the segment where the search resumes
      size_t last_end = 0;  // end of the previous match (bytes, within segment)
      while (pos <= len) {
        const int rc = pcre2_match(re->code, subj, len, pos, PCRE2_NO_UTF_CHECK, md, nullptr);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
          pcre2_match_data_free(md);
          throw Error("tokenizer: pre-tokenizer regex failed (PCRE2 error " + std::to_string(rc) +
                      ")");
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
        const size_t ms = ov[0], me = ov[1];
        if (me == ms) {  // cannot happen with these regexes; guard against a loop anyway
          pos = me + 1;
          while (pos < len && (subject[b0 + pos] & 0xC0) == 0x80) ++pos;
          continue;
        }
        if (ms > last_end) next.push_back(cpt_of[b0 + ms] - cpt_of[b0 + last_end]);
        next.push_back(cpt_of[b0 + me] - cpt_of[b0 + ms]);
        last_end = me;
        pos = me;
      }
      if (last_end < len) next.push_back(cpt_of[b1] - cpt_of[b0 + last_end]);
      start += seg_len;
    }
    pcre2_match_data_free(md);
    offsets = std::move(next);
  }

  std::vector<std::string> words;
  words.reserve(offsets.size());
  size_t start = 0;
  std::string utf8;
  for (size_t n : offsets) {
    std::string w;
    for (size_t i = start; i < start + n; ++i) {
      utf8.clear();
      unicode::append_utf8(utf8, cpts[i]);
      for (char ch : utf8) w += unicode::byte_to_utf8(static_cast<uint8_t>(ch));
    }
    words.push_back(std::move(w));
    start += n;
  }
  return words;
}

}  // namespace tandem
