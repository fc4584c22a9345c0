// Pipelined steps over real sockets (issue 24): a step with "queue": true waits behind its
// session's running step and runs after it, in arrival order, checked against the history the
// earlier steps left; POST .../cancel stops the steps that build on an abandoned position; a
// rewind whose append repeats the cut tail keeps that tail's KV. Old clients see what they saw:
// without "queue" a busy session is still 409 session_busy.
//
// A "long" step generates kLongTokens tokens on the synthetic model (about a second or more),
// so that other requests land while it runs; every wait is bounded, no timing is asserted.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <thread>

#include "common/protocol_hash.h"
#include "common/testdata.h"
#include "server_harness.h"

namespace tandem::testing {
namespace {

const std::vector<std::string> kLong = {"-c", "8192", "--max-generate", "8000"};
constexpr int kLongTokens = 4000;
// Greedy from this prompt, the synthetic llama runs kLongTokens without an end-of-generation
// token, so a long step always ends at kLongTokens.
const std::vector<int> kPrompt = {1, 2, 3};
constexpr int kAfterLong = 3 + kLongTokens;  // the history after {append kPrompt, generate long}

std::string model_path() {
  return testdata_path("models/synth-llama-Q8_0.gguf");
}

const char* kAliceKey = "alice-key-0123456789";
const char* kBobKey = "bob-key-0123456789";

// A key file with the clients alice and bob, for --api-key-file.
std::string key_file() {
  const auto path = std::filesystem::path(::testing::TempDir()) / "pipeline-keys.txt";
  std::ofstream(path) << "alice " << kAliceKey << "\nbob " << kBobKey << "\n";
  return path.string();
}

std::string new_session(TestClient& c) {
  const HttpResult r = c.post("/tandem/v1/sessions", json::object());
  EXPECT_EQ(r.status, 201) << r.body;
  return r.j().value("session", "");
}

std::string session_path(const std::string& id, const std::string& action) {
  return "/tandem/v1/sessions/" + id + action;
}

json long_step() {
  return {{"expected_pos", 0}, {"append", kPrompt}, {"generate", {{"n", kLongTokens}}}};
}

json generate_step(int expected_pos, int n, bool queue) {
  json step = {{"expected_pos", expected_pos}, {"generate", {{"n", n}}}};
  if (queue) step["queue"] = true;
  return step;
}

// One series of /metrics ("tandem_queue_length"); -1 when absent.
double metric(TestClient& c, const std::string& series) {
  std::istringstream lines(c.get("/metrics").body);
  for (std::string line; std::getline(lines, line);) {
    if (line.size() > series.size() && line.compare(0, series.size(), series) == 0 &&
        line[series.size()] == ' ')
      return std::stod(line.substr(series.size() + 1));
  }
  return -1;
}

bool eventually(const std::function<bool()>& done, double timeout_s = 60) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// Until the server counts `n` jobs queued, waiting or running.
bool queue_reaches(TestClient& c, int n) {
  return eventually([&] { return metric(c, "tandem_queue_length") >= n; });
}

// A request sent on its own connection from a thread; get() waits for its answer.
class InFlight {
 public:
  InFlight(ServerProcess& server, std::string path, json body)
      : thread_([this, &server, path = std::move(path), body = std::move(body)] {
          try {
            TestClient c = server.client();
            result_ = c.post(path, body);
          } catch (const std::exception& e) {
            result_.status = -1;
            result_.body = e.what();
          }
        }) {}
  ~InFlight() {
    if (thread_.joinable()) thread_.join();
  }
  const HttpResult& get() {
    if (thread_.joinable()) thread_.join();
    return result_;
  }

