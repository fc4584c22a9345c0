// tandem ui's server: request parsing, the SSE framing, and the handler driven with a recording
// Responder over a tiny test model (local mode, and route mode against a cloud that refuses
// connections); then the handler behind a real HTTP server on 127.0.0.1, attacked as a
// DNS-rebinding or cross-site page would (wrong Host, foreign Origin, deep JSON) while a
// legitimate request still works. The browser test (test_ui_browser.py) covers the real page.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <utility>

#include "common/testdata.h"
#include "tandem/client.h"
#include "tandem/engine.h"
#include "ui/assets.h"
#include "ui/ui_server.h"

namespace tandem::ui {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

// ---- parsing ----

std::string field_of_error(const std::string& body) {
  try {
    parse_generate_request(body, GenerateRequest{}, UiLimits{});
  } catch (const RequestError& e) {
    return e.field();
  }
  return "(accepted)";
}

TEST(UiRequest, BadInputNamesTheField) {
  EXPECT_EQ(field_of_error("{not json"), "body");
  EXPECT_EQ(field_of_error("[1,2]"), "body");
  EXPECT_EQ(field_of_error(R"({})"), "prompt");
  EXPECT_EQ(field_of_error(R"({"prompt": ""})"), "prompt");
  EXPECT_EQ(field_of_error(R"({"prompt": 3})"), "prompt");
  EXPECT_EQ(field_of_error(R"({"prompt": "a", "mode": "teleport"})"), "mode");
  EXPECT_EQ(field_of_error(R"({"prompt": "a", "policy": "coin"})"), "policy");
  EXPECT_EQ(field_of_error(R"({"prompt": "a", "threshold": 1.5})"), "threshold");
  EXPECT_EQ(field_of_error(R"({"prompt": "a", "threshold": "high"})"), "threshold");
  EXPECT_EQ(field_of_error(R"({"prompt": "a", "target_rate": -0.1})"), "target_rate");
  EXPECT_EQ(field_of_error(R"({"prompt": "a", "threshold": 0.5, "target_rate": 0.5})"),
            "target_rate");
  EXPECT_EQ(field_of_error(R"({"prompt": "a", "n_predict": 0})"), "n_predict");
  EXPECT_EQ(field_of_error(R"({"prompt": "a", "n_predict": 2.5})"), "n_predict");
  EXPECT_EQ(field_of_error(R"({"prompt": "a", "n_predict": 100000})"), "n_predict");
  EXPECT_EQ(field_of_error(R"({"prompt": "a", "temp": 9})"), "temp");
  EXPECT_EQ(field_of_error(R"({"prompt": "a", "continue": "yes"})"), "continue");
  EXPECT_EQ(field_of_error(R"({"prompt": "a", "chat": 1})"), "chat");
  EXPECT_EQ(field_of_error(R"({"prompt": "a", "treshold": 0.5})"), "treshold");
  EXPECT_EQ(field_of_error(R"({"prompt": "a", "": 1})"), "\"\"");  // found by fuzz_ui_request
  EXPECT_EQ(field_of_error(R"({"prompt": "a", "threshold": 0.5})"), "(accepted)");
}

TEST(UiRequest, FieldsOverrideTheDefaults) {
  GenerateRequest defaults;
  defaults.mode = EdgeMode::Local;
  defaults.n_predict = 7;
  const UiLimits limits;
  auto r = parse_generate_request(R"({"prompt": "hi"})", defaults, limits);
  EXPECT_EQ(r.prompt, "hi");
  EXPECT_EQ(r.mode, EdgeMode::Local);
  EXPECT_EQ(r.n_predict, 7);

  r = parse_generate_request(
      R"({"prompt": "hi", "mode": "route", "policy": "entropy", "threshold": 3.5, "n_predict": 9,
          "temp": 0.7, "continue": true, "chat": true})",
      defaults, limits);
  EXPECT_EQ(r.mode, EdgeMode::Route);
  EXPECT_EQ(r.routing.policy, "entropy");
  ASSERT_TRUE(r.routing.threshold.has_value());
  EXPECT_DOUBLE_EQ(*r.routing.threshold, 3.5);  // entropy is in nats: over 1 is fine
  EXPECT_FALSE(r.routing.target_rate.has_value());
  EXPECT_EQ(r.n_predict, 9);
  EXPECT_FLOAT_EQ(r.temp, 0.7f);
  EXPECT_TRUE(r.continue_conversation);
  EXPECT_TRUE(r.chat);

  r = parse_generate_request(R"({"prompt": "hi", "policy": "margin", "target_rate": 0.25})",
                             defaults, limits);
  ASSERT_TRUE(r.routing.target_rate.has_value());
  EXPECT_DOUBLE_EQ(*r.routing.target_rate, 0.25);
  EXPECT_EQ(routing_config(r.routing).policy, RouterPolicy::Margin);

  // The random policy's rate is the share itself, as on the command line (`--policy random
  // --target-rate 0.3`); with no target it routes 10%.
  r = parse_generate_request(R"({"prompt": "hi", "policy": "random", "target_rate": 0.3})",
                             defaults, limits);
  RouterConfig c = routing_config(r.routing);
  EXPECT_EQ(c.policy, RouterPolicy::Random);
  EXPECT_DOUBLE_EQ(c.random_rate, 0.3);
  EXPECT_FALSE(c.target_rate.has_value());
  r = parse_generate_request(R"({"prompt": "hi", "policy": "random"})", defaults, limits);
  EXPECT_DOUBLE_EQ(routing_config(r.routing).random_rate, 0.1);
  // A target rate sent without a policy on top of a command line's random:RATE replaces its rate.
  defaults.routing.policy = "random:0.2";
  r = parse_generate_request(R"({"prompt": "hi", "target_rate": 0.4})", defaults, limits);
  EXPECT_DOUBLE_EQ(routing_config(r.routing).random_rate, 0.4);
}

