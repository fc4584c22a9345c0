// The device against a hostile cloud: a fake server on 127.0.0.1 (a thread of this test, real
// sockets) that answers sessions and steps the way a broken or malicious cloud could -- 100,000
// nested arrays, huge or nested error messages, absurd Retry-After values, fields of the wrong
// type, token ids outside the vocabulary, lengths and positions that do not add up, a body over
// the size limit, a 60 MiB shallow flood. Each time the backend throws a CloudError (nothing
// else), and the edge decoder in route mode still returns the whole answer, decoded locally, with
// every fallback counted. MaliciousCloudCli runs `tandem run` and `tandem router collect` against
// such a cloud and bounds their exit, their stderr and their peak memory.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "client/cloud_answer.h"
#include "common/run_tandem.h"
#include "common/testdata.h"
#include "net/http_client.h"
#include "runtime/model_internals.h"
#include "tandem/client.h"
#include "tandem/cloud_rows.h"
#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

// ---- the fake cloud ----

struct Exchange {
  std::string method, target, body;
  bool is_create() const { return method == "POST" && target == "/tandem/v1/sessions"; }
  bool is_step() const { return target.find("/step") != std::string::npos; }
};

// A whole HTTP/1.1 answer.
std::string http_answer(int status, const std::string& body, const std::string& headers = "") {
  return "HTTP/1.1 " + std::to_string(status) +
         " X\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n" + headers + "\r\n" + body;
}

// What an honest tandem serve would answer (every generated token is kToken).
class HonestSession {
 public:
  static constexpr TokenId kToken = 7;
  HonestSession(std::string vocab_hash, int n_vocab)
      : vocab_hash_(std::move(vocab_hash)), n_vocab_(n_vocab) {}

  json create_json() const {
    return {
        {"session", "s1"},
        {"pos", 0},
        {"protocol", 1},
        {"model",
         {{"name", "fake"}, {"arch", "llama"}, {"n_vocab", n_vocab_}, {"vocab_hash", vocab_hash_}}},
        {"limits", {{"n_ctx", 512}, {"max_generate", 64}, {"max_draft", 16}}}};
  }
  json step_json(const Exchange& ex) const {
    const json req = json::parse(ex.body);
    const int n = req.contains("generate") ? req["generate"].value("n", 1) : 0;
    const int pos = req.value("expected_pos", 0) + static_cast<int>(req["append"].size()) + n;
    return {{"pos", pos},
            {"tokens", std::vector<TokenId>(n, kToken)},
            {"logprobs", std::vector<float>(n, -0.5f)},
            {"prefilled", 0},
            {"stop", "length"}};
  }
  std::string answer(const Exchange& ex) const {
    if (ex.is_create()) return http_answer(201, create_json().dump());
    if (ex.is_step()) return http_answer(200, step_json(ex).dump());
    return http_answer(200, "{}");  // DELETE
  }

 private:
  std::string vocab_hash_;
  int n_vocab_;
};

// What the fake cloud sends: a whole answer, or a flood too big to hold in the test -- the
// shallow document {"data":[{},{},...]} of exactly `flood_bytes` bytes (a 200 answer, with a
// Content-Length or chunked), written in 64 KiB pieces until the client hangs up.
struct Reply {
  std::string whole;
  size_t flood_bytes = 0;
  bool chunked = false;
  Reply(std::string text) : whole(std::move(text)) {}  // NOLINT: every script returns text
  static Reply flood(size_t bytes, bool chunked) {
    Reply r("");
    r.flood_bytes = bytes;
    r.chunked = chunked;
    return r;
  }
};

class FakeCloud {
 public:
  using Script = std::function<Reply(const Exchange&)>;