 private:
  HttpResult result_;
  std::thread thread_;  // last: it starts once result_ exists
};

std::string error_code(const HttpResult& r) {
  return r.j().is_object() && r.j().contains("error") ? r.j()["error"].value("code", "") : "";
}

// A server whose session runs a long step (`first`, the history kPrompt and kLongTokens after
// it), with the steps queue() sends waiting behind it.
class BusySession {
 public:
  explicit BusySession(const std::vector<std::string>& flags = kLong, const std::string& key = "")
      : server(model_path(), flags, false, key), c(server.client()), id(new_session(c)) {
    first = std::make_unique<InFlight>(server, step_path(), long_step());
    EXPECT_TRUE(queue_reaches(c, 1)) << "the long step runs";
  }
  // Sends `step` on its own connection; returns once the server counts it.
  InFlight& queue(json step) {
    waiting.push_back(std::make_unique<InFlight>(server, step_path(), std::move(step)));
    EXPECT_TRUE(queue_reaches(c, 1 + static_cast<int>(waiting.size()))) << "the step waits";
    return *waiting.back();
  }
  std::string step_path() const { return session_path(id, "/step"); }

  ServerProcess server;
  TestClient c;
  const std::string id;
  std::unique_ptr<InFlight> first;
  std::vector<std::unique_ptr<InFlight>> waiting;
};

TEST(Pipeline, InfoAndSessionsListQueueAndCancel) {
  ServerProcess server(model_path());
  TestClient c = server.client();
  const HttpResult info = c.get("/tandem/v1/info");
  const HttpResult created = c.post("/tandem/v1/sessions", json::object());
  for (const HttpResult* r : {&info, &created}) {
    ASSERT_TRUE(r->status == 200 || r->status == 201) << r->body;
    EXPECT_EQ(r->j()["features"], json::array({"rewind", "queue", "cancel", "history_hash"}));
    EXPECT_EQ(r->j()["limits"]["max_queued_steps"], 2);
  }
}

// A queued step on a second connection runs once the running step has ended, from the history
// it left, and answers what the same two steps give one after the other; the old client's step
// is still refused 409 session_busy.
TEST(Pipeline, QueuedStepRunsAfterTheRunningStep) {
  BusySession b;
  TestClient& c = b.c;
  const HttpResult busy = c.post(b.step_path(), generate_step(kAfterLong, 4, false));
  EXPECT_EQ(busy.status, 409) << busy.body;
  EXPECT_EQ(error_code(busy), "session_busy");
  const HttpResult queued = c.post(b.step_path(), generate_step(kAfterLong, 4, true));
  ASSERT_EQ(b.first->get().status, 200) << b.first->get().body;
  EXPECT_EQ(b.first->get().j()["pos"], kAfterLong);
  ASSERT_EQ(queued.status, 200) << queued.body;
  EXPECT_EQ(queued.j()["pos"], kAfterLong + 4);

  // The same steps in turn on another session.
  const std::string t = new_session(c);
  ASSERT_EQ(c.post(session_path(t, "/step"), long_step()).status, 200);
  const HttpResult alone = c.post(session_path(t, "/step"), generate_step(kAfterLong, 4, false));
  ASSERT_EQ(alone.status, 200) << alone.body;
  EXPECT_EQ(queued.j()["tokens"], alone.j()["tokens"]);
}

// Two queued steps run in arrival order (each names the position the one before leaves); a
// third waiting step is one too many.
TEST(Pipeline, QueuedStepsRunInArrivalOrder) {
  BusySession b;
  json first_queued = generate_step(kAfterLong, 1, true);
  first_queued["append"] = json::array({5});
  json second_queued = generate_step(kAfterLong + 2, 1, true);
  second_queued["append"] = json::array({6});
  InFlight& one = b.queue(first_queued);
  InFlight& two = b.queue(second_queued);
  const HttpResult refused = b.c.post(b.step_path(), generate_step(kAfterLong + 4, 1, true));
  EXPECT_EQ(refused.status, 409) << refused.body;
  EXPECT_EQ(error_code(refused), "session_busy");
  EXPECT_EQ(b.first->get().status, 200) << b.first->get().body;
  EXPECT_EQ(one.get().status, 200) << one.get().body;
  EXPECT_EQ(one.get().j()["pos"], kAfterLong + 2);
  EXPECT_EQ(two.get().status, 200) << two.get().body;
  EXPECT_EQ(two.get().j()["pos"], kAfterLong + 4);
}

// A queued step is checked when it starts: an expected_pos the earlier step made stale is a
// 409 position_mismatch naming the history the earlier step left.
TEST(Pipeline, QueuedStepWithAStalePositionGetsTheNewPosition) {
  BusySession b;
  const HttpResult stale = b.c.post(b.step_path(), generate_step(3, 1, true));
  EXPECT_EQ(b.first->get().status, 200) << b.first->get().body;
  EXPECT_EQ(stale.status, 409) << stale.body;
  EXPECT_EQ(error_code(stale), "position_mismatch");
  EXPECT_EQ(stale.j()["error"]["pos"], kAfterLong);
}

// Cancel drops a waiting step that builds past from_pos and leaves the running step that does
// not; a second cancel stops the running step early. The stopped step's history stays as far
// as it got (the cancel and the step report the same length), and the session goes on from
// there or from a rewind.
TEST(Pipeline, CancelDropsWaitingStepsAndStopsTheRunningOne) {
  ServerProcess server(model_path(), kLong);
  TestClient c = server.client();
  const std::string s = new_session(c);
  const std::string step = session_path(s, "/step"), cancel = session_path(s, "/cancel");
  ASSERT_EQ(c.post(step, {{"expected_pos", 0}, {"append", kPrompt}}).status, 200);
  InFlight running(server, step,
                   {{"expected_pos", 3}, {"append", {7}}, {"generate", {{"n", kLongTokens}}}});
  ASSERT_TRUE(queue_reaches(c, 1));
  InFlight waiting(server, step, generate_step(4 + kLongTokens, 1, true));
  ASSERT_TRUE(queue_reaches(c, 2));

  HttpResult r = c.post(cancel, {{"from_pos", 4}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j()["cancelled"], 1);
  EXPECT_EQ(waiting.get().status, 409) << waiting.get().body;
  EXPECT_EQ(error_code(waiting.get()), "cancelled");

  r = c.post(cancel, {{"from_pos", 3}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j()["cancelled"], 1);
  const int pos = r.j()["pos"];
  ASSERT_EQ(running.get().status, 409) << running.get().body;
  EXPECT_EQ(error_code(running.get()), "cancelled");
  EXPECT_EQ(running.get().j()["error"]["pos"], pos);
  EXPECT_GE(pos, 4);
  EXPECT_LT(pos, 4 + kLongTokens) << "the running step stopped early";
  EXPECT_EQ(metric(c, "tandem_cancelled_steps_total"), 2);

  r = c.post(step, generate_step(pos, 1, false));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j()["pos"], pos + 1);
  r = c.post(step,
             {{"rewind_to", 3}, {"expected_pos", 3}, {"append", {7}}, {"generate", {{"n", 3}}}});
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string fresh = new_session(c);
  const HttpResult want =
      c.post(session_path(fresh, "/step"),
             {{"expected_pos", 0}, {"append", {1, 2, 3, 7}}, {"generate", {{"n", 3}}}});
  EXPECT_EQ(r.j()["tokens"], want.j()["tokens"]);
  EXPECT_EQ(c.post(cancel, {{"from_pos", 0}}).j()["cancelled"], 0) << "nothing is left to cancel";
}

// A waiting step that cuts the history back to from_pos or before builds on nothing the cancel
// abandons (it replaces it): the cancel spares it, and it runs once the running step ends. It
// is the device's next step after a cancel, which may reach the server first.
TEST(Pipeline, CancelSparesAStepThatCutsBackToItsPosition) {
  BusySession b;  // running: append kPrompt (up to position 3), then generate
  InFlight& stale = b.queue(generate_step(kAfterLong, 1, true));
  InFlight& cut = b.queue({{"rewind_to", 3},
                           {"expected_pos", 3},
                           {"append", {7}},
                           {"generate", {{"n", 1}}},
                           {"queue", true}});
  const HttpResult r = b.c.post(session_path(b.id, "/cancel"), {{"from_pos", 3}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j()["cancelled"], 1);
  EXPECT_EQ(error_code(stale.get()), "cancelled") << stale.get().body;
  EXPECT_EQ(b.first->get().status, 200) << "it ends at position 3";
  ASSERT_EQ(cut.get().status, 200) << cut.get().body;
  EXPECT_EQ(cut.get().j()["pos"], 5);
}

// The cancel body is checked like a step's; a cancel of another key's session or an unknown
// one is 410, like a step on it.
TEST(Pipeline, CancelChecksItsBodyAndTheSessionsOwner) {
  ServerProcess server(model_path(), {"--api-key-file", key_file()}, false, kAliceKey);
  TestClient alice = server.client();
  TestClient bob(server.port(), false, kBobKey);
  const std::string s = new_session(alice);
  const std::string cancel = session_path(s, "/cancel");
  for (const json& body : {json::object(), json{{"from_pos", -1}}, json{{"from_pos", "1"}},
                           json{{"from_pos", 1}, {"from", 1}}}) {
    const HttpResult r = alice.post(cancel, body);
    EXPECT_EQ(r.status, 400) << body.dump() << " " << r.body;
  }
  HttpResult r = bob.post(cancel, {{"from_pos", 0}});
  EXPECT_EQ(r.status, 410) << r.body;
  EXPECT_EQ(r.j()["error"]["reason"], "unknown");
  r = alice.post(session_path("0123456789abcdef0123456789abcdef", "/cancel"), {{"from_pos", 0}});
  EXPECT_EQ(r.status, 410) << r.body;
  r = alice.post(cancel, {{"from_pos", 0}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j(), json({{"cancelled", 0}, {"pos", 0}}));
}

// A client that hangs up while its step waits drops the step (counted as a cancelled job); the
// running step is untouched and the session takes the next step.
TEST(Pipeline, HangUpWhileWaitingDropsTheStep) {
  BusySession b;
  TestClient& c = b.c;
  {
    namespace asio = boost::asio;
    asio::io_context io;
    asio::ip::tcp::socket sock(io);
    sock.connect(
        {asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(b.server.port())});
    const std::string body = generate_step(kAfterLong, 1, true).dump();
    asio::write(sock, asio::buffer("POST " + b.step_path() +
                                   " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                                   "application/json\r\nContent-Length: " +
                                   std::to_string(body.size()) + "\r\n\r\n" + body));
    ASSERT_TRUE(queue_reaches(c, 2));
  }  // hung up
  EXPECT_TRUE(eventually([&] { return metric(c, "tandem_cancelled_jobs_total") >= 1; }));
  EXPECT_TRUE(eventually([&] { return metric(c, "tandem_queue_length") <= 1; }));
  ASSERT_EQ(b.first->get().status, 200) << b.first->get().body;
  EXPECT_EQ(b.first->get().j()["pos"], kAfterLong) << "the running step ran on";
  const HttpResult next = c.post(b.step_path(), generate_step(kAfterLong, 2, false));
  ASSERT_EQ(next.status, 200) << next.body;
  EXPECT_EQ(next.j()["pos"], kAfterLong + 2);
}

// Waiting steps hold places in the server's queue: with --max-queue 2, a running step and one
// waiting behind it fill it, and another client's step is refused 429.
TEST(Pipeline, WaitingStepsCountAgainstTheQueue) {
  std::vector<std::string> flags = kLong;
  flags.insert(flags.end(), {"--max-queue", "2"});
  BusySession b(flags);
  const std::string other = new_session(b.c);
  InFlight& waiting = b.queue(generate_step(kAfterLong, 1, true));
  const HttpResult full =
      b.c.post(session_path(other, "/step"), {{"expected_pos", 0}, {"append", kPrompt}});
  EXPECT_EQ(full.status, 429) << full.body;
  EXPECT_EQ(b.c.post(session_path(b.id, "/cancel"), {{"from_pos", 0}}).j()["cancelled"], 2);
  EXPECT_EQ(b.first->get().status, 409);
  EXPECT_EQ(waiting.get().status, 409);
}

// ... and places in its key's quota: with --max-queue-per-key 1 the running step fills it.
TEST(Pipeline, WaitingStepsCountAgainstTheKeysQuota) {
  std::vector<std::string> flags = kLong;
  flags.insert(flags.end(), {"--api-key-file", key_file(), "--max-queue-per-key", "1"});
  BusySession b(flags, kAliceKey);
  const HttpResult over = b.c.post(b.step_path(), generate_step(kAfterLong, 1, true));
  EXPECT_EQ(over.status, 429) << over.body;
  EXPECT_EQ(error_code(over), "over_quota");
  EXPECT_EQ(b.first->get().status, 200) << b.first->get().body;
}

// A session closed while a step waits: the running step finishes, the waiting one is answered
// 410 closed.
TEST(Pipeline, ClosingTheSessionAnswersWaitingSteps410) {
  BusySession b;
  InFlight& waiting = b.queue(generate_step(kAfterLong, 1, true));
  ASSERT_EQ(b.c.request("DELETE", session_path(b.id, "")).status, 200);
  EXPECT_EQ(b.first->get().status, 200) << b.first->get().body;
  EXPECT_EQ(waiting.get().status, 410) << waiting.get().body;
  EXPECT_EQ(waiting.get().j()["error"]["reason"], "closed");
}

// SIGTERM drains waiting steps like other queued work: they run after the running step, and
// the server exits 0.
TEST(Pipeline, SigtermRunsWaitingSteps) {
  // The long step takes seconds here but over 30 (the default drain) under ASan on a busy
  // machine; the drain is what is tested, not its default length.
  std::vector<std::string> flags = kLong;
  flags.insert(flags.end(), {"--drain-timeout", "110"});
  BusySession b(flags);
  InFlight& waiting = b.queue(generate_step(kAfterLong, 2, true));
  EXPECT_EQ(b.server.stop(/*grace_s=*/120), 0);
  EXPECT_EQ(b.first->get().status, 200) << b.first->get().body;
  ASSERT_EQ(waiting.get().status, 200) << waiting.get().body;
  EXPECT_EQ(waiting.get().j()["pos"], kAfterLong + 2);
}

// A rewind whose append starts with the tokens it cuts keeps them and their KV: only what the
// server lacks is prefilled, and the answer equals a fresh session's.
TEST(Pipeline, RewindKeepsTheTailTheAppendRepeats) {
  ServerProcess server(model_path());
  TestClient c = server.client();
  const std::string s = new_session(c);
  const std::vector<int> prompt = {1, 40, 41, 42, 43, 44};
  HttpResult r = c.post(session_path(s, "/step"),
                        {{"expected_pos", 0}, {"append", prompt}, {"generate", {{"n", 8}}}});
  ASSERT_EQ(r.status, 200) << r.body;
  std::vector<int> history = prompt;
  const json first = r.j();  // range-for over r.j()["tokens"] would outlive the temporary
  for (int t : first["tokens"]) history.push_back(t);
  const std::vector<int> more = {50, 51, 52};
  auto with_more = [&](size_t keep) {
    std::vector<int> h(history.begin(), history.begin() + static_cast<std::ptrdiff_t>(keep));
    h.insert(h.end(), more.begin(), more.end());
    return h;
  };
  // Rewound to 2, the append repeats the whole cut tail and adds 3 tokens; then it repeats
  // the tail but its last 3 tokens and adds 3 others.
  for (const size_t keep : {history.size(), history.size() - 3}) {
    SCOPED_TRACE(keep);
    const std::vector<int> want_history = with_more(keep);
    r = c.post(session_path(s, "/step"),
               {{"rewind_to", 2},
                {"expected_pos", 2},
                {"append", std::vector<int>(want_history.begin() + 2, want_history.end())},
                {"generate", {{"n", 8}}}});
    ASSERT_EQ(r.status, 200) << r.body;
    // The new tokens and the one before them: the cache never holds the history's last token
    // (before a whole match), or gives up the last one kept (before a partial one).
    EXPECT_EQ(r.j()["prefilled"], more.size() + 1);
    const std::string fresh = new_session(c);
    const HttpResult want =
        c.post(session_path(fresh, "/step"),
               {{"expected_pos", 0}, {"append", want_history}, {"generate", {{"n", 8}}}});
    ASSERT_EQ(want.status, 200) << want.body;
    EXPECT_EQ(r.j()["tokens"], want.j()["tokens"]);
    EXPECT_EQ(r.j()["pos"], want.j()["pos"]);
    history = want_history;
    const json answer = r.j();
    for (int t : answer["tokens"]) history.push_back(t);
  }
}

// A step that overtook the cut it builds on (two connections, the later request first) finds a
// history of the very length it expects; its expected_hash makes it fail 409 history_mismatch
// and change nothing, and it runs once the cut has. The hash is checked across a cut (the
// server's cached hash of the longer history is not reused) and must be well formed.
TEST(Pipeline, ExpectedHashRefusesAStepThatOvertookTheCutItBuildsOn) {
  ASSERT_EQ(protocol_hash_hex({}), "cbf29ce484222325");
  ASSERT_EQ(protocol_hash_hex({1, 2, 3}), "fd1f0f4381eb0395");
  ServerProcess server(model_path());
  TestClient c = server.client();
  const std::string s = new_session(c);
  const std::vector<int> before = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<int> after = {1, 2, 3, 4, 9, 10, 11, 12};  // cut to 4, 4 others appended
  HttpResult r =
      c.post(session_path(s, "/step"),
             {{"expected_pos", 0}, {"expected_hash", protocol_hash_hex({})}, {"append", before}});
  ASSERT_EQ(r.status, 200) << r.body;
  const json cut = {{"rewind_to", 4},
                    {"expected_pos", 4},
                    {"expected_hash", protocol_hash_hex({1, 2, 3, 4})},
                    {"append", std::vector<int>(after.begin() + 4, after.end())}};
  const json next = {
      {"expected_pos", 8}, {"expected_hash", protocol_hash_hex(after)}, {"generate", {{"n", 2}}}};
  r = c.post(session_path(s, "/step"), next);
  EXPECT_EQ(r.status, 409) << r.body;
  EXPECT_EQ(error_code(r), "history_mismatch") << r.body;
  EXPECT_EQ(r.j()["error"]["pos"], 8);
  // The right hash of the history as it stands passes (and the server caches it)...
  r = c.post(session_path(s, "/step"),
             {{"expected_pos", 8}, {"expected_hash", protocol_hash_hex(before)}});
  ASSERT_EQ(r.status, 200) << r.body;
  // ... the cut goes through, and the step built on it now runs on what it was built for.
  r = c.post(session_path(s, "/step"), cut);
  ASSERT_EQ(r.status, 200) << r.body;
  r = c.post(session_path(s, "/step"), next);
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string fresh = new_session(c);
  const HttpResult want =
      c.post(session_path(fresh, "/step"),
             {{"expected_pos", 0}, {"append", after}, {"generate", {{"n", 2}}}});
  ASSERT_EQ(want.status, 200) << want.body;
  EXPECT_EQ(r.j()["tokens"], want.j()["tokens"]);
  EXPECT_EQ(r.j()["pos"], 10);
  for (const json& bad : {json("C79F11E5FF234BA5"), json("c79f11e5ff234ba"), json(""), json(12345),
                          json("c79f11e5ff234ba5x")}) {
    r = c.post(session_path(s, "/step"), {{"expected_pos", 10}, {"expected_hash", bad}});
    EXPECT_EQ(r.status, 400) << bad.dump() << ": " << r.body;
    EXPECT_EQ(r.j()["error"]["field"], "expected_hash") << r.body;
  }
}

// A queued step is checked when its turn comes: one built on a history of the right length
// but other tokens than the running step leaves fails 409 history_mismatch then.
TEST(Pipeline, QueuedStepChecksItsHashWhenItsTurnComes) {
  BusySession b;
  json step = generate_step(kAfterLong, 1, true);
  step["expected_hash"] = protocol_hash_hex(std::vector<int>(kAfterLong, 7));
  InFlight& waiting = b.queue(step);
  EXPECT_EQ(b.first->get().status, 200) << b.first->get().body;
  const HttpResult& r = waiting.get();
  EXPECT_EQ(r.status, 409) << r.body;
  EXPECT_EQ(error_code(r), "history_mismatch") << r.body;
  EXPECT_EQ(r.j()["error"]["pos"], kAfterLong);
}

}  // namespace
}  // namespace tandem::testing