TEST(UiRequest, ContradictionsAreRefusedAsOnTheCommandLine) {
  auto problem = [](const std::string& body) {
    try {
      parse_generate_request(body, GenerateRequest{}, UiLimits{});
    } catch (const RequestError& e) {
      return e.field() + ": " + e.problem();
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(problem(R"({"prompt": "a", "threshold": 0.5, "target_rate": 0.5})"),
            "target_rate: give a threshold or a target rate, not both");
  EXPECT_EQ(problem(R"({"prompt": "a", "policy": "random", "threshold": 0.5})"),
            "threshold: a threshold does not apply to the random policy: it routes a share "
            "(random:RATE or a target rate)");
  EXPECT_EQ(problem(R"({"prompt": "a", "policy": "always", "target_rate": 0.5})"),
            "target_rate: the always policy takes neither a threshold nor a target rate");
  EXPECT_EQ(problem(R"({"prompt": "a", "policy": "margin", "threshold": 3})"),
            "threshold: threshold 3 is outside [0, 1] for the margin policy");
  EXPECT_EQ(problem(R"({"prompt": "a", "policy": "router"})"),
            "policy: no trained router was given (tandem ui --router R.gguf)");
}

TEST(UiRequest, DeepJsonIsRefusedBeforeParsing) {
  const std::string deep =
      R"({"prompt":)" + std::string(100000, '[') + std::string(100000, ']') + "}";
  try {
    parse_generate_request(deep, GenerateRequest{}, UiLimits{});
    FAIL() << "accepted";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.field(), "body");
    EXPECT_NE(e.problem().find("deeper than 8"), std::string::npos) << e.problem();
  }
  // A long unknown name is cut in the answer.
  try {
    parse_generate_request(json{{"prompt", "a"}, {std::string(5000, 'k'), 1}}.dump(),
                           GenerateRequest{}, UiLimits{});
    FAIL() << "accepted";
  } catch (const RequestError& e) {
    EXPECT_LT(e.field().size(), 80u);
  }
}

TEST(UiHosts, LoopbackNamesWithThePort) {
  EXPECT_EQ(allowed_hosts(8090),
            (std::vector<std::string>{"127.0.0.1:8090", "localhost:8090", "[::1]:8090"}));
  // Browsers leave out port 80.
  EXPECT_EQ(allowed_hosts(80).size(), 6u);
  // A literal address the UI is bound to is its own name too; a host name or 0.0.0.0 is not.
  EXPECT_EQ(allowed_hosts(8090, "192.168.1.5").back(), "192.168.1.5:8090");
  EXPECT_EQ(allowed_hosts(8090, "fe80::1").back(), "[fe80::1]:8090");
  EXPECT_EQ(allowed_hosts(8090, "0.0.0.0").size(), 3u);
  EXPECT_EQ(allowed_hosts(8090, "my-laptop.local").size(), 3u);
}

TEST(UiHosts, RefusalNamesTheHeader) {
  const auto hosts = allowed_hosts(8090);
  net::HttpRequest r;
  r.method = "GET";
  r.headers["host"] = "LocalHost:8090";
  EXPECT_EQ(request_refusal(r, hosts), "");
  r.headers["host"] = "evil.example:8090";
  EXPECT_NE(request_refusal(r, hosts).find("Host 'evil.example:8090'"), std::string::npos);
  r.headers.erase("host");
  EXPECT_NE(request_refusal(r, hosts).find("Host ''"), std::string::npos);
  r.headers["host"] = "127.0.0.1:8090";
  r.headers["origin"] = "http://127.0.0.1.evil.example:8090";
  EXPECT_NE(request_refusal(r, hosts).find("cross-origin"), std::string::npos);
  r.headers["origin"] = "https://127.0.0.1:8090";  // the UI speaks plain HTTP only
  EXPECT_NE(request_refusal(r, hosts).find("cross-origin"), std::string::npos);
}

TEST(UiSse, OneEventPerBlock) {
  const std::string e = sse_event("token", 3, json{{"text", "a\nb"}, {"x", 1}});
  EXPECT_EQ(e, "id: 3\nevent: token\ndata: {\"text\":\"a\\nb\",\"x\":1}\n\n");
  // Invalid UTF-8 in a piece does not throw.
  EXPECT_NO_THROW(sse_event("token", 0, json{{"text", std::string("\xe6\x97", 2)}}));
}

TEST(UiAssets, PageIsEmbedded) {
  const EmbeddedAsset* index = find_asset("/");
  ASSERT_NE(index, nullptr);
  EXPECT_NE(std::string(index->content_type).find("text/html"), std::string::npos);
  const std::string html(index->data, index->size);
  EXPECT_NE(html.find("/ui.js"), std::string::npos);
  ASSERT_NE(find_asset("/ui.js"), nullptr);
  ASSERT_NE(find_asset("/ui.css"), nullptr);
  EXPECT_EQ(find_asset("/../CMakeLists.txt"), nullptr);
}

// ---- the handler ----

// Records what the handler answers; write() can be held closed to keep a turn running.
class RecordingResponder : public net::Responder {
 public:
  void send(int status, const std::string& type, std::string body,
            const net::HeaderList&) override {
    std::lock_guard lock(mutex_);
    status_ = status;
    content_type_ = type;
    body_ = std::move(body);
    finished_ = true;
    changed_.notify_all();
  }
  void start_stream(int status, const std::string& type, const net::HeaderList&) override {
    std::lock_guard lock(mutex_);
    status_ = status;
    content_type_ = type;
  }
  bool write(std::string chunk) override {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return open_; });
    body_ += chunk;
    changed_.notify_all();
    return true;
  }
  void end() override {
    std::lock_guard lock(mutex_);
    finished_ = true;
    changed_.notify_all();
  }
  bool alive() const override { return true; }

  void hold() { open_ = false; }
  void release() {
    std::lock_guard lock(mutex_);
    open_ = true;
    changed_.notify_all();
  }
  // Waits (bounded) for the answer to end.
  bool wait_finished(std::chrono::seconds limit = 60s) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, limit, [&] { return finished_; });
  }
  int status() {
    std::lock_guard lock(mutex_);
    return status_;
  }
  std::string body() {
    std::lock_guard lock(mutex_);
    return body_;
  }
  json body_json() { return json::parse(body(), nullptr, false); }
  // The SSE body as {type, data} pairs.
  std::vector<std::pair<std::string, json>> events() {
    std::vector<std::pair<std::string, json>> out;
    const std::string b = body();
    size_t pos = 0;
    while (true) {
      const size_t end = b.find("\n\n", pos);
      if (end == std::string::npos) break;
      const std::string block = b.substr(pos, end - pos);
      pos = end + 2;
      const size_t t = block.find("event: "), d = block.find("data: ");
      if (t == std::string::npos || d == std::string::npos) continue;
      out.emplace_back(block.substr(t + 7, block.find('\n', t) - t - 7),
                       json::parse(block.substr(d + 6)));
    }
    return out;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  int status_ = 0;
  std::string content_type_, body_;
  bool finished_ = false;
  bool open_ = true;
};