  explicit FakeCloud(Script script) : script_(std::move(script)) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    socklen_t len = sizeof addr;
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    listen(listen_fd_, 16);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~FakeCloud() {
    stop_ = true;
    shutdown(listen_fd_, SHUT_RDWR);
    close(listen_fd_);
    acceptor_.join();
    {
      std::lock_guard lock(mu_);
      for (int fd : fds_) shutdown(fd, SHUT_RDWR);
    }
    for (auto& t : connections_) t.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int requests() const { return requests_.load(); }

 private:
  void accept_loop() {
    for (;;) {
      const int fd = accept(listen_fd_, nullptr, nullptr);
      if (fd < 0 || stop_) {
        if (fd >= 0) close(fd);
        return;
      }
      std::lock_guard lock(mu_);
      fds_.push_back(fd);
      connections_.emplace_back([this, fd] {
        serve(fd);
        close(fd);
      });
    }
  }

  // Reads one request (headers, then Content-Length bytes); false when the client is gone.
  static bool read_request(int fd, std::string& in, Exchange& ex) {
    char buf[16384];
    size_t end;
    while ((end = in.find("\r\n\r\n")) == std::string::npos) {
      const ssize_t n = recv(fd, buf, sizeof buf, 0);
      if (n <= 0) return false;
      in.append(buf, static_cast<size_t>(n));
    }
    const std::string head = in.substr(0, end);
    size_t length = 0;
    if (const size_t cl = head.find("Content-Length: "); cl != std::string::npos) {
      length = std::stoul(head.substr(cl + 16));
    }
    while (in.size() < end + 4 + length) {
      const ssize_t n = recv(fd, buf, sizeof buf, 0);
      if (n <= 0) return false;
      in.append(buf, static_cast<size_t>(n));
    }
    const size_t sp1 = head.find(' '), sp2 = head.find(' ', sp1 + 1);
    ex.method = head.substr(0, sp1);
    ex.target = head.substr(sp1 + 1, sp2 - sp1 - 1);
    ex.body = in.substr(end + 4, length);
    in.erase(0, end + 4 + length);
    return true;
  }

  static bool send_all(int fd, std::string_view out) {
    for (size_t sent = 0; sent < out.size();) {
      const ssize_t n = send(fd, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return false;
      sent += static_cast<size_t>(n);
    }
    return true;
  }

  // {"data":[ then "{}," repeated, then {}]}: `bytes` in all (rounded down to fit), in pieces.
  static bool send_flood(int fd, size_t bytes, bool chunked) {
    const std::string head = "{\"data\":[", tail = "{}]}";
    const size_t repeats = (bytes - head.size() - tail.size()) / 3;
    const size_t total = head.size() + 3 * repeats + tail.size();
    std::string out = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n";
    out += chunked ? "Transfer-Encoding: chunked\r\n\r\n"
                   : "Content-Length: " + std::to_string(total) + "\r\n\r\n";
    auto piece = [&](std::string_view p) {
      if (!chunked) return send_all(fd, p);
      char size[32];
      std::snprintf(size, sizeof size, "%zx\r\n", p.size());
      return send_all(fd, size) && send_all(fd, p) && send_all(fd, "\r\n");
    };
    if (!send_all(fd, out) || !piece(head)) return false;
    std::string middle;
    for (int i = 0; i < 21845; ++i) middle += "{},";
    for (size_t left = repeats; left > 0;) {
      const size_t n = std::min<size_t>(left, 21845);
      if (!piece(std::string_view(middle).substr(0, 3 * n))) return false;
      left -= n;
    }
    return piece(tail) && (!chunked || send_all(fd, "0\r\n\r\n"));
  }

  void serve(int fd) {
    std::string in;
    Exchange ex;
    while (!stop_ && read_request(fd, in, ex)) {
      ++requests_;
      const Reply out = script_(ex);
      const bool ok = out.flood_bytes > 0 ? send_flood(fd, out.flood_bytes, out.chunked)
                                          : send_all(fd, out.whole);
      if (!ok) return;
    }
  }

  Script script_;
  int listen_fd_ = -1, port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> requests_{0};
  std::thread acceptor_;
  std::mutex mu_;
  std::vector<int> fds_;
  std::vector<std::thread> connections_;
};

// ---- hostile documents ----

std::string nested_arrays(int depth) {
  return std::string(depth, '[') + std::string(depth, ']');
}
// Deep, yet under the smallest answer cap (cloud::kAnswerFixedBytes): the depth check, not the
// cap, must refuse it.
constexpr int kDeep = 30000;

// An answer whose body is `body` with status `status`, for one kind of request only; everything
// else is answered honestly.
FakeCloud::Script on_step(const HonestSession& honest, int status, std::string body,
                          std::string headers = "") {
  return [&honest, status, body, headers](const Exchange& ex) {
    return ex.is_step() ? http_answer(status, body, headers) : honest.answer(ex);
  };
}
FakeCloud::Script on_create(const HonestSession& honest, int status, std::string body) {
  return [&honest, status, body](const Exchange& ex) {
    return ex.is_create() ? http_answer(status, body) : honest.answer(ex);
  };
}
// A step answer: the honest one with `patch` merged over it (a null removes a field).
FakeCloud::Script patched_step(const HonestSession& honest, json patch) {
  return [&honest, patch](const Exchange& ex) {
    if (!ex.is_step()) return honest.answer(ex);
    json j = honest.step_json(ex);
    j.merge_patch(patch);
    return http_answer(200, j.dump());
  };
}
FakeCloud::Script patched_create(const HonestSession& honest, json patch) {
  return [&honest, patch](const Exchange& ex) {
    if (!ex.is_create()) return honest.answer(ex);
    json j = honest.create_json();
    j.merge_patch(patch);
    return http_answer(201, j.dump());
  };
}

// ---- fixture ----

class HostileCloudTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    edge_ = Model::load(testing::testdata_path("models/synth-llama-Q4_K_M.gguf")).release();
    prompt_ = ModelInternals::tokenizer(*edge_).encode("The quick brown fox", true, false);
    Context ctx(*edge_, {.n_ctx = 256, .n_seq = 1, .n_threads = 1});
    SamplingParams sp;
    sp.temp = 0;
    Sampler sampler(sp);
    local_ = generate(ctx, prompt_, kN, sampler).ids;
    honest_ = new HonestSession(ModelInternals::tokenizer(*edge_).fingerprint_hex(),
                                ModelInternals::tokenizer(*edge_).n_vocab());
  }
  static void TearDownTestSuite() {
    delete honest_;
    delete edge_;
  }

  static CloudOptions cloud_options(const FakeCloud& cloud, const std::string& api = "tandem") {
    CloudOptions c;
    c.url = cloud.url();
    c.api = api;
    c.timeout_s = 5;
    return c;
  }

  static EdgeOptions route_always() {
    EdgeOptions o;
    o.mode = EdgeMode::Route;
    o.router = parse_router_policy("always");
    o.sampling.temp = 0;
    o.context = {.n_ctx = 256, .n_seq = 1, .n_threads = 1};
    o.cloud_timeout_s = 5;
    o.backoff_initial_s = 0.01;
    o.backoff_max_s = 0.05;
    return o;
  }

  // The edge against `cloud` in route mode (every token asks the cloud): the whole answer comes
  // back decoded locally and every token is a counted fallback.
  static EdgeResult expect_local_fallback(const FakeCloud& cloud, const std::string& label,
                                          const std::string& api = "tandem") {
    EdgeDecoder edge(*edge_, route_always(), make_cloud_backend(cloud_options(cloud, api), *edge_));
    EXPECT_NO_THROW(edge.start()) << label;
    const EdgeResult r = edge.generate(prompt_, kN);
    EXPECT_EQ(r.ids, local_) << label;
    EXPECT_EQ(r.stats.tokens, kN) << label;
    EXPECT_EQ(r.stats.fallbacks, kN) << label;
    EXPECT_EQ(r.stats.cloud_tokens, 0) << label;
    EXPECT_GT(cloud.requests(), 0) << label;
    return r;
  }

  // The backend alone: connect (and, when it succeeds, one generate step) must end in a
  // CloudError of `kind` whose message contains `needle`.
  static void expect_cloud_error(const FakeCloud& cloud, CloudError::Kind kind,
                                 const std::string& needle, const std::string& label,
                                 const std::string& api = "tandem") {
    auto backend = make_cloud_backend(cloud_options(cloud, api), *edge_);
    CloudOp op;
    op.kind = CloudOpKind::Generate;
    op.n_generate = 2;
    try {
      backend->connect();
      backend->step(prompt_, op);
      ADD_FAILURE() << label << ": no error";
    } catch (const CloudError& e) {
      EXPECT_EQ(static_cast<int>(e.kind()), static_cast<int>(kind)) << label << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
          << label << ": '" << e.what() << "' does not mention '" << needle << "'";
      EXPECT_LT(std::string(e.what()).size(), 1200u) << label;
    } catch (const std::exception& e) {
      ADD_FAILURE() << label << ": not a CloudError: " << e.what();
    }
  }

