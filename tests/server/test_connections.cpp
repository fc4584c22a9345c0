// Hostile and vanishing clients of `tandem serve`, over real sockets on 127.0.0.1: slowloris
// sockets closed at the header and body deadlines, the per-address connection cap, a reader
// that never reads its stream, clients that hang up while their job is queued or running
// (completions and native steps), and the drain deadline at SIGTERM. Each test starts its own
// server process on a testdata model; every wait is bounded and generous (a hang fails, no
// timing is asserted).
#include <gtest/gtest.h>
#include <poll.h>

#include <atomic>
#include <functional>
#include <memory>
#include <thread>

#include "common/testdata.h"
#include "server_harness.h"

namespace tandem::testing {
namespace {

std::string model_path() {
  return testdata_path("models/synth-llama-Q8_0.gguf");
}

// Long enough that a request of kLongTokens takes seconds on the synthetic model, so that a
// hang-up or a signal lands while it runs.
const std::vector<std::string> kLongContext = {"-c", "8192", "--max-generate", "8000"};
constexpr int kLongTokens = 7000;

json long_completion(bool stream = false) {
  return {
      {"prompt", "hello"}, {"max_tokens", kLongTokens}, {"ignore_eos", true}, {"stream", stream}};
}

bool wait_until(const std::function<bool()>& done, double timeout_s) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// The value of one series of /metrics (e.g. `tandem_queue_length` or
// `tandem_read_timeouts_total{part="header"}`); -1 when absent.
double metric(TestClient& c, const std::string& series) {
  const std::string m = "\n" + c.get("/metrics").body;
  const size_t at = m.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(m.substr(at + series.size() + 2));
}

std::string post_text(const std::string& path, const std::string& body) {
  return "POST " + path +
         " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

// A bare client socket: sends what a test says, reads only when told to.
class RawSocket {
 public:
  explicit RawSocket(int port, int receive_buffer = 0) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    if (receive_buffer > 0)
      setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof receive_buffer);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    if (connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
      throw std::runtime_error("connect");
  }
  ~RawSocket() { hang_up(); }
  RawSocket(const RawSocket&) = delete;
  RawSocket& operator=(const RawSocket&) = delete;

  void send_text(const std::string& s) {
    if (::send(fd_, s.data(), s.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(s.size()))
      throw std::runtime_error("send");
  }
  void hang_up() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  // Reads until the server closes the connection, for at most `timeout_s`; nullopt when it
  // was still open then.
  std::optional<std::string> read_to_close(double timeout_s) {
    std::string got;
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char buf[4096];
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) return got;  // closed or reset
      got.append(buf, static_cast<size_t>(n));
    }
  }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};

// Every silent or half-sent socket is closed once the header deadline passes, while an honest
// keep-alive client is answered throughout; a body trickled too slowly is closed at the body
// deadline. The sockets fill --max-connections, so until they close a newcomer is refused.
TEST(Connections, SlowlorisSocketsAreClosedAtTheDeadlines) {
  constexpr int kCap = 24;
  ServerProcess server(model_path(),
                       {"--max-connections", std::to_string(kCap), "--max-connections-per-ip", "0",
                        "--header-timeout", "2", "--body-timeout", "2"});
  TestClient honest = server.client();
  ASSERT_EQ(honest.get("/health").status, 200);
  std::vector<std::unique_ptr<RawSocket>> attackers;
  for (int i = 0; i < kCap - 2; ++i) {
    attackers.push_back(std::make_unique<RawSocket>(server.port()));
    if (i % 2 == 1) attackers.back()->send_text("POST /v1/completions HTTP/1.1\r\nHost: x\r\n");
  }
  auto trickler = std::make_unique<RawSocket>(server.port());
  trickler->send_text("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{");
  const HttpResult r =
      honest.post("/v1/completions", {{"prompt", "hello"}, {"max_tokens", 4}}, /*timeout_s=*/60);
  EXPECT_EQ(r.status, 200) << r.body;
  for (auto& a : attackers) {
    EXPECT_TRUE(a->read_to_close(/*timeout_s=*/60).has_value())
        << "a silent socket must be closed at the header deadline";
  }
  const auto trickled = trickler->read_to_close(60);
  ASSERT_TRUE(trickled.has_value()) << "a trickled body must be closed at the body deadline";
  EXPECT_EQ(trickled->find("200 OK"), std::string::npos);
  EXPECT_EQ(honest.get("/health").status, 200);
  TestClient newcomer = server.client();
  EXPECT_EQ(newcomer.get("/health").status, 200) << "the slots of the closed sockets are free";
  // The counters move just after the sockets close (another I/O thread may still be on it):
  // wait for them, with a deadline only to catch a counter that never moves.
  const auto counted = [&](const char* name, double at_least) {
    for (int i = 0; i < 200 && metric(honest, name) < at_least; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return metric(honest, name);
  };
  EXPECT_GE(counted("tandem_read_timeouts_total{part=\"header\"}", kCap - 2), kCap - 2);
  EXPECT_GE(counted("tandem_read_timeouts_total{part=\"body\"}", 1), 1);
}

// Connections beyond --max-connections-per-ip are answered 503 with Retry-After and closed once
// no idle keep-alive connection of the address is left to make way; once the extra ones close,
// new ones are taken again.
TEST(Connections, PerAddressCapAnswers503) {
  constexpr int kPerIp = 4;
  ServerProcess server(
      model_path(), {"--max-connections-per-ip", std::to_string(kPerIp), "--header-timeout", "60"});
  TestClient honest = server.client();
  ASSERT_EQ(honest.get("/health").status, 200);
  // Two more than the cap allows: the honest connection, idle, makes way for one of them (as
  // does the harness's health probe, if the server has not seen it close yet).
  std::vector<std::unique_ptr<RawSocket>> extra;
  for (int i = 0; i < kPerIp + 2; ++i) extra.push_back(std::make_unique<RawSocket>(server.port()));
  std::vector<pollfd> fds;
  for (auto& s : extra) fds.push_back({s->fd(), POLLIN, 0});
  ASSERT_GT(::poll(fds.data(), fds.size(), 30000), 0) << "no connection was refused";
  int refused = 0;
  for (size_t i = 0; i < extra.size(); ++i) {
    if (!(fds[i].revents & POLLIN)) continue;
    const auto answer = extra[i]->read_to_close(30);
    ASSERT_TRUE(answer.has_value());
    EXPECT_NE(answer->find("HTTP/1.1 503"), std::string::npos) << *answer;
    EXPECT_NE(answer->find("Retry-After: 1"), std::string::npos) << *answer;
    ++refused;
  }
  EXPECT_GE(refused, 1);
  extra.clear();  // hang up
  EXPECT_TRUE(wait_until(
      [&] {
        try {
          TestClient fresh = server.client();
          return fresh.get("/health").status == 200;
        } catch (const std::exception&) {
          return false;
        }
      },
      30))
      << "once the silent sockets close, a new connection is served";
  EXPECT_GE(metric(honest, "tandem_refused_connections_total{cap=\"per_ip\"}"), refused);
  EXPECT_GE(metric(honest, "tandem_evicted_connections_total{why=\"idle\"}"), 1);
}

// A client that asks for a long stream and never reads it is dropped once its write queue is
// over --max-write-queue; the job stops and the server stays healthy.
TEST(Connections, ReaderThatNeverReadsIsDropped) {
  ServerProcess server(model_path(), {"--max-write-queue", "65536"});
  TestClient honest = server.client();
  RawSocket lazy(server.port(), /*receive_buffer=*/4096);
  // Every streamed token carries its top-20 log-probabilities: megabytes in all.
  json body = long_completion(/*stream=*/true);
  body["max_tokens"] = 4000;
  body["logprobs"] = 20;
  lazy.send_text(post_text("/v1/completions", body.dump()));
  EXPECT_TRUE(
      wait_until([&] { return metric(honest, "tandem_slow_clients_dropped_total") >= 1; }, 120));
  EXPECT_TRUE(wait_until([&] { return metric(honest, "tandem_queue_length") == 0; }, 60))
      << "the dropped client's job stops";
  EXPECT_TRUE(wait_until([&] { return metric(honest, "tandem_sse_clients") == 0; }, 60));
  EXPECT_GE(metric(honest, "tandem_cancelled_jobs_total"), 1);
  const HttpResult r = honest.post("/v1/completions", {{"prompt", "hello"}, {"max_tokens", 4}});
  EXPECT_EQ(r.status, 200) << r.body;
}

// Token 462 of the synthetic vocabulary is sixteen spaces: a /detokenize body whose answer is
// about `answer_bytes` long (4 bytes of body per 16 of answer).
json spaces_request(size_t answer_bytes) {
  return {{"tokens", std::vector<int>(answer_bytes / 16, 462)}};
}

// Bytes one connection may have queued beyond the bounds: a small answer into an empty queue.
constexpr double kSmallAnswer = 16 << 10;

// Waits until the server has answered (or refused) `n` /detokenize requests in all.
bool detokenized(TestClient& c, int n) {
  return wait_until(
      [&] {
        double done = 0;
        for (const char* status : {"200", "413", "503"}) {
          done += std::max(0.0, metric(c, std::string("tandem_requests_total{route=\"/detokenize\","
                                                      "status=\"") +
                                              status + "\"}"));
        }
        return done >= n;
      },
      120);
}

// Eight clients ask for 6 MiB answers and never read them: the answers queued in all stay under
// --max-write-total (the rest are refused before they are built), and once the non-readers have
// stalled past --slow-reader-grace, a client that reads gets its whole 6 MiB answer: the
// stalled ones are closed to make room.
TEST(Connections, UnreadAnswersStayUnderTheTotal) {
  constexpr double kTotal = 16 << 20;
  ServerProcess server(model_path(), {"--max-write-total", std::to_string(int64_t{16} << 20),
                                      "--max-body", "4194304", "--slow-reader-grace", "0.5"});
  TestClient honest = server.client();
  const std::string request = post_text("/detokenize", spaces_request(6 << 20).dump());
  std::vector<std::unique_ptr<RawSocket>> lazy;
  for (int i = 0; i < 8; ++i) {
    lazy.push_back(std::make_unique<RawSocket>(server.port(), /*receive_buffer=*/4096));
    lazy.back()->send_text(request);
  }
  ASSERT_TRUE(detokenized(honest, 8));
  // At most two 6 MiB answers fit in the total: each of the other six was refused, or made room
  // by closing a reader stalled past the grace (on a slow machine the first answers are already
  // past it while the later ones are built). The last one taken is still held.
  const double queued = metric(honest, "tandem_write_queued_bytes");
  EXPECT_GE(queued, 5 << 20)
      << "the answer taken last is held, never read (less what the socket took)";
  EXPECT_LE(queued, kTotal + 9 * kSmallAnswer);
  EXPECT_GE(metric(honest, "tandem_answers_refused_total{bound=\"total\"}") +
                metric(honest, "tandem_evicted_connections_total{why=\"slow_reader\"}"),
            6);
  std::this_thread::sleep_for(std::chrono::seconds(1));  // the non-readers stall past the grace
  const HttpResult r = honest.post("/detokenize", spaces_request(6 << 20));
  ASSERT_EQ(r.status, 200) << r.body.substr(0, 300);
  // Whole, but for the leading space that decoding removes.
  EXPECT_EQ(r.j()["content"].get<std::string>().size(), (size_t{6} << 20) - 1);
  EXPECT_GE(metric(honest, "tandem_evicted_connections_total{why=\"slow_reader\"}"), 1);
  EXPECT_LE(metric(honest, "tandem_write_queued_bytes"), kTotal + 9 * kSmallAnswer);
  EXPECT_EQ(honest.get("/health").status, 200);
}

// An answer whose size is known before it is built reserves its bytes first: over
// --max-write-queue it is answered 413, and while non-readers fill --max-write-total, 503 with
// Retry-After (--slow-reader-grace is long here, so nobody is closed to make room).
TEST(Connections, ReservationsAnswer413And503) {
  ServerProcess server(model_path(), {"--max-write-total", std::to_string(int64_t{12} << 20),
                                      "--max-body", "4194304", "--slow-reader-grace", "600"});
  TestClient honest = server.client();
  const HttpResult big = honest.post("/detokenize", spaces_request(9 << 20));
  EXPECT_EQ(big.status, 413) << big.body.substr(0, 300);
  EXPECT_EQ(big.j()["error"]["code"], "too_large");
  const std::string request = post_text("/detokenize", spaces_request(5 << 20).dump());
  std::vector<std::unique_ptr<RawSocket>> lazy;
  for (int i = 0; i < 2; ++i) {
    lazy.push_back(std::make_unique<RawSocket>(server.port(), /*receive_buffer=*/4096));
    lazy.back()->send_text(request);
  }
  ASSERT_TRUE(detokenized(honest, 3));
  const HttpResult full = honest.post("/detokenize", spaces_request(5 << 20));
  EXPECT_EQ(full.status, 503) << full.body.substr(0, 300);
  EXPECT_EQ(full.retry_after, "1");
  EXPECT_EQ(honest.post("/detokenize", spaces_request(1024)).status, 200) << "small ones fit";
  EXPECT_GE(metric(honest, "tandem_answers_refused_total{bound=\"connection\"}"), 1);
  EXPECT_GE(metric(honest, "tandem_answers_refused_total{bound=\"total\"}"), 1);
  EXPECT_EQ(metric(honest, "tandem_evicted_connections_total{why=\"slow_reader\"}"), 0);
}

// /tokenize with pieces reserves its answer too: 256 KiB of text is some 3 MB of pieces.
TEST(Connections, TokenizeReservesItsAnswer) {
  ServerProcess server(model_path(), {"--max-write-queue", "1048576"});
  TestClient c = server.client();
  std::string text;
  while (text.size() < (200 << 10)) text += "hello world ";
  const HttpResult r = c.post("/tokenize", {{"content", text}, {"with_pieces", true}});
  EXPECT_EQ(r.status, 413) << r.body.substr(0, 300);
  EXPECT_EQ(c.post("/tokenize", {{"content", text}}).status, 200) << "ids alone fit";
  // The answer is written without a json tree, byte for byte as the tree's dump was.
  const HttpResult small = c.post("/tokenize", {{"content", "hello world"}, {"with_pieces", true}});
  EXPECT_EQ(small.body,
            R"({"n_vocab":2048,"tokens":[{"id":1,"piece":"<s>"},{"id":1081,"piece":" hel"},)"
            R"({"id":417,"piece":"lo"},{"id":281,"piece":" w"},{"id":1613,"piece":"orld"}],)"
            R"("vocab_hash":"44cf87271e39ab39"})");
}

// At --max-connections (and at --max-connections-per-ip), a new connection closes the oldest
// idle keep-alive connection instead of being refused; the closed client reconnects.
TEST(Connections, IdleKeepAliveConnectionsMakeWayAtTheCaps) {
  for (const auto& cap :
       {std::vector<std::string>{"--max-connections", "6", "--max-connections-per-ip", "0"},
        std::vector<std::string>{"--max-connections-per-ip", "6"}}) {
    ServerProcess server(model_path(), cap);
    std::vector<std::unique_ptr<TestClient>> idle;
    for (int i = 0; i < 6; ++i) idle.push_back(std::make_unique<TestClient>(server.port()));
    for (auto& c : idle) ASSERT_EQ(c->get("/health").status, 200);
    TestClient newcomer = server.client();
    EXPECT_EQ(newcomer.get("/health").status, 200) << cap[0];
    EXPECT_GE(metric(newcomer, "tandem_evicted_connections_total{why=\"idle\"}"), 1) << cap[0];
  }
}

// A client sends `request` on a bare socket, waits until the server has it queued or running
// (`in_queue` jobs in all), and hangs up; the job is cancelled, and the next request is served.
void expect_cancelled_on_hang_up(ServerProcess& server, TestClient& honest,
                                 const std::string& request, int in_queue) {
  const double cancelled_before = metric(honest, "tandem_cancelled_jobs_total");
  RawSocket client(server.port());
  client.send_text(request);
  ASSERT_TRUE(wait_until([&] { return metric(honest, "tandem_queue_length") >= in_queue; }, 60));
  client.hang_up();
  EXPECT_TRUE(wait_until(
      [&] { return metric(honest, "tandem_cancelled_jobs_total") >= cancelled_before + 1; }, 60))
      << "the job of a client that hung up is cancelled";
  EXPECT_GE(metric(honest, "tandem_client_disconnects_total"), 1);
}

TEST(Connections, HangUpCancelsRunningCompletion) {
  ServerProcess server(model_path(), kLongContext);
  TestClient honest = server.client();
  expect_cancelled_on_hang_up(server, honest,
                              post_text("/v1/completions", long_completion().dump()), 1);
  EXPECT_TRUE(wait_until([&] { return metric(honest, "tandem_queue_length") == 0; }, 60));
  const HttpResult r = honest.post("/v1/completions", {{"prompt", "hello"}, {"max_tokens", 4}});
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_GE(metric(honest, "tandem_cancelled_jobs_total"), 1);
}

// With one stateless slot busy, a second request waits in the queue; its client hangs up and
// it leaves the queue while the first one runs on.
TEST(Connections, HangUpCancelsQueuedCompletion) {
  ServerProcess server(model_path(), {"-c", "8192", "--max-generate", "8000", "--parallel", "1"});
  TestClient honest = server.client();
  RawSocket runner(server.port());
  runner.send_text(post_text("/v1/completions", long_completion().dump()));
  ASSERT_TRUE(wait_until([&] { return metric(honest, "tandem_queue_length") >= 1; }, 60));
  expect_cancelled_on_hang_up(
      server, honest, post_text("/completion", json{{"prompt", "hi"}, {"n_predict", 8}}.dump()), 2);
  EXPECT_EQ(metric(honest, "tandem_queue_length"), 1) << "the running job is untouched";
  runner.hang_up();
  EXPECT_TRUE(wait_until([&] { return metric(honest, "tandem_queue_length") == 0; }, 60));
  const HttpResult r = honest.post("/v1/completions", {{"prompt", "hello"}, {"max_tokens", 4}});
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_GE(metric(honest, "tandem_cancelled_jobs_total"), 2);
}

// A native step whose device hangs up is cancelled, and the session is left as before the
// step: the same step sent again is taken (same expected_pos) and answered.
TEST(Connections, HangUpCancelsNativeStepAndTheStepCanBeResent) {
  ServerProcess server(model_path(), kLongContext);
  TestClient honest = server.client();
  const HttpResult created = honest.post("/tandem/v1/sessions", json::object());
  ASSERT_EQ(created.status, 201) << created.body;
  const std::string path =
      "/tandem/v1/sessions/" + created.j()["session"].get<std::string>() + "/step";
  json step = {{"expected_pos", 0}, {"append", {1, 2, 3}}, {"generate", {{"n", kLongTokens}}}};
  expect_cancelled_on_hang_up(server, honest, post_text(path, step.dump()), 1);
  EXPECT_TRUE(wait_until([&] { return metric(honest, "tandem_queue_length") == 0; }, 60));
  step["generate"]["n"] = 4;
  const HttpResult again = honest.post(path, step);
  ASSERT_EQ(again.status, 200) << again.body;
  EXPECT_EQ(again.j()["pos"], 3 + 4);
}

// SIGTERM with --drain-timeout 1 while two long requests run: after the deadline the plain one
// is answered 503, the stream gets an error event and ends, and the process exits 0.
TEST(Connections, DrainTimeoutAnswers503AndExitsZero) {
  std::vector<std::string> flags = kLongContext;
  flags.insert(flags.end(), {"--drain-timeout", "1", "--parallel", "2"});
  ServerProcess server(model_path(), flags);
  TestClient probe = server.client();
  HttpResult plain, stream;
  std::thread a([&] {
    TestClient c = server.client();
    plain = c.post("/v1/completions", long_completion(), /*timeout_s=*/120);
  });
  std::thread b([&] {
    TestClient c = server.client();
    stream = c.post("/v1/completions", long_completion(/*stream=*/true), /*timeout_s=*/120);
  });
  const bool running = wait_until([&] { return metric(probe, "tandem_queue_length") >= 2; }, 60);
  EXPECT_TRUE(running) << "both requests run before the signal";
  EXPECT_EQ(server.stop(/*grace_s=*/60), 0);
  a.join();
  b.join();
  EXPECT_EQ(plain.status, 503) << plain.body;
  EXPECT_NE(plain.body.find("unavailable"), std::string::npos) << plain.body;
  EXPECT_EQ(stream.status, 200);
  EXPECT_NE(stream.body.find("\"unavailable\""), std::string::npos)
      << "the stream ends with an error event";
}

}  // namespace
}  // namespace tandem::testing
