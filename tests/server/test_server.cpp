// `tandem serve` over real sockets on 127.0.0.1: every native protocol step and error code, the
// compatible endpoints' basics, limits, auth, TLS and a drain on SIGTERM. Each test starts its
// own server process on a testdata model.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

#include "common/testdata.h"
#include "model/model_config.h"
#include "runtime/model_internals.h"
#include "server_harness.h"
#include "tandem/engine.h"
#include "tokenizer/tokenizer.h"

namespace tandem::testing {
namespace {

const char* kLlama = "models/synth-llama-Q8_0.gguf";

std::string model_path(const char* rel = kLlama) {
  return testdata_path(rel);
}

// Greedy continuation computed in this process, as `tandem generate --temp 0` does.
std::vector<TokenId> local_greedy(const std::string& path, const std::vector<TokenId>& prompt,
                                  int n, KvCacheType kv = KvCacheType::F32) {
  auto model = Model::load(path);
  Context ctx(*model, {.n_ctx = 512, .n_seq = 1, .n_threads = 1, .type_k = kv, .type_v = kv});
  SamplingParams sp;
  sp.temp = 0;
  Sampler sampler(sp);
  return generate(ctx, prompt, n, sampler).ids;
}

std::vector<TokenId> prompt_ids(const std::string& path, const std::string& text) {
  auto model = Model::load(path);
  return ModelInternals::tokenizer(*model).encode(text, true, false);
}

std::string new_session(TestClient& c) {
  const HttpResult r = c.post("/tandem/v1/sessions", json::object());
  EXPECT_EQ(r.status, 201) << r.body;
  return r.j()["session"].get<std::string>();
}

std::string step_path(const std::string& id) {
  return "/tandem/v1/sessions/" + id + "/step";
}

std::vector<TokenId> ids_of(const json& j) {
  return j["tokens"].get<std::vector<TokenId>>();
}

// With an f16 KV cache (llama.cpp's spelling, -ctk/-ctv), a session still equals `generate`
// with the same cache type, alone and among 7 other sessions' steps.
TEST(Server, F16CacheSessionEqualsLocalGreedy) {
  const std::string path = model_path("models/synth-gemma3-Q4_K_M.gguf");
  const auto prompt = prompt_ids(path, "Once upon a time there was a small robot who lived");
  const auto want = local_greedy(path, prompt, 40, KvCacheType::F16);
  ASSERT_NE(want, local_greedy(path, prompt, 40)) << "the cache type changed nothing";
  ServerProcess server(path, {"-ctk", "f16", "-ctv", "f16"});
  std::vector<std::thread> threads;
  std::vector<std::vector<TokenId>> got(8);
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      TestClient c = server.client();
      const std::string id = new_session(c);
      std::vector<TokenId> p = prompt;
      if (i > 0) p.back() = 300 + i;  // the others' prompts differ
      const HttpResult r =
          c.post(step_path(id), {{"expected_pos", 0}, {"append", p}, {"generate", {{"n", 40}}}});
      if (r.status == 200) got[i] = ids_of(r.j());
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(got[0], want);
}

TEST(Server, InfoCarriesTheModelFingerprint) {
  const std::string path = model_path();
  ServerProcess server(path);
  TestClient c = server.client();
  const HttpResult r = c.get("/tandem/v1/info");
  ASSERT_EQ(r.status, 200) << r.body;
  auto model = Model::load(path);
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx",
                static_cast<unsigned long long>(ModelInternals::tokenizer(*model).fingerprint()));
  EXPECT_EQ(r.j()["model"]["vocab_hash"], hash);
  EXPECT_EQ(r.j()["model"]["n_vocab"], model->info().n_vocab);
  EXPECT_EQ(r.j()["protocol"], 1);
  const HttpResult s = c.post("/tandem/v1/sessions", json::object());
  ASSERT_EQ(s.status, 201);
  EXPECT_EQ(s.j()["pos"], 0);
  EXPECT_EQ(s.j()["model"]["vocab_hash"], hash);
}

// A session's greedy output through steps equals `generate` on the same model, however the
// steps are cut: one generate of 24, or append-then-generate-1 repeated, or sync then generate.
TEST(Server, SessionStepsEqualLocalGreedy) {
  for (const char* rel :
       {kLlama, "models/synth-qwen2-Q4_K_M.gguf", "models/synth-gemma3-Q4_K_M.gguf"}) {
    SCOPED_TRACE(rel);
    const std::string path = model_path(rel);
    const auto prompt = prompt_ids(path, "Once upon a time there was a small robot who");
    const auto want = local_greedy(path, prompt, 24);
    ASSERT_FALSE(want.empty());
    ServerProcess server(path);
    TestClient c = server.client();

    const std::string a = new_session(c);
    HttpResult r =
        c.post(step_path(a), {{"expected_pos", 0}, {"append", prompt}, {"generate", {{"n", 24}}}});
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(ids_of(r.j()), want);
    EXPECT_EQ(r.j()["pos"], prompt.size() + want.size());
    EXPECT_EQ(r.j()["prefilled"], prompt.size());

    // Token by token, the first step a sync (prefill only).
    const std::string b = new_session(c);
    r = c.post(step_path(b), {{"expected_pos", 0}, {"append", prompt}});
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.j()["pos"], prompt.size());
    EXPECT_TRUE(r.j()["tokens"].empty());
    std::vector<TokenId> got;
    int pos = static_cast<int>(prompt.size());
    for (size_t i = 0; i < want.size(); ++i) {
      r = c.post(step_path(b), {{"expected_pos", pos}, {"generate", {{"n", 1}}}});
      ASSERT_EQ(r.status, 200) << r.body;
      got.push_back(ids_of(r.j()).at(0));
      pos = r.j()["pos"];
    }
    EXPECT_EQ(got, want);

    // The edge decides some tokens itself (here: the right ones) and pushes them before asking.
    const std::string d = new_session(c);
    std::vector<TokenId> first(prompt);
    first.insert(first.end(), want.begin(), want.begin() + 5);
    r = c.post(step_path(d), {{"expected_pos", 0}, {"append", first}});
    ASSERT_EQ(r.status, 200);
    r = c.post(step_path(d), {{"expected_pos", first.size()}, {"generate", {{"n", 19}}}});
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.j()["prefilled"], 1) << "only the last pushed token is left to run";
    EXPECT_EQ(ids_of(r.j()), std::vector<TokenId>(want.begin() + 5, want.end()));
  }
}

