#include "server/metrics.h"

#include <cstdio>

namespace tandem::server {
namespace {

std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

void line(std::string& out, const std::string& name, const std::string& type,
          const std::string& help) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  std::lock_guard lk(mu_);
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::render(const std::string& name, std::string& out) const {
  std::lock_guard lk(mu_);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += name + "_bucket{le=\"" + number(bounds_[i]) + "\"} " + std::to_string(cumulative) + "\n";
  }
  cumulative += counts_.back();
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(cumulative) + "\n";
  out += name + "_sum " + number(sum_) + "\n";
  out += name + "_count " + std::to_string(count_) + "\n";
}

Metrics::Metrics()
    : batch_tokens({1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048}),
      batch_jobs({1, 2, 4, 8, 16, 32, 64, 128}),
      queue_depth({0, 1, 2, 4, 8, 16, 32, 64, 128, 256}),
      step_seconds({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}),
      request_seconds({0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}) {}

void Metrics::count_request(const std::string& route, int status) {
  std::lock_guard lk(mu_);
  ++requests_[{route, status}];
}

std::string Metrics::render() const {
  std::string out;
  line(out, "tandem_requests_total", "counter", "HTTP requests by route and status.");
  {
    std::lock_guard lk(mu_);
    for (const auto& [key, n] : requests_) {
      out += "tandem_requests_total{route=\"" + key.first + "\",status=\"" +
             std::to_string(key.second) + "\"} " + std::to_string(n) + "\n";
    }
  }
  auto counter = [&](const char* name, const char* help, uint64_t v) {
    line(out, name, "counter", help);
    out += std::string(name) + " " + std::to_string(v) + "\n";
  };
  auto gauge = [&](const char* name, const char* help, int64_t v) {
    line(out, name, "gauge", help);
    out += std::string(name) + " " + std::to_string(v) + "\n";
  };
  counter("tandem_prompt_tokens_total", "Input tokens run through the model.", prompt_tokens);
  counter("tandem_generated_tokens_total", "Tokens sampled by the model.", generated_tokens);
  counter("tandem_cached_prompt_tokens_total",
          "Prompt tokens of stateless requests found in the prefix cache.", cached_prompt_tokens);
  counter("tandem_accepted_drafts_total", "Draft tokens accepted by verify steps.",
          accepted_drafts);
  counter("tandem_evictions_total", "Sessions evicted for KV memory or session slots.", evictions);
  counter("tandem_expirations_total", "Sessions expired after being idle.", expirations);
  counter("tandem_rejected_overload_total", "Requests refused with 429 or 503 for load.",
          rejected_overload);
  counter("tandem_cancelled_jobs_total",
          "Jobs dropped, queued or running, because their client hung up.", cancelled_jobs);
  counter("tandem_cancelled_steps_total",
          "Native steps, waiting or running, cancelled by their device (POST .../cancel).",
          cancelled_steps);
  counter("tandem_drain_failed_jobs_total",
          "Jobs answered 503 at shutdown because --drain-timeout passed.", drain_failed_jobs);
  line(out, "tandem_refused_connections_total", "counter",
       "Connections answered 503 and closed, by the cap that refused them.");
  out += "tandem_refused_connections_total{cap=\"max_connections\"} " +
         std::to_string(refused_connections_total) + "\n";
  out += "tandem_refused_connections_total{cap=\"per_ip\"} " +
         std::to_string(refused_connections_per_ip) + "\n";
  line(out, "tandem_read_timeouts_total", "counter",
       "Connections closed because a request's headers or body were not in by their deadline.");
  out += "tandem_read_timeouts_total{part=\"header\"} " + std::to_string(header_timeouts) + "\n";
  out += "tandem_read_timeouts_total{part=\"body\"} " + std::to_string(body_timeouts) + "\n";
  counter("tandem_slow_clients_dropped_total",
          "Connections dropped because the client did not read its answer (write queue cap or "
          "write timeout).",
          slow_clients_dropped);
  line(out, "tandem_answers_refused_total", "counter",
       "Answers (or their reservations) refused by a bound on queued answer bytes: 413 over "
       "--max-write-queue, 503 over --max-write-total; a stream refused is dropped.");
  out += "tandem_answers_refused_total{bound=\"connection\"} " +
         std::to_string(answers_refused_connection) + "\n";
  out += "tandem_answers_refused_total{bound=\"total\"} " + std::to_string(answers_refused_total) +
         "\n";
  line(out, "tandem_evicted_connections_total", "counter",
       "Connections closed to make room: slow readers for --max-write-total, idle keep-alive "
       "connections for a new connection at a connection cap.");
  out += "tandem_evicted_connections_total{why=\"slow_reader\"} " +
         std::to_string(slow_clients_evicted) + "\n";
  out += "tandem_evicted_connections_total{why=\"idle\"} " +
         std::to_string(idle_connections_evicted) + "\n";
  counter("tandem_client_disconnects_total",
          "Clients that hung up while their request was being answered.", client_disconnects);
  gauge("tandem_sessions_open", "Open native sessions.", sessions_open);
  gauge("tandem_kv_bytes_in_use", "KV cache bytes held by sessions and cached prefixes.",
        kv_bytes_in_use);
  gauge("tandem_queue_length", "Jobs waiting or running.", queue_length);
  gauge("tandem_sse_clients", "Open server-sent-event streams.", sse_clients);
  gauge("tandem_connections", "Open client connections.", connections);
  gauge("tandem_write_queued_bytes", "Answer bytes queued for all clients, not yet written.",
        write_queued_bytes);
  line(out, "tandem_batch_tokens", "histogram", "Tokens per decode batch.");
  batch_tokens.render("tandem_batch_tokens", out);
  line(out, "tandem_batch_jobs", "histogram", "Jobs sharing one decode batch.");
  batch_jobs.render("tandem_batch_jobs", out);
  line(out, "tandem_queue_depth", "histogram", "Jobs waiting or running, per batch.");
  queue_depth.render("tandem_queue_depth", out);
  line(out, "tandem_step_seconds", "histogram", "Native step latency.");
  step_seconds.render("tandem_step_seconds", out);
  line(out, "tandem_request_seconds", "histogram", "Model request latency.");
  request_seconds.render("tandem_request_seconds", out);
  return out;
}

}  // namespace tandem::server