  static constexpr int kN = 12;
  static inline Model* edge_ = nullptr;
  static inline HonestSession* honest_ = nullptr;
  static inline std::vector<TokenId> prompt_, local_;
};

// The fake cloud itself works: an honest script is used for every token.
TEST_F(HostileCloudTest, HonestFakeCloudIsUsed) {
  FakeCloud cloud([](const Exchange& ex) { return honest_->answer(ex); });
  EdgeDecoder edge(*edge_, route_always(), make_cloud_backend(cloud_options(cloud), *edge_));
  edge.start();
  const EdgeResult r = edge.generate(prompt_, kN);
  EXPECT_EQ(r.ids, std::vector<TokenId>(kN, HonestSession::kToken));
  EXPECT_EQ(r.stats.fallbacks, 0);
}

TEST_F(HostileCloudTest, DeeplyNestedAnswersAreRefusedBeforeParsing) {
  const std::string deep = nested_arrays(kDeep);
  const std::string deep_object = "{\"error\":" + nested_arrays(kDeep) + "}";
  struct Case {
    const char* label;
    FakeCloud::Script script;
    const char* needle;
  } cases[] = {
      {"deep step answer", on_step(*honest_, 200, deep), "nests deeper than 64"},
      {"deep session answer", on_create(*honest_, 201, deep), "nests deeper than 64"},
      {"deep error body", on_step(*honest_, 500, deep_object), "HTTP 500"},
      {"deep 409 body", on_step(*honest_, 409, deep_object), "position mismatches"},
      {"deep session error", on_create(*honest_, 503, deep_object), "HTTP 503"},
  };
  for (auto& c : cases) {
    FakeCloud cloud(c.script);
    expect_cloud_error(cloud, CloudError::Kind::Unavailable, c.needle, c.label);
    expect_local_fallback(cloud, c.label);
  }
}

TEST_F(HostileCloudTest, ErrorMessagesAreCutAndNeverDumped) {
  const std::string huge(32 << 10, 'A');  // under the cap: read, then cut
  const std::string nested_message =
      R"({"error":{"message":)" + nested_arrays(40) + R"(,"code":"x"}})";
  const std::string control = R"({"error":{"message":"bad\u0001\nline \u00e9"}})";
  const std::string raw = std::string("oops\x01\xff\xfe", 7);
  struct Case {
    const char* label;
    std::string body;
    const char* needle;
  } cases[] = {
      {"huge message", json{{"error", {{"message", huge}}}}.dump(), "AAAA..."},
      {"nested message", nested_message, "without a message string"},
      {"message is a number", R"({"error":{"message":5}})", "without a message string"},
      {"error is a string", R"({"error":"plain words"})", "plain words"},
      {"error body is an array", "[1,2,3]", "an array in JSON"},
      {"not JSON", std::string(5000, '<'), "'<<<<"},
      {"control characters", control, "bad? line \xc3\xa9"},
      {"invalid UTF-8", raw, "'oops?\?\?'"},  // \? : ??' would be a trigraph
  };
  for (auto& c : cases) {
    FakeCloud cloud(on_step(*honest_, 500, c.body));
    expect_cloud_error(cloud, CloudError::Kind::Unavailable, c.needle, c.label);
    const EdgeResult r = expect_local_fallback(cloud, c.label);
    // What the device keeps of the message is short and printable.
    EXPECT_LT(r.stats.last_cloud_error.size(), 1000u) << c.label;
    EXPECT_EQ(r.stats.last_cloud_error.find('\x01'), std::string::npos) << c.label;
  }
}

// The teacher-forced rows over HTTP (router collect, eval --task wikitext) classify a refusal as
// the backends do and quote the cloud's message as an excerpt, never its raw body.
TEST(HostileCloudRows, RefusalsAreClassifiedAndQuotedAsExcerpts) {
  struct Case {
    const char* label;
    int status;
    std::string body;
    CloudError::Kind kind;
    const char* needle;
  } cases[] = {
      {"wrong key", 401, R"({"error":{"message":"bad\u0001key"}})", CloudError::Kind::Fatal,
       "check --api-key"},
      {"huge body", 500, std::string(32 << 10, 'A'), CloudError::Kind::Unavailable, "HTTP 500"},
      {"body over the cap", 500, std::string(1 << 20, 'A'), CloudError::Kind::Unavailable,
       "over 66560 bytes"},  // 64 KiB + 4 prompt tokens x 1 entry x 256 B
      {"control bytes", 400, std::string("x\x1b[2J\x01", 6), CloudError::Kind::Rejected,
       "HTTP 400"},
  };
  for (auto& c : cases) {
    FakeCloud cloud([&](const Exchange&) { return http_answer(c.status, c.body); });
    CloudOptions o;
    o.url = cloud.url();
    o.api = "openai";
    HttpCloudRows rows(o, 32000);
    try {
      rows.rows({1, 2, 3, 4}, 1, 0);
      ADD_FAILURE() << c.label << ": no error";
    } catch (const CloudError& e) {
      const std::string what = e.what();
      EXPECT_EQ(e.kind(), c.kind) << c.label << ": " << what;
      EXPECT_NE(what.find(c.needle), std::string::npos) << c.label << ": " << what;
      EXPECT_LT(what.size(), 1000u) << c.label;
      EXPECT_EQ(what.find_first_of("\x01\x1b"), std::string::npos) << c.label;
    }
  }
}

TEST(CloudExcerpt, PrintableBoundedAndCutAtACharacter) {
  EXPECT_EQ(cloud::excerpt("plain"), "plain");
  // ESC, a C1 CSI (U+009B), DEL and a newline: nothing a terminal would act on survives.
  EXPECT_EQ(cloud::excerpt("a\x1b[2Jb\xc2\x9b"
                           "31mc\x7f\nd"),
            "a?[2Jb?31mc? d");
  EXPECT_EQ(cloud::excerpt("\xe2\x82\xac \xed\xa0\x80 \xc3"),
            "\xe2\x82\xac ??? ?");  // a surrogate, a cut
  // Cut at the limit, never inside a character.
  EXPECT_EQ(cloud::excerpt("\xc3\xa9\xc3\xa9\xc3\xa9", 5), "\xc3\xa9\xc3\xa9...");
  EXPECT_EQ(cloud::excerpt(std::string(1000, 'x')).size(), cloud::kMaxQuotedBytes + 3);
}

