// RoutingSpec's rules (tandem/routing.h): the same refusals for every front end, and what each
// accepted spec turns into. The trained-router half of resolve_routing is in test_client.cpp
// (OneRouterLoader) and tests/router/test_shipped_routers.cpp.
#include "tandem/routing.h"

#include <gtest/gtest.h>

#include <limits>
#include <optional>
#include <string>

#include "tandem/error.h"

namespace tandem {
namespace {

// The message check_routing gives for `spec`, or "(accepted)".
std::string refusal(const RoutingSpec& spec) {
  try {
    check_routing(spec);
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(RoutingSpec, ContradictionsAreRefusedNamingTheRule) {
  EXPECT_EQ(refusal(RoutingSpec{.policy = "entropy", .router_file = "r.gguf"}),
            "give a policy (entropy) or a trained router (r.gguf), not both");
  EXPECT_EQ(refusal(RoutingSpec{.threshold = 0.5, .target_rate = 0.1}),
            "give a threshold or a target rate, not both");
  EXPECT_EQ(refusal(RoutingSpec{.policy = "random:0.1", .target_rate = 0.3}),
            "the random policy's rate is given twice (random:0.1 and a target rate of 0.3): "
            "give one");
  EXPECT_EQ(refusal(RoutingSpec{.policy = "random"}),
            "the random policy needs a rate: random:RATE or a target rate");
  EXPECT_EQ(refusal(RoutingSpec{.policy = "random:0.1", .threshold = 0.4}),
            "a threshold does not apply to the random policy: it routes a share (random:RATE or "
            "a target rate)");
  EXPECT_EQ(refusal(RoutingSpec{.policy = "never", .target_rate = 0.1}),
            "the never policy takes neither a threshold nor a target rate");
  EXPECT_EQ(refusal(RoutingSpec{.policy = "margin", .threshold = 2}),
            "threshold 2 is outside [0, 1] for the margin policy");
  EXPECT_EQ(refusal(RoutingSpec{.router_file = "r.gguf", .threshold = -1}), "(accepted)");
  EXPECT_EQ(refusal(RoutingSpec{.router_file = "r.gguf", .threshold = 2.5}), "(accepted)");
  EXPECT_EQ(refusal(RoutingSpec{.router_file = "r.gguf",
                                .threshold = std::numeric_limits<double>::infinity()}),
            "threshold inf is not a finite number (a trained router's score is a logit)");
  EXPECT_EQ(refusal(RoutingSpec{.target_rate = 1.5}), "target rate 1.5 is outside [0, 1]");
  EXPECT_EQ(refusal(RoutingSpec{.target_gain = 2}), "target gain 2 is outside [0, 1]");
  EXPECT_EQ(refusal(RoutingSpec{.route_span = 0}), "route span 0 is below 1");
  EXPECT_NE(refusal(RoutingSpec{.policy = "coin"}).find("coin"), std::string::npos);
}

TEST(RoutingSpec, AcceptedSpecsBecomeTheirConfig) {
  EXPECT_EQ(refusal(RoutingSpec{.policy = "entropy", .threshold = 7}), "(accepted)");  // nats
  RouterConfig c = routing_config(RoutingSpec{});
  EXPECT_EQ(c.policy, RouterPolicy::Confidence);
  EXPECT_DOUBLE_EQ(c.threshold, default_threshold(RouterPolicy::Confidence));
  EXPECT_FALSE(c.target_rate.has_value());

  c = routing_config(RoutingSpec{.policy = "margin", .target_rate = 0.07, .target_gain = 0.5});
  EXPECT_EQ(c.policy, RouterPolicy::Margin);
  ASSERT_TRUE(c.target_rate.has_value());
  EXPECT_DOUBLE_EQ(*c.target_rate, 0.07);
  EXPECT_DOUBLE_EQ(c.rate_gain, 0.5);

  // The random policy's rate, from the target rate or its own; its seed from random:RATE:SEED.
  c = routing_config(RoutingSpec{.policy = "random", .target_rate = 0.3});
  EXPECT_EQ(c.policy, RouterPolicy::Random);
  EXPECT_DOUBLE_EQ(c.random_rate, 0.3);
  EXPECT_FALSE(c.target_rate.has_value());
  c = routing_config(RoutingSpec{.policy = "random:0.2:9"});
  EXPECT_DOUBLE_EQ(c.random_rate, 0.2);
  EXPECT_EQ(c.random_seed, 9u);
  EXPECT_THROW(routing_config(RoutingSpec{.policy = "random"}), Error);
}

}  // namespace
}  // namespace tandem
