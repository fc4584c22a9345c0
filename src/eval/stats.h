// Statistics for comparing modes on the same items.
#pragma once

#include <cstdint>
#include <vector>

namespace tandem::eval {

struct Interval {
  double low = 0, high = 0;
};

// Wilson score interval for a proportion k/n at 95% (z = 1.959964); {0, 1} when n = 0.
Interval wilson_interval(int64_t k, int64_t n, double z = 1.959963984540054);

// Exact McNemar test (two-sided binomial test on the discordant pairs): b items right only in
// the first mode, c right only in the second. Returns the p-value (1 when b + c = 0).
double mcnemar_exact_p(int64_t b, int64_t c);

// Paired comparison of two modes' per-item correctness (same items, same order).
struct Paired {
  int64_t both = 0, only_a = 0, only_b = 0, neither = 0;
  double p = 1;
};
Paired compare_paired(const std::vector<bool>& a, const std::vector<bool>& b);

}  // namespace tandem::eval
