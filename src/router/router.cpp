// Router policies and the target-rate controller (see include/tandem/router.h).
#include "tandem/router.h"

#include "common/splitmix.h"
#include "tandem/router_mlp.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace tandem {
namespace {

double parse_number(const std::string& text, const std::string& what) {
  try {
    size_t used = 0;
    const double v = std::stod(text, &used);
    if (used != text.size()) throw std::invalid_argument(text);
    return v;
  } catch (const std::exception&) {
    throw std::invalid_argument("router policy: " + what + " '" + text + "' is not a number");
  }
}

// The integral term's bound, in tokens of accumulated share error.
constexpr double kIntegralLimit = 250;

}  // namespace

std::string router_policy_name(RouterPolicy policy) {
  switch (policy) {
    case RouterPolicy::Confidence:
      return "confidence";
    case RouterPolicy::Entropy:
      return "entropy";
    case RouterPolicy::Margin:
      return "margin";
    case RouterPolicy::Random:
      return "random";
    case RouterPolicy::Always:
      return "always";
    case RouterPolicy::Never:
      return "never";
    case RouterPolicy::Mlp:
      return "mlp";
  }
  return "?";
}

double default_threshold(RouterPolicy policy) {
  switch (policy) {
    case RouterPolicy::Confidence:
      return 0.5;
    case RouterPolicy::Entropy:
      return 2.0;
    case RouterPolicy::Margin:
      return 0.8;
    default:
      return 0.5;
  }
}

RouterConfig parse_router_policy(const std::string& spec) {
  RouterConfig c;
  const std::string name = spec.substr(0, spec.find(':'));
  const bool has_args = spec.find(':') != std::string::npos;
  if (name == "random") {
    c.policy = RouterPolicy::Random;
    if (!has_args)
      throw std::invalid_argument("router policy 'random' needs a rate: random:RATE[:SEED]");
    const std::string args = spec.substr(name.size() + 1);
    const size_t colon = args.find(':');
    c.random_rate = parse_number(args.substr(0, colon), "random rate");
    if (!(c.random_rate >= 0 && c.random_rate <= 1)) {
      throw std::invalid_argument("router policy: random rate " + args.substr(0, colon) +
                                  " is outside [0, 1]");
    }
    if (colon != std::string::npos) {
      const std::string seed = args.substr(colon + 1);
      if (seed.empty() || seed.find_first_not_of("0123456789") != std::string::npos) {
        throw std::invalid_argument("router policy: random seed '" + seed +
                                    "' is not a non-negative integer");
      }
      c.random_seed = std::stoull(seed);
    }
    return c;
  }
  if (has_args) throw std::invalid_argument("router policy '" + name + "' takes no arguments");
  if (name == "confidence")
    c.policy = RouterPolicy::Confidence;
  else if (name == "entropy")
    c.policy = RouterPolicy::Entropy;
  else if (name == "margin")
    c.policy = RouterPolicy::Margin;
  else if (name == "always")
    c.policy = RouterPolicy::Always;
  else if (name == "never")
    c.policy = RouterPolicy::Never;
  else {
    throw std::invalid_argument("unknown router policy '" + spec +
                                "' (choices: confidence, entropy, margin, random:RATE[:SEED], "
                                "always, never)");
  }
  c.threshold = default_threshold(c.policy);
  return c;
}

// ---- TargetRateController ----

TargetRateController::TargetRateController(double target_rate, int window, double gain)
    : target_(target_rate), window_(static_cast<size_t>(std::max(window, 1))), gain_(gain) {
  if (!(target_rate >= 0 && target_rate <= 1)) {
    throw std::invalid_argument("target rate " + std::to_string(target_rate) +
                                " is outside [0, 1]");
  }
  if (!(gain >= 0 && gain <= 1)) {
    throw std::invalid_argument("target-rate gain " + std::to_string(gain) + " is outside [0, 1]");
  }
}

double TargetRateController::level() const {
  return std::clamp(1.0 - target_ + gain_ * state_.integral, 0.0, 1.0);
}

