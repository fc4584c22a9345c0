// Error paths of `tandem serve` that had no test (issue 21): 409 session_busy, 503 when every
// session slot is busy, --max-sse 429, --max-connections 503 and --api-key-file. Each test starts
// a real server on a synthetic model and drives it over real sockets on 127.0.0.1. Nothing here
// is timed: a "busy" state is proven by the server's own answer before it is relied upon, and
// loops that wait for the server end when the awaited work has finished (or after a bound that
// only detects a hang).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/testdata.h"
#include "server_harness.h"

namespace tandem::testing {
namespace {

std::string model_path() {
  return testdata_path("models/synth-llama-Q8_0.gguf");
}

std::string step_path(const std::string& id) {
  return "/tandem/v1/sessions/" + id + "/step";
}

std::string new_session(TestClient& c) {
  const HttpResult r = c.post("/tandem/v1/sessions", json::object());
  EXPECT_EQ(r.status, 201) << r.body;
  return r.j().value("session", std::string());
}

std::string error_code(const HttpResult& r) {
  const json j = r.j();
  if (!j.is_object() || !j.contains("error")) return "";
  return j["error"].value("code", std::string());
}

// A step that keeps the engine busy for a while: 1 appended token, then `n` generated ones.
json long_step(int n) {
  return {{"expected_pos", 0}, {"append", {1}}, {"generate", {{"n", n}}}};
}

// Runs `long_step(n)` on `id` in a thread; `done` turns true when its answer came.
struct LongStep {
  LongStep(int port, const std::string& id, int n)
      : thread([this, port, id, n] {
          TestClient c(port);
          result = c.post(step_path(id), long_step(n), 300);
          done = true;
        }) {}
  ~LongStep() {
    if (thread.joinable()) thread.join();
  }
  HttpResult result;
  std::atomic<bool> done{false};
  std::thread thread;
};

// Probes `id` with a sync step that only fits once the long step's append is in the history
// (expected_pos 1): before that it is a position mismatch, while the long step runs it is
// session_busy, afterwards a position mismatch again. True once session_busy was seen.
bool wait_until_busy(TestClient& probe, const std::string& id, const LongStep& running,
                     HttpResult* busy_answer) {
  while (!running.done) {
    const HttpResult r = probe.post(step_path(id), {{"expected_pos", 1}});
    if (error_code(r) == "session_busy") {
      *busy_answer = r;
      return true;
    }
  }
  return false;
}

// A blocking socket to the server, for requests the keep-alive TestClient cannot make (streams
// read only in part, connections held open).
class RawConnection {
 public:
  explicit RawConnection(int port) : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    timeval tv{.tv_sec = 60, .tv_usec = 0};  // a hang detector, not a timing assertion
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      throw std::runtime_error("connect to 127.0.0.1:" + std::to_string(port));
    }
  }
  ~RawConnection() { close(fd_); }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  bool send_post(const std::string& target, const std::string& body) {
    return send_all("POST " + target +
                    " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
                    "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
  }
  bool send_get(const std::string& target) {
    return send_all("GET " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  }
  // Reads until `needle` has arrived or the server closed the connection; returns all read.
  std::string read_until(const std::string& needle) {
    while (received_.find(needle) == std::string::npos) {
      char buf[4096];
      const ssize_t n = recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) break;
      received_.append(buf, static_cast<size_t>(n));
    }
    return received_;
  }

 private:
  // False when the server closed the connection first (it may answer and close at accept).
  bool send_all(const std::string& s) {
    size_t sent = 0;
    while (sent < s.size()) {
      const ssize_t n = ::send(fd_, s.data() + sent, s.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return false;
      sent += static_cast<size_t>(n);
    }
    return true;
  }
  int fd_;
  std::string received_;
};

// Retries `attempt` until it returns true; false after `bound` (which only detects a hang).
template <class F>
bool eventually(F attempt, std::chrono::seconds bound = std::chrono::seconds(60)) {
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < bound) {
    if (attempt()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// Two steps on one session at once: the second is 409 session_busy with the server's position;
// the first is unharmed and the session works afterwards.
TEST(ServerErrorPaths, ConcurrentStepIs409SessionBusy) {
  ServerProcess server(model_path(), {"-c", "4096", "--max-generate", "4000"});
  TestClient c = server.client();
  const std::string id = new_session(c);
  HttpResult busy;
  {
    LongStep running(server.port(), id, 4000);
    ASSERT_TRUE(wait_until_busy(c, id, running, &busy))
        << "the long step ended before a concurrent step was refused as busy";
    running.thread.join();
    ASSERT_EQ(running.result.status, 200) << running.result.body;
    EXPECT_EQ(running.result.j()["tokens"].size(), 4000u);
  }
  EXPECT_EQ(busy.status, 409) << busy.body;
  // The server's history length at that moment: the append plus what it generated so far.
  const int busy_pos = busy.j()["error"].value("pos", -1);
  EXPECT_GE(busy_pos, 1) << busy.body;
  EXPECT_LE(busy_pos, 4001) << busy.body;
  EXPECT_NE(busy.j()["error"]["message"].get<std::string>().find(id), std::string::npos);
  const HttpResult next = c.post(step_path(id), {{"expected_pos", 4001}, {"generate", {{"n", 1}}}});
  EXPECT_EQ(next.status, 200) << next.body;
}

// --max-sessions 2 with both sessions running a step: a create cannot evict either and gets 429
// `overloaded` with Retry-After (issue 21: "otherwise 429"); once they are idle, a create by
// their own client evicts one again.
TEST(ServerErrorPaths, CreateWhileAllSessionsBusyIs429) {
  ServerProcess server(model_path(),
                       {"-c", "4096", "--max-generate", "4000", "--max-sessions", "2"});
  TestClient c = server.client();
  const std::string a = new_session(c), b = new_session(c);
  {
    LongStep run_a(server.port(), a, 4000), run_b(server.port(), b, 4000);
    HttpResult busy;
    ASSERT_TRUE(wait_until_busy(c, a, run_a, &busy)) << "session a's step ended too early";
    ASSERT_TRUE(wait_until_busy(c, b, run_b, &busy)) << "session b's step ended too early";
    const HttpResult refused = c.post("/tandem/v1/sessions", json::object());
    const bool both_still_running = !run_a.done && !run_b.done;
    if (both_still_running) {
      EXPECT_EQ(refused.status, 429) << refused.body;
      EXPECT_EQ(error_code(refused), "overloaded") << refused.body;
      EXPECT_EQ(refused.retry_after, "1");
    } else {
      ADD_FAILURE() << "a long step ended before the create was answered; raise its length";
    }
    run_a.thread.join();
    run_b.thread.join();
    EXPECT_EQ(run_a.result.status, 200) << run_a.result.body;
    EXPECT_EQ(run_b.result.status, 200) << run_b.result.body;
  }
  EXPECT_EQ(c.post("/tandem/v1/sessions", json::object()).status, 201);
}

std::string stream_body(int max_tokens) {
  return json{{"prompt", {1, 2, 3}},
              {"max_tokens", max_tokens},
              {"temperature", 0},
              {"ignore_eos", true},
              {"stream", true}}
      .dump();
}

// --max-sse 1: while one stream is open a second is 429 with Retry-After (a plain request is
// still served); after the first client hangs up, streams are accepted again.
TEST(ServerErrorPaths, MaxSseRefusesASecondStreamWith429) {
  ServerProcess server(model_path(), {"-c", "4096", "--max-generate", "4000", "--max-sse", "1"});
  TestClient c = server.client();
  {
    RawConnection first(server.port());
    ASSERT_TRUE(first.send_post("/v1/completions", stream_body(4000)));
    const std::string head = first.read_until("data: ");
    ASSERT_NE(head.find("200 OK"), std::string::npos) << head.substr(0, 300);
    const HttpResult second = c.request("POST", "/v1/completions", stream_body(4));
    EXPECT_EQ(second.status, 429) << second.body;
    EXPECT_EQ(error_code(second), "overloaded") << second.body;
    EXPECT_EQ(second.retry_after, "1");
    const HttpResult plain =
        c.post("/v1/completions", {{"prompt", {1, 2}}, {"max_tokens", 2}, {"temperature", 0}});
    EXPECT_EQ(plain.status, 200) << plain.body;
  }  // the first client hangs up here
  EXPECT_TRUE(eventually([&] {
    return c.request("POST", "/v1/completions", stream_body(2)).status == 200;
  })) << "streams stayed refused after the only open stream's client left";
}

// --max-connections 3: with three connections open and none of them idle between requests
// (these have not sent one yet; an idle keep-alive connection would make way, see
// Connections.IdleKeepAliveConnectionsMakeWayAtTheCaps), a fourth connection is answered 503 with
// Retry-After and closed; when one of the three leaves, a new connection is served.
TEST(ServerErrorPaths, MaxConnectionsAnswers503) {
  ServerProcess server(model_path(), {"--max-connections", "3"});
  std::vector<std::unique_ptr<RawConnection>> held;
  for (int i = 0; i < 3; ++i) held.push_back(std::make_unique<RawConnection>(server.port()));
  {
    RawConnection extra(server.port());
    extra.send_get("/health");
    const std::string answer = extra.read_until("\r\n\r\n");
    EXPECT_EQ(answer.rfind("HTTP/1.1 503", 0), 0u) << answer;
    EXPECT_NE(answer.find("Retry-After: 1"), std::string::npos) << answer;
    // The server closes it: reading on ends with EOF, not with a timeout.
    const std::string all = extra.read_until("never sent");
    EXPECT_EQ(all.find("never sent"), std::string::npos);
  }
  held.pop_back();  // one of the three leaves
  EXPECT_TRUE(eventually([&] {
    TestClient fresh(server.port());
    try {
      return fresh.get("/health").status == 200;
    } catch (const std::exception&) {
      return false;
    }
  })) << "no new connection was served after one of the three closed";
}

std::string write_temp(const std::string& name, const std::string& content) {
  const auto p = std::filesystem::temp_directory_path() /
                 (name + "-" + std::to_string(getpid()) + "-" + std::to_string(rand()));
  std::ofstream(p) << content;
  return p.string();
}

// --api-key-file: the key from the file (trailing whitespace dropped) is required on every route
// but /health; an empty or missing file stops the server at start-up.
TEST(ServerErrorPaths, ApiKeyFileIsEnforced) {
  const std::string file = write_temp("tandem-keyfile", "file-sesame \n");
  {
    ServerProcess server(model_path(), {"--api-key-file", file});
    TestClient good(server.port(), false, "file-sesame");
    TestClient none(server.port());
    TestClient wrong(server.port(), false, "file-sesame2");
    TestClient prefix(server.port(), false, "file-sesam");
    EXPECT_EQ(none.get("/health").status, 200);
    EXPECT_EQ(none.post("/tandem/v1/sessions", json::object()).status, 401);
    EXPECT_EQ(error_code(none.get("/v1/models")), "unauthorized");
    EXPECT_EQ(wrong.get("/v1/models").status, 401);
    EXPECT_EQ(prefix.get("/v1/models").status, 401);
    EXPECT_EQ(none.get("/metrics").status, 401);
    EXPECT_EQ(good.get("/v1/models").status, 200);
    EXPECT_EQ(good.post("/tandem/v1/sessions", json::object()).status, 201);
  }
  std::filesystem::remove(file);
  const std::string empty = write_temp("tandem-keyfile-empty", " \n");
  const std::vector<std::string> with_empty = {"--api-key-file", empty};
  const std::vector<std::string> with_missing = {"--api-key-file", "/nonexistent/tandem/keys"};
  EXPECT_THROW(ServerProcess(model_path(), with_empty), std::runtime_error);
  EXPECT_THROW(ServerProcess(model_path(), with_missing), std::runtime_error);
  std::filesystem::remove(empty);
}

}  // namespace
}  // namespace tandem::testing
