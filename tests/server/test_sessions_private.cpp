// Private sessions and fairness in `tandem serve` (issue 21, items 3 and 4), over real sockets on
// 127.0.0.1 against real server processes: session ids are 128 random bits; a session answers
// only the credential that created it (to anyone else it is an unknown id, byte for byte);
// listing sessions needs the admin key; key files are checked line by line; per-client quotas
// answer 429 with Retry-After; under memory pressure a client evicts its own idle sessions first
// and never another client's that is younger than --evict-grace. Plus the key file parser
// itself, and a step refused after a rewind leaving its session as it was.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <bitset>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "common/error.h"
#include "common/testdata.h"
#include "model/model_config.h"
#include "runtime/model_internals.h"
#include "server/auth.h"
#include "server_harness.h"
#include "tandem/engine.h"

namespace tandem::testing {
namespace {

using server::KeyRing;

const char* kLlama = "models/synth-llama-Q8_0.gguf";

const char* kAliceKey = "alice-key-0123456789";
const char* kBobKey = "bob-key-0123456789";
const char* kOpsKey = "ops-key-0123456789";

std::string model_path() {
  return testdata_path(kLlama);
}

// A file under a fresh temporary directory, removed with it.
class TempFile {
 public:
  TempFile(const std::string& name, const std::string& text) {
    static std::atomic<int> n{0};
    dir_ = std::filesystem::temp_directory_path() /
           ("tandem-sessions-" + std::to_string(getpid()) + "-" + std::to_string(n++));
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / name).string();
    std::ofstream(path_) << text;
  }
  ~TempFile() { std::filesystem::remove_all(dir_); }
  const std::string& path() const { return path_; }

