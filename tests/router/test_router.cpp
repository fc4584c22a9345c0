// Router policies and the target-rate controller.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>
#include <stdexcept>
#include <vector>

#include "tandem/router.h"

namespace tandem {
namespace {

RouterSignal signal_with(float p1, float p2, float entropy) {
  RouterSignal s;
  s.top_probs = {p1, p2};
  s.margin = p1 - p2;
  s.entropy = entropy;
  return s;
}

TEST(RouterPolicy, ParsesNamesAndRejectsUnknown) {
  EXPECT_EQ(parse_router_policy("confidence").policy, RouterPolicy::Confidence);
  EXPECT_EQ(parse_router_policy("entropy").policy, RouterPolicy::Entropy);
  EXPECT_EQ(parse_router_policy("margin").policy, RouterPolicy::Margin);
  EXPECT_EQ(parse_router_policy("always").policy, RouterPolicy::Always);
  EXPECT_EQ(parse_router_policy("never").policy, RouterPolicy::Never);
  const RouterConfig r = parse_router_policy("random:0.25:42");
  EXPECT_EQ(r.policy, RouterPolicy::Random);
  EXPECT_DOUBLE_EQ(r.random_rate, 0.25);
  EXPECT_EQ(r.random_seed, 42u);
  EXPECT_THROW(parse_router_policy("bogus"), std::invalid_argument);
  EXPECT_THROW(parse_router_policy("random"), std::invalid_argument);
  EXPECT_THROW(parse_router_policy("random:1.5"), std::invalid_argument);
  EXPECT_THROW(parse_router_policy("random:x"), std::invalid_argument);
  EXPECT_THROW(parse_router_policy("random:0.1:-3"), std::invalid_argument);
  EXPECT_THROW(parse_router_policy("always:3"), std::invalid_argument);
  try {
    parse_router_policy("bogus");
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("bogus"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("confidence"), std::string::npos);
  }
}

TEST(RouterPolicy, ScoresFollowTheSignal) {
  RouterConfig c = parse_router_policy("confidence");
  c.threshold = 0.5;
  Router conf(c);
  EXPECT_FLOAT_EQ(conf.score(signal_with(0.9f, 0.05f, 0.3f)), 0.1f);
  EXPECT_FALSE(conf.decide(signal_with(0.9f, 0.05f, 0.3f)).cloud);
  EXPECT_TRUE(conf.decide(signal_with(0.3f, 0.2f, 3.0f)).cloud);

  RouterConfig m = parse_router_policy("margin");
  m.threshold = 0.8;
  Router margin(m);
  EXPECT_FLOAT_EQ(margin.score(signal_with(0.5f, 0.4f, 1.0f)), 0.9f);
  EXPECT_TRUE(margin.decide(signal_with(0.5f, 0.4f, 1.0f)).cloud);
  EXPECT_FALSE(margin.decide(signal_with(0.95f, 0.01f, 1.0f)).cloud);

  RouterConfig e = parse_router_policy("entropy");
  e.threshold = 2.0;
  Router ent(e);
  EXPECT_FLOAT_EQ(ent.score(signal_with(0.5f, 0.4f, 2.5f)), 2.5f);
  EXPECT_TRUE(ent.decide(signal_with(0.5f, 0.4f, 2.5f)).cloud);
  EXPECT_FALSE(ent.decide(signal_with(0.5f, 0.4f, 1.5f)).cloud);

  Router always(parse_router_policy("always"));
  Router never(parse_router_policy("never"));
  EXPECT_TRUE(always.decide(signal_with(1.0f, 0.0f, 0.0f)).cloud);
  EXPECT_FALSE(never.decide(signal_with(0.1f, 0.1f, 9.0f)).cloud);
}

TEST(RouterPolicy, RandomRateAndSeedAreReproducible) {
  Router a(parse_router_policy("random:0.3:7"));
  Router b(parse_router_policy("random:0.3:7"));
  int cloud = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const RouteDecision da = a.decide({});
    const RouteDecision db = b.decide({});
    ASSERT_EQ(da.cloud, db.cloud);
    ASSERT_EQ(da.score, db.score);
    cloud += da.cloud;
  }
  EXPECT_NEAR(static_cast<double>(cloud) / n, 0.3, 0.015);
}

// Feeds the router a long synthetic stream and returns the realised cloud share of tokens.
template <typename ScoreFn>
double run_stream(Router& router, int n_decisions, int route_span, ScoreFn next_p1) {
  long tokens = 0, cloud = 0;
  for (int i = 0; i < n_decisions; ++i) {
    const float p1 = next_p1(i);
    const RouteDecision d = router.decide(signal_with(p1, (1 - p1) / 2, 1.0f));
    const int n = d.cloud ? route_span : 1;
    router.record(d.cloud, n);
    tokens += n;
    if (d.cloud) cloud += n;
  }
  return static_cast<double>(cloud) / tokens;
}

// A decoder snapshots the router per in-flight consultation (Router::State) and puts it back
// when the cloud's answer differs from its guess: the decisions after a restore are those the
// router took from that point the first time, for the target-rate controller (window, integral,
// past a full ring) and the random stream.
TEST(RouterState, RestoreReplaysTheSameDecisions) {
  for (const char* policy : {"confidence", "random:0.3:7"}) {
    RouterConfig c = parse_router_policy(policy);
    if (c.policy != RouterPolicy::Random) c.target_rate = 0.2;
    c.window = 16;
    Router router(c);
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> p(0.3f, 1.0f);
    std::vector<RouterSignal> stream;
    for (int i = 0; i < 100; ++i) {
      const float p1 = p(rng);
      stream.push_back(signal_with(p1, (1 - p1) / 2, 1.0f));
    }
    auto run = [&](size_t from, size_t to) {
      std::vector<std::pair<bool, double>> out;
      for (size_t i = from; i < to; ++i) {
        const RouteDecision d = router.decide(stream[i]);
        router.record(d.cloud, 1);
        out.emplace_back(d.cloud, d.threshold);
      }
      return out;
    };
    run(0, 40);  // past a full window
    const Router::State snapshot = router.state();
    const auto first = run(40, 100);
    router.restore(snapshot);
    EXPECT_EQ(run(40, 100), first) << policy;
  }
}

TEST(TargetRate, TracksTheRateOnAStationaryStream) {
  for (double rate : {0.05, 0.1, 0.3, 0.6}) {
    RouterConfig c = parse_router_policy("confidence");
    c.target_rate = rate;
    Router router(c);
    std::mt19937 rng(11);
    std::gamma_distribution<float> ga(5.0f, 1.0f), gb(1.5f, 1.0f);
    const double share = run_stream(router, 100000, 1, [&](int) {
      const float a = ga(rng), b = gb(rng);
      return a / (a + b);  // beta(5, 1.5): mostly confident, a long tail
    });
    EXPECT_NEAR(share, rate, 0.01) << "target " << rate;
  }
}

TEST(TargetRate, TracksTheRateWithRouteSpansAndDrift) {
  RouterConfig c = parse_router_policy("margin");
  c.target_rate = 0.1;
  Router router(c);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  // The score distribution drifts slowly from confident to unsure and back; each cloud
  // decision produces 4 tokens.
  const int n = 200000;
  const double share = run_stream(router, n, 4, [&](int i) {
    const float phase = 0.5f + 0.45f * std::sin(6.2831853f * i / 50000.0f);
    return std::clamp(phase + 0.3f * (u(rng) - 0.5f), 0.0f, 1.0f);
  });
  EXPECT_NEAR(share, 0.1, 0.01);
}

// The realised share over every run of 256 consecutive tokens, for a stream of decisions of one
// token each: the fraction of those windows within one point of `rate`.
double windows_within_one_point(const std::vector<bool>& cloud, double rate) {
  const size_t w = 256;
  size_t in = 0, n = 0, ok = 0;
  for (size_t i = 0; i < cloud.size(); ++i) {
    in += cloud[i];
    if (i >= w) in -= cloud[i - w];
    if (i + 1 < w) continue;
    ++n;
    ok += std::abs(static_cast<double>(in) / w - rate) <= 0.01 + 1e-9;
  }
  return static_cast<double>(ok) / n;
}

// The decisions of a confidence router at `rate` (with the controller's gain) over a stationary
// stream of 20,000 tokens: beta(5, 1.5) top-1 probabilities, mostly confident with a long tail.
std::vector<bool> stationary_decisions(double rate, double gain) {
  RouterConfig c = parse_router_policy("confidence");
  c.target_rate = rate;
  c.rate_gain = gain;
  Router router(c);
  std::mt19937 rng(5);
  std::gamma_distribution<float> ga(5.0f, 1.0f), gb(1.5f, 1.0f);
  std::vector<bool> cloud;
  for (int i = 0; i < 20000; ++i) {
    const float a = ga(rng), b = gb(rng);
    const float p1 = a / (a + b);
    const RouteDecision d = router.decide(signal_with(p1, (1 - p1) / 2, 1.0f));
    router.record(d.cloud, 1);
    cloud.push_back(d.cloud);
  }
  return cloud;
}

TEST(TargetRate, HoldsEveryWindowOf256TokensNearTheRate) {
  // A threshold from the score quantile alone lets a window's share wander by its binomial
  // spread (at 7% over 256 tokens: ±1.6 points), so the controller's correction has to keep the
  // windows inside ±1 point; the old gain (0.002) did so for 39-86% of them.
  for (double rate : {0.02, 0.05, 0.07, 0.1, 0.2}) {
    SCOPED_TRACE(rate);
    const double held =
        windows_within_one_point(stationary_decisions(rate, kDefaultRateGain), rate);
    EXPECT_GE(held, 0.95);
    EXPECT_LT(windows_within_one_point(stationary_decisions(rate, 0.002), rate), held);
  }
}

TEST(TargetRate, CatchesUpWhenTheScoresShiftFromItsCalibration) {
  // The window starts from calibration scores of another task (a router trained on one task and
  // run on another): the scores the device sees are shifted towards routing, so the calibrated
  // threshold alone would send 31% of them. Over the first window of 256 tokens the share still
  // lands within a point of the rate (the old gain, 0.002: 12.9%).
  RouterConfig c = parse_router_policy("confidence");
  c.target_rate = 0.07;
  std::mt19937 rng(9);
  std::normal_distribution<float> prior(0.2f, 0.1f), shifted(0.3f, 0.1f);
  for (int i = 0; i < c.window; ++i) c.prior_scores.push_back(prior(rng));
  Router router(c);
  int cloud = 0;
  const int n = 256;
  for (int i = 0; i < n; ++i) {
    const float score = std::clamp(shifted(rng), 0.0f, 1.0f);  // confidence's score is 1 - p1
    const RouteDecision d = router.decide(signal_with(1 - score, score / 2, 1.0f));
    router.record(d.cloud, 1);
    cloud += d.cloud;
  }
  EXPECT_NEAR(static_cast<double>(cloud) / n, 0.07, 0.01);
}

TEST(TargetRate, ControllerEdgesAndEmptyWindow) {
  EXPECT_THROW(TargetRateController(0.1, 16, 1.5), std::invalid_argument);
  TargetRateController none(0.0, 16);
  none.observe_score(0.9);
  EXPECT_TRUE(std::isinf(none.threshold()) && none.threshold() > 0);
  TargetRateController all(1.0, 16);
  all.observe_score(0.1);
  EXPECT_TRUE(std::isinf(all.threshold()) && all.threshold() < 0);
  TargetRateController fresh(0.2, 16);
  EXPECT_GT(fresh.threshold(), 1e30);  // nothing seen yet: stay local
  for (int i = 0; i < 10; ++i) fresh.observe_score(i / 10.0);
  EXPECT_NEAR(fresh.threshold(), 0.7, 1e-9);  // 20% of {0, .1, ..., .9} lie above 0.7
  EXPECT_THROW(TargetRateController(1.5, 16), std::invalid_argument);
}

}  // namespace
}  // namespace tandem
