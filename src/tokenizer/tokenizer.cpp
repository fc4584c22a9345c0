#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <queue>
#include <set>

#include "common/error.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace tandem {

// ---------------------------------------------------------------------------------------------
// StrMap

namespace {
uint32_t hash_sv(std::string_view s) {
  // 64-bit FNV-1a folded to 32 bits: token texts are short, so this beats a block hash.
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return static_cast<uint32_t>(h ^ (h >> 32));
}
}  // namespace

void StrMap::build(const std::vector<std::string_view>* keys, size_t expected) {
  keys_ = keys;
  size_t cap = 16;
  while (cap < expected * 2) cap <<= 1;
  slots_.assign(cap, Slot{});
  mask_ = cap - 1;
  size_ = 0;
}

uint32_t StrMap::hash_of(int32_t index) const {
  return hash_sv((*keys_)[index]);
}

void StrMap::insert_hashed(int32_t index, uint32_t h, bool overwrite) {
  if ((size_ + 1) * 2 > slots_.size()) {
    std::vector<Slot> old = std::move(slots_);
    const size_t n = size_;
    build(keys_, std::max<size_t>(16, (n + 1) * 2));
    for (const auto& s : old) {
      if (s.value < 0) continue;
      size_t i = s.hash & mask_;
      while (slots_[i].value >= 0) i = (i + 1) & mask_;
      slots_[i] = s;
      ++size_;
    }
  }
  const std::string_view key = (*keys_)[index];
  size_t i = h & mask_;
  while (slots_[i].value >= 0) {
    if (slots_[i].hash == h && (*keys_)[slots_[i].value] == key) {
      if (overwrite) slots_[i].value = index;
      return;
    }
    i = (i + 1) & mask_;
  }
  slots_[i] = Slot{h, index};
  ++size_;
}

void StrMap::build_all(const std::vector<std::string_view>* keys, bool overwrite,
                       const std::vector<uint8_t>* skip) {
  const size_t n = keys->size();
  build(keys, n);
  std::vector<uint32_t> hashes(n);
  for (size_t i = 0; i < n; ++i) hashes[i] = hash_sv((*keys)[i]);
  constexpr size_t kAhead = 16;
  for (size_t i = 0; i < n; ++i) {
    if (i + kAhead < n) __builtin_prefetch(&slots_[hashes[i + kAhead] & mask_]);
    if (skip && (*skip)[i]) continue;
    insert_hashed(static_cast<int32_t>(i), hashes[i], overwrite);
  }
}

int32_t StrMap::find(std::string_view key) const {
  if (slots_.empty()) return -1;
  const uint32_t h = hash_sv(key);
  size_t i = h & mask_;
  while (slots_[i].value >= 0) {
    if (slots_[i].hash == h && (*keys_)[slots_[i].value] == key) return slots_[i].value;
    i = (i + 1) & mask_;
  }
  return -1;
}

namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space

bool c_isspace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

void escape_whitespace(std::string& s) {
  std::string out;
  out.reserve(s.size() + 16);
  for (char c : s) {
    if (c == ' ')
      out += kSpace;
    else
      out += c;
  }
  s.swap(out);
}

void unescape_whitespace(std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (s.compare(i, kSpace.size(), kSpace) == 0) {
      out += ' ';
      i += kSpace.size();
    } else {
      out += s[i++];
    }
  }
  s.swap(out);
}

