// Server metrics in the Prometheus text exposition format (version 0.0.4): counters, gauges and
// histograms with fixed buckets. Thread-safe; cheap enough to update on every request and batch.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "tandem/http_server.h"

namespace tandem::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double v);
  // Appends `name_bucket{le=..}`, `name_sum`, `name_count` lines.
  void render(const std::string& name, std::string& out) const;

 private:
  mutable std::mutex mu_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // [bounds + 1], the last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

// The connection counters (refusals, deadlines, drops, the open-connection gauge) come from
// net::ConnectionCounters, which the HTTP server updates; the rest is the model's work.
class Metrics : public net::ConnectionCounters {
 public:
  Metrics();

  void count_request(const std::string& route, int status);
  std::atomic<uint64_t> prompt_tokens{0};         // tokens run through the model as input
  std::atomic<uint64_t> generated_tokens{0};      // tokens sampled (generate, verify corrections)
  std::atomic<uint64_t> cached_prompt_tokens{0};  // stateless prompt tokens found in the cache
  std::atomic<uint64_t> accepted_drafts{0};
  std::atomic<uint64_t> evictions{0};
  std::atomic<uint64_t> expirations{0};
  std::atomic<uint64_t> rejected_overload{0};  // 429/503 answers for lack of queue or memory
  std::atomic<uint64_t> cancelled_jobs{0};     // jobs dropped, queued or running: client gone
  std::atomic<uint64_t> cancelled_steps{0};    // native steps cancelled by their device
  std::atomic<uint64_t> drain_failed_jobs{0};  // jobs answered 503 when --drain-timeout passed
  std::atomic<int64_t> sessions_open{0};
  std::atomic<int64_t> kv_bytes_in_use{0};
  std::atomic<int64_t> queue_length{0};
  std::atomic<int64_t> sse_clients{0};
  Histogram batch_tokens;     // tokens per decode batch
  Histogram batch_jobs;       // jobs per decode batch
  Histogram queue_depth;      // jobs waiting or running, sampled per batch
  Histogram step_seconds;     // native step latency, arrival to answer
  Histogram request_seconds;  // any model request, arrival to last byte produced

  std::string render() const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
};

}  // namespace tandem::server
