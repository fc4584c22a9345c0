// The serve loop of `tandem serve` (tandem/server.h): credentials, TLS, the HTTP server, the model
// loaded behind a 503 /health, and the drain on SIGTERM.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <thread>
#include <utility>

#include "server/api.h"
#include "server/metrics.h"
#include "server/scheduler.h"
#include "tandem/error.h"
#include "tandem/server.h"

namespace tandem::server {
namespace {

// Credentials from --api-key, --api-key-file and --admin-key, and the per-client quotas that
// follow from how many clients there are.
void load_keys(const ServeOptions& o, ApiOptions& api, SchedulerOptions& sched) {
  KeyRing& keys = api.keys;
  if (!o.api_key.empty()) keys.add("default", o.api_key, false, "--api-key");
  if (!o.api_key_file.empty()) keys.merge(KeyRing::load(o.api_key_file));
  if (!o.admin_key.empty()) keys.add("admin", o.admin_key, true, "--admin-key");
  api.loopback_only = is_loopback_host(o.http.host);
  // One client competes only with itself: the totals are its limits.
  const bool many = keys.client_count() > 1;
  if (sched.max_sessions_per_key == 0) {
    sched.max_sessions_per_key = many ? std::max(1, sched.max_sessions / 4) : 0;
  }
  if (sched.max_queue_per_key == 0) {
    sched.max_queue_per_key = many ? std::max(1, sched.max_queue / 4) : 0;
  }
}

void describe_keys(const ApiOptions& api, const SchedulerOptions& sched) {
  const KeyRing& keys = api.keys;
  if (keys.empty()) {
    std::fprintf(stderr, "tandem serve: no API key: every caller is one anonymous client%s\n",
                 api.loopback_only ? "" : "; session listing is refused (no admin key)");
    return;
  }
  const int sessions = sched.max_sessions_per_key ? sched.max_sessions_per_key : sched.max_sessions;
  const int queue = sched.max_queue_per_key ? sched.max_queue_per_key : sched.max_queue;
  std::fprintf(stderr,
               "tandem serve: %zu client key(s)%s; each at most %d sessions and %d queued "
               "jobs; others' idle sessions are safe from eviction for %g s\n",
               keys.client_count(), keys.has_admin() ? " and an admin key" : ", no admin key",
               sessions, queue, sched.evict_grace_s);
}

// What answers requests once the model is loaded.
struct Loaded {
  std::unique_ptr<Model> model;
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<Api> api;
};

// Loads the model, starts the scheduler and the API, hands the API to the HTTP handler (`api`)
// and prints the ready line. False (the error printed) when that fails.
bool load(const ServeOptions& o, const ApiOptions& api_options, Metrics& metrics,
          std::atomic<Api*>& api, Loaded& out) {
  try {
    LoadOptions lo;
    lo.repack = o.repack;
    out.model = Model::load(o.model, lo);
    out.scheduler = std::make_unique<Scheduler>(*out.model, o.scheduler, metrics);
    out.api = std::make_unique<Api>(*out.scheduler, metrics, api_options);
    api.store(out.api.get());
    const auto& so = out.scheduler->options();
    std::fprintf(
        stderr,
        "tandem serve: %s ready: n_ctx %d, %d sessions + %d stateless slots, KV cap %.1f "
        "MiB (%llu bytes/token), batch %d tokens, %d engine threads, packed weights %.1f MiB\n",
        api_options.model_name.c_str(), so.n_ctx, so.max_sessions, so.stateless_slots,
        static_cast<double>(so.kv_cap_bytes) / (1 << 20),
        static_cast<unsigned long long>(out.scheduler->kv_bytes_per_token()), so.batch_tokens,
        o.scheduler.n_threads, static_cast<double>(out.model->info().packed_bytes) / (1 << 20));
    std::fflush(stderr);
    return true;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return false;
  }
}

// The API's options: --api-key and friends loaded (and described on stderr; the quotas per
// client follow from how many there are), the model's name defaulting to its file's stem.
ApiOptions api_options_for(ServeOptions& o) {
  ApiOptions api_options;
  static_cast<ApiSettings&>(api_options) = o.api;
  load_keys(o, api_options, o.scheduler);
  describe_keys(api_options, o.scheduler);
  if (api_options.model_name.empty())
    api_options.model_name = std::filesystem::path(o.model).stem().string();
  return api_options;
}

// A request while the model loads: 503, as llama.cpp's /health does.
void answer_loading(const HttpRequest& req, Responder& res, Metrics& metrics) {
  const bool health = req.path == "/health";
  metrics.count_request(health ? "/health" : "other", 503);
  std::string body =
      health ? "{\"status\":\"loading model\"}" : net::error_json("unavailable", "loading model");
  net::send_json_text(res, 503, std::move(body), {{"Retry-After", "1"}});
}

}  // namespace

// Longer than most: the HTTP server's I/O threads and its signal handler share the locals here,
// in the order they must be built and torn down (metrics before the server, the API reset only
// after the I/O threads have stopped).
int serve(ServeOptions o) {
  const ApiOptions api_options = api_options_for(o);
  if (o.http.tls_cert_file.empty() != o.http.tls_key_file.empty()) {
    throw Error("TLS needs both --ssl-cert and --ssl-key");
  }

  // Declared before the server (and its I/O loop): handlers that the loop destroys last still
  // count connections and requests in it.
  Metrics metrics;
  std::atomic<Api*> api{nullptr};
  net::HttpServer server(
      o.http,
      [&](const HttpRequest& req, std::shared_ptr<Responder> res) {
        if (Api* a = api.load()) return a->handle(req, std::move(res));
        answer_loading(req, *res, metrics);
      },
      &metrics);
  server.start();  // reads the TLS files; I/O threads answer /health (503) while the model loads
  const char* scheme = o.http.tls_cert_file.empty() ? "http" : "https";
  std::fprintf(stderr, "tandem serve: listening on %s://%s:%d\n", scheme, o.http.host.c_str(),
               server.port());
  std::fflush(stderr);

  Loaded loaded;
  const int rc = load(o, api_options, metrics, api, loaded) ? 0 : 1;

  // SIGTERM/SIGINT: stop accepting, let queued and running work finish for at most
  // --drain-timeout (then it is answered 503), let the answers go out, exit 0.
  std::thread drainer;
  server.on_stop_signal([&](int sig) {
    std::fprintf(stderr, "tandem serve: signal %d, draining (at most %.1f s)\n", sig,
                 o.drain_timeout_s);
    std::fflush(stderr);
    if (loaded.api) loaded.api->set_draining();
    server.stop_accepting();
    drainer = std::thread([&] {
      if (loaded.scheduler && !loaded.scheduler->drain(o.drain_timeout_s)) {
        std::fprintf(stderr,
                     "tandem serve: --drain-timeout passed; unfinished work answered 503\n");
      }
      // Answers are posted to the I/O threads: wait (bounded) until they are written.
      if (!server.finish_answers(5.0)) {
        std::fprintf(stderr, "tandem serve: some answers were not written within 5 s\n");
      }
      server.stop();
    });
  });
  if (rc != 0) server.stop();
  server.wait();
  if (drainer.joinable()) drainer.join();
  api.store(nullptr);
  loaded.api.reset();
  loaded.scheduler.reset();
  if (rc == 0) std::fprintf(stderr, "tandem serve: stopped\n");
  return rc;
}

}  // namespace tandem::server