double TargetRateController::threshold() const {
  if (target_ <= 0) return std::numeric_limits<double>::infinity();
  if (target_ >= 1) return -std::numeric_limits<double>::infinity();
  if (state_.scores.empty()) return std::numeric_limits<double>::infinity();
  std::vector<double>& sorted = sorted_;
  sorted.assign(state_.scores.begin(), state_.scores.end());  // the ring's order does not matter
  // Scores strictly above the level-quantile go to the cloud: with n sorted scores, the one at
  // index ceil(level * n) - 1 leaves a share (1 - level) above it.
  const double n = static_cast<double>(sorted.size());
  const long idx = std::clamp<long>(static_cast<long>(std::ceil(level() * n)) - 1, -1,
                                    static_cast<long>(sorted.size()) - 1);
  if (idx < 0) return -std::numeric_limits<double>::infinity();
  std::nth_element(sorted.begin(), sorted.begin() + idx, sorted.end());
  return sorted[idx];
}

void TargetRateController::observe_score(double score) {
  std::vector<double>& ring = state_.scores;
  if (ring.size() < window_) {
    ring.push_back(score);
    return;
  }
  ring[state_.next] = score;  // the oldest goes
  state_.next = (state_.next + 1) % window_;
}

void TargetRateController::seed_scores(std::span<const float> scores) {
  for (float s : scores) observe_score(s);
}

void TargetRateController::observe_outcome(bool cloud, int n_tokens) {
  if (n_tokens <= 0) return;
  state_.tokens += n_tokens;
  if (cloud) state_.cloud_tokens += n_tokens;
  state_.integral += n_tokens * ((cloud ? 1.0 : 0.0) - target_);
  state_.integral = std::clamp(state_.integral, -kIntegralLimit, kIntegralLimit);
}

double TargetRateController::realised_share() const {
  return state_.tokens ? static_cast<double>(state_.cloud_tokens) / state_.tokens : 0.0;
}

// ---- Router ----

Router::Router(const RouterConfig& config) : config_(config), rng_state_(config.random_seed) {
  if (config.target_rate && config.policy != RouterPolicy::Always &&
      config.policy != RouterPolicy::Never && config.policy != RouterPolicy::Random) {
    controller_.emplace(*config.target_rate, config.window, config.rate_gain);
    controller_->seed_scores(config.prior_scores);
  }
  if (config.policy == RouterPolicy::Mlp && !config.mlp) {
    throw std::invalid_argument("router policy 'mlp' needs a trained router (--router R.gguf)");
  }
}

float Router::score(const RouterSignal& s) const {
  switch (config_.policy) {
    case RouterPolicy::Confidence:
      return s.top_probs.empty() ? 1.0f : 1.0f - s.top_probs[0];
    case RouterPolicy::Entropy:
      return s.entropy;
    case RouterPolicy::Margin:
      return 1.0f - s.margin;
    case RouterPolicy::Always:
      return 1.0f;
    case RouterPolicy::Never:
      return 0.0f;
    case RouterPolicy::Random:
      return 0.0f;  // drawn in decide()
    case RouterPolicy::Mlp:
      return config_.mlp->score(s);
  }
  return 0.0f;
}

double Router::threshold() const {
  if (controller_) return controller_->threshold();
  if (config_.policy == RouterPolicy::Random) return 1.0 - config_.random_rate;
  return config_.threshold;
}

RouteDecision Router::decide(const RouterSignal& signal) {
  RouteDecision d;
  d.threshold = threshold();  // once: a target-rate controller's quantile is not free
  switch (config_.policy) {
    case RouterPolicy::Always:
      d.cloud = true;
      d.score = 1.0f;
      return d;
    case RouterPolicy::Never:
      return d;
    case RouterPolicy::Random: {
      // score = 1 - u with u uniform in [0, 1): the cloud when u < rate.
      const double u = unit_interval(splitmix64(rng_state_));
      d.score = static_cast<float>(1.0 - u);
      d.cloud = u < config_.random_rate;
      return d;
    }
    default:
      break;
  }
  d.score = score(signal);
  d.cloud = d.score > d.threshold;
  if (controller_) controller_->observe_score(d.score);
  return d;
}

void Router::record(bool cloud, int n_tokens) {
  if (controller_) controller_->observe_outcome(cloud, n_tokens);
}

Router::State Router::state() const {
  State s;
  if (controller_) s.controller = controller_->state();
  s.rng = rng_state_;
  return s;
}

void Router::restore(const State& state) {
  if (controller_) controller_->restore(state.controller);
  rng_state_ = state.rng;
}

std::vector<RouteDecision> replay_decisions(const RouterConfig& config,
                                            std::span<const RouterSignal> signals) {
  Router router(config);
  std::vector<RouteDecision> out;
  out.reserve(signals.size());
  for (const RouterSignal& s : signals) {
    out.push_back(router.decide(s));
    router.record(out.back().cloud, 1);
  }
  return out;
}

}  // namespace tandem