// Verify accepts exactly the matching prefix, answers the correction, and drops the rest.
TEST(Server, VerifyAcceptsExactlyTheMatchingPrefix) {
  const std::string path = model_path();
  const auto prompt = prompt_ids(path, "The quick brown fox jumps over");
  const auto want = local_greedy(path, prompt, 12);
  ASSERT_GE(want.size(), 12u);
  ServerProcess server(path);
  TestClient c = server.client();
  auto model = Model::load(path);
  const int n_vocab = model->info().n_vocab;

  for (int k = 0; k <= 4; ++k) {
    SCOPED_TRACE("mismatch at draft " + std::to_string(k));
    const std::string s = new_session(c);
    std::vector<TokenId> draft(want.begin(), want.begin() + 5);
    if (k < 5) draft[k] = (want[k] + 1) % n_vocab;
    HttpResult r = c.post(
        step_path(s),
        {{"expected_pos", 0}, {"append", prompt}, {"verify", {{"draft", draft}}}, {"top_n", 3}});
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.j()["accepted"], k);
    std::vector<TokenId> expect(want.begin(), want.begin() + k + 1);
    EXPECT_EQ(ids_of(r.j()), expect);
    EXPECT_EQ(r.j()["pos"], prompt.size() + k + 1);
    EXPECT_EQ(r.j()["top"].size(), static_cast<size_t>(k + 1));
    EXPECT_EQ(r.j()["top"][0][0]["id"], want[0]);
    // Generation continues from the corrected history as if the rejected drafts never ran.
    r = c.post(step_path(s), {{"expected_pos", prompt.size() + k + 1}, {"generate", {{"n", 4}}}});
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(ids_of(r.j()), std::vector<TokenId>(want.begin() + k + 1, want.begin() + k + 5));
  }
  // Every draft right: all accepted plus the next token.
  const std::string s = new_session(c);
  const std::vector<TokenId> draft(want.begin(), want.begin() + 6);
  const HttpResult r = c.post(
      step_path(s), {{"expected_pos", 0}, {"append", prompt}, {"verify", {{"draft", draft}}}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j()["accepted"], 6);
  EXPECT_EQ(ids_of(r.j()), std::vector<TokenId>(want.begin(), want.begin() + 7));
}

