// resolve_routing: a RoutingSpec into the decoder's router, for every front end alike
// (tandem/routing.h has the rules). Messages name the setting in words, not as a flag: the
// command line and the browser view say the same.
#include "tandem/routing.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>

#include "router/router_file.h"
#include "tandem/engine.h"
#include "tandem/error.h"
#include "tandem/router_mlp.h"

namespace tandem {
namespace {

// "random", "random:RATE" or "random:RATE:SEED".
bool is_random(const std::string& policy) {
  return policy.rfind("random", 0) == 0;
}
bool random_has_rate(const std::string& policy) {
  return policy.find(':') != std::string::npos;
}

std::string number_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// The policy's config; the random policy without a rate of its own takes the target rate.
RouterConfig parse_policy(const RoutingSpec& spec) {
  std::string name = spec.policy.empty() ? "confidence" : spec.policy;
  if (is_random(name) && !random_has_rate(name) && spec.target_rate) {
    name = "random:" + number_text(*spec.target_rate);
  }
  try {
    return parse_router_policy(name);
  } catch (const std::invalid_argument& e) {
    throw Error(e.what());
  }
}

void check_random(const RoutingSpec& spec) {
  if (spec.threshold) {
    throw Error(
        "a threshold does not apply to the random policy: it routes a share "
        "(random:RATE or a target rate)");
  }
  const bool own_rate = random_has_rate(spec.policy);
  if (own_rate && spec.target_rate) {
    throw Error("the random policy's rate is given twice (" + spec.policy +
                " and a target rate of " + number_text(*spec.target_rate) + "): give one");
  }
  if (!own_rate && !spec.target_rate) {
    throw Error("the random policy needs a rate: random:RATE or a target rate");
  }
}

void check_threshold(const RoutingSpec& spec, RouterPolicy policy) {
  if (!spec.threshold) return;
  if (policy == RouterPolicy::Mlp && !std::isfinite(*spec.threshold)) {
    throw Error("threshold " + number_text(*spec.threshold) +
                " is not a finite number (a trained router's score is a logit)");
  }
  const auto [lo, hi] = threshold_range(policy);
  if (!(*spec.threshold >= lo && *spec.threshold <= hi)) {
    throw Error("threshold " + number_text(*spec.threshold) + " is outside [" + number_text(lo) +
                ", " + number_text(hi) + "] for " +
                (policy == RouterPolicy::Mlp ? std::string("a trained router")
                                             : "the " + router_policy_name(policy) + " policy"));
  }
}

// A trained router into the config: its threshold (given, else its calibration's for a 7%
// share) and, with a target rate, the controller's window seeded from its calibration.
TrainedRouterInfo load_router_file(const RoutingSpec& spec, const Model& edge_model,
                                   const std::string& edge_path, EdgeOptions& options) {
  router::RouterExpectations expect;
  expect.vocab_hash = edge_model.info().vocab_hash;
  expect.n_vocab = static_cast<uint32_t>(edge_model.info().n_vocab);
  expect.n_embd = edge_model.info().n_embd;
  expect.edge_path = edge_path;
  const router::LoadedRouter loaded = router::load_router(spec.router_file, expect);
  RouterConfig& r = options.router;
  r.policy = RouterPolicy::Mlp;
  r.mlp = loaded.model;
  r.threshold = spec.threshold ? *spec.threshold : loaded.model->threshold_for_share(0.07);
  if (r.target_rate) r.prior_scores = loaded.model->prior_scores(r.window);
  options.signal_hidden = true;
  options.top_k_signal = std::max(options.top_k_signal, loaded.model->spec.top_k);
  return {loaded.info.label, loaded.info.vocab_hash, loaded.info.edge_name,
          loaded.info.training_json};
}

}  // namespace

std::pair<double, double> threshold_range(RouterPolicy policy) {
  if (policy == RouterPolicy::Mlp) {  // a logit: any finite number
    return {std::numeric_limits<double>::lowest(), std::numeric_limits<double>::max()};
  }
  return policy == RouterPolicy::Entropy ? std::pair{0.0, 16.0} : std::pair{0.0, 1.0};
}

void check_routing(const RoutingSpec& spec) {
  if (!spec.policy.empty() && !spec.router_file.empty()) {
    throw Error("give a policy (" + spec.policy + ") or a trained router (" + spec.router_file +
                "), not both");
  }
  if (spec.threshold && spec.target_rate) {
    throw Error("give a threshold or a target rate, not both");
  }
  if (spec.target_rate && !(*spec.target_rate >= 0 && *spec.target_rate <= 1)) {
    throw Error("target rate " + number_text(*spec.target_rate) + " is outside [0, 1]");
  }
  if (!(spec.target_gain >= 0 && spec.target_gain <= 1)) {
    throw Error("target gain " + number_text(spec.target_gain) + " is outside [0, 1]");
  }
  if (spec.route_span < 1)
    throw Error("route span " + std::to_string(spec.route_span) + " is below 1");
  if (!spec.router_file.empty()) return check_threshold(spec, RouterPolicy::Mlp);
  if (is_random(spec.policy)) check_random(spec);
  const RouterConfig c = parse_policy(spec);
  if (c.policy == RouterPolicy::Always || c.policy == RouterPolicy::Never) {
    if (spec.threshold || spec.target_rate) {
      throw Error("the " + router_policy_name(c.policy) +
                  " policy takes neither a threshold nor a target rate");
    }
  }
  check_threshold(spec, c.policy);
}

RouterConfig routing_config(const RoutingSpec& spec) {
  check_routing(spec);
  RouterConfig r = parse_policy(spec);
  r.rate_gain = spec.target_gain;
  if (spec.threshold) r.threshold = *spec.threshold;
  if (spec.target_rate && r.policy != RouterPolicy::Random) r.target_rate = *spec.target_rate;
  return r;
}

std::optional<TrainedRouterInfo> resolve_routing(const RoutingSpec& spec, const Model& edge_model,
                                                 const std::string& edge_path,
                                                 EdgeOptions& options) {
  options.router = routing_config(spec);
  options.route_span = spec.route_span;
  if (spec.router_file.empty()) return std::nullopt;
  return load_router_file(spec, edge_model, edge_path, options);
}

}  // namespace tandem
