#include "eval/stats.h"

#include <algorithm>
#include <cmath>
#include <random>

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

GapRecovered gap_recovered(const std::vector<bool>& run, const std::vector<bool>& local,
                           const std::vector<bool>& cloud, int resamples, uint64_t seed) {
  const size_t n = run.size();
  if (local.size() != n || cloud.size() != n) throw Error("gap recovered over different items");
  // Per item, what it adds to run − local and to cloud − local: each in {-1, 0, 1}.
  auto recovered = [&](auto&& pick) {
    int64_t up = 0, gap = 0;
    for (size_t k = 0; k < n; ++k) {
      const size_t i = pick(k);
      up += static_cast<int>(run[i]) - static_cast<int>(local[i]);
      gap += static_cast<int>(cloud[i]) - static_cast<int>(local[i]);
    }
    return gap == 0 ? std::nan("") : static_cast<double>(up) / static_cast<double>(gap);
  };
  GapRecovered g;
  g.value = recovered([](size_t k) { return k; });
  if (n == 0 || std::isnan(g.value)) return g;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<size_t> item(0, n - 1);
  std::vector<double> draws;
  draws.reserve(static_cast<size_t>(resamples));
  for (int b = 0; b < resamples; ++b) {
    const double v = recovered([&](size_t) { return item(rng); });
    if (!std::isnan(v)) draws.push_back(v);
  }
  if (draws.empty()) return g;
  std::sort(draws.begin(), draws.end());
  auto at = [&](double q) {
    return draws[std::min(draws.size() - 1, static_cast<size_t>(q * (draws.size() - 1) + 0.5))];
  };
  g.ci95 = {at(0.025), at(0.975)};
  return g;
}

int64_t oracle_fixes(int64_t fixable, double budget_tokens) {
  if (budget_tokens <= 0) return 0;
  // One token an answer; a fractional budget buys only whole tokens.
  const auto whole = static_cast<int64_t>(std::floor(budget_tokens + 1e-9));
  return std::min(fixable, whole);
}

}  // namespace tandem::eval
