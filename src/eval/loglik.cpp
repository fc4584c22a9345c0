#include "tandem/eval_loglik.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace tandem::eval {

double mean_nll_edge(const std::vector<Position>& p) {
  double s = 0;
  for (const auto& x : p) s -= x.edge_logprob;
  return p.empty() ? 0 : s / static_cast<double>(p.size());
}

double mean_nll_cloud(const std::vector<Position>& p) {
  double s = 0;
  for (const auto& x : p) s -= x.cloud_logprob;
  return p.empty() ? 0 : s / static_cast<double>(p.size());
}

RoutedLoglik routed(const std::vector<Position>& p, const std::vector<bool>& to_cloud) {
  RoutedLoglik r;
  if (p.empty()) return r;
  double s = 0;
  size_t n_cloud = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const bool c = i < to_cloud.size() && to_cloud[i];
    s -= c ? p[i].cloud_logprob : p[i].edge_logprob;
    n_cloud += c;
  }
  r.nll = s / static_cast<double>(p.size());
  r.share = static_cast<double>(n_cloud) / static_cast<double>(p.size());
  const double edge = mean_nll_edge(p), cloud = mean_nll_cloud(p);
  r.gap_recovered = std::abs(edge - cloud) > 1e-12 ? (edge - r.nll) / (edge - cloud) : 0;
  return r;
}

namespace {

// Routes the top round(share × n) positions by key (ties broken by position, earlier first).
RoutedLoglik top_by(const std::vector<Position>& p, double share, float (*key)(const Position&)) {
  const size_t k = static_cast<size_t>(std::llround(std::clamp(share, 0.0, 1.0) * p.size()));
  std::vector<size_t> order(p.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return key(p[a]) > key(p[b]); });
  std::vector<bool> flags(p.size(), false);
  for (size_t i = 0; i < k; ++i) flags[order[i]] = true;
  return routed(p, flags);
}

}  // namespace

RoutedLoglik oracle(const std::vector<Position>& p, double share) {
  return top_by(p, share, [](const Position& x) { return x.cloud_logprob - x.edge_logprob; });
}

RoutedLoglik by_score_quantile(const std::vector<Position>& p, double share) {
  return top_by(p, share, [](const Position& x) { return x.score; });
}

WindowShares window_shares(const std::vector<bool>& flags, double rate, size_t window) {
  WindowShares w;
  if (flags.size() < window) return w;
  size_t cloud = 0, n = 0, within = 0;
  for (size_t i = 0; i < window; ++i) cloud += flags[i];
  for (size_t end = window;; ++end) {
    const double dev = std::abs(static_cast<double>(cloud) / window - rate);
    w.max_deviation = std::max(w.max_deviation, dev);
    within += dev <= 0.01 + 1e-9;
    ++n;
    if (end == flags.size()) break;
    cloud += flags[end];
    cloud -= flags[end - window];
  }
  w.within_1pt = static_cast<double>(within) / n;
  return w;
}

}  // namespace tandem::eval
