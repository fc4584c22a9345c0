// Turn-taking between clients (keys) at the server's queues (docs/server.md, "Fair shares
// between keys"). A key is a credential's name ("" for the one anonymous client of an open
// server). Every queue that more than one key's work shares serves the keys in turn, by name,
// and each key's own work in arrival order, so one key's load raises another key's wait by a
// bounded factor (the number of keys with work), never by the length of its queue.
//
// Header-only and free of server state, so that the rules are unit-tested as they are
// (tests/server/test_fair_share.cpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace tandem::server {

// The key whose turn follows `last`'s among `keys` (sorted, distinct, non-empty): the first one
// after it by name, wrapping around. With `has_last` false the turn starts at the first key.
inline const std::string& next_turn(const std::vector<std::string>& keys, const std::string& last,
                                    bool has_last) {
  if (!has_last) return keys.front();
  for (const std::string& k : keys) {
    if (k > last) return k;
  }
  return keys.front();
}

// The order in which one batch's prefill budget goes to jobs: item_keys[i] is the key of job i
// (jobs in arrival order). Keys take turns being first: the key after `last_first` goes first
// and its jobs, in arrival order, take what they can; then the next key's, and so on. Returns
// the job indices in that order and sets *first to the key that went first (keep it for the
// next batch). Example: keys {A, A, B, A, B}, last_first A -> {2, 4, 0, 1, 3}, *first = B.
inline std::vector<size_t> turn_order(const std::vector<std::string>& item_keys,
                                      const std::string& last_first, bool has_last,
                                      std::string* first) {
  std::map<std::string, std::vector<size_t>> lanes;  // key -> its jobs in arrival order
  for (size_t i = 0; i < item_keys.size(); ++i) lanes[item_keys[i]].push_back(i);
  std::vector<size_t> out;
  if (lanes.empty()) return out;
  std::vector<std::string> keys;
  for (const auto& kv : lanes) keys.push_back(kv.first);
  *first = next_turn(keys, last_first, has_last);
  auto start = lanes.find(*first);
  for (auto it = start; it != lanes.end(); ++it)
    out.insert(out.end(), it->second.begin(), it->second.end());
  for (auto it = lanes.begin(); it != start; ++it)
    out.insert(out.end(), it->second.begin(), it->second.end());
  return out;
}

// Which waiting job gets a freed shared resource (a stateless slot): the oldest job of the key
// that holds the fewest of it now (`held`: key -> count); among keys holding equally few, the
// next in turn after `last`, the key served last (by name, wrapping; see next_turn). A slot a
// key's job just gave back thus goes to another key that waits, not to the same key's next job.
// item_keys[i] is the key of waiting job i, in arrival order (must not be empty); returns i.
inline size_t least_served(const std::vector<std::string>& item_keys,
                           const std::map<std::string, int>& held, const std::string& last,
                           bool has_last) {
  auto held_by = [&](const std::string& k) {
    auto it = held.find(k);
    return it == held.end() ? 0 : it->second;
  };
  int fewest = -1;
  for (const std::string& k : item_keys) {
    if (fewest < 0 || held_by(k) < fewest) fewest = held_by(k);
  }
  std::vector<std::string> keys;  // the keys holding `fewest`, sorted, distinct
  for (const std::string& k : item_keys) {
    if (held_by(k) == fewest) keys.push_back(k);
  }
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  const std::string& turn = next_turn(keys, last, has_last);
  size_t i = 0;
  while (item_keys[i] != turn) ++i;
  return i;
}

// A FIFO per key, popped round-robin: pop() takes the oldest item of the key whose turn it is
// (the next key by name after the one served last that has items). With K keys holding items, a
// key's oldest item is served within K pops, whatever the other keys hold.
template <class T>
class FairQueue {
 public:
  void push(const std::string& key, T item) {
    lanes_[key].push_back(std::move(item));
    ++size_;
  }
  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  size_t size_of(const std::string& key) const {
    auto it = lanes_.find(key);
    return it == lanes_.end() ? 0 : it->second.size();
  }
  // The next item in turn; the queue must not be empty.
  T pop() {
    auto it = served_ ? lanes_.upper_bound(last_) : lanes_.begin();
    if (it == lanes_.end()) it = lanes_.begin();
    T item = std::move(it->second.front());
    it->second.pop_front();
    last_ = it->first;
    served_ = true;
    if (it->second.empty()) lanes_.erase(it);  // only keys with items keep a lane
    --size_;
    return item;
  }
  void clear() {
    lanes_.clear();
    size_ = 0;
  }

 private:
  std::map<std::string, std::deque<T>> lanes_;  // key -> its items in arrival order
  std::string last_;                            // the key served last
  bool served_ = false;
  size_t size_ = 0;
};

}  // namespace tandem::server