net::HttpRequest request(const std::string& method, const std::string& target,
                         const std::string& body = "") {
  net::HttpRequest r;
  r.method = method;
  const size_t q = target.find('?');
  r.path = target.substr(0, q);
  if (q != std::string::npos) r.query = target.substr(q + 1);
  r.body = body;
  r.headers["host"] = "127.0.0.1:8090";
  if (method == "POST") {
    r.headers["content-type"] = "application/json";
    r.headers["origin"] = "http://127.0.0.1:8090";
  }
  return r;
}

class UiServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = Model::load(testing::testdata_path("models/synth-llama-Q4_K_M.gguf")).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }

  std::unique_ptr<UiServer> make_server(const std::string& cloud_url = "") {
    UiOptions o;
    o.edge.context = {.n_ctx = 256, .n_seq = 1, .n_threads = 1};
    o.edge.cloud_timeout_s = 2;
    o.edge.backoff_initial_s = 0.01;
    o.edge.backoff_max_s = 0.05;
    o.defaults.mode = EdgeMode::Local;
    o.defaults.n_predict = 8;
    o.model_name = "synth";
    o.cloud_url = cloud_url;
    o.port = 8090;
    UiServer::BackendFactory factory = [cloud_url]() -> std::unique_ptr<CloudBackend> {
      if (cloud_url.empty()) return nullptr;
      CloudOptions c;
      c.url = cloud_url;
      c.timeout_s = 2;
      return make_cloud_backend(c, *model_);
    };
    return std::make_unique<UiServer>(*model_, o, factory);
  }

  std::shared_ptr<RecordingResponder> call(UiServer& ui, const std::string& method,
                                           const std::string& target,
                                           const std::string& body = "") {
    auto r = std::make_shared<RecordingResponder>();
    ui.handle(request(method, target, body), r);
    return r;
  }

  // The worker clears `busy` just after a turn's last event: wait for it before the next POST.
  void wait_idle(UiServer& ui) {
    for (int i = 0; i < 500 && call(ui, "GET", "/api/info")->body_json()["busy"] == true; ++i) {
      std::this_thread::sleep_for(10ms);
    }
  }

  static Model* model_;
};
Model* UiServerTest::model_ = nullptr;

