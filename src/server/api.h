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
#include "tandem/server.h"  // ApiSettings

namespace tandem::server {

// The HTTP server (src/net) the API answers on, by the names the API's files use.
using net::HeaderList;
using net::HttpRequest;
using net::Responder;

// The limits (tandem/server.h's ApiSettings) and who may call.
struct ApiOptions : ApiSettings {
  // Who may call (docs/server.md, "Keys and sessions"). Empty: no auth, every caller is one
  // anonymous client.
  KeyRing keys;
  // Admin routes (listing sessions) without an admin key: allowed only when the server has no
  // keys at all and binds a loopback address.
  bool loopback_only = false;
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
