// Unit tests for the runtime pieces that do not need a model: thread pool and sampler.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <map>
#include <vector>

#include "common/thread_pool.h"
#include "tandem/engine.h"

namespace tandem {
namespace {

TEST(ThreadPool, ParallelForCoversEveryIndexOnce) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 7, 100, 1001}) {
      for (int64_t grain : {1, 4, 64}) {
        std::vector<std::atomic<int>> hits(n);
        pool.parallel_for(n, grain, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) hits[i]++;
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << threads << " " << n;
      }
    }
  }
}

TEST(ThreadPool, ManySmallJobsFinish) {
  ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  for (int job = 0; job < 20000; ++job) {
    pool.run([&](int t, int n) { sum += t + 1; });
  }
  EXPECT_EQ(sum.load(), 20000 * 3);
}

TEST(Sampler, GreedyPicksArgmaxLowestIdOnTies) {
  SamplingParams p;
  p.temp = 0;
  Sampler s(p);
  std::vector<float> logits = {1, 5, 3, 5};
  EXPECT_EQ(s.sample(logits), 1);
}

TEST(Sampler, SeededDrawsAreReproducibleAndFollowTheDistribution) {
  SamplingParams p;
  p.temp = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.seed = 1234;
  std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  Sampler a(p), b(p);
  std::map<int, int> counts;
  for (int i = 0; i < 20000; ++i) {
    const int x = a.sample(logits);
    ASSERT_EQ(x, b.sample(logits));
    counts[x]++;
  }
  EXPECT_NEAR(counts[0] / 20000.0, 0.5, 0.02);
  EXPECT_NEAR(counts[1] / 20000.0, 0.3, 0.02);
  EXPECT_NEAR(counts[2] / 20000.0, 0.2, 0.02);
}

TEST(Sampler, TopKTopPMinPRestrictTheCandidates) {
  std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  auto support = [&](SamplingParams p) {
    p.seed = 7;
    Sampler s(p);
    std::map<int, int> c;
    for (int i = 0; i < 5000; ++i) c[s.sample(logits)]++;
    return c;
  };
  SamplingParams p;
  p.temp = 1;
  p.top_k = 2;
  p.top_p = 1;
  p.min_p = 0;
  EXPECT_EQ(support(p).size(), 2u);
  p.top_k = 0;
  p.top_p = 0.75f;  // 0.5 + 0.3 reaches 0.75
  EXPECT_EQ(support(p).size(), 2u);
  p.top_p = 1;
  p.min_p = 0.25f;  // keeps p >= 0.125
  EXPECT_EQ(support(p).size(), 3u);
}

TEST(Sampler, RepetitionPenaltyLowersSeenTokens) {
  SamplingParams p;
  p.temp = 0;
  p.repeat_penalty = 2.0f;
  Sampler s(p);
  std::vector<float> logits = {2.0f, 1.5f};
  EXPECT_EQ(s.sample(logits), 0);
  s.accept(0);
  EXPECT_EQ(s.sample(logits), 1);  // 2.0 / 2 = 1.0 < 1.5
}

TEST(Sampler, RejectsBadParameters) {
  SamplingParams p;
  p.repeat_penalty = 0;
  EXPECT_THROW(Sampler{p}, std::exception);
}

}  // namespace
}  // namespace tandem