TEST_F(UiServerTest, ServesThePageAndAnswersUnknownPaths) {
  auto ui = make_server();
  auto page = call(*ui, "GET", "/");
  EXPECT_EQ(page->status(), 200);
  EXPECT_NE(page->body().find("<html"), std::string::npos);
  EXPECT_EQ(call(*ui, "GET", "/nothing.js")->status(), 404);
  EXPECT_EQ(call(*ui, "GET", "/api/nothing")->status(), 404);
  EXPECT_EQ(call(*ui, "GET", "/api/generate")->status(), 405);
  EXPECT_EQ(call(*ui, "POST", "/index.html")->status(), 405);
  auto info = call(*ui, "GET", "/api/info")->body_json();
  EXPECT_EQ(info["model"], "synth");
  EXPECT_EQ(info["defaults"]["mode"], "local");
  EXPECT_EQ(info["busy"], false);
}

TEST_F(UiServerTest, BadRequestIs400NamingTheField) {
  auto ui = make_server();
  auto r = call(*ui, "POST", "/api/generate", R"({"prompt": "x", "mode": "warp"})");
  EXPECT_EQ(r->status(), 400);
  EXPECT_EQ(r->body_json()["error"]["field"], "mode");
  r = call(*ui, "POST", "/api/generate", R"({"prompt": "x", "threshold": 7})");
  EXPECT_EQ(r->status(), 400);
  EXPECT_EQ(r->body_json()["error"]["field"], "threshold");
  EXPECT_EQ(r->body_json()["error"]["message"],
            "threshold 7 is outside [0, 1] for the confidence policy");
  EXPECT_EQ(call(*ui, "GET", "/api/turns/1/events?after=x")->status(), 400);
  EXPECT_EQ(call(*ui, "GET", "/api/turns/99/events")->status(), 404);
}

TEST_F(UiServerTest, PostsFromOtherSitesAreRefused) {
  auto ui = make_server();
  auto post = [&](const std::string& content_type, const std::string& origin) {
    net::HttpRequest req = request("POST", "/api/stop", "{}");
    req.headers["content-type"] = content_type;
    req.headers.erase("origin");
    if (!origin.empty()) req.headers["origin"] = origin;
    auto r = std::make_shared<RecordingResponder>();
    ui->handle(req, r);
    return r->status();
  };
  EXPECT_EQ(post("application/json", "http://127.0.0.1:8090"), 200);
  EXPECT_EQ(post("application/json; charset=utf-8", "http://localhost:8090"), 200);
  // A form or a plain fetch from another page (no preflight), no Origin at all, and another
  // origin are refused.
  EXPECT_EQ(post("text/plain", "http://127.0.0.1:8090"), 403);
  EXPECT_EQ(post("", "http://127.0.0.1:8090"), 403);
  EXPECT_EQ(post("application/json", ""), 403);
  EXPECT_EQ(post("application/json", "null"), 403);
  EXPECT_EQ(post("application/json", "http://evil.example"), 403);
  EXPECT_EQ(post("application/json", "http://127.0.0.1:9999"), 403);
  EXPECT_EQ(call(*ui, "HEAD", "/")->status(), 405);
}

