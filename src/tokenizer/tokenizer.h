// Tokenizers read from a GGUF vocabulary, reproducing llama.cpp's llama-vocab exactly:
//
//  - "llama" (SentencePiece-style, SPM): bigram merges by score over UTF-8 characters, spaces
//    escaped as U+2581, optional space prefix, byte fallback <0xXX>.
//  - "gpt2" (byte-level BPE): pre-tokenizer regex (chosen by tokenizer.ggml.pre, run with PCRE2),
//    GPT-2 byte-to-unicode mapping, merges by rank.
//
// Special tokens (CONTROL, USER_DEFINED, UNKNOWN) are partitioned out of the text first, longest
// first, as llama.cpp's tokenizer_st_partition does: USER_DEFINED always, CONTROL/UNKNOWN only
// with parse_special. Detokenization follows llama_token_to_piece / llama_detokenize.
//
// A Tokenizer owns copies of everything it needs; the GgufFile may be closed after from_gguf.
// All methods are const and thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/vocab.h"  // fingerprint_hex

namespace tandem {

class GgufFile;

using TokenId = int32_t;

// Token types as stored in tokenizer.ggml.token_type (llama.cpp's LLAMA_TOKEN_TYPE_*).
enum class TokenAttr {
  UNDEFINED = 0,
  NORMAL = 1,
  UNKNOWN = 2,
  CONTROL = 3,
  USER_DEFINED = 4,
  UNUSED = 5,
  BYTE = 6
};

struct TokenizerImpl;

class Tokenizer {
 public:
  // Reads tokenizer.ggml.* from the file. Throws tandem::Error naming the missing or malformed
  // key (unknown model, unknown pre-tokenizer, array length mismatches, ...).
  static std::unique_ptr<Tokenizer> from_gguf(const GgufFile& f);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // add_special: BOS/EOS as the vocab says (tokenizer.ggml.add_bos_token / add_eos_token, with
  // llama.cpp's defaults when absent). parse_special: CONTROL token texts in the input become
  // single tokens (USER_DEFINED token texts always do). Invalid UTF-8 never throws.
  std::vector<TokenId> encode(std::string_view text, bool add_special, bool parse_special) const;

  // Exact bytes of llama_token_to_piece(id, special). Out-of-range ids give "".
  std::string token_to_piece(TokenId id, bool special = true) const;
  // llama_detokenize(ids, remove_special, unparse_special), including the SPM leading-space
  // removal and (for vocabs that ask for it) clean_up_tokenization_spaces.
  std::string decode(std::span<const TokenId> ids, bool remove_special = false,
                     bool unparse_special = true) const;

  int32_t n_vocab() const;
  TokenId bos() const;
  TokenId eos() const;
  TokenId eot() const;  // -1 if none
  TokenId unk() const;  // -1 if none
  TokenId pad() const;  // -1 if none
  bool add_bos() const;
  bool add_eos() const;
  bool add_space_prefix() const;
  // Whether decode() applies llama.cpp's clean_spaces pass (gpt2 / llama-bpe pre-tokenizers).
  bool clean_spaces() const;
  bool is_eog(TokenId id) const;  // llama.cpp's end-of-generation set
  const std::vector<TokenId>& eog_ids() const;

  std::string_view model_name() const;            // "llama" (SPM) or "gpt2" (BPE)
  std::string_view pre_name() const;              // tokenizer.ggml.pre ("" for SPM)
  std::string_view token_text(TokenId id) const;  // "" when out of range
  TokenAttr attr(TokenId id) const;               // UNDEFINED when out of range
  // Finds a token by its exact text; -1 when absent.
  TokenId find_token(std::string_view text) const;

  // Stable 64-bit hash (FNV-1a) of the model kind, token texts and types, and special ids.
  uint64_t fingerprint() const;
  // fingerprint() as 16 lowercase hex digits: the `vocab_hash` of the native protocol, of
  // router files and of eval results (fingerprint_hex(uint64_t) below).
  std::string fingerprint_hex() const;

  const TokenizerImpl& impl() const { return *impl_; }

 private:
  Tokenizer();
  std::unique_ptr<TokenizerImpl> impl_;
};

// Streaming detokenizer: push ids one at a time; each call returns only complete, valid UTF-8
// characters and holds back a trailing partial sequence. Bytes that can never become valid are
// replaced by U+FFFD as soon as that is certain; flush() returns what is held back (an
// incomplete sequence becomes U+FFFD) and resets the decoder.
// The concatenated output equals the concatenation of token_to_piece(id, special) (no leading-
// space removal and no clean-up pass, as llama.cpp's streaming does) when that is valid UTF-8.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool special = true);
  std::string push(TokenId id);
  std::string flush();

 private:
  const Tokenizer& tok_;
  bool special_;
  std::string pending_;
};

// Appends the longest valid-UTF-8 prefix of `in` to `out`, replacing invalid bytes by U+FFFD,
// and returns the number of trailing bytes of `in` that form an incomplete (but so far valid)
// sequence and were not consumed. When `final` is true nothing is held back.
size_t utf8_sanitize_append(std::string_view in, std::string& out, bool final);

}  // namespace tandem
