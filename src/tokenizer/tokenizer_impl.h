// Internal state of a Tokenizer (not part of the public API).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"

namespace tandem {

// llama.cpp's llama_token_attr bit flags.
enum : uint32_t {
  kAttrUndefined = 0,
  kAttrUnknown = 1u << 0,
  kAttrUnused = 1u << 1,
  kAttrNormal = 1u << 2,
  kAttrControl = 1u << 3,
  kAttrUserDefined = 1u << 4,
  kAttrByte = 1u << 5,
  kAttrNormalized = 1u << 6,
  kAttrLstrip = 1u << 7,
  kAttrRstrip = 1u << 8,
  kAttrSingleWord = 1u << 9,
};

// Open-addressing hash map from keys[i] (string_views owned elsewhere) to i. Slots hold a
// 32-bit hash and the index, so probing touches 8 bytes per slot.
class StrMap {
 public:
  // keys must outlive the map and not move.
  void build(const std::vector<std::string_view>* keys, size_t expected);
  // Maps (*keys)[index] to index; when the key is already present, overwrite decides whether
  // the new index replaces the old one (last wins) or is dropped (first wins).
  void insert(int32_t index, bool overwrite) { insert_hashed(index, hash_of(index), overwrite); }
  // build() and insert every key in index order (prefetching ahead; same result as a loop).
  void build_all(const std::vector<std::string_view>* keys, bool overwrite,
                 const std::vector<uint8_t>* skip = nullptr);
  int32_t find(std::string_view key) const;  // -1 when absent
  size_t size() const { return size_; }

 private:
  uint32_t hash_of(int32_t index) const;
  void insert_hashed(int32_t index, uint32_t h, bool overwrite);
  struct Slot {
    uint32_t hash = 0;
    int32_t value = -1;
  };
  const std::vector<std::string_view>* keys_ = nullptr;
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

struct TokenizerImpl {
  enum class Kind { SPM, BPE };
  Kind kind = Kind::SPM;
  std::string model;  // tokenizer.ggml.model
  std::string pre;    // tokenizer.ggml.pre
  PreType pre_type = PreType::DEFAULT;

  std::string text_arena;               // all token texts, back to back
  std::vector<std::string_view> texts;  // views into text_arena
  size_t max_token_len = 0;
  std::vector<float> scores;
  std::vector<uint32_t> attrs;  // llama.cpp attribute flags
  std::vector<uint8_t> types;   // tokenizer.ggml.token_type as stored (for fingerprint)
  StrMap token_to_id;

  std::string merge_arena;
  std::vector<std::string_view> merges;  // "left right" as stored
  StrMap merge_rank;                     // merge text -> rank (first occurrence wins)

  TokenId bos = -1, eos = -1, eot = -1, eom = -1, unk = -1, sep = -1, pad = -1, mask = -1;
  TokenId fim_pre = -1, fim_suf = -1, fim_mid = -1, fim_pad = -1, fim_rep = -1, fim_sep = -1;
  bool add_space_prefix = false;
  bool add_bos = false;
  bool add_eos = false;
  bool ignore_merges = false;
  bool clean_spaces = false;

  std::vector<TokenId> special_cache;  // CONTROL/USER_DEFINED/UNKNOWN ids, longest text first
  std::vector<TokenId> eog;            // sorted
  std::unique_ptr<PreTokenizer> pretok;

  TokenId text_to_token(std::string_view s) const { return token_to_id.find(s); }
  int bpe_rank(std::string_view left, std::string_view right, std::string& scratch) const;
  TokenId byte_to_token(uint8_t b) const;

  void spm_tokenize(const std::string& text, std::vector<TokenId>& out) const;
  void bpe_tokenize(std::string_view text, std::vector<TokenId>& out) const;
  std::string piece(TokenId id, bool special, int lstrip) const;
};

}  // namespace tandem