TEST(Server, WrongPositionGets409WithTheServersPosition) {
  ServerProcess server(model_path());
  TestClient c = server.client();
  const std::string s = new_session(c);
  ASSERT_EQ(c.post(step_path(s), {{"expected_pos", 0}, {"append", {1, 2, 3}}}).status, 200);
  const HttpResult r = c.post(step_path(s), {{"expected_pos", 7}, {"generate", {{"n", 1}}}});
  EXPECT_EQ(r.status, 409);
  EXPECT_EQ(r.j()["error"]["code"], "position_mismatch");
  EXPECT_EQ(r.j()["error"]["pos"], 3);
  // Resending from the server's position works.
  EXPECT_EQ(c.post(step_path(s), {{"expected_pos", 3}, {"generate", {{"n", 1}}}}).status, 200);
}

// rewind_to cuts a session back to a shared prefix: what follows equals a fresh session's
// output, only the new tail is prefilled, and a cut past the history is a 409 with the position.
TEST(Server, RewindCutsTheHistoryToASharedPrefix) {
  const std::string path = model_path();
  const auto shared = prompt_ids(path, "Question: what is the colour of the sky? Answer:");
  auto with_tail = [&](const std::vector<TokenId>& tail) {
    std::vector<TokenId> p(shared);
    p.insert(p.end(), tail.begin(), tail.end());
    return p;
  };
  const auto tail_a = prompt_ids(path, " blue and the sea is");
  const auto tail_b = prompt_ids(path, " grey when it rains, and");
  const auto prompt_b = with_tail({tail_b.begin() + 1, tail_b.end()});  // without its BOS
  const auto want_b = local_greedy(path, prompt_b, 8);
  ServerProcess server(path);
  TestClient c = server.client();
  const HttpResult created = c.post("/tandem/v1/sessions", json::object());
  ASSERT_EQ(created.status, 201);
  const json features = created.j()["features"];
  EXPECT_NE(std::find(features.begin(), features.end(), "rewind"), features.end());
  const std::string s = created.j()["session"];
  std::vector<TokenId> history_a = with_tail({tail_a.begin() + 1, tail_a.end()});
  HttpResult r =
      c.post(step_path(s), {{"expected_pos", 0}, {"append", history_a}, {"generate", {{"n", 6}}}});
  ASSERT_EQ(r.status, 200) << r.body;
  const int pos_a = r.j()["pos"];
  for (TokenId t : ids_of(r.j())) history_a.push_back(t);

  // Past the history: 409 naming rewind_to, with the server's position.
  r = c.post(step_path(s), {{"rewind_to", pos_a + 1}, {"expected_pos", pos_a + 1}});
  EXPECT_EQ(r.status, 409);
  EXPECT_EQ(r.j()["error"]["pos"], pos_a);
  EXPECT_NE(r.j()["error"]["message"].get<std::string>().find("rewind_to"), std::string::npos);
  // expected_pos must count the history after the cut.
  r = c.post(step_path(s), {{"rewind_to", 3}, {"expected_pos", pos_a}});
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.j()["error"]["field"], "expected_pos");

  const int common = static_cast<int>(shared.size());
  r = c.post(step_path(s),
             {{"rewind_to", common},
              {"expected_pos", common},
              {"append", std::vector<TokenId>(prompt_b.begin() + common, prompt_b.end())},
              {"generate", {{"n", 8}}}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(ids_of(r.j()), want_b);
  EXPECT_EQ(r.j()["pos"], prompt_b.size() + want_b.size());
  // Whatever the two histories share stayed cached -- past rewind_to too, where the append
  // repeats what the cut removed -- but its last token (fed again for a logits row).
  size_t same = 0;
  while (same < history_a.size() && same < prompt_b.size() && history_a[same] == prompt_b[same])
    ++same;
  ASSERT_GE(same, static_cast<size_t>(common));
  EXPECT_EQ(r.j()["prefilled"], prompt_b.size() - same + 1);

  // Down to nothing: the session starts over.
  r = c.post(
      step_path(s),
      {{"rewind_to", 0}, {"expected_pos", 0}, {"append", prompt_b}, {"generate", {{"n", 8}}}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(ids_of(r.j()), want_b);
}

TEST(Server, LostSessionsGet410NamingWhy) {
  ServerProcess server(model_path(), {"--max-sessions", "2", "--idle-timeout", "1"});
  TestClient c = server.client();
  HttpResult r = c.post(step_path("0123456789abcdef"), {{"expected_pos", 0}});
  EXPECT_EQ(r.status, 410);
  EXPECT_EQ(r.j()["error"]["reason"], "unknown");

  const std::string closed = new_session(c);
  EXPECT_EQ(c.request("DELETE", "/tandem/v1/sessions/" + closed).status, 200);
  r = c.post(step_path(closed), {{"expected_pos", 0}});
  EXPECT_EQ(r.status, 410);
  EXPECT_EQ(r.j()["error"]["reason"], "closed");

  // Two slots: a third session evicts the least recently used idle one.
  const std::string a = new_session(c);
  ASSERT_EQ(c.post(step_path(a), {{"expected_pos", 0}, {"append", {1, 2}}}).status, 200);
  const std::string b = new_session(c);
  ASSERT_EQ(c.post(step_path(b), {{"expected_pos", 0}, {"append", {1, 2}}}).status, 200);
  const std::string third = new_session(c);
  r = c.post(step_path(a), {{"expected_pos", 2}});
  EXPECT_EQ(r.status, 410);
  EXPECT_EQ(r.j()["error"]["reason"], "evicted");
  EXPECT_EQ(c.post(step_path(b), {{"expected_pos", 2}}).status, 200);

  // Idle for longer than --idle-timeout: expired.
  std::this_thread::sleep_for(std::chrono::milliseconds(1600));
  r = c.post(step_path(b), {{"expected_pos", 2}});
  EXPECT_EQ(r.status, 410);
  EXPECT_EQ(r.j()["error"]["reason"], "expired");
  (void)third;
}

// A KV cap that holds about one long session: a second one evicts the idle first, and a step
// that cannot fit even alone is refused with 503.
TEST(Server, KvCapEvictsLeastRecentlyUsed) {
  const std::string path = model_path();
  auto model = Model::load(path);
  const ModelConfig& cfg = ModelInternals::config(*model);
  const uint64_t per_token = static_cast<uint64_t>(cfg.n_layer) * (cfg.kv_dim() + cfg.v_dim()) * 4;
  EXPECT_THROW(ServerProcess(path, {"--kv-cap", "1"}), std::runtime_error)
      << "a cap below two tokens must be refused at start-up";

  ServerProcess server(path, {"--kv-cap", std::to_string(per_token * 100)});
  TestClient c = server.client();
  std::vector<TokenId> sixty(60);
  for (int i = 0; i < 60; ++i) sixty[i] = 1 + i;
  const std::string a = new_session(c);
  ASSERT_EQ(c.post(step_path(a), {{"expected_pos", 0}, {"append", sixty}}).status, 200);
  const std::string b = new_session(c);
  HttpResult r =
      c.post(step_path(b), {{"expected_pos", 0}, {"append", sixty}, {"generate", {{"n", 2}}}});
  ASSERT_EQ(r.status, 200) << r.body;
  r = c.post(step_path(a), {{"expected_pos", 60}, {"generate", {{"n", 1}}}});
  EXPECT_EQ(r.status, 410);
  EXPECT_EQ(r.j()["error"]["reason"], "evicted");
  const json list = c.get("/tandem/v1/sessions").j();
  EXPECT_LE(list["kv_bytes_in_use"].get<uint64_t>(), per_token * 100);
  EXPECT_EQ(list["sessions"].size(), 1u);

  // More than the whole cap in one step: 503 with Retry-After, and the session stays usable.
  std::vector<TokenId> many(150, 7);
  const std::string big = new_session(c);
  r = c.post(step_path(big), {{"expected_pos", 0}, {"append", many}, {"generate", {{"n", 1}}}});
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_EQ(r.retry_after, "1");
  const HttpResult m = c.get("/metrics");
  EXPECT_NE(m.body.find("tandem_evictions_total 1"), std::string::npos) << m.body;
  // Usable: the refused step took nothing, so a smaller one from the same position runs (it
  // used to find the session busy for ever; it evicts the idle session b to fit).
  r = c.post(step_path(big), {{"expected_pos", 0}, {"append", sixty}, {"generate", {{"n", 1}}}});
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j()["pos"], 61);
}

// Results do not depend on what else is in the batch: 32 sessions stepping at once give the
// same tokens as each alone.
TEST(Server, BatchedSessionsEqualSessionsAlone) {
  const std::string path = model_path("models/synth-gemma3-Q4_K_M.gguf");
  auto model = Model::load(path);
  constexpr int kSessions = 32, kSteps = 6, kPerStep = 3;
  std::vector<std::vector<TokenId>> prompts(kSessions), want(kSessions);
  for (int i = 0; i < kSessions; ++i) {
    prompts[i] = ModelInternals::tokenizer(*model).encode(
        "Story number " + std::to_string(i * 7919) + std::string(static_cast<size_t>(i % 5), '!') +
            " begins",
        true, false);
    want[i] = local_greedy(path, prompts[i], kSteps * kPerStep);
  }
  ServerProcess server(path, {"--max-sessions", "40"});
  std::vector<std::vector<TokenId>> got(kSessions);
  std::vector<std::thread> threads;
  for (int i = 0; i < kSessions; ++i) {
    threads.emplace_back([&, i] {
      TestClient c = server.client();
      const std::string s = new_session(c);
      int pos = 0;
      std::vector<TokenId> append = prompts[i];
      for (int k = 0; k < kSteps; ++k) {
        const HttpResult r =
            c.post(step_path(s),
                   {{"expected_pos", pos}, {"append", append}, {"generate", {{"n", kPerStep}}}});
        if (r.status != 200) return;
        for (TokenId t : ids_of(r.j())) got[i].push_back(t);
        pos = r.j()["pos"];
        append.clear();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kSessions; ++i) EXPECT_EQ(got[i], want[i]) << "session " << i;
  // And they did share batches.
  const std::string m = server.client().get("/metrics").body;
  auto value = [&](const std::string& key) {
    const size_t at = m.find(key);
    return at == std::string::npos ? -1.0 : std::stod(m.substr(at + key.size()));
  };
  EXPECT_LT(value("tandem_batch_jobs_bucket{le=\"1\"} "), value("tandem_batch_jobs_count "));
}

// A full queue answers 429 with Retry-After; nothing else fails.
TEST(Server, FullQueueAnswers429) {
  ServerProcess server(model_path(), {"--max-queue", "2", "-c", "2048"});
  std::atomic<int> ok{0}, busy{0}, other{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 12; ++i) {
    threads.emplace_back([&, i] {
      TestClient c = server.client();
      const HttpResult r = c.post(
          "/v1/completions",
          {{"prompt", std::vector<int>{1, 2, 3 + i}}, {"max_tokens", 1500}, {"temperature", 0}});
      if (r.status == 200) {
        ++ok;
      } else if (r.status == 429 && r.retry_after == "1") {
        ++busy;
      } else {
        ++other;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_GE(ok.load(), 2);
  EXPECT_GE(busy.load(), 1);
  EXPECT_EQ(other.load(), 0);
}

// A completion's id is 128 random bits: unique, and nothing shared between ids (an id made of a
// heap address and the time shared its top 16 bits with every other and repeated).
TEST(Server, CompletionIdsAreRandom) {
  ServerProcess server(model_path());
  TestClient c = server.client();
  std::set<std::string> ids;
  for (int i = 0; i < 16; ++i) {
    const HttpResult r =
        c.post("/v1/completions", {{"prompt", std::vector<int>{1, 2}}, {"max_tokens", 1}});
    ASSERT_EQ(r.status, 200) << r.body;
    const std::string id = r.j()["id"];
    ASSERT_EQ(id.size(), 5u + 32u) << id;
    EXPECT_EQ(id.rfind("cmpl-", 0), 0u) << id;
    EXPECT_EQ(id.find_first_not_of("0123456789abcdef", 5), std::string::npos) << id;
    ids.insert(id);
  }
  EXPECT_EQ(ids.size(), 16u) << "every id differs";
  // The longest prefix all 16 share after "cmpl-": 16 random ids share none but by a chance of
  // 16^-15 per digit.
  const std::string& first = *ids.begin();
  size_t shared = 5;
  while (shared < first.size() && std::all_of(ids.begin(), ids.end(), [&](const std::string& id) {
           return id[shared] == first[shared];
         }))
    ++shared;
  EXPECT_EQ(shared, 5u) << first;
}

TEST(Server, BadInputGets400NamingTheField) {
  ServerProcess server(model_path(), {"-c", "128", "--max-body", "4096"});
  TestClient c = server.client();
  const std::string s = new_session(c);
  struct Case {
    std::string body;
    int status;
    std::string field;
  };
  const std::vector<Case> cases = {
      {"{not json", 400, ""},
      {"[1,2]", 400, ""},
      {R"({"append":[1]})", 400, "expected_pos"},
      {R"({"expected_pos":"0"})", 400, "expected_pos"},
      {R"({"expected_pos":-1})", 400, "expected_pos"},
      {R"({"expected_pos":0,"append":[1,"x"]})", 400, "append[1]"},
      {R"({"expected_pos":0,"append":[1,99999999]})", 400, "append[1]"},
      {R"({"expected_pos":0,"append":[-3]})", 400, "append[0]"},
      {R"({"expected_pos":0,"append":{"a":1}})", 400, "append"},
      {R"({"expected_pos":0,"append":[1],"generate":{"n":0}})", 400, "n"},
      {R"({"expected_pos":0,"append":[1],"generate":{"n":1,"temperature":"hot"}})", 400,
       "temperature"},
      {R"({"expected_pos":0,"append":[1],"generate":{"n":1},"verify":{"draft":[1]}})", 400,
       "generate"},
      {R"({"expected_pos":0,"append":[1],"verify":{"draft":[]}})", 400, "verify.draft"},
      {R"({"expected_pos":0,"append":[1],"top_n":1000})", 400, "top_n"},
      {R"({"expected_pos":0,"bogus":1})", 400, "bogus"},
      {R"({"expected_pos":0,"generate":{"n":1}})", 400, "append"},
      {R"({"expected_pos":0,"append":[1],"generate":{"n":200}})", 413, ""},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.body);
    const HttpResult r = c.request("POST", step_path(s), k.body);
    EXPECT_EQ(r.status, k.status) << r.body;
    ASSERT_TRUE(r.j().contains("error")) << r.body;
    EXPECT_FALSE(r.j()["error"]["message"].get<std::string>().empty());
    if (!k.field.empty()) {
      EXPECT_EQ(r.j()["error"]["field"], k.field) << r.body;
    }
  }
  // A body over --max-body: 413 before any parsing.
  const HttpResult big = c.request("POST", step_path(s), std::string(8192, ' '));
  EXPECT_EQ(big.status, 413);
  // Unknown paths and methods.
  EXPECT_EQ(c.get("/nope").status, 404);
  EXPECT_EQ(c.get("/tandem/v1/sessions/" + s + "/step").status, 405);
  // The session still works after all that.
  EXPECT_EQ(
      c.post(step_path(s), {{"expected_pos", 0}, {"append", {1}}, {"generate", {{"n", 2}}}}).status,
      200);
}

TEST(Server, ApiKeyIsRequiredWhenSet) {
  ServerProcess server(model_path(), {"--api-key", "sesame"}, false, "sesame");
  TestClient good = server.client();
  TestClient none(server.port());
  TestClient wrong(server.port(), false, "sesame2");
  EXPECT_EQ(none.get("/health").status, 200);
  EXPECT_EQ(none.post("/tandem/v1/sessions", json::object()).status, 401);
  EXPECT_EQ(wrong.get("/v1/models").status, 401);
  EXPECT_EQ(none.get("/metrics").status, 401);
  EXPECT_EQ(good.get("/v1/models").status, 200);
  EXPECT_EQ(good.post("/tandem/v1/sessions", json::object()).status, 201);
}

TEST(Server, TlsWorks) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("tandem-tls-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string cert = (dir / "cert.pem").string(), key = (dir / "key.pem").string();
  const std::string cmd =
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=127.0.0.1 -keyout " + key +
      " -out " + cert + " >/dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "openssl could not make a test certificate";
  {
    ServerProcess server(model_path(), {"--ssl-cert", cert, "--ssl-key", key}, /*tls=*/true);
    TestClient c = server.client();
    const std::string s = new_session(c);
    const HttpResult r = c.post(
        step_path(s), {{"expected_pos", 0}, {"append", {1, 5, 9}}, {"generate", {{"n", 3}}}});
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.j()["tokens"].size(), 3u);
    // Plain HTTP to a TLS port gets nothing useful, and the server survives it.
    TestClient plain(server.port());
    EXPECT_THROW(plain.request("GET", "/health", "", 5), std::exception);
    EXPECT_EQ(c.get("/health").status, 200);
  }
  std::filesystem::remove_all(dir);
}

// SIGTERM while steps are running: every started step is answered in full, then the server
// exits 0.
TEST(Server, SigtermDrainsRunningSteps) {
  constexpr int kSteps = 4, kTokens = 400;
  ServerProcess server(model_path(), {"-c", "2048"});
  // Sessions first, so that only the steps are in flight when the signal comes.
  std::vector<std::string> ids;
  {
    TestClient c = server.client();
    for (int i = 0; i < kSteps; ++i) ids.push_back(new_session(c));
  }
  std::vector<std::thread> threads;
  std::atomic<int> ok{0}, sent{0};
  std::vector<int> lengths(kSteps, -1);
  for (int i = 0; i < kSteps; ++i) {
    threads.emplace_back([&, i] {
      try {
        TestClient c = server.client();
        c.get("/health");  // connected before the signal
        ++sent;
        const HttpResult r = c.post(
            step_path(ids[i]),
            {{"expected_pos", 0}, {"append", {1, 2, 3 + i}}, {"generate", {{"n", kTokens}}}});
        if (r.status == 200) {
          ++ok;
          lengths[i] = static_cast<int>(r.j()["tokens"].size());
        }
      } catch (const std::exception& e) {
        ADD_FAILURE() << "step " << i << ": " << e.what();
      }
    });
  }
  // Wait until all steps are queued or running (the server's own count), then SIGTERM.
  TestClient probe = server.client();
  bool filled = false;
  for (int k = 0; k < 2000 && !filled; ++k) {
    const std::string m = probe.get("/metrics").body;
    const size_t at = m.find("\ntandem_queue_length ");
    filled = sent == kSteps && at != std::string::npos && std::stoi(m.substr(at + 21)) >= kSteps;
    if (!filled) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(filled) << "every step was queued or running before the signal";
  EXPECT_EQ(server.stop(/*grace_s=*/120), 0);
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), kSteps);
  for (int n : lengths) EXPECT_EQ(n, kTokens) << "every started step answered in full";
}

TEST(Server, MetricsAreExposed) {
  ServerProcess server(model_path());
  TestClient c = server.client();
  const std::string s = new_session(c);
  ASSERT_EQ(
      c.post(step_path(s), {{"expected_pos", 0}, {"append", {1, 2}}, {"generate", {{"n", 3}}}})
          .status,
      200);
  c.get("/nope");
  const HttpResult m = c.get("/metrics");
  ASSERT_EQ(m.status, 200);
  for (const char* want :
       {"tandem_requests_total{route=\"/tandem/v1/sessions/{id}/step\",status=\"200\"} 1",
        "tandem_requests_total{route=\"other\",status=\"404\"} 1",
        "tandem_generated_tokens_total 3", "tandem_sessions_open 1", "tandem_batch_tokens_bucket",
        "tandem_step_seconds_count 1", "tandem_kv_bytes_in_use", "tandem_evictions_total 0",
        "tandem_queue_length"}) {
    EXPECT_NE(m.body.find(want), std::string::npos) << want << "\n" << m.body;
  }
}

}  // namespace
}  // namespace tandem::testing
