// A bounded load test of `tandem serve` on 127.0.0.1: 64 sessions doing mixed prefill, decode
// and verify steps from 64 threads while 256 idle keep-alive connections stay open, for a fixed
// time (TANDEM_LOAD_SECONDS, default 12). Checks: no error but intended 429s, the idle
// connections still answer afterwards, the server's RSS stays within its model, its KV cap and a
// fixed allowance, and every session made progress. Prints the step latency distribution (the
// figures themselves belong in docs/benchmarks.md, not in assertions).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <mutex>
#include <random>

#include "common/testdata.h"
#include "model/model_config.h"
#include "runtime/model_internals.h"
#include "server_harness.h"
#include "tandem/engine.h"

namespace tandem::testing {
namespace {

long rss_kib(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

TEST(ServerLoad, SixtyFourSessionsAndIdleConnections) {
  const char* model_env = std::getenv("TANDEM_LOAD_MODEL");
  const std::string path = model_env ? model_env : testdata_path("models/synth-gemma3-Q4_K_M.gguf");
  const double seconds =
      std::getenv("TANDEM_LOAD_SECONDS") ? std::atof(std::getenv("TANDEM_LOAD_SECONDS")) : 12;
  auto model = Model::load(path);
  const ModelConfig& cfg = ModelInternals::config(*model);
  const int n_vocab = model->info().n_vocab;
  const uint64_t per_token = static_cast<uint64_t>(cfg.n_layer) * (cfg.kv_dim() + cfg.v_dim()) * 4;
  constexpr int kSessions = 64, kIdle = 256, kMaxHistory = 768;
  // Room for every session's full history, so nothing is evicted: any 410 is an error here.
  const uint64_t kv_cap = per_token * kSessions * (kMaxHistory + 64);
  ServerProcess server(path, {"--max-sessions", "72", "-c", "1024", "--kv-cap",
                              std::to_string(kv_cap), "--max-queue", "96", "-t", "2",
                              // every connection comes from 127.0.0.1
                              "--max-connections-per-ip", "0"});
  const long rss_start = rss_kib(server.pid());

  // Idle devices: a connection each that asked once and then holds on.
  std::vector<std::unique_ptr<TestClient>> idle;
  for (int i = 0; i < kIdle; ++i) {
    idle.push_back(std::make_unique<TestClient>(server.port()));
    ASSERT_EQ(idle.back()->get("/health").status, 200);
  }

  std::atomic<int> errors{0}, overloaded{0};
  std::atomic<long> rss_max{rss_start};
  std::mutex mu;
  std::vector<double> latencies_ms;
  std::vector<int> steps_done(kSessions, 0);
  std::string first_error;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);

  std::vector<std::thread> workers;
  for (int w = 0; w < kSessions; ++w) {
    workers.emplace_back([&, w] {
      std::mt19937 rng(1234 + w);
      TestClient c = server.client();
      std::string id;
      int pos = 0;
      auto fail = [&](const std::string& what) {
        ++errors;
        std::lock_guard lk(mu);
        if (first_error.empty()) first_error = what;
      };
      while (std::chrono::steady_clock::now() < deadline) {
        if (id.empty() || pos > kMaxHistory - 80) {
          if (!id.empty()) c.request("DELETE", "/tandem/v1/sessions/" + id);
          const HttpResult r = c.post("/tandem/v1/sessions", json::object());
          if (r.status != 201) {
            fail("create: " + std::to_string(r.status) + " " + r.body);
            return;
          }
          id = r.j()["session"];
          pos = 0;
        }
        json step = {{"expected_pos", pos}};
        const int kind = pos == 0 ? 0 : static_cast<int>(rng() % 3);
        const int n_append =
            kind == 0 ? 16 + static_cast<int>(rng() % 48) : static_cast<int>(rng() % 4);
        std::vector<TokenId> append(n_append);
        for (auto& t : append) t = static_cast<TokenId>(rng() % n_vocab);
        step["append"] = append;
        if (kind == 1) step["generate"] = {{"n", 1 + static_cast<int>(rng() % 6)}};
        if (kind == 2) {
          std::vector<TokenId> draft(1 + rng() % 5);
          for (auto& t : draft) t = static_cast<TokenId>(rng() % n_vocab);
          step["verify"] = {{"draft", draft}};
        }
        if (kind == 0 && append.empty()) step["append"] = {1};
        const auto t0 = std::chrono::steady_clock::now();
        HttpResult r;
        try {
          r = c.post("/tandem/v1/sessions/" + id + "/step", step, 60);
        } catch (const std::exception& e) {
          fail(std::string("transport: ") + e.what());
          c.reset();
          continue;
        }
        const double ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count();
        if (r.status == 429) {
          ++overloaded;
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          continue;
        }
        if (r.status != 200) {
          fail("step: " + std::to_string(r.status) + " " + r.body);
          id.clear();
          continue;
        }
        pos = r.j()["pos"];
        {
          std::lock_guard lk(mu);
          latencies_ms.push_back(ms);
          ++steps_done[w];
        }
        if (w == 0) rss_max = std::max(rss_max.load(), rss_kib(server.pid()));
      }
    });
  }
  for (auto& t : workers) t.join();
  rss_max = std::max(rss_max.load(), rss_kib(server.pid()));

  int idle_ok = 0;
  for (auto& c : idle) idle_ok += c->get("/health").status == 200;
  const std::string metrics = server.client().get("/metrics").body;

  std::sort(latencies_ms.begin(), latencies_ms.end());
  auto pct = [&](double p) {
    return latencies_ms.empty() ? 0.0
                                : latencies_ms[static_cast<size_t>(p * (latencies_ms.size() - 1))];
  };
  std::printf(
      "load: %zu steps in %.0f s from %d sessions, %d idle connections; 429s %d, errors %d\n",
      latencies_ms.size(), seconds, kSessions, kIdle, overloaded.load(), errors.load());
  std::printf("step latency ms: p50 %.1f  p95 %.1f  p99 %.1f  max %.1f\n", pct(0.5), pct(0.95),
              pct(0.99), latencies_ms.empty() ? 0.0 : latencies_ms.back());
  std::printf("fewest steps by one session: %d; server RSS %ld -> max %ld KiB (KV cap %llu KiB)\n",
              *std::min_element(steps_done.begin(), steps_done.end()), rss_start, rss_max.load(),
              static_cast<unsigned long long>(kv_cap / 1024));

  EXPECT_EQ(errors.load(), 0) << first_error;
  EXPECT_EQ(idle_ok, kIdle) << "idle keep-alive connections must survive the load";
  EXPECT_GT(*std::min_element(steps_done.begin(), steps_done.end()), 0) << "a session was starved";
  // Resident memory: what it was when idle (the mapped model, buffers) plus the KV cap and a fixed
  // allowance for batch scratch and connection buffers.
  EXPECT_LE(rss_max.load(), rss_start + static_cast<long>(kv_cap / 1024) + 200 * 1024);
  EXPECT_NE(metrics.find("tandem_connections"), std::string::npos);
  EXPECT_EQ(server.stop(), 0);
}

}  // namespace
}  // namespace tandem::testing