TEST_F(HostileCloudTest, RetryAfterValuesAreClampedAndParsedSafely) {
  const double now = 1'700'000'000;
  EXPECT_EQ(net::parse_retry_after("", now), 0);
  EXPECT_EQ(net::parse_retry_after("3", now), 3);
  EXPECT_EQ(net::parse_retry_after(" 1.5 ", now), 1.5);
  EXPECT_EQ(net::parse_retry_after("120", now), 60);
  EXPECT_EQ(net::parse_retry_after("99999999999999999999999999", now), 60);
  EXPECT_EQ(net::parse_retry_after("inf", now), 0);
  EXPECT_EQ(net::parse_retry_after("nan", now), 0);
  EXPECT_EQ(net::parse_retry_after("1e308", now), 0);
  EXPECT_EQ(net::parse_retry_after("-5", now), 0);
  EXPECT_EQ(net::parse_retry_after("soon", now), 0);
  EXPECT_EQ(net::parse_retry_after("3 seconds", now), 0);
  // 2023-11-14 22:13:20 GMT is `now`; an HTTP-date is measured from it.
  EXPECT_EQ(net::parse_retry_after("Tue, 14 Nov 2023 22:13:30 GMT", now), 10);
  EXPECT_EQ(net::parse_retry_after("Tue, 14 Nov 2023 22:13:10 GMT", now), 0);  // past
  EXPECT_EQ(net::parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", now), 60);
  EXPECT_EQ(net::parse_retry_after("Tue, 14 Nov 2023 25:13:30 GMT", now), 0);  // no hour 25
  EXPECT_EQ(net::parse_retry_after("Tue, 14 Foo 2023 22:13:30 GMT", now), 0);
  // Whatever a backend passes, a CloudError's pause is finite and at most 60 s.
  EXPECT_EQ(CloudError(CloudError::Kind::Unavailable, "", INFINITY).retry_after_s(), 60);
  EXPECT_EQ(CloudError(CloudError::Kind::Unavailable, "", NAN).retry_after_s(), 0);
  EXPECT_EQ(CloudError(CloudError::Kind::Unavailable, "", -1e308).retry_after_s(), 0);
}

TEST_F(HostileCloudTest, AbsurdRetryAfterNeitherCrashesNorTurnsTheCloudOff) {
  for (const char* value :
       {"inf", "nan", "1e308", "-5", "garbage", "Sun, 06 Nov 1994 08:49:37 GMT"}) {
    // The first step is refused with the value; every later one is answered honestly.
    std::atomic<int> steps{0};
    FakeCloud cloud([&](const Exchange& ex) {
      if (ex.is_step() && steps++ == 0) {
        return http_answer(503, R"({"error":{"message":"busy"}})",
                           "Retry-After: " + std::string(value) + "\r\n");
      }
      return honest_->answer(ex);
    });
    // Without sync-ahead the first step is the first route event: the refusal is a fallback
    // and sets the pause.
    EdgeOptions o = route_always();
    o.sync_ahead = false;
    EdgeDecoder edge(*edge_, o, make_cloud_backend(cloud_options(cloud), *edge_));
    edge.start();
    const EdgeResult first = edge.generate(prompt_, kN);
    EXPECT_EQ(first.stats.tokens, kN) << value;
    EXPECT_GT(first.stats.fallbacks, 0) << value;
    // None of these values asks for a pause: the cloud is used again after the client's own
    // short backoff (a generous bound on the attempts, not a timing).
    int cloud_tokens = 0;
    for (int i = 0; i < 400 && cloud_tokens == 0; ++i) {
      std::this_thread::sleep_for(10ms);
      cloud_tokens = edge.generate(prompt_, 2).stats.cloud_tokens;
    }
    EXPECT_GT(cloud_tokens, 0) << "Retry-After: " << value << " kept the cloud off";
  }
}

TEST_F(HostileCloudTest, MalformedSessionAnswersFallBack) {
  struct Case {
    const char* label;
    json patch;
    const char* needle;
  } cases[] = {
      {"model is an array", {{"model", json::array()}}, "'model' is an array"},
      {"no model", {{"model", nullptr}}, "no 'model'"},
      {"n_vocab a string", {{"model", {{"n_vocab", "many"}}}}, "'n_vocab' is a string"},
      {"n_vocab 1e300", {{"model", {{"n_vocab", 1e300}}}}, "'n_vocab' is a number"},
      {"n_vocab negative", {{"model", {{"n_vocab", -3}}}}, "'n_vocab' is out of range"},
      {"n_vocab 2^64-1", {{"model", {{"n_vocab", UINT64_MAX}}}}, "'n_vocab' is out of range"},
      {"vocab_hash a number", {{"model", {{"vocab_hash", 5}}}}, "'vocab_hash' is a number"},
      {"name an object", {{"model", {{"name", {{"a", 1}}}}}}, "'name' is an object"},
      {"session a number", {{"session", 123}}, "'session' is a number"},
      {"session not URL-safe", {{"session", "../admin"}}, "URL-safe"},
      {"session too long", {{"session", std::string(5000, 'a')}}, "5000 bytes"},
      {"limits a string", {{"limits", "none"}}, "'limits' is a string"},
      {"max_generate a float", {{"limits", {{"max_generate", 2.5}}}}, "'max_generate' is a number"},
      {"eog out of vocabulary",
       {{"model", {{"eog", json::array({1, 1 << 30})}}}},
       "outside the vocabulary"},
      {"eog a float", {{"model", {{"eog", json::array({1e300})}}}}, "expected a token id"},
      {"bos a string", {{"model", {{"bos", "<s>"}}}}, "'bos' is a string"},
  };
  for (auto& c : cases) {
    FakeCloud cloud(patched_create(*honest_, c.patch));
    expect_cloud_error(cloud, CloudError::Kind::Unavailable, c.needle, c.label);
    expect_local_fallback(cloud, c.label);
  }
  for (const char* body : {"[]", "null", "42", "\"s1\"", "{\"session\":"}) {
    FakeCloud cloud(on_create(*honest_, 201, body));
    expect_cloud_error(cloud, CloudError::Kind::Unavailable, "not a JSON object", body);
    expect_local_fallback(cloud, body);
  }
}

TEST_F(HostileCloudTest, MalformedStepAnswersFallBack) {
  const int n_vocab = ModelInternals::tokenizer(*edge_).n_vocab();
  struct Case {
    const char* label;
    json patch;
    const char* needle;
  } cases[] = {
      {"token at n_vocab", {{"tokens", json::array({n_vocab})}}, "outside the vocabulary"},
      {"negative token", {{"tokens", json::array({-1})}}, "outside the vocabulary"},
      {"token 2^64-1", {{"tokens", json::array({UINT64_MAX})}}, "outside the vocabulary"},
      {"token a float", {{"tokens", json::array({7.5})}}, "expected a token id"},
      {"token a string", {{"tokens", json::array({"7"})}}, "expected a token id"},
      {"tokens an object", {{"tokens", {{"0", 7}}}}, "'tokens' is an object"},
      {"more tokens than asked", {{"tokens", std::vector<int>(1000, 7)}}, "more than the"},
      {"no tokens for a generate",
       {{"tokens", json::array()}, {"logprobs", json::array()}},
       "do not fit"},
      {"pos a string", {{"pos", "10"}}, "'pos' is a string"},
      {"pos 1e300", {{"pos", 1e300}}, "'pos' is a number"},
      {"pos negative", {{"pos", -4}}, "'pos' is out of range"},
      {"pos off by one", {{"pos", 1000}}, "the server says pos 1000"},
      {"no pos", {{"pos", nullptr}}, "no 'pos'"},
      {"logprobs too short", {{"logprobs", {-0.1, -0.2, -0.3}}}, "'logprobs' is an array of 3"},
      {"logprob a string", {{"logprobs", json::array({"x"})}}, "'logprobs'"},
      {"logprob 1e300", {{"logprobs", json::array({1e300})}}, ""},  // clamped, not UB: no error
      {"prefilled 2^40", {{"prefilled", 1LL << 40}}, "'prefilled' is out of range"},
      {"stop a number", {{"stop", 5}}, "'stop' is a number"},
      {"accepted a string", {{"accepted", "all"}}, "'accepted' is a string"},
  };
  for (auto& c : cases) {
    FakeCloud cloud(patched_step(*honest_, c.patch));
    if (std::string(c.needle).empty()) {  // accepted: the cloud's tokens are used
      EdgeOptions o = route_always();
      o.sync_ahead = false;  // the patch fits a one-token generate, not a sync
      EdgeDecoder edge(*edge_, o, make_cloud_backend(cloud_options(cloud), *edge_));
      edge.start();
      EXPECT_EQ(edge.generate(prompt_, kN).stats.cloud_tokens, kN) << c.label;
      continue;
    }
    expect_cloud_error(cloud, CloudError::Kind::Unavailable, c.needle, c.label);
    expect_local_fallback(cloud, c.label);
  }
  for (const char* body : {"[]", "null", "{\"pos\":", "<html>"}) {
    FakeCloud cloud(on_step(*honest_, 200, body));
    expect_cloud_error(cloud, CloudError::Kind::Unavailable, "not a JSON object", body);
    expect_local_fallback(cloud, body);
  }
  // A 409 whose fields have the wrong types or impossible positions.
  for (const char* body : {R"({"error":{"code":5}})", R"({"error":{"pos":"x"}})",
                           R"({"error":{"pos":1e300}})", R"({"error":{"pos":-1}})"}) {
    FakeCloud cloud(on_step(*honest_, 409, body));
    expect_cloud_error(cloud, CloudError::Kind::Unavailable, "", body);
    expect_local_fallback(cloud, body);
  }
}

TEST_F(HostileCloudTest, SpeculativeVerifyThatDoesNotAddUpFallsBack) {
  const int n_vocab = ModelInternals::tokenizer(*edge_).n_vocab();
  // Each verify answer has len(draft) + 1 tokens, none of them the drafts, and a position that
  // counts them: `accepted` out of range, or in range but not matching the tokens. Generate
  // steps (no drafts left) are refused, so every token must be the edge's own.
  for (const int accepted : {99, -1, 0, 2}) {
    FakeCloud cloud([&](const Exchange& ex) {
      if (!ex.is_step()) return honest_->answer(ex);
      const json req = json::parse(ex.body);
      if (req.contains("generate")) return http_answer(500, R"({"error":{"message":"no"}})");
      if (!req.contains("verify")) return honest_->answer(ex);
      const json& draft = req["verify"]["draft"];
      std::vector<TokenId> tokens;
      for (const auto& d : draft) tokens.push_back((d.get<TokenId>() + 1) % n_vocab);
      tokens.push_back(HonestSession::kToken);
      const size_t pos = req["expected_pos"].get<size_t>() + req["append"].size() + tokens.size();
      return http_answer(200, json{{"pos", pos},
                                   {"tokens", tokens},
                                   {"logprobs", std::vector<float>(tokens.size(), -1.0f)},
                                   {"accepted", accepted},
                                   {"prefilled", 0}}
                                  .dump());
    });
    EdgeOptions o = route_always();
    o.mode = EdgeMode::Speculative;
    o.draft = 4;
    EdgeDecoder edge(*edge_, o, make_cloud_backend(cloud_options(cloud), *edge_));
    edge.start();
    const EdgeResult r = edge.generate(prompt_, kN);
    EXPECT_EQ(r.ids, local_) << "accepted " << accepted;
    EXPECT_EQ(r.stats.fallbacks, kN) << "accepted " << accepted;
    EXPECT_EQ(r.stats.accepted_drafts, 0) << "accepted " << accepted;
    EXPECT_GT(cloud.requests(), 1) << "accepted " << accepted;
  }
}

TEST_F(HostileCloudTest, BodiesOverTheSizeLimitAreRefused) {
  // A Content-Length over the step's cap (64 KiB + 2 tokens x 64 B for a generate of 2):
  // refused from the header, before any body.
  {
    FakeCloud cloud([](const Exchange& ex) {
      if (!ex.is_step()) return honest_->answer(ex);
      return std::string("HTTP/1.1 200 OK\r\nContent-Length: 104857600\r\n\r\n{\"pos\":");
    });
    const size_t cap = cloud::answer_cap(64u << 20, {{2, cloud::kNativeTokenBytes}}).bytes;
    EXPECT_EQ(cap, 65664u);
    expect_cloud_error(cloud, CloudError::Kind::Unavailable,
                       "over " + std::to_string(cap) + " bytes", "100 MiB");
    expect_local_fallback(cloud, "100 MiB");
  }
  // A chunked body that grows past a smaller configured limit.
  FakeCloud cloud([](const Exchange& ex) {
    if (!ex.is_step()) return honest_->answer(ex);
    std::string out = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
    const std::string chunk(4096, ' ');
    for (int i = 0; i < 64; ++i) out += "1000\r\n" + chunk + "\r\n";
    return out + "0\r\n\r\n";
  });
  CloudOptions c = cloud_options(cloud);
  c.max_answer_bytes = 16384;
  auto backend = make_cloud_backend(c, *edge_);
  backend->connect();
  CloudOp op;
  op.kind = CloudOpKind::Generate;
  try {
    backend->step(prompt_, op);
    ADD_FAILURE() << "a 256 KiB answer passed a 16 KiB limit";
  } catch (const CloudError& e) {
    EXPECT_NE(std::string(e.what()).find("over 16384 bytes"), std::string::npos) << e.what();
  }
  EdgeDecoder edge(*edge_, route_always(), make_cloud_backend(c, *edge_));
  edge.start();
  const EdgeResult r = edge.generate(prompt_, kN);
  EXPECT_EQ(r.ids, local_);
  EXPECT_EQ(r.stats.fallbacks, kN);
}

// The stateless APIs read their answers the same way.
TEST_F(HostileCloudTest, StatelessApisFallBackOnMalformedAnswers) {
  const int n_vocab = ModelInternals::tokenizer(*edge_).n_vocab();
  struct Case {
    const char* api;
    std::string body;
    const char* needle;
  } cases[] = {
      {"llamacpp", R"({"tokens":[1e300]})", "expected a token id"},
      {"llamacpp", R"({"tokens":[)" + std::to_string(n_vocab) + "]}", "outside the vocabulary"},
      {"llamacpp", R"({"tokens":"7"})", "'tokens' is a string"},
      {"llamacpp", R"({"tokens":[7],"stop_type":[]})", "'stop_type' is an array"},
      {"llamacpp", nested_arrays(kDeep), "nests deeper"},
      {"sglang", R"({"output_ids":[7]})", "no 'meta_info'"},
      {"sglang", R"({"output_ids":[7,7,7,7,7,7,7,7,7],"meta_info":{}})", "more than the"},
      {"openai", R"({"choices":{}})", "'choices' to be a non-empty array"},
      {"openai", R"({"choices":[{"logprobs":{"tokens":["token_id:99999999999"]}}]})",
       "expected 'token_id:N'"},
      {"openai", R"({"choices":[{"logprobs":{"tokens":["token_id:7","token_id:x"]}}]})",
       "expected 'token_id:N'"},
      {"openai", R"({"choices":[{"text":5}]})", "'text' is a number"},
  };
  for (auto& c : cases) {
    const std::string body = c.body;
    FakeCloud cloud([body](const Exchange& ex) {
      if (ex.target == "/v1/models") return http_answer(200, R"({"data":[{"id":"m"}]})");
      if (ex.target == "/tokenize") return http_answer(404, "{}");
      return http_answer(200, body);
    });
    const std::string label = std::string(c.api) + " " + c.body.substr(0, 80);
    expect_cloud_error(cloud, CloudError::Kind::Unavailable, c.needle, label, c.api);
    expect_local_fallback(cloud, label, c.api);
  }
  // A model list or a vocabulary probe of the wrong shape ends connect() with a CloudError.
  for (const char* models : {R"({"data":[{"id":5}]})", R"({"data":"m"})", "[[[[[[]]]]]]"}) {
    FakeCloud cloud([models](const Exchange& ex) {
      return ex.target == "/v1/models" ? http_answer(200, models) : http_answer(404, "{}");
    });
    expect_cloud_error(cloud, CloudError::Kind::Unavailable, "GET /v1/models", models, "openai");
  }
  FakeCloud probe([](const Exchange& ex) {
    return ex.target == "/tokenize" ? http_answer(200, R"({"vocab_hash":{"x":1}})")
                                    : http_answer(404, "{}");
  });
  expect_cloud_error(probe, CloudError::Kind::Unavailable, "'vocab_hash' is an object", "probe",
                     "llamacpp");
}

// ---- a malicious cloud: sizes, and the CLI end to end ----

TEST(AnswerCap, FollowsTheRequestWithinTheCeiling) {
  using cloud::answer_cap;
  EXPECT_EQ(answer_cap(64u << 20).bytes, cloud::kAnswerFixedBytes);
  EXPECT_EQ(answer_cap(64u << 20, {{16, cloud::kCompletionTokenBytes}}).bytes, (64u + 16) << 10);
  EXPECT_EQ(answer_cap(64u << 20, {{16, 64}, {100, 64}}).bytes, (64u << 10) + 116 * 64);
  EXPECT_EQ(answer_cap(1000, {{16, 64}}).bytes, 1000u);              // the ceiling wins
  EXPECT_EQ(answer_cap(SIZE_MAX, {{SIZE_MAX, 2}}).bytes, SIZE_MAX);  // saturates
  EXPECT_EQ(answer_cap(64u << 20).max_values(), 4096u);
}

// The shallow flood of the issue, {"data":[{},{},...]} of 60 MiB (under the 64 MiB ceiling), on
// every request of every API, with and without a Content-Length: refused at the request's cap
// (from the header, or as the body passes it), a CloudError, and the decoder falls back.
TEST_F(HostileCloudTest, ShallowFloodIsCutAtTheRequestsCap) {
  for (const char* api : {"tandem", "openai", "sglang", "llamacpp"}) {
    for (const bool chunked : {false, true}) {
      FakeCloud cloud([chunked](const Exchange&) { return Reply::flood(60u << 20, chunked); });
      const std::string label = std::string(api) + (chunked ? " chunked" : " content-length");
      expect_cloud_error(cloud, CloudError::Kind::Unavailable, "bytes", label, api);
      EdgeDecoder edge(*edge_, route_always(),
                       make_cloud_backend(cloud_options(cloud, api), *edge_));
      edge.start();
      const EdgeResult r = edge.generate(prompt_, kN);
      EXPECT_EQ(r.ids, local_) << label;
      EXPECT_EQ(r.stats.cloud_tokens, 0) << label;
      // Each refused answer was cut at its cap: far less than one flood crossed the network.
      EXPECT_LT(r.stats.bytes_down, 16u << 20) << label;
    }
  }
}

// A document of many values in few bytes under a large cap is refused by its count of values
// before the parser builds a tree (the tree would cost 27x the text).
TEST_F(HostileCloudTest, ManyValuesAreRefusedBeforeParsing) {
  std::string wide = R"({"pos":1,"x":[{})";
  for (int i = 0; i < 20000; ++i) wide += ",{}";
  wide += "]}";
  FakeCloud cloud(on_step(*honest_, 200, wide));
  expect_cloud_error(cloud, CloudError::Kind::Unavailable, "holds more than", "wide step");
  expect_local_fallback(cloud, "wide step");
}

// HttpCloudRows (router collect, eval --task wikitext) reads prompt log-probabilities and
// continuations with the same guards: ids checked against the vocabulary, values by type.
TEST(HostileCloudRows, OutOfRangeAndWrongTypedRowsAreCloudErrors) {
  constexpr int kVocab = 100;
  const std::vector<TokenId> chunk = {1, 2, 3, 4};
  // prompt_logprobs: null, then one row per later prompt token with the true token and `extra`.
  auto rows_answer = [&](const json& extra) {
    json pl = json::array({nullptr});
    for (size_t i = 1; i < chunk.size(); ++i) {
      json row = {{std::to_string(chunk[i]), {{"logprob", -1.0}, {"rank", 1}}}};
      row.merge_patch(extra);
      pl.push_back(row);
    }
    return json{{"choices", {{{"text", ""}, {"prompt_logprobs", pl}}}}}.dump();
  };
  struct Case {
    const char* label;
    std::string body;
    const char* needle;
  } cases[] = {
      {"id at n_vocab", rows_answer({{"100", {{"logprob", -0.5}, {"rank", 2}}}}), "key '100'"},
      {"negative id", rows_answer({{"-1", {{"logprob", -0.5}, {"rank", 2}}}}), "key '-1'"},
      {"id with junk", rows_answer({{"7x", {{"logprob", -0.5}, {"rank", 2}}}}), "key '7x'"},
      {"control key", rows_answer({{"\x1b[2J", {{"logprob", -0.5}}}}), "key '?[2J'"},
      {"logprob a string", rows_answer({{"2", {{"logprob", "x"}}}, {"3", {{"logprob", "x"}}}}),
       "'logprob' is a string"},
      {"rank a float", rows_answer({{"9", {{"logprob", -0.5}, {"rank", 1.5}}}}), "'rank'"},
      {"too many entries", rows_answer({{"9", {{"logprob", -0.5}}}, {"8", {{"logprob", -0.5}}}}),
       "at most 2 entries"},
      {"rows too short", json{{"choices", {{{"prompt_logprobs", {nullptr}}}}}}.dump(),
       "'prompt_logprobs'"},
      {"choices a string", R"({"choices":"x"})", "'choices'"},
      {"deep", nested_arrays(kDeep), "nests deeper"},
  };
  for (auto& c : cases) {
    FakeCloud cloud([&](const Exchange&) { return http_answer(200, c.body); });
    CloudOptions o;
    o.url = cloud.url();
    o.api = "openai";
    HttpCloudRows rows(o, kVocab);
    try {
      rows.rows(chunk, 0, 1);
      ADD_FAILURE() << c.label << ": no error";
    } catch (const CloudError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(c.needle), std::string::npos) << c.label << ": " << what;
      EXPECT_EQ(what.find('\x1b'), std::string::npos) << c.label;
    }
  }
  // Continuations: "token_id:N" with N in the vocabulary, no more than asked for.
  for (const char* tokens : {R"(["token_id:100"])", R"(["token_id:-3"])", R"([7])",
                             R"(["token_id:1","token_id:1","token_id:1"])", R"("x")"}) {
    const std::string body =
        std::string(R"({"choices":[{"text":"","logprobs":{"tokens":)") + tokens + "}}]}";
    FakeCloud cloud([&](const Exchange&) { return http_answer(200, body); });
    CloudOptions o;
    o.url = cloud.url();
    o.api = "openai";
    HttpCloudRows rows(o, kVocab);
    EXPECT_THROW(rows.continuation(chunk, 2), CloudError) << tokens;
  }
}

