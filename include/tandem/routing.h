// How the device routes, said once: a RoutingSpec is what a user asks for (on the command line,
// in an eval's run list, in the browser view's request) and resolve_routing turns it into the
// decoder's router, the same way for every front end.
//
//   auto small = tandem::Model::load("edge.gguf");
//   tandem::RoutingSpec spec{.policy = "entropy", .target_rate = 0.07};
//   tandem::EdgeOptions opts;
//   tandem::resolve_routing(spec, *small, "edge.gguf", opts);  // opts.router is ready
//
// The rules (check_routing names the one broken):
//   - a policy or a trained router file, not both;
//   - a threshold or a target rate, not both; a threshold lies in the policy's score range;
//   - the random policy routes a share: its rate comes from random:RATE or from the target
//     rate, exactly once, and it takes no threshold;
//   - always and never take neither a threshold nor a target rate.
#pragma once

#include <optional>
#include <string>
#include <utility>

#include "tandem/client.h"
#include "tandem/router.h"

namespace tandem {

class Model;

struct RoutingSpec {
  // confidence | entropy | margin | random[:RATE[:SEED]] | always | never; empty: confidence,
  // or the trained router when router_file is given.
  std::string policy{};
  std::string router_file{};  // a trained router (GGUF, `tandem router train`)
  // Route where the score exceeds this; default: the policy's (confidence 0.5, entropy 2,
  // margin 0.8), a trained router's calibration for a 7% share.
  std::optional<double> threshold{};
  // Keep the cloud share of tokens near this rate instead (the random policy: its rate).
  std::optional<double> target_rate{};
  double target_gain = kDefaultRateGain;  // RouterConfig::rate_gain
  int route_span = 1;                     // cloud tokens per route event

  bool operator==(const RoutingSpec&) const = default;
};

// The range a threshold of the policy's score may take (entropy in nats: a distribution over a
// 262k vocabulary has at most ln(262144) ~ 12.5; confidence and margin are probabilities; a
// trained router's score is a logit: any finite number).
std::pair<double, double> threshold_range(RouterPolicy policy);

// Throws tandem::Error naming the rule `spec` breaks (see above); the model is not needed.
void check_routing(const RoutingSpec& spec);

// The router config `spec` asks for, without its trained router's file (resolve_routing loads
// that): the policy (the random policy's rate from random:RATE or the target rate), threshold,
// target rate and gain. Throws tandem::Error as check_routing does.
RouterConfig routing_config(const RoutingSpec& spec);

// Replaces options.router (and route_span; for a trained router the signal it needs:
// signal_hidden, top_k_signal) with what `spec` asks for. A trained router is checked against
// the edge model (another model's router, a damaged file: tandem::Error naming the file and what
// differs) and, with a target rate, its controller starts from the file's calibration. Returns
// what a trained router's file says of itself.
std::optional<TrainedRouterInfo> resolve_routing(const RoutingSpec& spec, const Model& edge_model,
                                                 const std::string& edge_path,
                                                 EdgeOptions& options);

}  // namespace tandem
