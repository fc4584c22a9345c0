// tandem router: decides per token whether the device's small model ("local") or the cloud's
// large model ("cloud") produces it.
//
//   std::vector<float> logits(151936);  // the small model's logits row [n_vocab]
//   tandem::RouterSignal s = tandem::router_signal_from_logits(logits, /*position=*/42, 4);
//   tandem::Router router(tandem::parse_router_policy("confidence"));
//   tandem::RouteDecision d = router.decide(s);  // d.cloud, d.score
//   router.record(d.cloud, 1);                   // tokens the decision produced
//
// The router is a pure function of a narrow signal plus its own small state (a random stream,
// the target-rate controller); it knows nothing of the engine or the network.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace tandem {

// What the router sees at one position: the small model's next-token distribution, summarised.
struct RouterSignal {
  int position = 0;               // history length (tokens before the one being decided)
  std::vector<float> top_probs;   // most likely first, probabilities after softmax (k >= 2)
  float entropy = 0;              // nats, over the full distribution
  float margin = 0;               // top_probs[0] - top_probs[1]
  std::span<const float> hidden;  // final hidden state [n_embd], optional (empty when absent)
};

// The router's signal from a small model's logits row (softmax, top-k probabilities with k at
// least 2, entropy, margin), through the kernels' logits maths (tandem/vector_ops.h).
RouterSignal router_signal_from_logits(std::span<const float> logits, int position, int top_k);

enum class RouterPolicy { Confidence, Entropy, Margin, Random, Always, Never, Mlp };

class MlpRouterModel;  // a trained router (tandem/router_mlp.h)

// RouterConfig::rate_gain's default (docs/router.md: the realised share's window against the
// routed tokens' value).
inline constexpr double kDefaultRateGain = 0.2;

struct RouterConfig {
  RouterPolicy policy = RouterPolicy::Confidence;
  // Route to the cloud when score > threshold (threshold policies).
  double threshold = 0.5;
  // When set: ignore `threshold` and keep the cloud share of tokens near this rate (0..1).
  std::optional<double> target_rate;
  // random:RATE[:SEED]
  double random_rate = 0.1;
  uint64_t random_seed = 0x5eed;
  // Scores the target-rate controller keeps to estimate their distribution.
  int window = 256;
  // How hard the target-rate controller corrects the share it has realised: the quantile level
  // moves by this much per token of accumulated error (cloud tokens - rate * tokens). Higher holds
  // every window of 256 tokens closer to the rate, lower routes more strictly by score.
  double rate_gain = kDefaultRateGain;
  // Mlp: the trained model that scores each signal (its signals must carry the hidden state).
  std::shared_ptr<const MlpRouterModel> mlp;
  // Scores to start the target-rate controller's window with (e.g. a trained router's
  // calibration quantiles), so its first decisions already hold the target; empty: none.
  std::vector<float> prior_scores;
};

// Parses "confidence", "entropy", "margin", "random:RATE[:SEED]", "always", "never".
// Throws std::invalid_argument naming the policy and the choices.
RouterConfig parse_router_policy(const std::string& spec);
std::string router_policy_name(RouterPolicy policy);
// A sensible threshold when none is given (confidence 0.5, entropy 2 nats, margin 0.8).
double default_threshold(RouterPolicy policy);

struct RouteDecision {
  bool cloud = false;
  float score = 0;  // higher: more reason to ask the cloud
  // The threshold the score was held against (computed once per decision: a target-rate
  // controller's quantile over its window). The random policy: 1 - its rate.
  double threshold = 0;
};

// Keeps the realised cloud share of tokens near a target rate R: the threshold is the (1-R)
// quantile of the last `window` scores, with the quantile level nudged by an integral term on
// the realised share (so a route span > 1 token or a drifting score distribution still lands on
// R in the long run).
class TargetRateController {
 public:
  TargetRateController(double target_rate, int window, double gain = kDefaultRateGain);
  // Threshold for the next decision (scores above it go to the cloud).
  double threshold() const;
  void observe_score(double score);
  // Fills the window with scores from elsewhere (a calibration table) before any are observed.
  void seed_scores(std::span<const float> scores);
  // After a decision: how many tokens it produced and whether they came from the cloud.
  void observe_outcome(bool cloud, int n_tokens);
  double realised_share() const;
  double target() const { return target_; }

  // What the controller has learned (its window of scores and its integral): what a snapshot
  // needs to put it back, nothing of its settings or scratch. The window is a ring [window].
  struct State {
    std::vector<double> scores;  // at most window, oldest at `next` once full
    size_t next = 0;             // where the next score goes once the ring is full
    double integral = 0;         // accumulated (cloud indicator - target), per token
    uint64_t tokens = 0, cloud_tokens = 0;
  };
  const State& state() const { return state_; }
  void restore(const State& state) { state_ = state; }

 private:
  double level() const;
  double target_;
  size_t window_;
  double gain_;
  State state_;
  mutable std::vector<double> sorted_;  // scratch for the quantile
};

class Router {
 public:
  explicit Router(const RouterConfig& config);
  const RouterConfig& config() const { return config_; }
  // Score of a signal under the policy (no state change).
  float score(const RouterSignal& signal) const;
  RouteDecision decide(const RouterSignal& signal);
  // The decision produced n_tokens tokens, from the cloud or (fallback) locally.
  void record(bool cloud, int n_tokens);
  double threshold() const;

  // What decisions change (the controller's window and integral, the random stream): a
  // snapshot a decoder keeps per in-flight consultation or held token and puts back when the
  // cloud's answer differs from its guess. The config stays with the router.
  struct State {
    TargetRateController::State controller;  // empty without a target rate
    uint64_t rng = 0;
  };
  State state() const;
  void restore(const State& state);

 private:
  RouterConfig config_;
  std::optional<TargetRateController> controller_;
  uint64_t rng_state_;
};

// The decisions a device's router takes over a stream of signals, in order, each recorded as one
// token before the next (the cloud's when routed): the offline replay that scores a policy on
// teacher-forced text exactly as `tandem run` would decide on the same stream.
std::vector<RouteDecision> replay_decisions(const RouterConfig& config,
                                            std::span<const RouterSignal> signals);

}  // namespace tandem
