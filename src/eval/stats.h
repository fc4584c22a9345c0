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

// The share of the local→cloud accuracy gap a run recovers, (acc_run − acc_local) /
// (acc_cloud − acc_local), with a 95% paired bootstrap interval (items resampled together in all
// three runs, `resamples` times from `seed`; resamples whose gap is zero are skipped). All three
// vectors hold the same items in the same order.
struct GapRecovered {
  double value = 0;
  Interval ci95;
};
GapRecovered gap_recovered(const std::vector<bool>& run, const std::vector<bool>& local,
                           const std::vector<bool>& cloud, int resamples = 2000, uint64_t seed = 1);

// The oracle router at a budget of cloud tokens: it knows which answers some cloud token turns
// from wrong to right (`fixable` of them) and routes one token in each, the fewest any route
// pays for a fix, while the budget lasts. Returns how many it fixes.
int64_t oracle_fixes(int64_t fixable, double budget_tokens);

}  // namespace tandem::eval
