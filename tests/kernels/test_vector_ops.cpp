// The public logits maths (tandem/vector_ops.h) against naive references written out here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/kernels.h"
#include "tandem/error.h"
#include "tandem/vector_ops.h"
#include "test_util.h"

namespace tandem {
namespace {

using kernels::testing::RandomFloats;

// Rows of vocabulary-like sizes with the awkward cases: ties at the top, a masked (-inf) logit.
std::vector<std::vector<float>> Rows() {
  std::mt19937 rng(37);
  std::vector<std::vector<float>> rows;
  for (size_t n : {1, 2, 7, 257, 4864, 262144}) {
    auto x = RandomFloats(rng, n, 8.0f);
    rows.push_back(x);
    if (n < 3) continue;
    x[n / 3] = x[2 * n / 3] = 40.0f;  // the top twice: the lower id comes first
    x[n / 2] = -INFINITY;
    rows.push_back(x);
  }
  // Few distinct values: ties everywhere, across top_n's blocks of 64, the lower id first.
  std::vector<float> ties(5000);
  for (size_t i = 0; i < ties.size(); ++i) ties[i] = static_cast<float>((i * 7919) % 5);
  rows.push_back(ties);
  return rows;
}

// The obvious first-largest scan.
TokenId NaiveArgmax(const std::vector<float>& x) {
  TokenId best = 0;
  for (size_t i = 1; i < x.size(); ++i)
    if (x[i] > x[static_cast<size_t>(best)]) best = static_cast<TokenId>(i);
  return best;
}

// log Σ exp in long double, no shift.
long double NaiveLogSumExp(const std::vector<float>& x) {
  long double sum = 0;
  for (float v : x) sum += std::exp(static_cast<long double>(v));
  return std::log(sum);
}

// Every index sorted by logit (largest first), the lower id first among equals.
std::vector<TokenId> NaiveRanking(const std::vector<float>& x) {
  std::vector<TokenId> ids(x.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](TokenId a, TokenId b) { return x[a] > x[b]; });
  return ids;
}

TEST(KernelsVectorOps, ArgmaxIsTheFirstLargest) {
  for (const auto& x : Rows()) EXPECT_EQ(argmax(x), NaiveArgmax(x)) << "n=" << x.size();
  EXPECT_EQ(argmax(std::vector<float>(5, -INFINITY)), 0);
  EXPECT_EQ(argmax({}), 0);
}

TEST(KernelsVectorOps, LogitStatsAreTheKernels) {
  for (const auto& x : Rows()) {
    const LogitStats got = logit_stats(x);
    const LogitStats want = kernels::logit_stats(x.data(), static_cast<int64_t>(x.size()));
    EXPECT_EQ(got.max, want.max);
    EXPECT_EQ(got.log_z, want.log_z);
    EXPECT_EQ(got.entropy, want.entropy);
    EXPECT_EQ(got.argmax, NaiveArgmax(x));
    const double exact = static_cast<double>(NaiveLogSumExp(x));
    EXPECT_NEAR(got.log_z, exact, 1e-5 * std::fabs(exact) + 1e-6);
  }
  const LogitStats empty = logit_stats({});
  EXPECT_EQ(empty.log_z, 0);
  EXPECT_EQ(empty.argmax, 0);
}

// log_sum_exp: close to the exact value (the f32 differences round by half an f32 ulp), and bit
// for bit the f64 sum it promises (each exp of the
// f32 difference to the largest logit, in order), which teacher-forced scores were made with.
TEST(KernelsVectorOps, LogSumExpIsTheF64Sum) {
  for (const auto& x : Rows()) {
    const float max = *std::max_element(x.begin(), x.end());
    double sum = 0;
    for (float v : x) sum += std::exp(static_cast<double>(v - max));
    EXPECT_EQ(log_sum_exp(x), max + std::log(sum)) << "n=" << x.size();
    EXPECT_NEAR(log_sum_exp(x), static_cast<double>(NaiveLogSumExp(x)), 1e-6) << "n=" << x.size();
  }
}

TEST(KernelsVectorOps, LogProbAgainstLogSumExp) {
  for (const auto& x : Rows()) {
    const double lse = log_sum_exp(x);
    for (TokenId t : {TokenId{0}, static_cast<TokenId>(x.size() - 1), NaiveArgmax(x)})
      EXPECT_EQ(log_prob(x, t), static_cast<float>(x[static_cast<size_t>(t)] - lse));
  }
  const std::vector<float> two = {0.0f, 0.0f};
  EXPECT_FLOAT_EQ(log_prob(two, 1), static_cast<float>(-std::log(2.0)));
  EXPECT_THROW(log_prob(two, 2), Error);
  EXPECT_THROW(log_prob(two, -1), Error);
}

TEST(KernelsVectorOps, TopNIsTheRankingsHead) {
  for (const auto& x : Rows()) {
    const std::vector<TokenId> ranking = NaiveRanking(x);
    const double log_z = 1.25;  // any log Z: the entries are logits[id] - log_z
    for (int n : {1, 2, 5, 40}) {
      const auto top = top_n(x, n, log_z);
      ASSERT_EQ(top.size(), std::min<size_t>(static_cast<size_t>(n), x.size()));
      for (size_t i = 0; i < top.size(); ++i) {
        EXPECT_EQ(top[i].id, ranking[i]) << "n=" << x.size() << " rank " << i;
        EXPECT_EQ(top[i].log_prob, x[static_cast<size_t>(ranking[i])] - log_z);
      }
    }
    // Without log Z: logit_stats' one.
    const auto top = top_n(x, 3);
    const double lz = logit_stats(x).log_z;
    for (size_t i = 0; i < top.size(); ++i)
      EXPECT_EQ(top[i].log_prob, x[static_cast<size_t>(top[i].id)] - lz);
  }
  EXPECT_TRUE(top_n(std::vector<float>{1, 2}, 0, 0).empty());
  EXPECT_TRUE(top_n(std::vector<float>{1, 2}, -3, 0).empty());
  EXPECT_TRUE(top_n({}, 4, 0).empty());
}

}  // namespace
}  // namespace tandem
