// BranchSet on a tiny synthetic model, without a cloud: a fork decodes the small model's other
// choices beside the main line, a takeover hands over exactly the line a fresh greedy decode
// gives after that choice, and a fork takes only as many branches as its estimates say pay.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "client/branch_set.h"
#include "common/testdata.h"
#include "tandem/engine.h"
#include "tandem/router.h"
#include "tandem/vector_ops.h"

namespace tandem {
namespace {

constexpr int kSlots = 3;  // the main slot 0 and two branches

class BranchSetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = Model::load(tandem::testing::testdata_path("models/synth-llama-Q4_K_M.gguf"));
    ctx_ = std::make_unique<Context>(*model_,
                                     ContextParams{.n_ctx = 128, .n_seq = kSlots, .n_threads = 1});
    router_ = std::make_unique<Router>(parse_router_policy("never"));
    branches_ =
        std::make_unique<BranchSet>(*ctx_, *model_, *router_, std::vector<int>{1, 2}, false, 8);
  }

  // The main line's step: `token` at the end of slot 0, the branches' rows riding along; the
  // main line's logits after it.
  std::vector<float> step(TokenId token) {
    std::vector<BatchToken> batch{{token, ctx_->seq_length(0), 0, true}};
    branches_->add_rows(batch);
    ctx_->decode(batch);
    branches_->take_rows(1);
    const auto row = ctx_->logits(0);
    return {row.begin(), row.end()};
  }

  // A fresh context's greedy continuation of `prefix`: n tokens.
  std::vector<TokenId> greedy_after(const std::vector<TokenId>& prefix, int n) {
    Context fresh(*model_, {.n_ctx = 128, .n_seq = 1, .n_threads = 1});
    SamplingParams sp;
    sp.temp = 0;
    Sampler sampler(sp);
    return generate(fresh, prefix, n, sampler).ids;
  }

  std::unique_ptr<Model> model_;
  std::unique_ptr<Context> ctx_;
  std::unique_ptr<Router> router_;
  std::unique_ptr<BranchSet> branches_;
};

TEST_F(BranchSetTest, TakeoverHandsOverTheGreedyLineAfterTheAnswer) {
  const std::vector<TokenId> prompt = {1, 17, 230, 54, 9, 88};
  std::vector<BatchToken> batch;
  for (size_t i = 0; i < prompt.size(); ++i) {
    batch.push_back({prompt[i], static_cast<int32_t>(i), 0, i + 1 == prompt.size()});
  }
  ctx_->decode(batch);
  const auto row = ctx_->logits(static_cast<int>(prompt.size()) - 1);
  const std::vector<float> logits(row.begin(), row.end());
  const TokenId guess = argmax(logits);
  // The second best token: what branch 1 must take.
  std::vector<float> others = logits;
  others[guess] = -1e30f;
  const TokenId second = argmax(others);

  branches_->fork(/*ticket=*/7, prompt, /*main_seq=*/0, logits, guess, router_->state(),
                  prompt.size() + 10, 2);
  ASSERT_TRUE(branches_->active());
  EXPECT_EQ(branches_->rows(), 2u);
  std::vector<TokenId> main_line = prompt;
  TokenId next = guess;
  for (int i = 0; i < 4; ++i) {
    main_line.push_back(next);
    next = argmax(step(next));
  }
  EXPECT_EQ(branches_->decoded(), 8u);

  // Another consultation's answer, or an alternative no branch took, hands nothing over.
  std::vector<TokenId> main_kv = main_line;
  EXPECT_FALSE(branches_->take_over(8, second, 0, main_kv));
  EXPECT_FALSE(branches_->active());
  branches_->fork(7, prompt, 0, logits, guess, router_->state(), prompt.size() + 10, 2);
  for (int i = 0; i < 4; ++i) step(main_line[prompt.size() + i]);
  EXPECT_FALSE(branches_->take_over(7, guess, 0, main_kv));

  branches_->fork(9, prompt, 0, logits, guess, router_->state(), prompt.size() + 10, 2);
  for (int i = 0; i < 4; ++i) step(main_line[prompt.size() + i]);
  const std::optional<BranchSet::Takeover> t = branches_->take_over(9, second, 0, main_kv);
  ASSERT_TRUE(t);
  EXPECT_NE(t->seq, 0);
  // The slot holds the prompt, the answer and the produced tokens decoded so far (the last one
  // produced is still to decode); its logits are those after what it holds.
  std::vector<TokenId> want = prompt;
  want.push_back(second);
  const std::vector<TokenId> more = greedy_after(want, 4);
  ASSERT_EQ(t->produced.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(t->produced[i].token.id, more[i]) << i;
    EXPECT_EQ(t->produced[i].token.source, TokenSource::Local);
  }
  want.insert(want.end(), more.begin(), more.begin() + 3);
  EXPECT_EQ(main_kv, want);
  EXPECT_EQ(ctx_->seq_length(t->seq), static_cast<int>(want.size()));
  EXPECT_EQ(argmax(t->logits), more[3]);
  EXPECT_FALSE(branches_->active());
}

TEST_F(BranchSetTest, ForksOnlyAsManyAsPay) {
  // The prior: a third of the answers the top-1, a sixth each the next two; rows at a quarter of
  // a step each: two branches keep the most per unit of time.
  EXPECT_EQ(branches_->worth_forking(), 2u);
  // The cloud keeps agreeing with the device: forking costs more than it keeps.
  std::vector<float> logits(16, 0.0f);
  logits[3] = 5;
  logits[4] = 4;
  logits[5] = 3;
  for (int i = 0; i < 30; ++i) branches_->note_answer(logits, 3);
  EXPECT_EQ(branches_->worth_forking(), 0u);
  // ... then mostly answers the second choice, and a row is cheap: one branch covers it.
  for (int i = 0; i < 90; ++i) branches_->note_answer(logits, 4);
  for (int i = 0; i < 5; ++i) {
    branches_->note_step(0, 10.0);
    branches_->note_step(1, 11.0);
    branches_->note_step(2, 30.0);
  }
  EXPECT_EQ(branches_->worth_forking(), 1u);
  // Rows that make a step ten times dearer never pay.
  for (int i = 0; i < 50; ++i) {
    branches_->note_step(1, 100.0);
    branches_->note_step(2, 100.0);
  }
  EXPECT_EQ(branches_->worth_forking(), 0u);
}

}  // namespace
}  // namespace tandem