TEST_F(UiServerTest, LocalTurnStreamsTokensThenStats) {
  auto ui = make_server();
  auto r = call(*ui, "POST", "/api/generate",
                R"({"prompt": "The capital of France is", "mode": "local", "n_predict": 6})");
  ASSERT_TRUE(r->wait_finished());
  EXPECT_EQ(r->status(), 200);
  const auto events = r->events();
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.front().first, "start");
  EXPECT_EQ(events.front().second["mode"], "local");
  EXPECT_EQ(events.back().first, "done");
  const json& done = events.back().second;
  int tokens = 0;
  std::string text;
  for (const auto& [type, data] : events) {
    if (type == "token") {
      EXPECT_EQ(data["source"], "local");
      EXPECT_EQ(data["i"], tokens);
      ++tokens;
    }
    if (type == "token" || type == "text") text += data["text"].get<std::string>();
  }
  EXPECT_EQ(done["stats"]["tokens"], tokens);
  EXPECT_EQ(done["text"], text);
  EXPECT_EQ(done["stats"]["cloud_tokens"], 0);
  EXPECT_EQ(done["cloud_unavailable"], false);

  // A page that reconnects gets the kept events again, from any point.
  auto replay = call(*ui, "GET", "/api/turns/1/events?after=1");
  ASSERT_TRUE(replay->wait_finished());
  const auto again = replay->events();
  ASSERT_EQ(again.size(), events.size() - 1);
  EXPECT_EQ(again.back().second, done);
  const json turns = call(*ui, "GET", "/api/turns")->body_json();
  ASSERT_EQ(turns["turns"].size(), 1u);
  EXPECT_EQ(turns["turns"][0]["events"].size(), events.size());
  EXPECT_EQ(turns["turns"][0]["finished"], true);

  // A continued turn's context is the whole conversation plus the new text (no second BOS);
  // a fresh one is just its own prompt.
  const int first_context = events.front().second["context_tokens"];
  wait_idle(*ui);
  auto next = call(*ui, "POST", "/api/generate",
                   R"({"prompt": " and", "mode": "local", "n_predict": 2, "continue": true})");
  ASSERT_TRUE(next->wait_finished());
  const int continued = next->events().front().second["context_tokens"];
  wait_idle(*ui);
  auto fresh =
      call(*ui, "POST", "/api/generate", R"({"prompt": " and", "mode": "local", "n_predict": 2})");
  ASSERT_TRUE(fresh->wait_finished());
  const int alone = fresh->events().front().second["context_tokens"];
  EXPECT_EQ(continued, first_context + tokens + alone - 1);
}

TEST_F(UiServerTest, SecondTurnWhileOneRunsIs409AndStopEndsTheFirst) {
  auto ui = make_server();
  auto first = std::make_shared<RecordingResponder>();
  first->hold();  // the worker blocks on its first event until released
  ui->handle(request("POST", "/api/generate", R"({"prompt": "Once upon", "n_predict": 200})"),
             first);
  auto second = call(*ui, "POST", "/api/generate", R"({"prompt": "again"})");
  EXPECT_EQ(second->status(), 409);
  EXPECT_EQ(second->body_json()["error"]["code"], "busy");
  EXPECT_EQ(call(*ui, "GET", "/api/info")->body_json()["busy"], true);
  auto stop = call(*ui, "POST", "/api/stop");
  EXPECT_EQ(stop->body_json()["stopping"], true);
  first->release();
  ASSERT_TRUE(first->wait_finished());
  const auto events = first->events();
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().first, "done");
  EXPECT_EQ(events.back().second["stop"], "stopped");
  EXPECT_EQ(events.back().second["stats"]["tokens"], 1);  // stopped at its first token
  wait_idle(*ui);
  auto third = call(*ui, "POST", "/api/generate", R"({"prompt": "again", "n_predict": 2})");
  ASSERT_TRUE(third->wait_finished());
  EXPECT_EQ(third->events().back().second["stats"]["tokens"], 2);
}

// A chat turn on a model without a chat template ends with an error that says so; the UI goes on.
TEST_F(UiServerTest, ChatTurnWithoutATemplateEndsWithAnError) {
  auto ui = make_server();
  auto r = call(*ui, "POST", "/api/generate", R"({"prompt": "Hi", "chat": true, "n_predict": 2})");
  ASSERT_TRUE(r->wait_finished());
  const auto events = r->events();
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().first, "error");
  EXPECT_NE(events.back().second["message"].get<std::string>().find("chat_template"),
            std::string::npos)
      << events.back().second.dump();
  wait_idle(*ui);
  auto next = call(*ui, "POST", "/api/generate", R"({"prompt": "Hello", "n_predict": 2})");
  ASSERT_TRUE(next->wait_finished());
  EXPECT_EQ(next->events().back().second["stats"]["tokens"], 2);
}

