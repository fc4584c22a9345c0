// Fair shares between keys (issue 32), over real sockets against a real `tandem serve` on a
// testdata model: one key flooding the server with long prompts that ask for their
// log-probabilities does not hold up another key's session steps by more than a bounded count
// of its jobs; a chat message's role counts against --max-text-bytes; an expected_hash is
// checked at whatever position a step names (the session keeps a hash per position).
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/history_hash.h"
#include "common/testdata.h"
#include "server_harness.h"

namespace tandem::testing {
namespace {

const char* kAKey = "flood-key-0123456789";
const char* kBKey = "device-key-0123456789";

std::string model_path() {
  return testdata_path("models/synth-llama-Q8_0.gguf");
}

// A key file with clients A (flood) and B (device), removed with the object.
class KeyFile {
 public:
  KeyFile() {
    path_ = (std::filesystem::temp_directory_path() /
             ("tandem-fair-keys-" + std::to_string(getpid()) + ".txt"))
                .string();
    std::ofstream(path_) << "flood " << kAKey << "\ndevice " << kBKey << "\n";
  }
  ~KeyFile() { std::filesystem::remove(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// n token ids from `first` on, cycling below 1000 (the test model has 2048).
std::vector<int> tokens(int n, int first = 1) {
  std::vector<int> out(n);
  for (int i = 0; i < n; ++i) out[i] = 1 + (first - 1 + i) % 999;
  return out;
}

std::string step_path(const std::string& id) {
  return "/tandem/v1/sessions/" + id + "/step";
}

std::string hash_hex(const std::vector<int>& history) {
  return HistoryHash::hex(HistoryHash::of(history));
}

// The value of a gauge in /metrics (-1 when absent).
double gauge(TestClient& c, const std::string& name) {
  const std::string text = c.get("/metrics").body;
  const size_t at = text.find("\n" + name + " ");
  return at == std::string::npos ? -1 : std::stod(text.substr(at + name.size() + 2));
}

// Key A keeps 8 connections busy with 600-token prompts asking for their log-probabilities
// (each one is 600 logits rows: 300 batches at the default --prefill-chunk, with 4 stateless
// slots always full and 4 more waiting); key B then makes 6 session steps of 4 appended tokens.
// Before the keys took turns, each of B's steps waited behind every A job admitted before it
// (about 4 A completions per step, 24 over the 6); now each of B's prefills goes first every
// other batch, so B's 6 steps take a few dozen batches, in which at most the A jobs that were
// about to end can end. Counts only: no wall-clock bound (the 120 s per request only ends a
// hang).
TEST(FairKeys, FloodingKeyDoesNotStallAnotherKeysSteps) {
  KeyFile keys;
  ServerProcess server(model_path(), {"--api-key-file", keys.path(), "--parallel", "4",
                                      "--max-queue-per-key", "16", "-c", "1024"});
  std::atomic<bool> stop{false};
  std::atomic<int> a_done{0};
  std::atomic<int> a_failed{0};
  std::vector<std::thread> flood;
  for (int t = 0; t < 8; ++t) {
    flood.emplace_back([&, t] {
      TestClient a(server.port(), false, kAKey);
      const json body = {
          {"prompt", tokens(600, 1 + 37 * t)}, {"max_tokens", 1}, {"echo", true}, {"logprobs", 1}};
      while (!stop) {
        const HttpResult r = a.post("/v1/completions", body, 300);
        if (r.status != 200) ++a_failed;
        ++a_done;
      }
    });
  }
  TestClient b(server.port(), false, kBKey);
  while (gauge(b, "tandem_queue_length") < 8 && a_done == 0) {  // A's 8 jobs queued or running
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const HttpResult created = b.post("/tandem/v1/sessions", json::object());
  ASSERT_EQ(created.status, 201) << created.body;
  const std::string id = created.j()["session"];
  const int done_before = a_done;
  int pos = 0;
  for (int i = 0; i < 6; ++i) {
    const HttpResult r = b.post(
        step_path(id),
        {{"expected_pos", pos}, {"append", tokens(4, 1 + 4 * i)}, {"generate", {{"n", 1}}}}, 120);
    ASSERT_EQ(r.status, 200) << r.body;
    pos = r.j()["pos"];
  }
  const int done_during = a_done - done_before;
  stop = true;
  for (auto& t : flood) t.join();
  EXPECT_EQ(a_failed.load(), 0);
  EXPECT_LE(done_during, 3) << "A jobs that ended while B made its 6 steps";
  std::printf("A jobs ended during B's steps: %d; in all: %d\n", done_during, a_done.load());
  EXPECT_GE(a_done.load(), 8);  // the flood was served too: every connection's request ended
}

// One stateless slot, key A's 6 long requests queued for it: key B's short request gets the
// slot as soon as A's running request frees it (B holds no slot, A holds one), not after A's
// whole queue. Before the keys took turns B waited for all 6.
TEST(FairKeys, FreedStatelessSlotGoesToTheKeyHoldingFewest) {
  KeyFile keys;
  ServerProcess server(model_path(), {"--api-key-file", keys.path(), "--parallel", "1",
                                      "--max-queue-per-key", "16", "-c", "1024"});
  std::atomic<int> a_done{0};
  std::vector<std::thread> flood;
  for (int t = 0; t < 6; ++t) {
    flood.emplace_back([&, t] {
      TestClient a(server.port(), false, kAKey);
      const json body = {
          {"prompt", tokens(600, 1 + 37 * t)}, {"max_tokens", 1}, {"echo", true}, {"logprobs", 1}};
      EXPECT_EQ(a.post("/v1/completions", body, 300).status, 200);
      ++a_done;
    });
  }
  TestClient b(server.port(), false, kBKey);
  while (gauge(b, "tandem_queue_length") < 6 && a_done == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const int done_before = a_done;
  const HttpResult r = b.post("/v1/completions", {{"prompt", tokens(8)}, {"max_tokens", 1}}, 300);
  const int done_during = a_done - done_before;
  EXPECT_EQ(r.status, 200) << r.body;
  for (auto& t : flood) t.join();
  EXPECT_LE(done_during, 2) << "A requests that ended while B's one waited and ran";
  std::printf("A requests ended during B's request: %d (A done before it: %d)\n", done_during,
              done_before);
}

// The role is part of the conversation the chat template renders and the tokenizer reads.
TEST(FairKeys, ChatRoleCountsAgainstMaxTextBytes) {
  ServerProcess server(model_path(), {"--max-text-bytes", "1000"});
  TestClient c = server.client();
  const json huge_role = {{"messages", {{{"role", std::string(5000, 'r')}, {"content", "hi"}}}},
                          {"max_tokens", 1}};
  HttpResult r = c.post("/v1/chat/completions", huge_role);
  EXPECT_EQ(r.status, 413) << r.body;
  EXPECT_EQ(r.j()["error"]["field"], "messages") << r.body;
  // Role and content together over the limit, each under it.
  const json together = {
      {"messages", {{{"role", std::string(600, 'r')}, {"content", std::string(600, 'c')}}}},
      {"max_tokens", 1}};
  r = c.post("/v1/chat/completions", together);
  EXPECT_EQ(r.status, 413) << r.body;
}

// The session keeps a hash per history position: a step that rewinds to a shorter prefix is
// checked against that prefix's hash (refused with history_mismatch when wrong, the session
// unchanged), and checks alternating between positions all answer right.
TEST(FairKeys, ExpectedHashIsCheckedAtAnyPrefix) {
  ServerProcess server(model_path());
  TestClient c = server.client();
  HttpResult r = c.post("/tandem/v1/sessions", json::object());
  ASSERT_EQ(r.status, 201) << r.body;
  const std::string id = r.j()["session"];
  const std::vector<int> history = tokens(64, 5);
  r = c.post(step_path(id), {{"expected_pos", 0}, {"append", history}});
  ASSERT_EQ(r.status, 200) << r.body;
  auto prefix = [&](int n) { return std::vector<int>(history.begin(), history.begin() + n); };
  for (int round = 0; round < 3; ++round) {
    for (int at : {8, 40, 1, 63}) {
      const json wrong = {
          {"rewind_to", at}, {"expected_pos", at}, {"expected_hash", hash_hex(prefix(at + 1))}};
      r = c.post(step_path(id), wrong);
      EXPECT_EQ(r.status, 409) << r.body;
      EXPECT_EQ(r.j()["error"]["code"], "history_mismatch") << r.body;
    }
    // Refused steps left the whole history: the full length's hash still passes.
    r = c.post(step_path(id), {{"expected_pos", 64}, {"expected_hash", hash_hex(history)}});
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.j()["pos"], 64);
  }
  // The right hash of a shorter prefix is accepted, with the rewind it names ...
  r = c.post(step_path(id), {{"rewind_to", 40},
                             {"expected_pos", 40},
                             {"expected_hash", hash_hex(prefix(40))},
                             {"append", tokens(3, 500)}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j()["pos"], 43);
  // ... and the hashes past the cut are those of the new history.
  std::vector<int> now = prefix(40);
  for (int t : tokens(3, 500)) now.push_back(t);
  r = c.post(step_path(id), {{"expected_pos", 43}, {"expected_hash", hash_hex(history)}});
  EXPECT_EQ(r.status, 409) << r.body;
  r = c.post(step_path(id), {{"expected_pos", 43}, {"expected_hash", hash_hex(now)}});
  EXPECT_EQ(r.status, 200) << r.body;
}

}  // namespace
}  // namespace tandem::testing
