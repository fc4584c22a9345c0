// `tandem serve` on the real default model (Gemma 3 270M Q4_K_M), over real sockets: sessions
// alone and batched give `generate`'s greedy tokens, verify accepts exactly the matching prefix.
// Skipped when scripts/fetch_model.sh has not fetched the model.
#include <gtest/gtest.h>

#include <filesystem>

#include "common/default_model.h"
#include "runtime/model_internals.h"
#include "server_harness.h"
#include "tandem/engine.h"
#include "tokenizer/tokenizer.h"

namespace tandem::testing {
namespace {

TEST(RealModelServer, SessionsAloneAndBatchedEqualGenerate) {
  const std::string path = test_model_path();
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "real model not found at " << path;
  auto model = Model::load(path);
  const std::vector<std::string> texts = {"The capital of France is",
                                          "Water boils at a temperature of",
                                          "Q: What is 2 + 3?\nA:",
                                          "The first president of the United States was",
                                          "In 1492, Christopher Columbus",
                                          "The largest planet in the solar system is",
                                          "def fibonacci(n):",
                                          "My favourite recipe for pancakes starts with"};
  constexpr int kTokens = 12;
  std::vector<std::vector<TokenId>> prompts, want;
  for (const auto& t : texts) {
    prompts.push_back(ModelInternals::tokenizer(*model).encode(t, true, false));
    Context ctx(*model, {.n_ctx = 256, .n_seq = 1, .n_threads = 2});
    SamplingParams sp;
    sp.temp = 0;
    Sampler sampler(sp);
    want.push_back(generate(ctx, prompts.back(), kTokens, sampler).ids);
  }
  ServerProcess server(path, {"-c", "512", "-t", "2"});
  // Alone, one after the other.
  TestClient c = server.client();
  for (size_t i = 0; i < prompts.size(); ++i) {
    const HttpResult s = c.post("/tandem/v1/sessions", json::object());
    const std::string id = s.j()["session"];
    const HttpResult r =
        c.post("/tandem/v1/sessions/" + id + "/step",
               {{"expected_pos", 0}, {"append", prompts[i]}, {"generate", {{"n", kTokens}}}});
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.j()["tokens"].get<std::vector<TokenId>>(), want[i]) << texts[i];
  }
  // All at once, token by token, so their decode rows share batches.
  std::vector<std::vector<TokenId>> got(prompts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i) {
    threads.emplace_back([&, i] {
      TestClient tc = server.client();
      const std::string id = tc.post("/tandem/v1/sessions", json::object()).j()["session"];
      int pos = 0;
      std::vector<TokenId> append = prompts[i];
      for (int k = 0; k < kTokens; ++k) {
        const HttpResult r =
            tc.post("/tandem/v1/sessions/" + id + "/step",
                    {{"expected_pos", pos}, {"append", append}, {"generate", {{"n", 1}}}});
        if (r.status != 200) return;
        got[i].push_back(r.j()["tokens"][0]);
        pos = r.j()["pos"];
        append.clear();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got[i], want[i]) << texts[i];

  // Verify: the first 4 greedy tokens with the third one wrong.
  const std::string id = c.post("/tandem/v1/sessions", json::object()).j()["session"];
  std::vector<TokenId> draft(want[0].begin(), want[0].begin() + 4);
  draft[2] = draft[2] == 100 ? 101 : 100;
  const HttpResult r =
      c.post("/tandem/v1/sessions/" + id + "/step",
             {{"expected_pos", 0}, {"append", prompts[0]}, {"verify", {{"draft", draft}}}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j()["accepted"], 2);
  EXPECT_EQ(r.j()["tokens"].get<std::vector<TokenId>>(),
            std::vector<TokenId>(want[0].begin(), want[0].begin() + 3));
}

}  // namespace
}  // namespace tandem::testing
