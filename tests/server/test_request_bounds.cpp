// What one request may cost `tandem serve`, attacked over real sockets on 127.0.0.1: nesting,
// numbers past int64, text over the tokenizer cap, SGLang streams that re-send everything, the
// per-request time budget. Each test starts its own server on a testdata model and checks the
// server still answers honest requests afterwards.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "common/testdata.h"
#include "server_harness.h"

namespace tandem::testing {
namespace {

std::string llama() {
  return testdata_path("models/synth-llama-Q8_0.gguf");
}

std::string nested(int levels, const std::string& inner) {
  return std::string(levels, '[') + inner + std::string(levels, ']');
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

void expect_serves_honest_requests(TestClient& c) {
  EXPECT_EQ(c.get("/health").status, 200);
  const HttpResult r = c.post(
      "/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 4}, {"temperature", 0}});
  EXPECT_EQ(r.status, 200) << r.body;
}

// 100,000 nested arrays (200 KB) used to overflow the stack of the prompt reader; every route
// that reads JSON now refuses anything deeper than 64 levels before parsing it.
TEST(RequestBounds, DeeplyNestedBodiesGet400OnEveryRoute) {
  ServerProcess server(llama());
  TestClient c = server.client();
  const std::string deep = nested(100000, "\"hi\"");
  const std::pair<std::string, std::string> attacks[] = {
      {"/v1/completions", "{\"prompt\":" + deep + "}"},
      {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":" + deep + "}]}"},
      {"/completion", "{\"prompt\":" + deep + "}"},
      {"/generate", "{\"text\":\"hi\",\"sampling_params\":{\"x\":" + deep + "}}"},
      {"/tokenize", "{\"content\":" + deep + "}"},
      {"/detokenize", "{\"tokens\":" + deep + "}"},
      {"/tandem/v1/sessions", "{\"protocol\":" + deep + "}"},
  };
  for (const auto& [path, body] : attacks) {
    const HttpResult r = c.request("POST", path, body);
    EXPECT_EQ(r.status, 400) << path << ": " << r.body.substr(0, 300);
    EXPECT_NE(r.body.find("nests deeper than 64 levels"), std::string::npos) << path << r.body;
  }
  // A native step too, on a real session.
  const std::string id = c.post("/tandem/v1/sessions", json::object()).j()["session"];
  const HttpResult r = c.request("POST", "/tandem/v1/sessions/" + id + "/step",
                                 "{\"expected_pos\":0,\"append\":" + deep + "}");
  EXPECT_EQ(r.status, 400) << r.body.substr(0, 300);
  // 64 levels is still a document the server reads (and refuses for what it says).
  const HttpResult ok = c.request("POST", "/v1/completions",
                                  "{\"prompt\":" + nested(63, "\"hi\"") + ",\"max_tokens\":1}");
  EXPECT_EQ(ok.status, 200) << ok.body;
  expect_serves_honest_requests(c);
}

// 2^63 as a double rounds to INT64_MAX's neighbour: converting it was undefined behaviour.
TEST(RequestBounds, IntegersPastInt64Get400NamingTheField) {
  ServerProcess server(llama());
  TestClient c = server.client();
  for (const char* v : {"9223372036854775808.0", "9.3e18", "1e300", "-9.3e18"}) {
    const HttpResult r = c.request("POST", "/v1/completions",
                                   std::string("{\"prompt\":\"hi\",\"max_tokens\":") + v + "}");
    EXPECT_EQ(r.status, 400) << v << ": " << r.body;
    EXPECT_EQ(r.j()["error"]["field"], "max_tokens") << r.body;
  }
  const HttpResult seed =
      c.request("POST", "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":1,\"seed\":9.3e18}");
  EXPECT_EQ(seed.status, 400) << seed.body;
  expect_serves_honest_requests(c);
}

TEST(RequestBounds, TextOverTheTokenizerCapGets413BeforeTokenizing) {
  ServerProcess server(llama(), {"--max-text-bytes", "1000"});
  TestClient c = server.client();
  const std::string big(1001, '<');
  struct Case {
    const char* path;
    json body;
    const char* field;
  };
  const Case cases[] = {
      {"/v1/completions", {{"prompt", big}}, "prompt"},
      {"/v1/completions", {{"prompt", json::array({"a", big})}}, "prompt[1]"},
      {"/completion", {{"prompt", big}}, "prompt"},
      {"/generate", {{"text", big}}, "text"},
      {"/tokenize", {{"content", big}}, "content"},
      {"/v1/chat/completions",
       {{"messages", json::array({{{"role", "user"}, {"content", std::string(600, 'a')}},
                                  {{"role", "user"}, {"content", std::string(600, 'b')}}})}},
       "messages"},
  };
  for (const Case& k : cases) {
    const HttpResult r = c.post(k.path, k.body);
    EXPECT_EQ(r.status, 413) << k.path << ": " << r.body.substr(0, 300);
    EXPECT_EQ(r.j()["error"]["field"], k.field) << r.body.substr(0, 300);
    EXPECT_NE(r.body.find("--max-text-bytes"), std::string::npos) << r.body.substr(0, 300);
  }
  EXPECT_EQ(c.post("/tokenize", {{"content", std::string(1000, '<')}}).status, 200);
  expect_serves_honest_requests(c);
}

// SGLang's streaming chunks repeat the whole answer so far; the server spaces them out so a
// stream costs a bounded multiple of its answer, and the last chunk is still the whole answer.
TEST(RequestBounds, SglangStreamCostIsLinearInTheAnswer) {
  ServerProcess server(llama());
  TestClient c = server.client();
  const json sp = {{"max_new_tokens", 400}, {"ignore_eos", true}, {"temperature", 0}};
  const HttpResult whole = c.post("/generate", {{"input_ids", {1, 2, 3}}, {"sampling_params", sp}});
  ASSERT_EQ(whole.status, 200) << whole.body;
  const std::string text = whole.j()["text"];
  const HttpResult stream =
      c.post("/generate", {{"input_ids", {1, 2, 3}}, {"sampling_params", sp}, {"stream", true}});
  ASSERT_EQ(stream.status, 200);
  const size_t chunks = count(stream.body, "data: {");
  EXPECT_GT(chunks, 16u);   // the first tokens still stream one by one
  EXPECT_LT(chunks, 120u);  // not one chunk per token (400)
  // The final event (before [DONE]) carries the whole text, as a non-streamed answer does.
  const size_t last = stream.body.rfind("data: {");
  const json final_event = json::parse(
      stream.body.substr(last + 6, stream.body.find("\n\n", last) - last - 6), nullptr, false);
  ASSERT_FALSE(final_event.is_discarded());
  EXPECT_EQ(final_event["text"], text);
  EXPECT_LT(stream.body.size(), 40 * whole.body.size()) << "stream bytes " << stream.body.size();
}

// A generation that outlives --max-request-time ends as if it had reached max_tokens.
TEST(RequestBounds, TimeBudgetEndsALongGeneration) {
  ServerProcess server(llama(), {"-c", "4096", "--max-request-time", "0.1"});
  TestClient c = server.client();
  const HttpResult r = c.post("/v1/completions", {{"prompt", json::array({1, 2, 3})},
                                                  {"max_tokens", 4000},
                                                  {"ignore_eos", true},
                                                  {"temperature", 0}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j()["choices"][0]["finish_reason"], "length");
  EXPECT_LT(r.j()["usage"]["completion_tokens"].get<int>(), 4000);
  const std::string id = c.post("/tandem/v1/sessions", json::object()).j()["session"];
  const HttpResult s =
      c.post("/tandem/v1/sessions/" + id + "/step",
             {{"expected_pos", 0}, {"append", {1, 2}}, {"generate", {{"n", 4000}}}});
  ASSERT_EQ(s.status, 200) << s.body;
  EXPECT_EQ(s.j()["stop"], "time");
  EXPECT_LT(s.j()["tokens"].size(), 4000u);
}

// While another device decodes, a prompt's work goes in chunks (--prefill-chunk; at 8 one
// logits row per batch): its prompt log-probabilities and its greedy continuation must be what
// the same request gets in whole batches on an idle server.
TEST(RequestBounds, PromptChunksWhileOthersDecodeGiveTheSameAnswer) {
  ServerProcess server(llama(), {"-c", "4096", "--prefill-chunk", "8"});
  TestClient c = server.client();
  std::vector<int> prompt;
  for (int i = 0; i < 300; ++i) prompt.push_back(1 + (i * 37) % 900);
  const json request = {
      {"prompt", prompt}, {"max_tokens", 8}, {"temperature", 0}, {"logprobs", 1}, {"echo", true}};
  const HttpResult alone = c.post("/v1/completions", request);
  ASSERT_EQ(alone.status, 200) << alone.body;
  // Another client decodes a long answer meanwhile, so the prompt is cut into chunks.
  std::thread other([&] {
    TestClient o = server.client();
    o.post("/v1/completions", {{"prompt", json::array({1, 2, 3})},
                               {"max_tokens", 3000},
                               {"ignore_eos", true},
                               {"temperature", 0}});
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const HttpResult sliced = c.post("/v1/completions", request);
  other.join();
  ASSERT_EQ(sliced.status, 200) << sliced.body;
  const json a = alone.j()["choices"][0];
  const json b = sliced.j()["choices"][0];
  EXPECT_EQ(a["text"], b["text"]);
  const json& la = a["logprobs"]["token_logprobs"];
  const json& lb = b["logprobs"]["token_logprobs"];
  ASSERT_EQ(la.size(), 308u);
  ASSERT_EQ(lb.size(), la.size());
  for (size_t i = 1; i < la.size(); ++i) {
    EXPECT_NEAR(la[i].get<double>(), lb[i].get<double>(), 1e-4) << "token " << i;
  }
}

}  // namespace
}  // namespace tandem::testing
