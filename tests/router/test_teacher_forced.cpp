// The outcome probe's answer mode (GSM8K's outcome label): its two continuations are the edge's
// greedy ones, as a fresh context decodes them here, and the outcome is the judge's verdict on
// the routed one minus on the edge's own.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../common/testdata.h"
#include "runtime/model_internals.h"
#include "tandem/engine.h"
#include "tandem/router_tools.h"
#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {

using testing::testdata_path;

// chunk[0, i] then `first`, continued greedily for n - 1 more tokens: the n tokens from `first`.
std::vector<TokenId> greedy_after(const Model& model, const std::vector<TokenId>& chunk, int i,
                                  TokenId first, int n) {
  Context ctx(model, {.n_ctx = 256, .n_seq = 1, .n_threads = 1});
  std::vector<BatchToken> batch;
  for (int p = 0; p <= i; ++p) batch.push_back({chunk[p], p, 0, false, false});
  ctx.decode(batch);
  std::vector<TokenId> out = {first};
  for (int k = 1; k < n; ++k) {
    const std::vector<BatchToken> step = {{out.back(), i + k, 0, true, false}};
    ctx.decode(step);
    out.push_back(argmax(ctx.logits(0)));
  }
  return out;
}

TEST(OutcomeProbe, AnswerModeJudgesTheEdgesTwoGreedyContinuations) {
  const auto edge = Model::load(testdata_path("models/synth-llama-Q4_0.gguf"));
  const Tokenizer& tok = ModelInternals::tokenizer(*edge);
  const std::vector<TokenId> chunk = tok.encode(
      "Question: Tom has 3 apples and buys 4 more. How many?\nAnswer: 3 + 4 = 7 apples. #### 7\n\n",
      true, false);
  ASSERT_GT(chunk.size(), 24u);
  const int answer_from = 18;
  constexpr int kMore = 6;  // continuation tokens: the judge never says complete
  OutcomeProbe probe(*edge, nullptr, static_cast<int>(chunk.size()), 64, 1);
  // Two tokens standing for the edge's and the cloud's top-1 (the probe does not check them).
  const TokenId own = chunk[5], routed = chunk[9];
  ASSERT_NE(own, routed);
  // Positions visited out of order: the slots must drop what the previous call left.
  for (int i : {22, answer_from - 1, 20, 22}) {
    SCOPED_TRACE(i);
    const int so_far = i + 1 - answer_from;
    auto text = [&](TokenId first) {
      std::vector<TokenId> all(chunk.begin() + answer_from, chunk.begin() + i + 1);
      const auto more = greedy_after(*edge, chunk, i, first, kMore);
      all.insert(all.end(), more.begin(), more.end());
      return tok.decode(all);
    };
    const std::string own_text = text(own), routed_text = text(routed);
    ASSERT_NE(own_text, routed_text);
    OutcomeProbe::AnswerJudge judge;
    judge.answer_from = answer_from;
    judge.max_tokens = so_far + kMore;
    std::vector<std::string> judged;
    judge.complete = [](const std::string&) { return false; };
    judge.correct = [&](const std::string& a) {
      judged.push_back(a);
      return a == routed_text;
    };
    EXPECT_EQ(probe.measure_answer(chunk, i, own, routed, judge), 1.0f);
    ASSERT_EQ(judged.size(), 2u);
    EXPECT_EQ(judged[0], own_text);
    EXPECT_EQ(judged[1], routed_text);
    judge.correct = [&](const std::string& a) { return a == own_text; };
    EXPECT_EQ(probe.measure_answer(chunk, i, own, routed, judge), -1.0f);
    // Agreeing top-1s: nothing to measure.
    EXPECT_EQ(probe.measure_answer(chunk, i, own, own, judge), 0.0f);
  }
}

TEST(OutcomeProbe, AnswerModeStopsWhereTheJudgeSaysComplete) {
  const auto edge = Model::load(testdata_path("models/synth-llama-Q4_0.gguf"));
  const Tokenizer& tok = ModelInternals::tokenizer(*edge);
  const std::vector<TokenId> chunk =
      tok.encode("Question: 1 + 1?\nAnswer: 2 #### 2\n\n", true, false);
  const int answer_from = 8, i = 10;
  ASSERT_GT(static_cast<int>(chunk.size()), i + 1);
  OutcomeProbe probe(*edge, nullptr, static_cast<int>(chunk.size()), 64, 1);
  const TokenId own = chunk[2], routed = chunk[3];
  OutcomeProbe::AnswerJudge judge;
  judge.answer_from = answer_from;
  judge.max_tokens = 64;
  int asked = 0;
  judge.complete = [&](const std::string&) { return ++asked, true; };
  std::vector<std::string> judged;
  judge.correct = [&](const std::string& a) { return judged.push_back(a), false; };
  EXPECT_EQ(probe.measure_answer(chunk, i, own, routed, judge), 0.0f);
  EXPECT_EQ(asked, 2) << "each row asked once, then no decoding";
  std::vector<TokenId> so_far(chunk.begin() + answer_from, chunk.begin() + i + 1);
  so_far.push_back(own);
  ASSERT_EQ(judged.size(), 2u);
  EXPECT_EQ(judged[0], tok.decode(so_far));
}

}  // namespace
}  // namespace tandem