uint32_t type_to_attr(int64_t t) {
  switch (t) {
    case 1:
      return kAttrNormal;
    case 2:
      return kAttrUnknown;
    case 3:
      return kAttrControl;
    case 4:
      return kAttrUserDefined;
    case 5:
      return kAttrUnused;
    case 6:
      return kAttrByte;
    default:
      return kAttrUndefined;
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Special tokens: the trie and the one-pass partition

void SpecialMatcher::build(const std::vector<std::string_view>& texts,
                           const std::vector<TokenId>& special,
                           const std::vector<uint8_t> enabled[2]) {
  // A map-based trie of the reversed texts first, then flattened breadth first so that each
  // node's edges are one sorted, contiguous range and parents come before children.
  struct Draft {
    std::map<uint8_t, int32_t> next;
    int32_t rank[2] = {-1, -1};
  };
  std::vector<Draft> draft(1);
  std::vector<int32_t> draft_of_rank(special.size(), -1);
  for (size_t r = 0; r < special.size(); ++r) {
    const std::string_view text = texts[special[r]];
    if (text.empty() || (!enabled[0][r] && !enabled[1][r])) continue;
    int32_t node = 0;
    for (auto c = text.rbegin(); c != text.rend(); ++c) {
      const uint8_t b = static_cast<uint8_t>(*c);
      const auto it = draft[node].next.find(b);
      if (it != draft[node].next.end()) {
        node = it->second;
        continue;
      }
      const auto fresh = static_cast<int32_t>(draft.size());
      draft[node].next.emplace(b, fresh);
      draft.emplace_back();
      node = fresh;
    }
    draft_of_rank[r] = node;
    // Ranks ascend, so the first token of a text is the one with priority (a later token with
    // the same text can never match: every span it could take is taken or blocked already).
    for (int mode = 0; mode < 2; ++mode)
      if (enabled[mode][r] && draft[node].rank[mode] < 0)
        draft[node].rank[mode] = static_cast<int32_t>(r);
  }

  nodes_.assign(draft.size(), Node{});
  edge_byte_.clear();
  edge_child_.clear();
  std::vector<int32_t> order = {0};  // draft ids in breadth-first order; index = final id
  std::vector<int32_t> final_of(draft.size(), 0);
  for (size_t k = 0; k < order.size(); ++k) {
    const Draft& d = draft[order[k]];
    Node& n = nodes_[k];
    n.first_edge = static_cast<uint32_t>(edge_byte_.size());
    n.n_edges = static_cast<uint32_t>(d.next.size());
    n.rank[0] = d.rank[0];
    n.rank[1] = d.rank[1];
    for (const auto& [byte, child] : d.next) {
      final_of[child] = static_cast<int32_t>(order.size());
      nodes_[order.size()].depth = n.depth + 1;
      edge_byte_.push_back(byte);
      edge_child_.push_back(static_cast<int32_t>(order.size()));
      order.push_back(child);
    }
  }
  std::fill(std::begin(root_child_), std::end(root_child_), -1);
  for (uint32_t e = 0; e < nodes_[0].n_edges; ++e) root_child_[edge_byte_[e]] = edge_child_[e];
  node_of_rank_.assign(special.size(), -1);
  for (size_t r = 0; r < special.size(); ++r)
    if (draft_of_rank[r] >= 0) node_of_rank_[r] = final_of[draft_of_rank[r]];

  // Failure links and outputs in breadth-first order (a node's failure target is shallower, so
  // it is complete by then).
  for (size_t k = 0; k < nodes_.size(); ++k) {
    Node& n = nodes_[k];
    for (int mode = 0; mode < 2; ++mode)
      n.out[mode] = n.rank[mode] >= 0 ? static_cast<int32_t>(k) : nodes_[n.fail].out[mode];
    for (uint32_t e = n.first_edge; e < n.first_edge + n.n_edges; ++e) {
      const int32_t c = edge_child_[e];
      nodes_[c].fail = k == 0 ? 0 : step(n.fail, edge_byte_[e]);
    }
  }
}

int32_t SpecialMatcher::child(int32_t node, uint8_t byte) const {
  if (node == 0) return root_child_[byte];
  const Node& n = nodes_[node];
  const auto first = edge_byte_.begin() + n.first_edge;
  const auto last = first + n.n_edges;
  const auto it = std::lower_bound(first, last, byte);
  return (it != last && *it == byte) ? edge_child_[it - edge_byte_.begin()] : -1;
}

int32_t SpecialMatcher::step(int32_t state, uint8_t byte) const {
  for (;;) {
    const int32_t next = child(state, byte);
    if (next >= 0) return next;
    if (state == 0) return 0;
    state = nodes_[state].fail;
  }
}

void TokenizerImpl::build_special_matcher() {
  std::vector<uint8_t> enabled[2];
  for (const TokenId id : special_cache) {
    enabled[0].push_back((attrs[id] & (kAttrControl | kAttrUnknown)) == 0);
    enabled[1].push_back(1);
  }
  special_matcher.build(texts, special_cache, enabled);
}

namespace {

// Which bytes of the text are taken: by an accepted special token or by the whitespace an
// lstrip/rstrip token removed. Only ever grows.
class TakenBytes {
 public:
  explicit TakenBytes(size_t n) : words_((n + 63) / 64, 0) {}
  bool test(size_t i) const { return (words_[i >> 6] >> (i & 63)) & 1; }
  void set(size_t i) { words_[i >> 6] |= uint64_t{1} << (i & 63); }
  void set_range(size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) set(i);
  }
  // First taken byte in [b, e), or e. Special texts are short, so this reads a word or two.
  size_t first_in(size_t b, size_t e) const {
    for (size_t i = b; i < e;) {
      const uint64_t w = words_[i >> 6] >> (i & 63);
      if (w) return std::min(e, i + static_cast<size_t>(__builtin_ctzll(w)));
      i = (i | 63) + 1;
    }
    return e;
  }

 private:
  std::vector<uint64_t> words_;
};

}  // namespace

namespace {

// The first candidate of every position that starts a special text, as keys
// rank << 32 | position in (rank, position) order. Found in one backward scan (the matcher reads
// the text backwards, so positions come out descending); a stable counting sort by rank of the
// reversed list (linear; ranks are few) then orders them.
std::vector<uint64_t> first_candidates(const SpecialMatcher& m, size_t n_ranks,
                                       std::string_view text, int mode) {
  std::vector<uint64_t> firsts;  // rank << 32 | position, the first candidate of each position
  if (!m.empty()) {
    int32_t state = 0;
    for (size_t pos = text.size(); pos-- > 0;) {
      state = m.step(state, static_cast<uint8_t>(text[pos]));
      const int32_t node = m.match(state, mode);
      if (node >= 0) firsts.push_back(uint64_t(m.rank(node, mode)) << 32 | pos);
    }
  }
  if (firsts.empty()) return firsts;
  std::reverse(firsts.begin(), firsts.end());
  std::vector<uint32_t> start(n_ranks + 1, 0);
  for (const uint64_t k : firsts) ++start[(k >> 32) + 1];
  for (size_t r = 1; r < start.size(); ++r) start[r] += start[r - 1];
  std::vector<uint64_t> sorted(firsts.size());
  for (const uint64_t k : firsts) sorted[start[k >> 32]++] = k;
  return sorted;
}

}  // namespace

// llama.cpp's tokenizer_st_partition takes the special tokens one at a time, longest text first
// (rank = index in special_cache), and splits every raw fragment at each leftmost,
// non-overlapping occurrence; that costs (number of special tokens) x (text length), 6,414 x
// 1 MB for Gemma. The same result in one pass: an occurrence of rank r at byte p is accepted
// exactly when, once every better rank and every earlier occurrence of rank r has been decided,
// none of its bytes is taken. So candidates are decided in (rank, position) order, one per
// position: the longest special text that starts there (Aho-Corasick over the text read
// backwards). A candidate that finds a taken byte at p + k is replaced by the longest text at p
// of at most k bytes (a worse rank, decided later); bytes only ever become taken, so a
// candidate that fails once fails forever. A position is re-queued at most once per distinct
// special-text length, and in practice never.
std::vector<Fragment> TokenizerImpl::partition_special(std::string_view text,
                                                       bool parse_special) const {
  std::vector<Fragment> out;
  if (text.empty()) return out;
  const int mode = parse_special ? 1 : 0;
  if (text.size() > UINT32_MAX)
    throw Error("tokenizer: text of " + std::to_string(text.size()) +
                " bytes is over the 4 GiB limit");
  const SpecialMatcher& m = special_matcher;
  const std::vector<uint64_t> firsts = first_candidates(m, special_cache.size(), text, mode);
  if (firsts.empty()) {
    out.push_back(Fragment{false, -1, 0, text.size()});
    return out;
  }
  std::vector<uint64_t> retries;  // min-heap of re-queued candidates, same keys
  size_t next_first = 0;
  auto pop_candidate = [&]() -> uint64_t {
    if (!retries.empty() && (next_first == firsts.size() || retries.front() < firsts[next_first])) {
      std::pop_heap(retries.begin(), retries.end(), std::greater<>());
      const uint64_t k = retries.back();
      retries.pop_back();
      return k;
    }
    return firsts[next_first++];
  };

  TakenBytes taken(text.size());
  std::vector<std::pair<size_t, TokenId>> found;  // (position, token), accepted occurrences
  while (next_first < firsts.size() || !retries.empty()) {
    const uint64_t key = pop_candidate();
    const size_t pos = key & 0xFFFFFFFFu;
    if (taken.test(pos)) continue;
    const auto rank = static_cast<int32_t>(key >> 32);
    const TokenId id = special_cache[rank];
    const size_t end = pos + texts[id].size();
    const size_t blocked = taken.first_in(pos, end);
    if (blocked < end) {
      int32_t node = m.shorter(m.node_of_rank(rank), mode);
      while (node >= 0 && m.length(node) > blocked - pos) node = m.shorter(node, mode);
      if (node >= 0) {
        retries.push_back(uint64_t(m.rank(node, mode)) << 32 | pos);
        std::push_heap(retries.begin(), retries.end(), std::greater<>());
      }
      continue;
    }
    taken.set_range(pos, end);
    found.emplace_back(pos, id);
    // lstrip/rstrip remove the whitespace up to the next taken byte (llama.cpp strips within
    // the fragment, whose ends are exactly those bytes).
    if (attrs[id] & kAttrLstrip)
      for (size_t b = pos; b > 0 && !taken.test(b - 1) && c_isspace(text[b - 1]); --b)
        taken.set(b - 1);
    if (attrs[id] & kAttrRstrip)
      for (size_t e = end; e < text.size() && !taken.test(e) && c_isspace(text[e]); ++e)
        taken.set(e);
  }

  // Raw text between two tokens is what is not taken; stripped whitespace sits at its ends.
  std::sort(found.begin(), found.end());
  auto add_raw = [&](size_t b, size_t e) {
    while (b < e && taken.test(b)) ++b;
    while (e > b && taken.test(e - 1)) --e;
    if (e > b) out.push_back(Fragment{false, -1, b, e - b});
  };
  size_t cursor = 0;
  for (const auto& [pos, id] : found) {
    add_raw(cursor, pos);
    out.push_back(Fragment{true, id, 0, 0});
    cursor = pos + texts[id].size();
  }
  add_raw(cursor, text.size());
  return out;
}

namespace {

// ---------------------------------------------------------------------------------------------
// SPM (llama.cpp's llm_tokenizer_spm_session)

struct Symbol {
  int prev;
  int next;
  const char* text;
  size_t n;
};

struct SpmBigram {
  int left, right;
  float score;
  size_t size;
};
struct SpmCmp {
  bool operator()(const SpmBigram& l, const SpmBigram& r) const {
    return (l.score < r.score) || (l.score == r.score && l.left > r.left);
  }
};

struct BpeBigram {
  int left, right;
  int rank;
  size_t size;
};
struct BpeCmp {
  bool operator()(const BpeBigram& l, const BpeBigram& r) const {
    return l.rank > r.rank || (l.rank == r.rank && l.left > r.left);
  }
};

// Appends one symbol per UTF-8 character of s (a truncated last character keeps the bytes
// left), linked as a list: symbols[i].prev = i - 1, .next = i + 1 or -1 at the end. Expects
// `symbols` empty, since the links are indices from 0.
void append_char_symbols(std::string_view s, std::vector<Symbol>& symbols) {
  int index = 0;
  size_t offset = 0;
  while (offset < s.size()) {
    Symbol sym;
    sym.text = s.data() + offset;
    sym.n = std::min(unicode::len_utf8(s[offset]), s.size() - offset);
    offset += sym.n;
    sym.prev = index - 1;
    sym.next = offset == s.size() ? -1 : index + 1;
    index++;
    symbols.push_back(sym);
  }
}

// Merges symbol `right` (the next in the list) into `left`: right keeps n == 0 and is unlinked.
inline void merge_right_into_left(std::vector<Symbol>& symbols, int left, int right) {
  Symbol& l = symbols[left];
  Symbol& r = symbols[right];
  l.n += r.n;
  r.n = 0;
  l.next = r.next;
  if (r.next >= 0) symbols[r.next].prev = left;
}

}  // namespace

TokenId TokenizerImpl::byte_to_token(uint8_t b) const {
  static const char* hex = "0123456789ABCDEF";
  if (kind == Kind::SPM) {
    const char buf[6] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
    TokenId id = text_to_token(std::string_view(buf, 6));
    if (id >= 0) return id;
    id = text_to_token(std::string_view(reinterpret_cast<const char*>(&b), 1));
    if (id >= 0) return id;
  } else {
    TokenId id = text_to_token(unicode::byte_to_utf8(b));
    if (id >= 0) return id;
  }
  if (unk >= 0) return unk;
  char msg[96];
  std::snprintf(msg, sizeof msg, "tokenizer: vocabulary has no token for byte 0x%02X", b);
  throw Error(msg);
}

void TokenizerImpl::spm_tokenize(const std::string& text, std::vector<TokenId>& output) const {
  std::vector<Symbol> symbols;
  symbols.reserve(text.size());
  append_char_symbols(text, symbols);

  // Lazy invalidation: a merge changes two symbols, and the bigrams that named them stay in the
  // queue until popped and found stale (their size no longer adds up). Each merge pushes at most
  // two bigrams, so one piece of n symbols costs O(n log n), however long it is.
  std::priority_queue<SpmBigram, std::vector<SpmBigram>, SpmCmp> work_queue;

  auto try_add_bigram = [&](int left, int right) {
    if (left == -1 || right == -1) return;
    const std::string_view s(symbols[left].text, symbols[left].n + symbols[right].n);
    if (s.size() > max_token_len) return;
    const TokenId token = text_to_token(s);
    if (token < 0 || static_cast<size_t>(token) >= texts.size()) return;
    work_queue.push(SpmBigram{left, right, scores.empty() ? 0.0f : scores[token], s.size()});
  };

  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) try_add_bigram(i - 1, i);

  while (!work_queue.empty()) {
    const SpmBigram bigram = work_queue.top();
    work_queue.pop();
    auto& left_sym = symbols[bigram.left];
    auto& right_sym = symbols[bigram.right];
    if (left_sym.n == 0 || right_sym.n == 0 || left_sym.n + right_sym.n != bigram.size) continue;
    merge_right_into_left(symbols, bigram.left, bigram.right);
    try_add_bigram(left_sym.prev, bigram.left);
    try_add_bigram(bigram.left, left_sym.next);
  }

  // llama.cpp resegments a final symbol that is not a token through a map of the merges it made
  // (recursively). Here every merge makes a token (try_add_bigram queues only texts that are
  // tokens), so a final symbol that is not a token is one unmerged character, and a character is
  // never the text of a merge: a merge's left symbol alone is as long as its first byte says a
  // character is. So that map is never hit, and the bytes fall back directly.
  if (symbols.empty()) return;
  for (int i = 0; i != -1; i = symbols[i].next) {
    const Symbol& symbol = symbols[i];
    const TokenId token = text_to_token(std::string_view(symbol.text, symbol.n));
    if (token >= 0) {
      output.push_back(token);
      continue;
    }
    for (size_t j = 0; j < symbol.n; ++j)
      output.push_back(byte_to_token(static_cast<uint8_t>(symbol.text[j])));
  }
}

