// The HTTP API of `tandem serve`: the native session protocol (docs/protocol.md) and the
// OpenAI-, llama.cpp- and SGLang-compatible endpoints, all running their model work through one
// Scheduler. Request parsing is strict: every field is type- and range-checked and an error names
// the field.
#pragma once

#include <memory>
#include <string>

#include "server/auth.h"
#include "server/metrics.h"
#include "server/scheduler.h"
#include "tandem/http_server.h"

namespace tandem::server {

// The HTTP server (src/net) the API answers on, by the names the API's files use.
using net::HeaderList;
using net::HttpRequest;
using net::Responder;

struct ApiOptions {
  // Who may call (docs/server.md, "Keys and sessions"). Empty: no auth, every caller is one
  // anonymous client.
  KeyRing keys;
  // Admin routes (listing sessions) without an admin key: allowed only when the server has no
  // keys at all and binds a loopback address.
  bool loopback_only = false;
  std::string model_name;  // what /v1/models reports
  int max_generate = 4096;
  int max_draft = 64;
  int max_top_n = 20;
  int max_sse_clients = 256;
  // Per-request CPU bounds (docs/security.md).
  size_t max_text_bytes = 256 << 10;  // a prompt or /tokenize text longer than this: 413
  double max_request_seconds = 300;   // generation stops ("length") once a job has run this long
  int cpu_workers = 2;                // threads that tokenize and detokenize off the I/O threads
  int max_cpu_queue = 64;             // requests waiting for a worker; more get 503
};

class Api {
 public:
  Api(Scheduler& scheduler, Metrics& metrics, const ApiOptions& options);
  // Answers one request; runs on an I/O thread.
  void handle(const HttpRequest& req, std::shared_ptr<Responder> res);
  // Stops taking model work (SIGTERM): later requests get 503.
  void set_draining() { draining_ = true; }

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
  std::atomic<bool> draining_{false};
};

}  // namespace tandem::server