TEST_F(UiServerTest, PromptOverTheContextEndsTheTurnWithAnError) {
  auto ui = make_server();
  std::string words;
  for (int i = 0; i < 600; ++i) words += "word ";  // over the test's n_ctx of 256
  auto r = call(*ui, "POST", "/api/generate", json{{"prompt", words}}.dump());
  ASSERT_TRUE(r->wait_finished());
  const auto events = r->events();
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().first, "error");
  EXPECT_EQ(events.back().second["turn"], 1);
  EXPECT_NE(events.back().second["message"].get<std::string>().find("context"), std::string::npos);
  wait_idle(*ui);  // the UI goes on
  auto next = call(*ui, "POST", "/api/generate", R"({"prompt": "Hello", "n_predict": 3})");
  ASSERT_TRUE(next->wait_finished());
  EXPECT_EQ(next->events().back().second["stats"]["tokens"], 3);
}

TEST_F(UiServerTest, DeadCloudFallsBackAndSaysSo) {
  // Port 1 on loopback: nothing listens, the connection is refused at once.
  auto ui = make_server("http://127.0.0.1:1");
  auto r = call(*ui, "POST", "/api/generate",
                R"({"prompt": "Hello", "mode": "route", "policy": "always", "n_predict": 5})");
  ASSERT_TRUE(r->wait_finished());
  const auto events = r->events();
  ASSERT_EQ(events.back().first, "done");
  EXPECT_NE(events.front().second["cloud"].get<std::string>().find("unavailable"),
            std::string::npos);
  int fallbacks = 0;
  for (const auto& [type, data] : events) {
    if (type != "token") continue;
    EXPECT_EQ(data["source"], "local");
    EXPECT_EQ(data["fallback"], true);
    EXPECT_GT(data["score"].get<double>(), data["threshold"].get<double>());
    ++fallbacks;
  }
  EXPECT_EQ(fallbacks, 5);
  EXPECT_EQ(events.back().second["stats"]["fallbacks"], 5);
  EXPECT_EQ(events.back().second["cloud_unavailable"], true);

  // The other cloud modes (a new decoder each, as the settings change) fall back the same way;
  // they have no router score.
  for (const char* mode : {"speculative", "cloud"}) {
    wait_idle(*ui);
    auto m = call(*ui, "POST", "/api/generate",
                  json{{"prompt", "Hello"}, {"mode", mode}, {"n_predict", 4}}.dump());
    ASSERT_TRUE(m->wait_finished());
    const auto ev = m->events();
    ASSERT_EQ(ev.back().first, "done") << mode;
    EXPECT_EQ(ev.front().second["mode"], mode);
    EXPECT_EQ(ev.back().second["stats"]["fallbacks"], 4) << mode;
    for (const auto& [type, data] : ev) {
      if (type == "token") {
        EXPECT_FALSE(data.contains("score")) << mode;
      }
    }
  }
}

// ---- over a real socket ----

struct RawAnswer {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;                            // as sent (chunked framing left in)
  json body_json() const { return json::parse(body, nullptr, false); }
};

// Sends `request` as is on a new connection and reads until the server closes it.
RawAnswer raw_exchange(int port, const std::string& request) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  RawAnswer out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return out;
  }
  timeval limit{60, 0};  // only a hang is caught here
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  for (size_t sent = 0; sent < request.size();) {
    const ssize_t n = send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  std::string in;
  char buf[16384];
  for (ssize_t n; (n = recv(fd, buf, sizeof buf, 0)) > 0;) in.append(buf, static_cast<size_t>(n));
  close(fd);
  const size_t end = in.find("\r\n\r\n");
  if (in.rfind("HTTP/1.1 ", 0) != 0 || end == std::string::npos) return out;
  out.status = std::stoi(in.substr(9, 3));
  for (size_t line = in.find("\r\n") + 2; line < end;) {
    const size_t next = in.find("\r\n", line);
    const std::string field = in.substr(line, next - line);
    const size_t colon = field.find(':');
    std::string name = field.substr(0, colon);
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    out.headers[name] = field.substr(field.find_first_not_of(' ', colon + 1));
    line = next + 2;
  }
  out.body = in.substr(end + 4);
  return out;
}

std::string http_request(const std::string& method, const std::string& target,
                         const std::vector<std::string>& headers, const std::string& body = "") {
  std::string r = method + " " + target + " HTTP/1.1\r\n";
  for (const auto& h : headers) r += h + "\r\n";
  if (method == "POST") r += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  return r + "Connection: close\r\n\r\n" + body;
}