// ---------------------------------------------------------------------------------------------
// BPE (llama.cpp's llm_tokenizer_bpe_session)

int TokenizerImpl::bpe_rank(std::string_view left, std::string_view right,
                            std::string& scratch) const {
  scratch.assign(left);
  scratch += ' ';
  scratch += right;
  const int32_t i = merge_rank.find(scratch);
  if (i < 0) return -1;
  // The stored merge splits at its first space after position 0; it must split where we do.
  if (merges[i].find(' ', 1) != left.size()) return -1;
  return i;
}

namespace {

// One pre-tokenized word into its BPE symbols: split into UTF-8 characters (or kept whole when
// ignore_merges and the word is a token), then the lowest-rank adjacent pair merged until none
// is a merge. Merged-away symbols are left with n == 0. `symbols` and `scratch` are reused
// across words to keep their capacity.
void bpe_merge_word(const TokenizerImpl& v, const std::string& word, std::vector<Symbol>& symbols,
                    std::string& scratch) {
  std::priority_queue<BpeBigram, std::vector<BpeBigram>, BpeCmp> work_queue;
  symbols.clear();
  if (v.ignore_merges && v.text_to_token(word) >= 0) {
    symbols.push_back(Symbol{-1, -1, word.data(), word.size()});
  } else {
    append_char_symbols(word, symbols);
  }

  auto add_new_bigram = [&](int left, int right) {
    if (left == -1 || right == -1) return;
    const std::string_view lt(symbols[left].text, symbols[left].n);
    const std::string_view rt(symbols[right].text, symbols[right].n);
    const int rank = v.bpe_rank(lt, rt, scratch);
    if (rank < 0) return;
    work_queue.push(BpeBigram{left, right, rank, lt.size() + rt.size()});
  };

  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) add_new_bigram(i - 1, i);