// The CLI against a malicious cloud: `tandem run` (OpenAI and native APIs) and `tandem router
// collect` as child processes. Each ends by exiting 0 (fell back to local decoding) or 1 with a
// one-line reason -- never by a signal --, prints no control character the cloud sent, and
// peaks within 128 MiB of a local run's resident set (both forked from this process).
class MaliciousCloudCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::filesystem::path(std::filesystem::temp_directory_path() /
                                     ("tandem-malicious-" + std::to_string(getpid())));
    std::filesystem::create_directories(*dir_);
    const testing::Ran local = testing::run_tandem(run_args("local", "", ""), *dir_);
    ASSERT_EQ(local.rc, 0) << local.err;
    local_rss_kib_ = local.max_rss_kib;
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }

  static std::string model() { return testing::testdata_path("models/synth-llama-Q4_0.gguf"); }
  static std::vector<std::string> run_args(const std::string& mode, const std::string& api,
                                           const std::string& url) {
    std::vector<std::string> a = {"run", "-m",     model(),  "-p", "The quick brown fox",
                                  "-n",  "8",      "--temp", "0",  "-t",
                                  "1",   "--mode", mode};
    if (!url.empty()) {
      a.insert(a.end(),
               {"--cloud", url, "--cloud-api", api, "--policy", "always", "--cloud-timeout", "5"});
    }
    return a;
  }
  static std::vector<std::string> collect_args(const std::string& url) {
    return {"router",
            "collect",
            "-m",
            model(),
            "--data",
            (testing::shared_dir() / "data").string(),
            "--out",
            (*dir_ / "t.trace").string(),
            "--overwrite",
            "--chunks",
            "1",
            "--chunk-tokens",
            "32",
            "-t",
            "1",
            "--cloud",
            url,
            "--cloud-timeout",
            "5"};
  }

  // What every run against a malicious cloud must satisfy.
  static void expect_contained(const testing::Ran& r, const std::string& label) {
    EXPECT_EQ(r.signal, 0) << label << ": killed by signal " << r.signal;
    EXPECT_TRUE(r.rc == 0 || r.rc == 1) << label << ": exit " << r.rc << "\n" << r.err;
    if (r.rc == 1) {
      // One line of reason: "error: ..." once, ending the output.
      const size_t at = r.err.rfind("error: ");
      ASSERT_NE(at, std::string::npos) << label << ": " << r.err;
      EXPECT_EQ(r.err.find('\n', at), r.err.size() - 1) << label << ": " << r.err;
      EXPECT_LT(r.err.size() - at, 2000u) << label;
    }
    for (const char c : r.err) {
      const auto u = static_cast<unsigned char>(c);
      EXPECT_FALSE((u < 0x20 && c != '\n') || u == 0x7f) << label << ": control byte " << int(u);
    }
    EXPECT_EQ(r.err.find("\xc2\x9b"), std::string::npos) << label << ": a C1 CSI";
    EXPECT_LE(r.max_rss_kib, local_rss_kib_ + (128 << 10))
        << label << ": peak " << r.max_rss_kib / 1024 << " MiB, local " << local_rss_kib_ / 1024
        << " MiB";
    std::fprintf(stderr, "[ rss ] %s: peak %ld MiB (local %ld MiB)\n", label.c_str(),
                 r.max_rss_kib / 1024, local_rss_kib_ / 1024);
  }

  static inline std::filesystem::path* dir_ = nullptr;
  static inline long local_rss_kib_ = 0;
};

