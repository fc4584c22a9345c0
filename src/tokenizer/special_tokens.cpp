// Special tokens (docs/tokenizer.md): the trie over their texts and the one-pass partition of
// a text into special tokens and the raw runs between them.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "common/error.h"
#include "tokenizer/tokenizer_impl.h"

namespace tandem {

namespace {

bool c_isspace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
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

}  // namespace tandem