// tandem ui's handler behind the HTTP server tandem ui runs, on a free loopback port.
class UiSocketTest : public UiServerTest {
 protected:
  void SetUp() override {
    ui_ = make_server();
    net::HttpServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.max_body_bytes = 64 * 1024;                   // as tandem ui sets it
    o.own_answer_headers = ui::security_headers();  // likewise
    http_ = std::make_unique<net::HttpServer>(
        o, [this](const net::HttpRequest& req, std::shared_ptr<net::Responder> res) {
          ui_->handle(req, std::move(res));
        });
    http_->start();
    port_ = http_->port();
    ui_->set_address("127.0.0.1", port_);
  }
  void TearDown() override {
    http_->stop_accepting();
    http_->stop();
    http_->wait();
    ui_.reset();  // before the server: its open streams hold connections on the server's loop
    http_.reset();
  }

  std::string own() const { return "127.0.0.1:" + std::to_string(port_); }
  RawAnswer get(const std::string& target, const std::string& host,
                const std::string& origin = "") {
    std::vector<std::string> h = {"Host: " + host};
    if (!origin.empty()) h.push_back("Origin: " + origin);
    return raw_exchange(port_, http_request("GET", target, h));
  }
  RawAnswer post(const std::string& target, const std::string& body, const std::string& host,
                 const std::string& origin) {
    std::vector<std::string> h = {"Host: " + host, "Content-Type: application/json"};
    if (!origin.empty()) h.push_back("Origin: " + origin);
    return raw_exchange(port_, http_request("POST", target, h, body));
  }

  static void expect_security_headers(const RawAnswer& a, const std::string& label) {
    const auto header = [&](const char* name) {
      const auto it = a.headers.find(name);
      return it == a.headers.end() ? std::string("(absent)") : it->second;
    };
    const std::string csp = header("content-security-policy");
    for (const char* directive :
         {"default-src 'self'", "frame-ancestors 'none'", "object-src 'none'", "base-uri 'none'"}) {
      EXPECT_NE(csp.find(directive), std::string::npos) << label << ": CSP '" << csp << "'";
    }
    EXPECT_EQ(csp.find("unsafe-inline"), std::string::npos) << label;
    EXPECT_EQ(header("x-frame-options"), "DENY") << label;
    EXPECT_EQ(header("x-content-type-options"), "nosniff") << label;
    EXPECT_EQ(header("referrer-policy"), "no-referrer") << label;
  }

  std::unique_ptr<UiServer> ui_;
  std::unique_ptr<net::HttpServer> http_;
  int port_ = 0;
};

