// BPE pre-tokenizers: llama.cpp's regexes per tokenizer.ggml.pre, run with PCRE2.
//
// llama.cpp runs these regexes either with hand-written matchers (gpt-2, llama3) or with
// std::regex over a "collapsed" text where every non-ASCII code point stands for its Unicode
// category (qwen2). Both treat exactly the Unicode White_Space code points as \s; PCRE2's \s
// differs (it lacks U+0085), so \s and \S are spelled out as explicit classes here.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

enum class PreType { DEFAULT, GPT2, LLAMA3, QWEN2 };

// Maps tokenizer.ggml.pre to a PreType; throws tandem::Error listing the supported names.
PreType pre_type_from_name(std::string_view name);

class PreTokenizer {
 public:
  explicit PreTokenizer(PreType type);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Splits text like llama.cpp's unicode_regex_split and returns the words with every byte
  // mapped through the GPT-2 byte-to-unicode table. Invalid UTF-8 becomes U+FFFD first.
  std::vector<std::string> split(std::string_view text) const;

 private:
  struct Regex;
  std::vector<std::unique_ptr<Regex>> regexes_;
};

}  // namespace tandem
