// Perplexity / KL statistics on synthetic logits.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tandem/perplexity.h"

namespace tandem::eval {
namespace {

TEST(Perplexity, LogprobIsLogSoftmax) {
  const std::vector<float> l = {1.0f, 2.0f, 3.0f, -1.0f};
  double z = 0;
  for (float v : l) z += std::exp(double(v));
  for (int t = 0; t < 4; ++t) EXPECT_NEAR(token_logprob(l, t), l[t] - std::log(z), 1e-12);
  // Large logits do not overflow.
  const std::vector<float> big = {1000.0f, 1000.0f};
  EXPECT_NEAR(token_logprob(big, 0), std::log(0.5), 1e-12);
}

TEST(Perplexity, UniformLogitsGiveVocabularySize) {
  const std::vector<float> l(1000, 0.25f);
  PplStats s;
  for (int i = 0; i < 50; ++i) s.add_logprob(token_logprob(l, i));
  EXPECT_NEAR(s.ppl(), 1000.0, 1e-6);
  EXPECT_NEAR(s.ppl_error(), 0.0, 1e-3);  // E[x^2] - E[x]^2 cancellation
}

TEST(Perplexity, StandardErrorAsLlamaCpp) {
  // NLLs 1, 2, 3, 4: mean 2.5, E[x^2] 7.5, var 1.25, se = sqrt(1.25 / 3) * e^2.5.
  PplStats s;
  for (double nll : {1.0, 2.0, 3.0, 4.0}) s.add_logprob(-nll);
  EXPECT_NEAR(s.ppl(), std::exp(2.5), 1e-9);
  EXPECT_NEAR(s.ppl_error(), std::sqrt(1.25 / 3) * std::exp(2.5), 1e-9);
}

TEST(KlDivergence, IdenticalIsZeroAndAgrees) {
  const std::vector<float> a = {0.1f, 2.0f, -1.0f, 0.5f};
  KlStats k;
  k.add(a, a);
  k.add(a, a);
  EXPECT_NEAR(k.mean_kl(), 0.0, 1e-12);
  EXPECT_EQ(k.top1(), 1.0);
  EXPECT_EQ(k.top1_error(), 0.0);
}

TEST(KlDivergence, TwoClassClosedForm) {
  // p = softmax(0, 0) = (1/2, 1/2); q = softmax(0, ln 3) = (1/4, 3/4).
  const std::vector<float> base = {0.0f, 0.0f};
  const std::vector<float> model = {0.0f, static_cast<float>(std::log(3.0))};
  KlStats k;
  k.add(base, model);
  const double expect = 0.5 * std::log(0.5 / 0.25) + 0.5 * std::log(0.5 / 0.75);
  EXPECT_NEAR(k.mean_kl(), expect, 1e-7);
  // argmax: base ties -> index 0, model -> 1: disagree.
  EXPECT_EQ(k.top1(), 0.0);
  KlStats k2;
  k2.add(base, model);
  k2.add(model, model);
  EXPECT_NEAR(k2.mean_kl(), expect / 2, 1e-7);
  EXPECT_NEAR(k2.kl_error(), std::sqrt((expect * expect / 2 - expect * expect / 4) / 1), 1e-7);
  EXPECT_NEAR(k2.top1(), 0.5, 1e-12);
  EXPECT_NEAR(k2.top1_error(), 0.5, 1e-12);
}

TEST(Perplexity, ChunkGeometry) {
  EXPECT_EQ(n_chunks(1000, 512, 0), 1);
  EXPECT_EQ(n_chunks(1024, 512, 0), 2);
  EXPECT_EQ(n_chunks(100000, 512, 3), 3);
  EXPECT_EQ(n_chunks(100, 512, 0), 0);
  EXPECT_EQ(first_scored(512), 256);
}

}  // namespace
}  // namespace tandem::eval
