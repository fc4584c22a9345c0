#include "eval/stats.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"

namespace tandem::eval {

Interval wilson_interval(int64_t k, int64_t n, double z) {
  if (n <= 0) return {0, 1};
  const double p = static_cast<double>(k) / static_cast<double>(n);
  const double nn = static_cast<double>(n);
  const double denom = 1 + z * z / nn;
  const double centre = (p + z * z / (2 * nn)) / denom;
  const double half = z * std::sqrt(p * (1 - p) / nn + z * z / (4 * nn * nn)) / denom;
  return {std::max(0.0, centre - half), std::min(1.0, centre + half)};
}

double mcnemar_exact_p(int64_t b, int64_t c) {
  const int64_t n = b + c;
  if (n == 0) return 1;
  const int64_t k = std::min(b, c);
  // P(X <= k) for X ~ Binomial(n, 1/2), summed in log space (n can be in the thousands).
  double tail = 0;
  for (int64_t i = 0; i <= k; ++i) {
    const double log_term = std::lgamma(n + 1.0) - std::lgamma(i + 1.0) - std::lgamma(n - i + 1.0) -
                            static_cast<double>(n) * std::log(2.0);
    tail += std::exp(log_term);
  }
  return std::min(1.0, 2 * tail);
}

Paired compare_paired(const std::vector<bool>& a, const std::vector<bool>& b) {
  if (a.size() != b.size()) throw Error("paired comparison of runs over different items");
  Paired r;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] && b[i])
      ++r.both;
    else if (a[i])
      ++r.only_a;
    else if (b[i])
      ++r.only_b;
    else
      ++r.neither;
  }
  r.p = mcnemar_exact_p(r.only_a, r.only_b);
  return r;
}

}  // namespace tandem::eval
