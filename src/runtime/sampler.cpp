#include <algorithm>
#include <cassert>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/splitmix.h"
#include "kernels/kernels.h"
#include "tandem/engine.h"

namespace tandem {

namespace {

using Candidate = std::pair<float, TokenId>;

// The sampler's order: higher logit first, then lower id. A strict total order (logits are
// never NaN), so every correct sort of a set gives the same sequence.
bool before(const Candidate& a, const Candidate& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

// A radix key whose ascending order is descending logit; -0 and +0 share one key, as they
// compare equal.
uint32_t descending_key(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7FFFFFFFu) == 0) u = 0;
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return ~u;
}

// Sorts v[0, n) into the sampler's order. The radix sort is stable, so when v is in ascending
// id order (the caller's promise) equal logits stay in id order, as `before` wants. O(n): three
// passes of 11 bits, each skipped when every key shares its digit.
void sort_in_order(Candidate* v, size_t n, std::vector<Candidate>& buf) {
  if (n < 256) {
    std::sort(v, v + n, before);
    return;
  }
  constexpr int kBits = 11, kBuckets = 1 << kBits, kPasses = 3;
  std::vector<uint32_t> count(kPasses * kBuckets, 0);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t k = descending_key(v[i].first);
    for (int p = 0; p < kPasses; ++p) ++count[p * kBuckets + ((k >> (p * kBits)) & (kBuckets - 1))];
  }
  buf.resize(std::max(buf.size(), n));
  Candidate* src = v;
  Candidate* dst = buf.data();
  for (int p = 0; p < kPasses; ++p) {
    uint32_t* c = count.data() + p * kBuckets;
    if (*std::max_element(c, c + kBuckets) == n) continue;  // one digit for all: nothing moves
    uint32_t sum = 0;
    for (int b = 0; b < kBuckets; ++b) sum += std::exchange(c[b], sum);
    for (size_t i = 0; i < n; ++i)
      dst[c[(descending_key(src[i].first) >> (p * kBits)) & (kBuckets - 1)]++] = src[i];
    std::swap(src, dst);
  }
  if (src != v) std::copy(src, src + n, v);
}

// The survivors of the filters so far: the first size() candidates of the full order. Only the
// part a step reads is put in order: [0, ordered_) is in the full order; [ordered_, size_) holds
// the other survivors, all after the ordered ones, in ascending id order (so that a stable sort
// of any part of it breaks ties by id).
class Ranking {
 public:
  // cand: every candidate, in id order.
  Ranking(std::vector<Candidate>& cand, std::vector<Candidate>& buf)
      : v_(cand), buf_(buf), size_(cand.size()) {}

  size_t size() const { return size_; }
  size_t ordered() const { return ordered_; }

  // The i-th survivor in the full order. Walking past the ordered part orders all the rest (a
  // draw gets there with probability ~1e-16, or when logits are infinite).
  const Candidate& at(size_t i) {
    if (i >= ordered_) order_while([](const Candidate&) { return true; });
    return v_[i];
  }

  // The best survivor (orders the ones tied with it if nothing is ordered yet).
  const Candidate& first() {
    if (ordered_ == 0) {
      const float mx = max_logit();
      order_while([&](const Candidate& c) { return c.first >= mx; });
    }
    return at(0);
  }

  // top-k. A k small next to the vocabulary: std::partial_sort, as the full-sort algorithm did
  // (about one comparison per candidate). A larger one, where partial_sort's heap would cost
  // n log k: the k-th candidate by nth_element on a copy, then the k best kept in id order, to
  // be ordered later only as far as a step needs.
  void keep_best(size_t k) {
    if (k <= size_ / 32) {
      std::partial_sort(v_.begin(), v_.begin() + k, v_.begin() + size_, before);
      ordered_ = size_ = k;
      return;
    }
    buf_.assign(v_.begin(), v_.begin() + size_);
    std::nth_element(buf_.begin(), buf_.begin() + (k - 1), buf_.end(), before);
    const Candidate kth = buf_[k - 1];
    split_off([&](const Candidate& c) { return !before(kth, c); });
    size_ = k;
  }

  // Orders the unordered survivors for which pred holds. pred must hold on a prefix of the full
  // order (e.g. "logit >= t"), so that they are exactly the next ones in it.
  template <typename Pred>
  void order_while(Pred pred) {
    const size_t n = split_off(pred);
    sort_in_order(v_.data() + ordered_, n, buf_);
    ordered_ += n;
    assert(ordered_ <= size_);
  }

  void truncate(size_t n) {
    assert(n >= 1 && "every filter keeps at least the best candidate");
    size_ = std::min(size_, n);
    ordered_ = std::min(ordered_, size_);
  }

  float max_logit() const {
    if (ordered_ > 0) return v_[0].first;
    float mx = v_[0].first;
    for (size_t i = 1; i < size_; ++i) mx = std::max(mx, v_[i].first);
    return mx;
  }

 private:
  // Moves the unordered survivors for which pred holds to the front of the unordered part, both
  // groups keeping id order; returns how many held.
  template <typename Pred>
  size_t split_off(Pred pred) {
    buf_.clear();
    size_t kept = ordered_;
    for (size_t i = ordered_; i < size_; ++i) {
      if (pred(v_[i]))
        v_[kept++] = v_[i];
      else
        buf_.push_back(v_[i]);
    }
    std::copy(buf_.begin(), buf_.end(), v_.begin() + kept);
    return kept - ordered_;
  }

