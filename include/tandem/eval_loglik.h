// Teacher-forced log-likelihood under routing: at each scored position of a text the router
// (seeing only the edge model's distribution) picks whose probability of the true next token
// counts, the edge's or the cloud's. Because the text is fixed, a routing decision does not change
// later contexts, so the routed negative log-likelihood is the mean of the chosen log-probs, and
// the gap recovered is (NLL_edge − NLL_route) / (NLL_edge − NLL_cloud).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace tandem::eval {

// One scored position.
struct Position {
  float edge_logprob = 0;   // log p_edge(true token)
  float cloud_logprob = 0;  // log p_cloud(true token)
  float score = 0;          // the router's score for this position (higher: more reason to ask)
};

struct RoutedLoglik {
  double share = 0;          // fraction of positions routed to the cloud
  double nll = 0;            // mean negative log-likelihood, nats per token
  double gap_recovered = 0;  // (nll_edge - nll) / (nll_edge - nll_cloud)
};

double mean_nll_edge(const std::vector<Position>& p);
double mean_nll_cloud(const std::vector<Position>& p);

// Routes the positions whose flag is set.
RoutedLoglik routed(const std::vector<Position>& p, const std::vector<bool>& to_cloud);

// The ceiling at a share: route the round(share × n) positions where the cloud's log-probability
// of the true token gains most over the edge's.
RoutedLoglik oracle(const std::vector<Position>& p, double share);

// Routes the positions whose score is above the (1 − share) quantile of all scores (an offline
// threshold set with hindsight of the score distribution).
RoutedLoglik by_score_quantile(const std::vector<Position>& p, double share);

// The realised share over every run of kShareWindow consecutive decisions, which the target-rate
// controller is to hold within one point of its rate.
inline constexpr size_t kShareWindow = 256;
struct WindowShares {
  double within_1pt = 0;     // fraction of the windows within ±0.01 of the rate
  double max_deviation = 0;  // the largest |window share - rate|
};
// Over every window of `window` consecutive flags (none when there are fewer flags).
WindowShares window_shares(const std::vector<bool>& flags, double rate, size_t window);

}  // namespace tandem::eval
