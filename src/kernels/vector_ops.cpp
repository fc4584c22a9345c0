// The public f32 vector entry points and logits maths (include/tandem/vector_ops.h) over the
// kernels. logit_stats and argmax are the SIMD kernels (tested against kernels_ref); the rest is
// scalar on purpose: log_sum_exp's f64 sum is its point, and top_n is a selection (its block
// prefilter is a plain loop the compiler vectorizes on every target).
#include "tandem/vector_ops.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/kernels.h"
#include "tandem/error.h"

namespace tandem {

float vector_dot(const float* a, const float* b, int64_t n) {
  return kernels::dot_f32(a, b, n);
}

LogitStats logit_stats(std::span<const float> logits) {
  return kernels::logit_stats(logits.data(), static_cast<int64_t>(logits.size()));
}

TokenId argmax(std::span<const float> logits) {
  return static_cast<TokenId>(kernels::argmax(logits.data(), static_cast<int64_t>(logits.size())));
}

double log_sum_exp(std::span<const float> logits) {
  float max = -INFINITY;
  for (float v : logits) max = std::max(max, v);
  // The difference is taken in f32, then widened: the bits teacher-forced scores have always had.
  double sum = 0;
  for (float v : logits) sum += std::exp(static_cast<double>(v - max));
  return max + std::log(sum);
}

float log_prob(std::span<const float> logits, TokenId token) {
  if (token < 0 || static_cast<size_t>(token) >= logits.size()) {
    throw Error("log_prob: token id " + std::to_string(token) + " outside a logits row of " +
                std::to_string(logits.size()));
  }
  return static_cast<float>(logits[token] - log_sum_exp(logits));
}

namespace {

// Logits are scanned for the top n in blocks of this many: a block none of whose logits beats
// the worst of the n best so far is passed over after one compare per logit, which the
// compiler vectorizes (x > t for every lane, OR-ed): on a 262k row only a few blocks reach the
// heap.
constexpr int kTopBlock = 64;

bool any_above(const float* x, int n, float t) {
  int any = 0;
  for (int j = 0; j < n; ++j) any |= x[j] > t ? 1 : 0;
  return any != 0;
}

}  // namespace

std::vector<TokenLogProb> top_n(std::span<const float> logits, int n, double log_z) {
  std::vector<TokenLogProb> out;
  if (n <= 0 || logits.empty()) return out;
  const int size = static_cast<int>(logits.size());
  n = std::min(n, size);
  // The n best so far in a heap whose top is the worst of them (larger logit first, the lower
  // id on ties): no 1 MiB index array and no sort of the vocabulary per row. A later logit
  // equal to the worst never enters (its id is higher), so "beats" is strictly greater.
  const auto better = [&](int a, int b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::vector<int> best(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) best[i] = i;
  std::make_heap(best.begin(), best.end(), better);
  for (int start = n; start < size; start += kTopBlock) {
    const int len = std::min(kTopBlock, size - start);
    if (!any_above(logits.data() + start, len, logits[best.front()])) continue;
    for (int i = start; i < start + len; ++i) {
      if (!better(i, best.front())) continue;
      std::pop_heap(best.begin(), best.end(), better);
      best.back() = i;
      std::push_heap(best.begin(), best.end(), better);
    }
  }
  std::sort(best.begin(), best.end(), better);
  out.reserve(best.size());
  for (int i : best) out.push_back({i, logits[i] - log_z});
  return out;
}

std::vector<TokenLogProb> top_n(std::span<const float> logits, int n) {
  return top_n(logits, n, logit_stats(logits).log_z);
}

}  // namespace tandem