// Every answer of the cloud, by API: a model list with a name full of terminal escapes, no
// /tokenize, and `completion` (with `status`) for completions, sessions and steps.
FakeCloud::Script every_answer(std::string completion, int status = 200) {
  return [completion, status](const Exchange& ex) -> Reply {
    if (ex.target == "/v1/models") {
      return http_answer(200, R"({"data":[{"id":"m\u001b]0;pwned\u0007\u001b[2J\u009b31m"}]})");
    }
    if (ex.target == "/tokenize") return http_answer(404, "{}");
    return http_answer(status, completion);
  };
}

struct Attack {
  const char* label;
  FakeCloud::Script script;
};

// The issue's shallow flood on every request: 60 MiB, with a Content-Length and chunked; then
// `more` attacks.
std::vector<Attack> floods_and(std::vector<Attack> more) {
  std::vector<Attack> all = {
      {"60 MiB flood, content-length",
       [](const Exchange&) { return Reply::flood(60u << 20, false); }},
      {"60 MiB flood, chunked", [](const Exchange&) { return Reply::flood(60u << 20, true); }}};
  all.insert(all.end(), more.begin(), more.end());
  return all;
}

TEST_F(MaliciousCloudCli, RunFallsBackWithinMemory) {
  const std::vector<Attack> attacks = floods_and({
      {"deep", every_answer(nested_arrays(kDeep))},
      {"wrong types", every_answer(R"({"choices":[{"text":5,"logprobs":[],"finish_reason":{}}]})")},
      {"token id out of range",
       every_answer(R"({"choices":[{"text":"","logprobs":{"tokens":["token_id:2147483647"]}}]})")},
      {"negative token id",
       every_answer(R"({"choices":[{"text":"","logprobs":{"tokens":["token_id:-1"]}}]})")},
      {"control characters",
       every_answer(R"({"error":{"message":"\u001b[2J\u001b]0;x\u0007gone\r\nfake: ok"}})", 500)},
  });
  for (const Attack& c : attacks) {
    FakeCloud cloud(c.script);
    for (const char* api : {"openai", "tandem"}) {
      const std::string label = std::string(c.label) + " (" + api + ")";
      const testing::Ran r = testing::run_tandem(run_args("route", api, cloud.url()), *dir_);
      expect_contained(r, label);
      EXPECT_EQ(r.rc, 0) << label << ": " << r.err;  // a cloud never stops a local answer
    }
  }
}