 private:
  std::filesystem::path dir_;
  std::string path_;
};

std::string three_clients() {
  return std::string("# clients of the test\n\nalice ") + kAliceKey + "\nbob\t" + kBobKey +
         "\nops " + kOpsKey + " admin\n";
}

std::string create(TestClient& c) {
  const HttpResult r = c.post("/tandem/v1/sessions", json::object());
  EXPECT_EQ(r.status, 201) << r.body;
  return r.status == 201 ? r.j()["session"].get<std::string>() : "";
}

std::string step_path(const std::string& id) {
  return "/tandem/v1/sessions/" + id + "/step";
}

// n token ids from `first` on, cycling below 1000 (the test model has 2048).
std::vector<int> tokens(int n, int first = 1) {
  std::vector<int> out(n);
  for (int i = 0; i < n; ++i) out[i] = 1 + (first - 1 + i) % 999;
  return out;
}

// `body` with every occurrence of `id` replaced, so that answers about two ids can be compared.
std::string without_id(std::string body, const std::string& id) {
  for (size_t at = body.find(id); at != std::string::npos; at = body.find(id, at)) {
    body.replace(at, id.size(), "<id>");
  }
  return body;
}

// Runs `tandem serve` expecting it to refuse to start; returns its exit code and output.
std::pair<int, std::string> serve_fails(const std::vector<std::string>& args) {
  std::string cmd =
      std::string("timeout 60 ") + TANDEM_BINARY + " serve -m '" + model_path() + "' --port 0";
  for (const auto& a : args) cmd += " '" + a + "'";
  cmd += " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) throw std::runtime_error("popen failed");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

uint64_t kv_bytes_per_token() {
  auto model = Model::load(model_path());
  const ModelConfig& cfg = ModelInternals::config(*model);
  return static_cast<uint64_t>(cfg.n_layer) * (cfg.kv_dim() + cfg.v_dim()) * 4;
}

// ---------------------------------------------------------------------------------------------
// The key file parser

TEST(ServerKeyFile, ParsesNamesKeysAdminsAndComments) {
  const KeyRing ring = KeyRing::parse(three_clients(), "keys.txt");
  EXPECT_EQ(ring.client_count(), 2u);
  EXPECT_TRUE(ring.has_admin());
  const server::Credential* a = ring.find(kAliceKey);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->name, "alice");
  EXPECT_FALSE(a->admin);
  const server::Credential* ops = ring.find(kOpsKey);
  ASSERT_NE(ops, nullptr);
  EXPECT_EQ(ops->name, "ops");
  EXPECT_TRUE(ops->admin);
  EXPECT_EQ(ring.find("alice"), nullptr);
  EXPECT_EQ(ring.find(""), nullptr);
  EXPECT_EQ(ring.find(std::string(kAliceKey) + "x"), nullptr);
  EXPECT_EQ(ring.find(std::string(kAliceKey).substr(1)), nullptr);
}

TEST(ServerKeyFile, OneBareKeyIsOneClient) {
  const KeyRing ring = KeyRing::parse("sesame\r\n", "old.key");
  ASSERT_NE(ring.find("sesame"), nullptr);
  EXPECT_EQ(ring.find("sesame")->name, "default");
  EXPECT_FALSE(ring.has_admin());
}

TEST(ServerKeyFile, ErrorsNameFileAndLine) {
  auto error_of = [](const std::string& text) {
    try {
      KeyRing::parse(text, "k.txt");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error_of(""), "k.txt: holds no key (expected lines 'NAME KEY [admin]')");
  EXPECT_EQ(error_of("# only a comment\n\n"),
            "k.txt: holds no key (expected lines 'NAME KEY [admin]')");
  EXPECT_NE(error_of("a k1\n# c\nb k2 root\n").find("k.txt:3: the third field must be 'admin'"),
            std::string::npos);
  EXPECT_NE(error_of("a k1\nb k2 admin extra\n").find("k.txt:2: expected 'NAME KEY'"),
            std::string::npos);
  EXPECT_NE(error_of("a k1\nlonely\n").find("k.txt:2: expected 'NAME KEY'"), std::string::npos);
  EXPECT_EQ(error_of("a k1\n\nb k1\n"),
            "k.txt:3: the key of 'b' is already the key of 'a' (k.txt:1)");
  EXPECT_EQ(error_of("a k1\na k2\n"), "k.txt:2: the name 'a' is already used (k.txt:1)");
  EXPECT_NE(error_of("a/b k1\n").find("k.txt:1: the name 'a/b' must be"), std::string::npos);
  EXPECT_NE(error_of(std::string("a k\x01y\n")).find("k.txt:1: the key of 'a' must be"),
            std::string::npos);
  // Two sources: the second names both places.
  KeyRing ring = KeyRing::parse("a k1\n", "k.txt");
  try {
    ring.add("admin", "k1", true, "--admin-key");
    ADD_FAILURE() << "a key used twice must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "--admin-key: the key of 'admin' is already the key of 'a' (k.txt:1)");
  }
}

TEST(ServerKeyFile, LoopbackHosts) {
  for (const char* h : {"127.0.0.1", "127.1.2.3", "localhost", "::1", "[::1]", "::ffff:127.0.0.1"})
    EXPECT_TRUE(server::is_loopback_host(h)) << h;
  for (const char* h : {"0.0.0.0", "::", "10.0.0.1", "128.0.0.1", "example.com", ""})
    EXPECT_FALSE(server::is_loopback_host(h)) << h;
}

// ---------------------------------------------------------------------------------------------
// tandem serve

// A key file with a bad line or a reused key: the server names file:line and exits non-zero.
TEST(ServerSessions, BadKeyFilesStopTheServerNamingFileAndLine) {
  {
    TempFile f("keys.txt", "alice k-alice\n# fine\nbob k-bob admin please\n");
    const auto [rc, out] = serve_fails({"--api-key-file", f.path()});
    EXPECT_NE(rc, 0) << out;
    EXPECT_NE(out.find(f.path() + ":3: expected 'NAME KEY' or 'NAME KEY admin', found 4 fields"),
              std::string::npos)
        << out;
  }
  {
    TempFile f("keys.txt", "alice k-same\n\nbob k-same\n");
    const auto [rc, out] = serve_fails({"--api-key-file", f.path()});
    EXPECT_NE(rc, 0) << out;
    EXPECT_NE(out.find(f.path() + ":3: the key of 'bob' is already the key of 'alice' (" +
                       f.path() + ":1)"),
              std::string::npos)
        << out;
    EXPECT_EQ(out.find("k-same"), std::string::npos) << "a key must never be printed: " << out;
  }
  {
    TempFile f("keys.txt", "alice k-alice\n");
    const auto [rc, out] = serve_fails({"--api-key-file", f.path(), "--admin-key", "k-alice"});
    EXPECT_NE(rc, 0) << out;
    EXPECT_NE(out.find("--admin-key: the key of 'admin' is already the key of 'alice'"),
              std::string::npos)
        << out;
  }
  {
    const auto [rc, out] = serve_fails({"--api-key-file", "/nonexistent/keys.txt"});
    EXPECT_NE(rc, 0) << out;
    EXPECT_NE(out.find("cannot read key file '/nonexistent/keys.txt'"), std::string::npos) << out;
  }
}

// The format before names (one bare key, the file's only line) still works; without an admin
// key nobody may list sessions.
TEST(ServerSessions, BareKeyFileStillWorks) {
  TempFile f("key", "sesame-0123456789\n");
  ServerProcess server(model_path(), {"--api-key-file", f.path()}, false, "sesame-0123456789");
  TestClient good = server.client();
  TestClient wrong(server.port(), false, "sesame-012345678");
  TestClient none(server.port());
  EXPECT_EQ(none.post("/tandem/v1/sessions", json::object()).status, 401);
  EXPECT_EQ(wrong.post("/tandem/v1/sessions", json::object()).status, 401);
  const std::string id = create(good);
  EXPECT_EQ(good.post(step_path(id), {{"expected_pos", 0}, {"append", tokens(3)}}).status, 200);
  const HttpResult list = good.get("/tandem/v1/sessions");
  EXPECT_EQ(list.status, 403) << list.body;
  EXPECT_NE(list.body.find("this server has none"), std::string::npos) << list.body;
}

// 128 bits from the CSPRNG, hex, after the prefix: 200 ids have no structure in common (every
// bit is set in about half of them, every hex digit position takes many values, and consecutive
// ids differ in about half their bits). A counter-based scheme fails each of these.
TEST(ServerSessions, IdsAre128RandomBitsAfterThePrefix) {
  ServerProcess server(model_path(), {"--max-sessions", "1", "--session-prefix", "r7-"});
  TestClient c = server.client();
  std::vector<std::string> ids;
  for (int i = 0; i < 200; ++i) {
    const std::string id = create(c);
    ASSERT_EQ(c.request("DELETE", "/tandem/v1/sessions/" + id).status, 200);
    ASSERT_EQ(id.size(), 3u + 32u) << id;
    ASSERT_EQ(id.substr(0, 3), "r7-");
    ids.push_back(id.substr(3));
  }
  EXPECT_EQ(std::set<std::string>(ids.begin(), ids.end()).size(), ids.size());
  std::vector<std::bitset<128>> bits;
  for (const auto& hex : ids) {
    std::bitset<128> b;
    for (size_t i = 0; i < 32; ++i) {
      const char ch = hex[i];
      ASSERT_TRUE((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f')) << hex;
      const int v = ch <= '9' ? ch - '0' : ch - 'a' + 10;
      for (int k = 0; k < 4; ++k) b[i * 4 + k] = (v >> k) & 1;
    }
    bits.push_back(b);
  }
  // Binomial(200, 1/2) has sd 7.1: 50 away is 7 sd (a fair bit fails about once in 1e11).
  for (size_t k = 0; k < 128; ++k) {
    int ones = 0;
    for (const auto& b : bits) ones += b[k];
    EXPECT_GT(ones, 50) << "bit " << k;
    EXPECT_LT(ones, 150) << "bit " << k;
  }
  for (size_t pos = 0; pos < 32; ++pos) {
    std::set<char> seen;
    for (const auto& hex : ids) seen.insert(hex[pos]);
    EXPECT_GE(seen.size(), 10u) << "hex digit " << pos;
  }
  // Consecutive ids: Binomial(128, 1/2) differing bits, sd 5.7.
  for (size_t i = 1; i < bits.size(); ++i) {
    const size_t differ = (bits[i] ^ bits[i - 1]).count();
    EXPECT_GT(differ, 24u) << i;
    EXPECT_LT(differ, 104u) << i;
  }
}

// Client B stepping, rewinding, closing or probing client A's session gets exactly the answer
// for an id never issued; A's session is untouched. After A closes it, B still sees "unknown".
TEST(ServerSessions, AnotherClientsSessionLooksUnknown) {
  TempFile keys("keys.txt", three_clients());
  ServerProcess server(model_path(), {"--api-key-file", keys.path()});
  TestClient alice(server.port(), false, kAliceKey);
  TestClient bob(server.port(), false, kBobKey);
  const std::string a = create(alice);
  HttpResult r = alice.post(step_path(a), {{"expected_pos", 0}, {"append", tokens(6)}});
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string never = "0123456789abcdef0123456789abcdef";
  ASSERT_EQ(never.size(), a.size());

  auto same_as_unknown = [&](const std::string& method, const std::string& path_a,
                             const std::string& path_never, const std::string& body) {
    const HttpResult on_a = bob.request(method, path_a, body);
    const HttpResult on_never = bob.request(method, path_never, body);
    EXPECT_EQ(on_a.status, on_never.status) << method << " " << path_a;
    EXPECT_EQ(without_id(on_a.body, a), without_id(on_never.body, never)) << method;
    EXPECT_EQ(on_a.retry_after, on_never.retry_after);
    return on_a;
  };
  const int n_ctx = alice.get("/tandem/v1/info").j()["limits"]["n_ctx"];
  const std::vector<std::string> bodies = {
      json({{"expected_pos", 6}, {"generate", {{"n", 2}}}}).dump(),  // step
      json({{"expected_pos", 0}, {"rewind_to", 0}}).dump(),          // rewind
      json({{"expected_pos", 3}}).dump(),  // a wrong position: no 409 that would tell
      // Too long: no 413 that would tell either.
      json({{"expected_pos", 6}, {"append", tokens(n_ctx - 4)}, {"generate", {{"n", 8}}}}).dump(),
  };
  EXPECT_EQ(alice.request("POST", step_path(a), bodies[2]).status, 409);
  EXPECT_EQ(alice.request("POST", step_path(a), bodies[3]).status, 413);
  for (const auto& body : bodies) {
    r = same_as_unknown("POST", step_path(a), step_path(never), body);
    EXPECT_EQ(r.status, 410) << r.body;
    EXPECT_EQ(r.j()["error"]["reason"], "unknown");
  }
  r = same_as_unknown("DELETE", "/tandem/v1/sessions/" + a, "/tandem/v1/sessions/" + never, "");
  EXPECT_EQ(r.status, 410);

  // A's session is as A left it: same position, still open.
  r = alice.post(step_path(a), {{"expected_pos", 6}, {"generate", {{"n", 1}}}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j()["pos"], 7);

  // Closed by A: A learns why, B still gets the unknown-id answer.
  ASSERT_EQ(alice.request("DELETE", "/tandem/v1/sessions/" + a).status, 200);
  r = alice.post(step_path(a), {{"expected_pos", 7}});
  EXPECT_EQ(r.status, 410);
  EXPECT_EQ(r.j()["error"]["reason"], "closed");
  same_as_unknown("POST", step_path(a), step_path(never), bodies[0]);
  same_as_unknown("DELETE", "/tandem/v1/sessions/" + a, "/tandem/v1/sessions/" + never, "");
}

// Listing sessions needs the admin key; the admin sees every session with its owner.
TEST(ServerSessions, ListingNeedsTheAdminKey) {
  TempFile keys("keys.txt", three_clients());
  ServerProcess server(model_path(), {"--api-key-file", keys.path()});
  TestClient alice(server.port(), false, kAliceKey);
  TestClient ops(server.port(), false, kOpsKey);
  TestClient none(server.port());
  const std::string a = create(alice);
  HttpResult r = alice.get("/tandem/v1/sessions");
  EXPECT_EQ(r.status, 403) << r.body;
  EXPECT_EQ(r.j()["error"]["code"], "forbidden");
  EXPECT_EQ(r.body.find(a), std::string::npos);
  EXPECT_EQ(none.get("/tandem/v1/sessions").status, 401);
  r = ops.get("/tandem/v1/sessions");
  ASSERT_EQ(r.status, 200) << r.body;
  ASSERT_EQ(r.j()["sessions"].size(), 1u);
  EXPECT_EQ(r.j()["sessions"][0]["session"], a);
  EXPECT_EQ(r.j()["sessions"][0]["owner"], "alice");
  // /metrics stays open to every client (aggregates only, no ids).
  EXPECT_EQ(alice.get("/metrics").status, 200);

  // --api-key and --admin-key on the command line: the same split.
  ServerProcess flags(model_path(), {"--api-key", kBobKey, "--admin-key", kOpsKey}, false, kBobKey);
  TestClient bob(flags.port(), false, kBobKey);
  TestClient admin(flags.port(), false, kOpsKey);
  EXPECT_EQ(bob.get("/tandem/v1/sessions").status, 403);
  EXPECT_EQ(admin.get("/tandem/v1/sessions").status, 200);
}

// A client at its session quota gets 429 naming the quota, with Retry-After; other clients are
// not affected, and closing one of its sessions lets it create again.
TEST(ServerSessions, SessionQuotaAnswers429) {
  TempFile keys("keys.txt", three_clients());
  ServerProcess server(model_path(), {"--api-key-file", keys.path(), "--max-sessions", "8",
                                      "--max-sessions-per-key", "2"});
  TestClient alice(server.port(), false, kAliceKey);
  TestClient bob(server.port(), false, kBobKey);
  const std::string a1 = create(alice);
  create(alice);
  HttpResult r = alice.post("/tandem/v1/sessions", json::object());
  EXPECT_EQ(r.status, 429) << r.body;
  EXPECT_EQ(r.retry_after, "1");
  EXPECT_EQ(r.j()["error"]["code"], "over_quota");
  EXPECT_NE(r.body.find("--max-sessions-per-key"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("client 'alice' has 2 sessions open"), std::string::npos) << r.body;
  create(bob);
  create(bob);
  ASSERT_EQ(alice.request("DELETE", "/tandem/v1/sessions/" + a1).status, 200);
  create(alice);
}

// A client with --max-queue-per-key jobs queued or running gets 429 naming that quota for the
// next one, while another client's step still runs. (The long step must still be running when
// the second arrives: retried a few times, each a fresh long step.)
TEST(ServerSessions, QueueQuotaAnswers429) {
  TempFile keys("keys.txt", three_clients());
  ServerProcess server(model_path(), {"--api-key-file", keys.path(), "--max-queue-per-key", "1",
                                      "-c", "4096", "-b", "1"});
  TestClient alice(server.port(), false, kAliceKey);
  TestClient probe(server.port(), false, kAliceKey);
  TestClient bob(server.port(), false, kBobKey);
  const std::string b = create(bob);
  int over_quota = 0;
  for (int round = 0; round < 10 && over_quota == 0; ++round) {
    const std::string slow = create(alice);
    const std::string other = create(alice);
    std::atomic<bool> done{false};
    std::thread long_step([&] {
      alice.post(step_path(slow),
                 {{"expected_pos", 0}, {"append", tokens(64)}, {"generate", {{"n", 3000}}}});
      done = true;
    });
    // Wait until the long step holds its session, and so its place in alice's queue quota. The
    // probe's position is never right, so it never queues anything itself.
    bool running = false;
    while (!running && !done) {
      const HttpResult busy = probe.post(step_path(slow), {{"expected_pos", 1}});
      running = busy.status == 409 && busy.j()["error"]["code"] == "session_busy";
    }
    if (running) {
      const HttpResult r =
          probe.post(step_path(other), {{"expected_pos", 0}, {"append", tokens(2)}});
      if (r.status == 429) {
        ++over_quota;
        EXPECT_EQ(r.j()["error"]["code"], "over_quota") << r.body;
        EXPECT_NE(r.body.find("client 'alice' has 1 jobs queued or running"), std::string::npos)
            << r.body;
        EXPECT_NE(r.body.find("--max-queue-per-key"), std::string::npos) << r.body;
        EXPECT_EQ(r.retry_after, "1");
        const HttpResult rb = bob.post(step_path(b), {{"expected_pos", 0}, {"append", tokens(2)}});
        EXPECT_EQ(rb.status, 200) << "alice's quota must not limit bob: " << rb.body;
        // The refused step took nothing: alice's session is still empty.
        const HttpResult ro = probe.post(step_path(other), {{"expected_pos", 1}});
        EXPECT_EQ(ro.j()["error"]["pos"], 0) << ro.body;
      } else {
        EXPECT_EQ(r.status, 200) << r.body;  // the long step had ended already
      }
    }
    long_step.join();
    ASSERT_EQ(alice.request("DELETE", "/tandem/v1/sessions/" + slow).status, 200);
    ASSERT_EQ(alice.request("DELETE", "/tandem/v1/sessions/" + other).status, 200);
  }
  EXPECT_EQ(over_quota, 1) << "never caught the long step running";
}

// Slots full: a create evicts the requester's own least recently used idle session even when
// another client's is older; with only other clients' young sessions to take, it gets 429 with
// Retry-After and evicts nothing.
TEST(ServerSessions, FullSlotsEvictTheRequestersOwnSessionsFirst) {
  TempFile keys("keys.txt", three_clients());
  ServerProcess server(model_path(), {"--api-key-file", keys.path(), "--max-sessions", "3",
                                      "--max-sessions-per-key", "3", "--evict-grace", "600"});
  TestClient alice(server.port(), false, kAliceKey);
  TestClient bob(server.port(), false, kBobKey);
  auto sync = [](TestClient& c, const std::string& id, int pos) {
    return c.post(step_path(id), {{"expected_pos", pos}, {"append", tokens(2)}});
  };
  const std::string a1 = create(alice);  // the least recently used of all
  ASSERT_EQ(sync(alice, a1, 0).status, 200);
  const std::string b1 = create(bob);
  ASSERT_EQ(sync(bob, b1, 0).status, 200);
  const std::string b2 = create(bob);
  ASSERT_EQ(sync(bob, b2, 0).status, 200);
  const std::string b3 = create(bob);  // evicts b1, not a1
  HttpResult r = sync(bob, b1, 2);
  EXPECT_EQ(r.status, 410);
  EXPECT_EQ(r.j()["error"]["reason"], "evicted");
  EXPECT_EQ(sync(alice, a1, 2).status, 200);
  EXPECT_EQ(sync(bob, b2, 2).status, 200);

  // Now alice holds every slot; bob may not evict her young sessions.
  ASSERT_EQ(bob.request("DELETE", "/tandem/v1/sessions/" + b2).status, 200);
  ASSERT_EQ(bob.request("DELETE", "/tandem/v1/sessions/" + b3).status, 200);
  const std::string a2 = create(alice);
  const std::string a3 = create(alice);
  r = bob.post("/tandem/v1/sessions", json::object());
  EXPECT_EQ(r.status, 429) << r.body;
  EXPECT_EQ(r.j()["error"]["code"], "overloaded");
  EXPECT_NE(r.body.find("--evict-grace"), std::string::npos) << r.body;
  ASSERT_FALSE(r.retry_after.empty());
  const int wait = std::stoi(r.retry_after);
  EXPECT_GE(wait, 1);
  EXPECT_LE(wait, 600);
  EXPECT_EQ(sync(alice, a1, 4).status, 200);
  EXPECT_EQ(sync(alice, a2, 0).status, 200);
  EXPECT_EQ(sync(alice, a3, 0).status, 200);
}

// Past the grace period another client's idle session may go.
TEST(ServerSessions, AnotherClientsSessionIsEvictedOnlyAfterTheGrace) {
  TempFile keys("keys.txt", three_clients());
  ServerProcess server(model_path(), {"--api-key-file", keys.path(), "--max-sessions", "1",
                                      "--max-sessions-per-key", "1", "--evict-grace", "1"});
  TestClient alice(server.port(), false, kAliceKey);
  TestClient bob(server.port(), false, kBobKey);
  const std::string a = create(alice);
  HttpResult r = bob.post("/tandem/v1/sessions", json::object());
  ASSERT_EQ(r.status, 429) << r.body;
  EXPECT_EQ(r.retry_after, "1");
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  create(bob);
  r = alice.post(step_path(a), {{"expected_pos", 0}});
  EXPECT_EQ(r.status, 410);
  EXPECT_EQ(r.j()["error"]["reason"], "evicted");
}

// Under --kv-cap the same rule: a step evicts its own client's idle session first, never
// another client's young one (429 with Retry-After instead), and a step so refused leaves its
// session as it was, even after a rewind.
TEST(ServerSessions, KvCapEvictsTheRequestersOwnSessionsFirst) {
  const uint64_t per_token = kv_bytes_per_token();
  TempFile keys("keys.txt", three_clients());
  ServerProcess server(model_path(), {"--api-key-file", keys.path(), "--kv-cap",
                                      std::to_string(per_token * 100), "--evict-grace", "600"});
  TestClient alice(server.port(), false, kAliceKey);
  TestClient bob(server.port(), false, kBobKey);
  const std::string a1 = create(alice);  // the least recently used of all
  ASSERT_EQ(alice.post(step_path(a1), {{"expected_pos", 0}, {"append", tokens(30)}}).status, 200);
  const std::string b1 = create(bob);
  ASSERT_EQ(bob.post(step_path(b1), {{"expected_pos", 0}, {"append", tokens(30)}}).status, 200);
  const std::string b2 = create(bob);
  HttpResult r = bob.post(step_path(b2), {{"expected_pos", 0}, {"append", tokens(60)}});
  ASSERT_EQ(r.status, 200) << r.body;
  r = bob.post(step_path(b1), {{"expected_pos", 30}});
  EXPECT_EQ(r.status, 410);
  EXPECT_EQ(r.j()["error"]["reason"], "evicted");
  EXPECT_EQ(alice.post(step_path(a1), {{"expected_pos", 30}}).status, 200);

  // Only alice's young session to take: 429, nothing evicted, b3 as it was.
  ASSERT_EQ(bob.request("DELETE", "/tandem/v1/sessions/" + b2).status, 200);
  const std::string b3 = create(bob);
  ASSERT_EQ(bob.post(step_path(b3), {{"expected_pos", 0}, {"append", tokens(10)}}).status, 200);
  r = bob.post(step_path(b3), {{"expected_pos", 5}, {"rewind_to", 5}, {"append", tokens(80, 100)}});
  EXPECT_EQ(r.status, 429) << r.body;
  EXPECT_EQ(r.j()["error"]["code"], "overloaded");
  ASSERT_FALSE(r.retry_after.empty());
  EXPECT_GE(std::stoi(r.retry_after), 1);
  EXPECT_LE(std::stoi(r.retry_after), 600);
  EXPECT_EQ(alice.post(step_path(a1), {{"expected_pos", 30}}).status, 200);
  r = bob.post(step_path(b3), {{"expected_pos", 10}, {"generate", {{"n", 1}}}});
  EXPECT_EQ(r.status, 200) << "the refused rewind must leave all 10 tokens: " << r.body;
}

// A step refused with 413 after a rewind leaves the history as it was (it used to cut first).
TEST(ServerSessions, TooLongStepAfterRewindLeavesTheSessionAsItWas) {
  ServerProcess server(model_path(), {"-c", "64"});
  TestClient c = server.client();
  const std::string s = create(c);
  const std::string control = create(c);
  ASSERT_EQ(c.post(step_path(s), {{"expected_pos", 0}, {"append", tokens(10)}}).status, 200);
  // 4 kept + 50 appended + 20 to generate > 64: refused by the session's length, after the cut.
  HttpResult r = c.post(
      step_path(s),
      {{"expected_pos", 4}, {"rewind_to", 4}, {"append", tokens(50)}, {"generate", {{"n", 20}}}});
  EXPECT_EQ(r.status, 413) << r.body;
  EXPECT_NE(r.body.find("would not fit n_ctx 64"), std::string::npos) << r.body;
  r = c.post(step_path(s), {{"expected_pos", 10}, {"generate", {{"n", 3}}}});
  ASSERT_EQ(r.status, 200) << "the history must still hold 10 tokens: " << r.body;
  EXPECT_EQ(r.j()["pos"], 13);
  const HttpResult want = c.post(
      step_path(control), {{"expected_pos", 0}, {"append", tokens(10)}, {"generate", {{"n", 3}}}});
  ASSERT_EQ(want.status, 200) << want.body;
  EXPECT_EQ(r.j()["tokens"], want.j()["tokens"]);
}

}  // namespace
}  // namespace tandem::testing