TEST_F(UiSocketTest, WrongHostIsRefusedOnEveryRoute) {
  const std::string port = std::to_string(port_);
  const std::vector<std::string> bad_hosts = {
      "evil.example:" + port,      // a DNS-rebinding page: its own name, our address
      "evil.example",              // without the port
      "127.0.0.1",                 // the right address, no port (the UI is not on 80)
      "localhost",                 //
      "127.0.0.1:1",               // another port
      "127.0.0.1.nip.io:" + port,  // a name that resolves to loopback is still a name
      "[::1]:1",                   //
      "",                          // empty
  };
  const std::vector<std::pair<std::string, std::string>> routes = {
      {"GET", "/"},         {"GET", "/ui.js"},         {"GET", "/ui.css"},
      {"GET", "/api/info"}, {"GET", "/api/turns"},     {"GET", "/api/turns/1/events?after=0"},
      {"GET", "/nothing"},  {"POST", "/api/generate"}, {"POST", "/api/stop"},
  };
  for (const auto& host : bad_hosts) {
    for (const auto& [method, target] : routes) {
      // The page's own Origin: only the Host is wrong.
      const RawAnswer a = method == "GET"
                              ? get(target, host)
                              : post(target, R"({"prompt":"hi"})", host, "http://" + own());
      const std::string label = method + " " + target + " Host '" + host + "'";
      EXPECT_EQ(a.status, 403) << label;
      EXPECT_EQ(a.body_json()["error"]["code"], "forbidden") << label << ": " << a.body;
      EXPECT_NE(a.body.find("is not this server"), std::string::npos) << label << ": " << a.body;
      expect_security_headers(a, label);
    }
  }
  // No Host header at all.
  const RawAnswer none = raw_exchange(port_, "GET /api/info HTTP/1.1\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(none.status, 403);
  // Nothing was started by any of it.
  EXPECT_EQ(get("/api/turns", own()).body_json()["turns"].size(), 0u);
}

TEST_F(UiSocketTest, ForeignOriginsAreRefused) {
  const std::string port = std::to_string(port_);
  const std::string body = R"({"prompt":"hi","mode":"local","n_predict":2})";
  for (const std::string& origin : std::vector<std::string>{
           "http://evil.example:" + port, "http://evil.example", "null", "http://127.0.0.1:1",
           "https://127.0.0.1:" + port, "http://127.0.0.1:" + port + ".evil.example"}) {
    const RawAnswer p = post("/api/generate", body, own(), origin);
    EXPECT_EQ(p.status, 403) << origin;
    EXPECT_NE(p.body.find("cross-origin"), std::string::npos) << origin << ": " << p.body;
    // A cross-origin read (a CORS fetch names its page) is refused as well.
    EXPECT_EQ(get("/api/turns", own(), origin).status, 403) << origin;
    EXPECT_EQ(get("/api/info", own(), origin).status, 403) << origin;
  }
  // The rebinding page controls Host and Origin alike: both name it, both are refused.
  EXPECT_EQ(
      post("/api/generate", body, "evil.example:" + port, "http://evil.example:" + port).status,
      403);
  // A POST with no Origin at all (no browser sends one so).
  const RawAnswer bare = post("/api/stop", "{}", own(), "");
  EXPECT_EQ(bare.status, 403);
  EXPECT_NE(bare.body.find("Origin"), std::string::npos) << bare.body;
  EXPECT_EQ(get("/api/turns", own()).body_json()["turns"].size(), 0u);
}

// The answers the HTTP layer gives before the UI's handler runs carry the headers too.
TEST_F(UiSocketTest, HttpLayersOwnAnswersCarryTheSecurityHeaders) {
  const RawAnswer big =
      post("/api/generate", std::string(70 * 1024, ' '), own(), "http://" + own());
  EXPECT_EQ(big.status, 413);
  expect_security_headers(big, "body over the limit");
  const RawAnswer bad =
      raw_exchange(port_, "GET / HTTP/1.1\r\nHost: " + own() + "\r\nContent-Length: x\r\n\r\n");
  EXPECT_EQ(bad.status, 400);
  expect_security_headers(bad, "malformed request");
}

TEST_F(UiSocketTest, DeepJsonIs400AndALegitimateTurnStillWorks) {
  const std::string origin = "http://" + own();
  // 30,000 nested arrays: within the 64 KiB body limit, refused before any parser runs.
  const std::string deep =
      R"({"prompt":)" + std::string(30000, '[') + std::string(30000, ']') + "}";
  const RawAnswer d = post("/api/generate", deep, own(), origin);
  EXPECT_EQ(d.status, 400);
  EXPECT_EQ(d.body_json()["error"]["field"], "body") << d.body;
  EXPECT_NE(d.body.find("nests deeper than 8"), std::string::npos) << d.body;
  expect_security_headers(d, "deep JSON");
  // A prompt over the cap is named.
  const RawAnswer big =
      post("/api/generate", json{{"prompt", std::string(40000, 'a')}}.dump(), own(), origin);
  EXPECT_EQ(big.status, 400);
  EXPECT_EQ(big.body_json()["error"]["field"], "prompt") << big.body;

  // The page, its files and a whole turn, by each loopback name.
  const std::string port = std::to_string(port_);
  for (const std::string& host :
       {own(), "localhost:" + port, "LOCALHOST:" + port, "[::1]:" + port}) {
    const RawAnswer page = get("/", host);
    EXPECT_EQ(page.status, 200) << host;
    EXPECT_NE(page.body.find("<html"), std::string::npos) << host;
    expect_security_headers(page, "page via " + host);
    EXPECT_EQ(get("/api/info", host).body_json()["model"], "synth") << host;
  }
  expect_security_headers(get("/ui.js", own()), "ui.js");
  expect_security_headers(get("/nothing", own()), "404");
  const RawAnswer turn =
      post("/api/generate", R"({"prompt":"Hello","mode":"local","n_predict":3})", own(), origin);
  EXPECT_EQ(turn.status, 200);
  EXPECT_EQ(turn.headers.at("content-type"), "text/event-stream");
  expect_security_headers(turn, "event stream");
  EXPECT_NE(turn.body.find("event: done"), std::string::npos) << turn.body;
  for (int i = 0; i < 500 && get("/api/info", own()).body_json()["busy"] != false; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  const RawAnswer kept = get("/api/turns", own());
  EXPECT_EQ(kept.status, 200);
  EXPECT_EQ(kept.body_json()["turns"].size(), 1u);
  const RawAnswer replay = get("/api/turns/1/events?after=0", "localhost:" + port);
  EXPECT_EQ(replay.status, 200);
  EXPECT_NE(replay.body.find("event: done"), std::string::npos);
}

}  // namespace
}  // namespace tandem::ui
