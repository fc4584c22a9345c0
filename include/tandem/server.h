// What `tandem serve` needs to run the cloud server, so that the CLI includes no header of
// src/server: the scheduler's and the API's settings (one per flag) and the serve loop itself,
// which binds the port, loads the model while answering /health with 503, and drains on
// SIGTERM. The protocols are described in src/server/api.h and docs/server.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "tandem/engine.h"  // KvCacheType
#include "tandem/http_server.h"

namespace tandem::server {

struct SchedulerOptions {
  int n_ctx = 4096;
  int max_sessions = 64;
  int stateless_slots = 8;
  int batch_tokens = 512;  // token budget of one decode batch
  // While other jobs run, the prompt part of a batch costs at most this many units
  // (--prefill-chunk; a prompt token 1, a prompt token that wants logits kLogitRowCost).
  int prefill_chunk = 16;
  int max_queue = 256;          // jobs waiting or running; more are refused (429)
  uint64_t kv_cap_bytes = 0;    // 0: as much as n_ctx × slots needs
  double idle_timeout_s = 600;  // sessions unused this long expire
  int n_threads = 0;
  KvCacheType type_k = KvCacheType::F32;  // --cache-type-k / -ctk
  KvCacheType type_v = KvCacheType::F32;  // --cache-type-v / -ctv
  // Prepended to session ids, so a proxy in front of several replicas can route a session's
  // steps to the replica that holds it by the id alone (docs/deploy.md).
  std::string session_prefix;
  // Fairness between credentials: sessions one may hold open, and jobs one may have queued or
  // running. 0 or more than the totals: only the totals apply.
  int max_sessions_per_key = 0;
  int max_queue_per_key = 0;
  // Another credential's idle session is never evicted before it has been idle this long (a
  // requester's own idle sessions always may be).
  double evict_grace_s = 60;
  // Steps of one session that may wait behind its running step (protocol feature "queue").
  int max_queued_steps = 2;
};

// The API's settings besides its credentials (ApiOptions in src/server/api.h adds those).
struct ApiSettings {
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

struct ServeOptions {
  std::string model;  // the GGUF file
  // Credentials (docs/server.md, "Keys, sessions and fairness"): --api-key (client 'default'),
  // --api-key-file, --admin-key (client 'admin'); none: every caller is one anonymous client.
  std::string api_key, api_key_file, admin_key;
  // --host, --port, the connection limits, --http-threads (http.io_threads), and TLS from
  // --ssl-cert and --ssl-key (http.tls_cert_file, http.tls_key_file: both or neither).
  net::HttpServerOptions http;
  // A per-key quota of 0 becomes the total with one client, else a quarter of it.
  SchedulerOptions scheduler;
  ApiSettings api;              // an empty model_name becomes the model file's stem
  double drain_timeout_s = 30;  // SIGTERM lets running work finish this long; then 503
  bool repack = true;           // LoadOptions::repack
};

// Runs the server until SIGINT or SIGTERM and returns the exit code: 0 after a drain, 1 when the
// model failed to load (the error printed on stderr). Progress lines go to stderr. Throws
// tandem::Error, before listening, for a bad key file or TLS files.
int serve(ServeOptions options);

}  // namespace tandem::server
