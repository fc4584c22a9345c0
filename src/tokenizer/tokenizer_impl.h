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

// A piece of the input after special-token partitioning: a special token, or raw text
// [off, off + len) of the input that the SPM/BPE algorithm still has to tokenize.
struct Fragment {
  bool is_token;
  TokenId id;
  size_t off, len;
};

// Aho-Corasick automaton over the special tokens' texts written backwards, for finding every
// special token in one pass (TokenizerImpl::partition_special). Reading a text from its end
// towards its start, the state after text[pos] names the longest special text that starts at
// pos; the shorter ones that start there follow by failure links. One step costs O(1)
// amortized, whatever the number of special tokens (6,414 for Gemma 3). Node 0 is the root;
// its children also sit in a 256-entry table (a byte that ends no special text costs one load).
class SpecialMatcher {
 public:
  // texts[special[r]] for each rank r (index in special_cache); enabled[mode][r] says whether
  // rank r is matched in that mode (mode 1: parse_special).
  void build(const std::vector<std::string_view>& texts, const std::vector<TokenId>& special,
             const std::vector<uint8_t> enabled[2]);
  bool empty() const { return nodes_.size() <= 1; }
  int32_t step(int32_t state, uint8_t byte) const;
  // The node of the longest special text enabled in `mode` that is a suffix of the state's
  // (backwards) string, i.e. a prefix of the text at the position; -1 when none.
  int32_t match(int32_t state, int mode) const { return nodes_[state].out[mode]; }
  // The next shorter such node after match node m; -1 when none.
  int32_t shorter(int32_t m, int mode) const { return nodes_[nodes_[m].fail].out[mode]; }
  int32_t rank(int32_t m, int mode) const { return nodes_[m].rank[mode]; }
  uint32_t length(int32_t m) const { return nodes_[m].depth; }
  int32_t node_of_rank(int32_t rank) const { return node_of_rank_[rank]; }

 private:
  struct Node {
    uint32_t first_edge = 0;  // edges [first_edge, first_edge + n_edges), sorted by byte
    uint32_t n_edges = 0;
    uint32_t depth = 0;
    int32_t fail = 0;
    int32_t rank[2] = {-1, -1};  // best rank whose text is exactly this node's, per mode
    int32_t out[2] = {-1, -1};   // longest node on the failure chain (self first) with a rank
  };
  int32_t child(int32_t node, uint8_t byte) const;
  std::vector<Node> nodes_ = std::vector<Node>(1);
  std::vector<uint8_t> edge_byte_;
  std::vector<int32_t> edge_child_;
  std::vector<int32_t> node_of_rank_;
  int32_t root_child_[256] = {};
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
  SpecialMatcher special_matcher;      // over special_cache (build_special_matcher)
  std::vector<TokenId> eog;            // sorted
  std::unique_ptr<PreTokenizer> pretok;

  TokenId text_to_token(std::string_view s) const { return token_to_id.find(s); }
  int bpe_rank(std::string_view left, std::string_view right, std::string& scratch) const;
  TokenId byte_to_token(uint8_t b) const;

  // Builds special_matcher from special_cache and attrs; call once both are final.
  void build_special_matcher();
  // Splits text into special tokens and raw fragments, exactly as llama.cpp's
  // tokenizer_st_partition does (longest special text first, leftmost matches first, lstrip and
  // rstrip), in time linear in the text (bounded by the longest special text per byte).
  std::vector<Fragment> partition_special(std::string_view text, bool parse_special) const;

  void spm_tokenize(const std::string& text, std::vector<TokenId>& out) const;
  void bpe_tokenize(std::string_view text, std::vector<TokenId>& out) const;
  std::string piece(TokenId id, bool special, int lstrip) const;
};

}  // namespace tandem