TEST_F(MaliciousCloudCli, RouterCollectStopsWithOneLine) {
  // prompt_logprobs rows of the request's own prompt, each with the true token and `extra`.
  auto rows = [](const json& extra) -> FakeCloud::Script {
    return [extra](const Exchange& ex) -> Reply {
      const json req = json::parse(ex.body, nullptr, false);
      json pl = json::array({nullptr});
      if (req.is_object() && req.contains("prompt")) {
        for (size_t i = 1; i < req["prompt"].size(); ++i) {
          json row = {{std::to_string(req["prompt"][i].get<int>()), {{"logprob", -1.0}}}};
          row.merge_patch(extra);
          pl.push_back(row);
        }
      }
      return http_answer(200, json{{"choices", {{{"text", ""}, {"prompt_logprobs", pl}}}}}.dump());
    };
  };
  const std::vector<Attack> attacks = floods_and({
      {"deep", [](const Exchange&) -> Reply { return http_answer(200, nested_arrays(kDeep)); }},
      {"wrong types", rows({{"1", {{"logprob", "high"}, {"rank", 1}}}})},
      {"token id out of range", rows({{"2147483647", {{"logprob", -0.1}, {"rank", 1}}}})},
      {"negative token id", rows({{"-7", {{"logprob", -0.1}, {"rank", 1}}}})},
      {"control characters", rows({{"\x1b[2J\x07", {{"logprob", -0.1}, {"rank", 1}}}})},
      {"control characters in an error",
       [](const Exchange&) -> Reply {
         return http_answer(500, R"({"error":{"message":"\u001b[2Jbad\u0007\r\nerror: fake"}})");
       }},
  });
  for (const Attack& c : attacks) {
    FakeCloud cloud(c.script);
    const testing::Ran r = testing::run_tandem(collect_args(cloud.url()), *dir_);
    expect_contained(r, c.label);
    EXPECT_EQ(r.rc, 1) << c.label << ": " << r.err;
  }
}

}  // namespace
}  // namespace tandem