  while (!work_queue.empty()) {
    const BpeBigram bigram = work_queue.top();
    work_queue.pop();
    auto& left_symbol = symbols[bigram.left];
    auto& right_symbol = symbols[bigram.right];
    if (left_symbol.n == 0 || right_symbol.n == 0) continue;
    // llama.cpp compares left+right with the bigram's text. Both symbols are alive, so right
    // still directly follows left in the word and the texts are equal iff the sizes are.
    if (left_symbol.n + right_symbol.n != bigram.size) continue;  // outdated
    merge_right_into_left(symbols, bigram.left, bigram.right);
    add_new_bigram(left_symbol.prev, bigram.left);
    add_new_bigram(bigram.left, left_symbol.next);
  }
}

}  // namespace

void TokenizerImpl::bpe_tokenize(std::string_view text, std::vector<TokenId>& output) const {
  const std::vector<std::string> words = pretok->split(text);
  std::vector<Symbol> symbols_final;
  std::vector<Symbol> symbols;
  std::string scratch;
  int final_prev_index = -1;

  for (const auto& word : words) {
    bpe_merge_word(*this, word, symbols, scratch);
    for (auto& sym : symbols) {
      if (sym.n > 0) {
        sym.prev = final_prev_index;
        sym.next = -1;
        if (final_prev_index != -1)
          symbols_final[final_prev_index].next = static_cast<int>(symbols_final.size());
        symbols_final.push_back(sym);
        final_prev_index = static_cast<int>(symbols_final.size()) - 1;
      }
    }
  }

  if (symbols_final.empty()) return;
  for (int i = 0; i != -1; i = symbols_final[i].next) {
    const auto& symbol = symbols_final[i];
    if (symbol.n == 0) continue;
    const std::string_view str(symbol.text, symbol.n);
    const TokenId token = text_to_token(str);
    if (token < 0) {
      for (char c : str) {
        const TokenId t = text_to_token(std::string_view(&c, 1));
        if (t >= 0) output.push_back(t);
      }
    } else {
      output.push_back(token);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Pieces

std::string TokenizerImpl::piece(TokenId id, bool special, int lstrip) const {
  if (id < 0 || static_cast<size_t>(id) >= texts.size()) return {};
  const uint32_t attr = attrs[id];
  constexpr uint32_t kSpecial = kAttrUnknown | kAttrControl;
  if (!special && (attr & kSpecial)) return {};
  std::string r;
  const std::string_view text = texts[id];
  if (attr & (kSpecial | kAttrUserDefined)) {
    r.assign(text);
  } else if (attr & kAttrNormal) {
    if (kind == Kind::SPM) {
      r.assign(text);
      unescape_whitespace(r);
    } else {
      const std::vector<uint32_t> cpts = unicode::cpts_from_utf8(text);
      std::string utf8;
      for (uint32_t c : cpts) {
        const int b = unicode::utf8_cpt_to_byte(c);
        if (b >= 0) {
          r += static_cast<char>(b);
        } else {
          utf8.clear();
          unicode::append_utf8(utf8, c);
          r += "[UNK_BYTE_0x";
          char hx[3];
          for (char ch : utf8) {
            std::snprintf(hx, sizeof hx, "%02x", static_cast<uint8_t>(ch));
            r += hx;
          }
          r.append(text);
          r += "]";
        }
      }
    }
  } else if ((attr & kAttrByte) && kind == Kind::SPM) {
    // strtol(text + 3, nullptr, 16) on "<0xXX>"
    unsigned v = 0;
    for (size_t i = 3; i < text.size(); ++i) {
      const char c = text[i];
      int d;
      if (c >= '0' && c <= '9')
        d = c - '0';
      else if (c >= 'a' && c <= 'f')
        d = c - 'a' + 10;
      else if (c >= 'A' && c <= 'F')
        d = c - 'A' + 10;
      else
        break;
      v = v * 16 + d;
    }
    r.push_back(static_cast<char>(v));
  }
  size_t skip = 0;
  while (static_cast<int>(skip) < lstrip && skip < r.size() && r[skip] == ' ') ++skip;
  if (skip) r.erase(0, skip);
  return r;
}

// ---------------------------------------------------------------------------------------------
// Loading

namespace {

std::optional<TokenId> read_id(const GgufFile& f, std::string_view key) {
  const auto v = f.get_u64_opt(key);
  if (!v) return std::nullopt;
  if (*v > static_cast<uint64_t>(INT32_MAX)) return std::nullopt;
  return static_cast<TokenId>(*v);
}

// from_gguf reads the vocabulary in the order llama.cpp's loader does, one step per function
// below; later steps read what earlier ones set (defaults, then texts, then special ids), so
// their order is part of the behaviour. `where` (" in <path>") ends every error message.

// The gpt2 merges, copied into one arena: merges[i] is the view "left right" of rank i.
void load_merges(TokenizerImpl& v, const GgufFile& f, const std::string& where) {
  if (!f.has("tokenizer.ggml.merges"))
    throw Error("tokenizer: missing key tokenizer.ggml.merges (required for gpt2 vocab)" + where);
  const auto& merges = f.get_string_array("tokenizer.ggml.merges");
  size_t total = 0;
  for (auto m : merges) total += m.size();
  v.merge_arena.reserve(total);
  for (auto m : merges) v.merge_arena.append(m);
  v.merges.reserve(merges.size());
  size_t off = 0;
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string_view m(v.merge_arena.data() + off, merges[i].size());
    off += m.size();
    v.merges.push_back(m);
  }
  // Without a space llama.cpp stores the pair ("", ""), which never matches: skip those.
  std::vector<uint8_t> skip(v.merges.size());
  for (size_t i = 0; i < v.merges.size(); ++i)
    skip[i] = v.merges[i].find(' ', 1) == std::string_view::npos;
  v.merge_rank.build_all(&v.merges, /*overwrite=*/false, &skip);
}

// tokenizer.ggml.model picks the algorithm and the defaults that metadata may override later.
void load_model_kind(TokenizerImpl& v, const GgufFile& f, const std::string& where) {
  const auto model = f.get_string_opt("tokenizer.ggml.model");
  if (!model) throw Error("tokenizer: missing key tokenizer.ggml.model" + where);
  v.model.assign(*model);
  v.pre.assign(f.get_string_opt("tokenizer.ggml.pre").value_or(""));

  if (v.model == "llama") {
    v.kind = TokenizerImpl::Kind::SPM;
    v.bos = 1;
    v.eos = 2;
    v.unk = 0;
    v.add_space_prefix = true;
    v.add_bos = true;
    v.add_eos = false;
    v.clean_spaces = false;
  } else if (v.model == "gpt2") {
    v.kind = TokenizerImpl::Kind::BPE;
    v.bos = 11;
    v.eos = 11;
    v.unk = -1;
    v.add_space_prefix = false;
    v.clean_spaces = true;
    v.pre_type = pre_type_from_name(v.pre);
    if (v.pre_type == PreType::LLAMA3) {
      v.ignore_merges = true;
      v.add_bos = true;
    } else if (v.pre_type == PreType::QWEN2) {
      v.clean_spaces = false;
    }
    load_merges(v, f, where);
    v.pretok = std::make_unique<PreTokenizer>(v.pre_type);
  } else {
    throw Error("tokenizer: unsupported tokenizer.ggml.model '" + v.model + "'" + where +
                " (supported: llama, gpt2)");
  }
  if (auto b = f.find("tokenizer.ggml.add_space_prefix")) {
    (void)b;
    v.add_space_prefix = f.get_bool_or("tokenizer.ggml.add_space_prefix", v.add_space_prefix);
  }
}

// Scores and token types, each at least n long (extra entries are ignored, as llama.cpp does).
void load_scores_and_types(TokenizerImpl& v, const GgufFile& f, size_t n,
                           const std::string& where) {
  if (f.has("tokenizer.ggml.scores")) {
    v.scores = f.get_f32_array("tokenizer.ggml.scores");
    if (v.scores.size() < n)
      throw Error("tokenizer: tokenizer.ggml.scores has " + std::to_string(v.scores.size()) +
                  " entries, expected " + std::to_string(n) + where);
    v.scores.resize(n);
  }
  v.attrs.assign(n, kAttrNormal);
  v.types.assign(n, 1);
  if (f.has("tokenizer.ggml.token_type")) {
    const auto types = f.get_int_array("tokenizer.ggml.token_type");
    if (types.size() < n)
      throw Error("tokenizer: tokenizer.ggml.token_type has " + std::to_string(types.size()) +
                  " entries, expected " + std::to_string(n) + where);
    for (size_t i = 0; i < n; ++i) {
      v.attrs[i] = type_to_attr(types[i]);
      v.types[i] = static_cast<uint8_t>(types[i] >= 0 && types[i] <= 6 ? types[i] : 0);
    }
  }
}

// Token texts copied into one arena (an empty text becomes "[EMPTY_<id>]", as in llama.cpp);
// texts[id] views it, token_to_id maps back (a later duplicate wins).
void build_texts(TokenizerImpl& v, const std::vector<std::string_view>& tokens) {
  const size_t n = tokens.size();
  size_t total = 0;
  for (size_t i = 0; i < n; ++i)
    total += tokens[i].empty() ? 8 + std::to_string(i).size() : tokens[i].size();
  v.text_arena.reserve(total);
  std::vector<std::pair<size_t, size_t>> spans(n);
  for (size_t i = 0; i < n; ++i) {
    const size_t start = v.text_arena.size();
    if (tokens[i].empty()) {
      v.text_arena += "[EMPTY_" + std::to_string(i) + "]";
    } else {
      v.text_arena.append(tokens[i]);
    }
    spans[i] = {start, v.text_arena.size() - start};
  }
  v.texts.resize(n);
  for (size_t i = 0; i < n; ++i) {
    v.texts[i] = std::string_view(v.text_arena.data() + spans[i].first, spans[i].second);
    v.max_token_len = std::max(v.max_token_len, v.texts[i].size());
  }
  v.token_to_id.build_all(&v.texts, /*overwrite=*/true);
}

// Tokens, scores, types; returns the vocabulary size n (1 <= n <= INT32_MAX).
size_t load_tokens(TokenizerImpl& v, const GgufFile& f, const std::string& where) {
  if (!f.has("tokenizer.ggml.tokens"))
    throw Error("tokenizer: missing key tokenizer.ggml.tokens" + where);
  const auto& tokens = f.get_string_array("tokenizer.ggml.tokens");
  const size_t n = tokens.size();
  if (n == 0) throw Error("tokenizer: tokenizer.ggml.tokens is empty" + where);
  if (n > static_cast<size_t>(INT32_MAX))
    throw Error("tokenizer: too many tokens (" + std::to_string(n) + ")" + where);
  load_scores_and_types(v, f, n, where);
  build_texts(v, tokens);
  return n;
}

// Special ids from metadata (out-of-range ids are ignored, as llama.cpp does).
void read_special_ids(TokenizerImpl& v, const GgufFile& f, size_t n) {
  const std::pair<const char*, TokenId*> keys[] = {
      {"tokenizer.ggml.bos_token_id", &v.bos},
      {"tokenizer.ggml.eos_token_id", &v.eos},
      {"tokenizer.ggml.eot_token_id", &v.eot},
      {"tokenizer.ggml.eom_token_id", &v.eom},
      {"tokenizer.ggml.unknown_token_id", &v.unk},
      {"tokenizer.ggml.seperator_token_id", &v.sep},
      {"tokenizer.ggml.padding_token_id", &v.pad},
      {"tokenizer.ggml.mask_token_id", &v.mask},
      {"tokenizer.ggml.fim_pre_token_id", &v.fim_pre},
      {"tokenizer.ggml.fim_suf_token_id", &v.fim_suf},
      {"tokenizer.ggml.fim_mid_token_id", &v.fim_mid},
      {"tokenizer.ggml.fim_pad_token_id", &v.fim_pad},
      {"tokenizer.ggml.fim_rep_token_id", &v.fim_rep},
      {"tokenizer.ggml.fim_sep_token_id", &v.fim_sep},
      {"tokenizer.ggml.prefix_token_id", &v.fim_pre},
      {"tokenizer.ggml.suffix_token_id", &v.fim_suf},
      {"tokenizer.ggml.middle_token_id", &v.fim_mid},
  };
  for (const auto& [key, dst] : keys) {
    const auto id = read_id(f, key);
    if (id && static_cast<size_t>(*id) < n) *dst = *id;
  }
  for (TokenId* id : {&v.bos, &v.eos, &v.unk})
    if (*id >= static_cast<TokenId>(n)) *id = -1;
  v.add_bos = f.get_bool_or("tokenizer.ggml.add_bos_token", v.add_bos);
  v.add_eos = f.get_bool_or("tokenizer.ggml.add_eos_token", v.add_eos);
}

void force_control(TokenizerImpl& v, TokenId id) {
  v.attrs[id] |= kAttrControl;
}

// Sets dst (when metadata left it unset) to the first of names present in the vocabulary.
void detect_special(TokenizerImpl& v, TokenId& dst, std::initializer_list<std::string_view> names) {
  if (dst >= 0) return;
  for (auto name : names) {
    const TokenId id = v.text_to_token(name);
    if (id >= 0) {
      dst = id;
      force_control(v, id);
      return;
    }
  }
}

// Special tokens recognised by their text (llama.cpp walks a hash map, so when several texts
// match, which one it takes is not specified; we prefer the order of its lists).
void detect_special_texts(TokenizerImpl& v) {
  detect_special(v, v.eot,
                 {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                  "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]",
                  "<\xEF\xBD\x9C"
                  "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
                  "<end_of_utterance>"});
  detect_special(v, v.eom, {"<|eom_id|>"});
  detect_special(v, v.fim_pre,
                 {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<PRE>", "\xE2\x96\x81<PRE>",
                  "<|code_prefix|>"});
  detect_special(v, v.fim_suf,
                 {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<SUF>", "\xE2\x96\x81<SUF>",
                  "<|code_suffix|>"});
  detect_special(v, v.fim_mid,
                 {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<MID>", "\xE2\x96\x81<MID>",
                  "<|code_middle|>"});
  detect_special(v, v.fim_pad, {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"});
  detect_special(v, v.fim_rep,
                 {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"});
  detect_special(v, v.fim_sep, {"<|file_sep|>"});

  // Control tokens whose text says "unused" are marked unused.
  for (size_t i = 0; i < v.texts.size(); ++i)
    if ((v.attrs[i] & kAttrControl) && v.texts[i].find("unused") != std::string_view::npos)
      v.attrs[i] |= kAttrUnused;
}

// The end-of-generation set (v.eog, sorted): FIM pad/repo/sep, the known end texts (forced to
// control), eos/eot/eom; gpt-oss's harmony markers become user-defined.
void collect_eog(TokenizerImpl& v) {
  std::set<TokenId> eog;
  for (TokenId id : {v.fim_pad, v.fim_rep, v.fim_sep})
    if (id >= 0) eog.insert(id);
  for (std::string_view name : {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>",
                                "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
                                "_<EOT>", "<|end_of_text|>", "<end_of_utterance>"}) {
    const TokenId id = v.text_to_token(name);
    if (id >= 0) {
      eog.insert(id);
      force_control(v, id);
    }
  }
  for (std::string_view name : {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"}) {
    const TokenId id = v.text_to_token(name);
    if (id >= 0) v.attrs[id] = kAttrUserDefined;
  }
  for (TokenId id : {v.eos, v.eot, v.eom})
    if (id >= 0) eog.insert(id);
  {  // gpt-oss: "<|end|>" is not end-of-generation when "<|return|>" and "<|call|>" exist
    const TokenId ret = v.text_to_token("<|return|>"), call = v.text_to_token("<|call|>");
    const TokenId end = v.text_to_token("<|end|>");
    if (ret >= 0 && call >= 0 && end >= 0 && eog.count(ret) && eog.count(call)) eog.erase(end);
  }
  v.eog.assign(eog.begin(), eog.end());
}

// Special-token cache, longest text first (std::sort like llama.cpp, so ties match g++).
void build_special_cache(TokenizerImpl& v) {
  for (size_t i = 0; i < v.texts.size(); ++i)
    if (v.attrs[i] & (kAttrControl | kAttrUserDefined | kAttrUnknown))
      v.special_cache.push_back(static_cast<TokenId>(i));
  std::sort(v.special_cache.begin(), v.special_cache.end(),
            [&](TokenId a, TokenId b) { return v.texts[a].size() > v.texts[b].size(); });
}

// Per-model token attributes (llama.cpp sets these by general.name); needs special_cache.
void apply_model_attrs(TokenizerImpl& v, const GgufFile& f) {
  std::string name(f.get_string_opt("general.name").value_or(""));
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  auto set_attr = [&](std::string_view text, uint32_t a, bool on) {
    const TokenId id = v.text_to_token(text);
    if (id < 0) return;
    v.attrs[id] = on ? (v.attrs[id] | a) : (v.attrs[id] & ~a);
  };
  if (v.pre.find("jina-v2") != std::string::npos) {
    set_attr("<mask>", kAttrLstrip, true);
  } else if (name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos) {
    for (TokenId id : v.special_cache) v.attrs[id] |= kAttrRstrip;
    set_attr("</s>", kAttrRstrip, true);
    for (auto t : {"<unk>", "<s>", "<|endoftext|>"}) set_attr(t, kAttrRstrip, false);
  }
}

}  // namespace

Tokenizer::Tokenizer() : impl_(std::make_unique<TokenizerImpl>()) {}
Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const GgufFile& f) {
  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  TokenizerImpl& v = *tok->impl_;
  const std::string where = " in " + f.path();

  load_model_kind(v, f, where);
  const size_t n = load_tokens(v, f, where);
  read_special_ids(v, f, n);
  detect_special_texts(v);
  collect_eog(v);
  build_special_cache(v);
  apply_model_attrs(v, f);
  v.build_special_matcher();
  return tok;
}

// ---------------------------------------------------------------------------------------------
// Encoding

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool add_special,
                                       bool parse_special) const {
  const TokenizerImpl& v = *impl_;
  const std::vector<Fragment> frags = v.partition_special(text, parse_special);

  std::vector<TokenId> out;
  if (v.kind == TokenizerImpl::Kind::SPM) {
    bool is_prev_special = true;  // prefix with space if first token
    if (add_special && v.add_bos && v.bos >= 0) out.push_back(v.bos);
    std::string s;
    for (const Fragment& fr : frags) {
      if (!fr.is_token) {
        s.clear();
        if (v.add_space_prefix && is_prev_special) s = ' ';
        s.append(text.substr(fr.off, fr.len));
        escape_whitespace(s);
        v.spm_tokenize(s, out);
        is_prev_special = false;
      } else {
        out.push_back(fr.id);
        is_prev_special = true;
      }
    }
    if (add_special && v.add_eos && v.eos >= 0) out.push_back(v.eos);
  } else {
    if (add_special && v.add_bos && v.bos >= 0) out.push_back(v.bos);
    for (const Fragment& fr : frags) {
      if (!fr.is_token)
        v.bpe_tokenize(text.substr(fr.off, fr.len), out);
      else
        out.push_back(fr.id);
    }
    if (add_special && v.add_eos && v.eos >= 0) out.push_back(v.eos);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Decoding

std::string Tokenizer::token_to_piece(TokenId id, bool special) const {
  return impl_->piece(id, special, 0);
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool remove_special,
                              bool unparse_special) const {
  const TokenizerImpl& v = *impl_;
  bool remove_space = v.add_space_prefix;
  if (remove_special && v.add_bos && !ids.empty() && ids.front() == v.bos) {
    remove_space = false;
    ids = ids.subspan(1);
  }
  if (remove_special && v.add_eos && !ids.empty() && ids.back() == v.eos)
    ids = ids.first(ids.size() - 1);

  std::string text;
  for (TokenId id : ids) {
    text += v.piece(id, unparse_special, remove_space ? 1 : 0);
    remove_space = false;
  }
  if (!v.clean_spaces || text.empty()) return text;

  // llama.cpp's clean_up_tokenization_spaces, three in-place passes.
  {  // " ?", " !", " .", " ,"
    const size_t total1 = text.size();
    size_t total = 1;
    for (size_t i = 1; i < total1; ++i) {
      const char x = text[i];
      if (text[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ','))
        --total;  // remove space
      text[total++] = x;
    }
    text.resize(total);
  }
  if (!text.empty()) {  // " ' " -> "'"
    const size_t total2 = text.size();
    size_t total = 1;
    for (size_t i = 1; i < total2; ++i) {
      const char x = text[i];
      if (x == '\'' && i + 1 < total2 && text[i - 1] == ' ' && text[i + 1] == ' ') {
        --total;           // remove prev space
        text[++i] = '\0';  // remove next space
      }
      text[total++] = x;
    }
    text.resize(total);
  }
  if (!text.empty()) {  // " 's", " 'm", " 're", " 've"
    const size_t total3 = text.size();
    size_t total = 1;
    for (size_t i = 1; i < total3; ++i) {
      const char x = text[i];
      if (text[i - 1] == ' ' && x == '\'' && i + 1 < total3) {
        const char x1 = text[i + 1];
        if (x1 == 't' || x1 == 'd') {
          // keep
        } else if (x1 == 's' || x1 == 'm') {
          --total;
        } else if (i + 2 < total3) {
          const char x2 = text[i + 2];
          if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) --total;
        }
      }
      text[total++] = x;
    }
    text.resize(total);
  }
  return text;
}

// ---------------------------------------------------------------------------------------------
// Accessors

int32_t Tokenizer::n_vocab() const {
  return static_cast<int32_t>(impl_->texts.size());
}
TokenId Tokenizer::bos() const {
  return impl_->bos;
}
TokenId Tokenizer::eos() const {
  return impl_->eos;
}
TokenId Tokenizer::eot() const {
  return impl_->eot;
}
TokenId Tokenizer::unk() const {
  return impl_->unk;
}
TokenId Tokenizer::pad() const {
  return impl_->pad;
}
bool Tokenizer::add_bos() const {
  return impl_->add_bos;
}
bool Tokenizer::add_eos() const {
  return impl_->add_eos;
}
bool Tokenizer::add_space_prefix() const {
  return impl_->add_space_prefix;
}
bool Tokenizer::clean_spaces() const {
  return impl_->clean_spaces;
}
bool Tokenizer::is_eog(TokenId id) const {
  return id >= 0 && std::binary_search(impl_->eog.begin(), impl_->eog.end(), id);
}
const std::vector<TokenId>& Tokenizer::eog_ids() const {
  return impl_->eog;
}
std::string_view Tokenizer::model_name() const {
  return impl_->model;
}
std::string_view Tokenizer::pre_name() const {
  return impl_->pre;
}

std::string_view Tokenizer::token_text(TokenId id) const {
  if (id < 0 || id >= n_vocab()) return {};
  return impl_->texts[id];
}

TokenAttr Tokenizer::attr(TokenId id) const {
  if (id < 0 || id >= n_vocab()) return TokenAttr::UNDEFINED;
  const uint32_t a = impl_->attrs[id];
  if (a & kAttrUnknown) return TokenAttr::UNKNOWN;
  if (a & kAttrControl) return TokenAttr::CONTROL;
  if (a & kAttrUserDefined) return TokenAttr::USER_DEFINED;
  if (a & kAttrByte) return TokenAttr::BYTE;
  if (a & kAttrNormal) return TokenAttr::NORMAL;
  if (a & kAttrUnused) return TokenAttr::UNUSED;
  return TokenAttr::UNDEFINED;
}

TokenId Tokenizer::find_token(std::string_view text) const {
  return impl_->text_to_token(text);
}

std::string fingerprint_hex(uint64_t fingerprint) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(fingerprint));
  return buf;
}

std::string Tokenizer::fingerprint_hex() const {
  return tandem::fingerprint_hex(fingerprint());
}

uint64_t Tokenizer::fingerprint() const {
  const TokenizerImpl& v = *impl_;
  uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&](const void* data, size_t len) {
    const auto* p = static_cast<const uint8_t*>(data);
    for (size_t i = 0; i < len; ++i) {
      h ^= p[i];
      h *= 0x100000001b3ull;
    }
  };
  auto mix_u32 = [&](uint32_t x) {
    uint8_t b[4] = {uint8_t(x), uint8_t(x >> 8), uint8_t(x >> 16), uint8_t(x >> 24)};
    mix(b, 4);
  };
  mix(v.model.data(), v.model.size());
  mix_u32(static_cast<uint32_t>(v.texts.size()));
  for (size_t i = 0; i < v.texts.size(); ++i) {
    mix_u32(static_cast<uint32_t>(v.texts[i].size()));
    mix(v.texts[i].data(), v.texts[i].size());
    mix(&v.types[i], 1);
  }
  for (TokenId id : {v.bos, v.eos, v.eot, v.unk, v.pad}) mix_u32(static_cast<uint32_t>(id));
  return h;
}

// ---------------------------------------------------------------------------------------------
// Streaming

size_t utf8_sanitize_append(std::string_view in, std::string& out, bool final) {
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  size_t i = 0;
  const size_t n = in.size();
  while (i < n) {
    const uint8_t c = static_cast<uint8_t>(in[i]);
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte (RFC 3629)
    if (c >= 0xC2 && c <= 0xDF) {
      need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      need = 2;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      need = 3;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      out += kReplacement;
      ++i;
      continue;
    }
    size_t k = 1;
    bool bad = false;
    for (; k <= need && i + k < n; ++k) {
      const uint8_t d = static_cast<uint8_t>(in[i + k]);
      const bool ok = (k == 1) ? (d >= lo && d <= hi) : (d >= 0x80 && d <= 0xBF);
      if (!ok) {
        bad = true;
        break;
      }
    }
    if (bad) {  // maximal invalid subpart -> one U+FFFD
      out += kReplacement;
      i += k;
      continue;
    }
    if (k <= need) {  // ran out of input: incomplete but valid so far
      if (!final) return n - i;
      out += kReplacement;
      return 0;
    }
    out.append(in.substr(i, need + 1));
    i += need + 1;
  }
  return 0;
}

StreamDecoder::StreamDecoder(const Tokenizer& tok, bool special) : tok_(tok), special_(special) {}

std::string StreamDecoder::push(TokenId id) {
  pending_ += tok_.token_to_piece(id, special_);
  std::string out;
  const size_t held = utf8_sanitize_append(pending_, out, false);
  pending_.erase(0, pending_.size() - held);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  utf8_sanitize_append(pending_, out, true);
  pending_.clear();
  return out;
}

}  // namespace tandem