  std::vector<Candidate>& v_;
  std::vector<Candidate>& buf_;
  size_t size_;
  size_t ordered_ = 0;
};

// The survivors' probabilities exp((logit - max) / temp) / sum, exactly as the full-sort
// algorithm computed them: the sum in order, largest term first. That order cannot be skipped
// (rounding depends on it), but the tail can: the first term is exp(0) = 1, and a term below
// 2^-53 added to a sum >= 1 is rounded away. So only the survivors with
// (logit - max) / temp >= -37.5 (exp(-37.5) = 5.2e-17, half of 2^-53, a margin far above exp's
// error) are ordered and summed, and the sum is the same double, bit for bit. How many that is
// depends on the logits and the temperature: at temperature 1 a language model's whole
// vocabulary is usually within 37.5 of its best logit, at 0.3 a few thousand tokens are.
class Normalizer {
 public:
  Normalizer(Ranking& ranked, float temp) : temp_(temp), mx_(ranked.first().first) {
    ranked.order_while([&](const Candidate& c) { return !(exponent(c) < -37.5); });
    for (size_t i = 0; i < ranked.ordered(); ++i) sum_ += std::exp(exponent(ranked.at(i)));
  }
  double prob(const Candidate& c) const { return std::exp(exponent(c)) / sum_; }

 private:
  double exponent(const Candidate& c) const { return (c.first - mx_) / temp_; }
  float temp_;
  double mx_;
  double sum_ = 0;
};

}  // namespace

Sampler::Sampler(const SamplingParams& params) : params_(params) {
  if (params.top_p < 0 || params.min_p < 0 || params.repeat_penalty <= 0 ||
      params.repeat_last_n < 0) {
    throw Error(
        "sampling parameters out of range: top_p and min_p must be >= 0, "
        "repeat_penalty > 0, repeat_last_n >= 0");
  }
  reset();
}

void Sampler::reset() {
  history_.clear();
  rng_state_ = params_.seed == kRandomSeed
                   ? static_cast<uint64_t>(
                         std::chrono::high_resolution_clock::now().time_since_epoch().count())
                   : params_.seed;
}

void Sampler::accept(TokenId token) {
  history_.push_back(token);
  const size_t keep = static_cast<size_t>(std::max(params_.repeat_last_n, 0));
  if (history_.size() > 4 * keep + 64) {
    history_.erase(history_.begin(), history_.end() - static_cast<std::ptrdiff_t>(keep));
  }
}

bool Sampler::greedy() const {
  return params_.temp <= 0 && (params_.repeat_penalty == 1.0f || params_.repeat_last_n <= 0);
}

TokenId Sampler::sample(std::span<const float> logits) {
  const int n = static_cast<int>(logits.size());
  if (n == 0) throw Error("sample: empty logits");
  // Greedy without penalties: the first largest logit, without building the candidate list (a
  // server samples hundreds of rows of 262k logits per batch on one thread).
  if (greedy()) return static_cast<TokenId>(kernels::argmax(logits.data(), n));
  cand_.resize(n);
  for (int i = 0; i < n; ++i) cand_[i] = {logits[i], i};

  // Repetition penalty over the last repeat_last_n accepted tokens (llama.cpp semantics:
  // positive logits are divided, negative ones multiplied).
  if (params_.repeat_penalty != 1.0f && params_.repeat_last_n > 0) {
    const size_t start = history_.size() > static_cast<size_t>(params_.repeat_last_n)
                             ? history_.size() - params_.repeat_last_n
                             : 0;
    std::vector<TokenId> seen(history_.begin() + start, history_.end());
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (TokenId t : seen) {
      if (t < 0 || t >= n) continue;
      float& l = cand_[t].first;
      l = l > 0 ? l / params_.repeat_penalty : l * params_.repeat_penalty;
    }
  }

  if (params_.temp <= 0) {
    return std::min_element(cand_.begin(), cand_.end(), before)->second;
  }

  // The steps of the full-sort algorithm (top-k, top-p at temperature 1, min-p, then a draw at
  // the temperature), each on as much of the order as it can see.
  thread_local std::vector<Candidate> scratch;
  Ranking ranked(cand_, scratch);
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < cand_.size())
    ranked.keep_best(params_.top_k);

  if (params_.top_p < 1.0f) {
    const Normalizer norm(ranked, 1.0f);
    double cum = 0;
    size_t cut = ranked.size();
    for (size_t i = 0; i < ranked.size(); ++i) {
      cum += norm.prob(ranked.at(i));
      if (cum >= params_.top_p) {
        cut = i + 1;
        break;
      }
    }
    ranked.truncate(std::max<size_t>(cut, 1));
  }
  if (params_.min_p > 0.0f) {
    const float threshold = ranked.first().first + std::log(params_.min_p);
    ranked.order_while([&](const Candidate& c) { return c.first >= threshold; });
    // Every survivor at or above the threshold is ordered now, so the cut is within that part.
    size_t cut = 1;
    while (cut < ranked.ordered() && ranked.at(cut).first >= threshold) ++cut;
    ranked.truncate(cut);
  }

  const Normalizer norm(ranked, params_.temp);
  const double r = unit_interval(splitmix64(rng_state_));
  double cum = 0;
  for (size_t i = 0; i < ranked.size(); ++i) {
    cum += norm.prob(ranked.at(i));
    if (r < cum) return ranked.at(i).second;
  }
  return ranked.at(ranked.size() - 1).second;
}

}  // namespace tandem
