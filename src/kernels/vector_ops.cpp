// The public f32 vector entry points and logits maths (include/tandem/vector_ops.h) over the
// kernels. logit_stats and argmax are the SIMD kernels (tested against kernels_ref); the rest is
// scalar on purpose: log_sum_exp's f64 sum is its point, and top_n is a selection, not a sweep.
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

std::vector<TokenLogProb> top_n(std::span<const float> logits, int n, double log_z) {
  std::vector<TokenLogProb> out;
  if (n <= 0 || logits.empty()) return out;
  n = std::min<int>(n, static_cast<int>(logits.size()));
  // One pass with the n best so far in a heap whose top is the worst of them (larger logit
  // first, the lower id on ties): no 1 MiB index array and no sort of the vocabulary per row.
  const auto better = [&](int a, int b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::vector<int> best;
  best.reserve(static_cast<size_t>(n));
  for (int i = 0; i < static_cast<int>(logits.size()); ++i) {
    if (static_cast<int>(best.size()) < n) {
      best.push_back(i);
      std::push_heap(best.begin(), best.end(), better);
    } else if (better(i, best.front())) {
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
