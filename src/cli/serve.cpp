// tandem serve: the cloud side. Hosts one model for many devices: native sessions
// (docs/protocol.md), OpenAI-, llama.cpp- and SGLang-compatible endpoints, /health, /metrics.
#include <utility>  // before Boost 1.74's asio (std::exchange)

#include <algorithm>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "cli/commands.h"
#include "server/api.h"
#include "server/metrics.h"
#include "server/scheduler.h"
#include "tandem/engine.h"
#include "tandem/error.h"
#include "tandem/http_server.h"

namespace tandem::cli {
namespace {

namespace asio = boost::asio;
using namespace tandem::server;

class ServeCommand : public Command {
 public:
  explicit ServeCommand(CLI::App& app)
      : Command(app.add_subcommand(
            "serve",
            "The cloud server: native sessions (docs/protocol.md), /v1/completions, "
            "/v1/chat/completions, /v1/models, /completion, /generate, /tokenize, /detokenize, "
            "/health, /metrics")) {
    sub_->add_option("-m,--model", model_, "GGUF model file")->default_str(default_model_path());
    sub_->add_option("--host", http_.host, "Address to bind (default: loopback only)")
        ->capture_default_str();
    sub_->add_option("--port", http_.port, "Port (0: any free port, printed on stderr)")
        ->check(CLI::Range(0, 65535))
        ->capture_default_str();
    sub_->add_option("--api-key", api_key_,
                     "Require 'Authorization: Bearer KEY' (one client, named 'default')");
    sub_->add_option("--api-key-file", api_key_file_,
                     "Key file: one client per line, 'NAME KEY' or 'NAME KEY admin' ('#' "
                     "comments); a file of one bare key is one client (docs/server.md)");
    // Admin and fairness between clients (docs/server.md, "Keys, sessions and fairness").
    sub_->add_option("--admin-key", admin_key_,
                     "Admin key (client 'admin'): may also list every session");
    sub_->add_option("--max-sessions-per-key", sched_.max_sessions_per_key,
                     "Sessions one client may hold open (0: --max-sessions with one client, "
                     "else a quarter of it)")
        ->check(CLI::Range(0, 4096))
        ->capture_default_str();
    sub_->add_option("--max-queue-per-key", sched_.max_queue_per_key,
                     "Jobs one client may have queued or running (0: --max-queue with one "
                     "client, else a quarter of it)")
        ->check(CLI::Range(0, 1 << 20))
        ->capture_default_str();
    sub_->add_option("--evict-grace", sched_.evict_grace_s,
                     "Seconds another client's idle session is safe from eviction")
        ->check(CLI::Range(0.0, 1e7))
        ->capture_default_str();
    sub_->add_option("--ssl-cert", ssl_cert_, "TLS certificate chain (PEM)");
    sub_->add_option("--ssl-key", ssl_key_, "TLS private key (PEM)");
    sub_->add_option("-c,--ctx-size", sched_.n_ctx,
                     "Context per session (0: model default, at most 4096)")
        ->check(CLI::Range(0, 1 << 20))
        ->capture_default_str();
    sub_->add_option("--max-sessions", sched_.max_sessions, "Open native sessions at most")
        ->check(CLI::Range(1, 4096))
        ->capture_default_str();
    sub_->add_option("--parallel,--np", sched_.stateless_slots,
                     "Slots for stateless requests (OpenAI, /completion, /generate)")
        ->check(CLI::Range(1, 256))
        ->capture_default_str();
    sub_->add_option("--kv-cap", sched_.kv_cap_bytes,
                     "KV cache bytes for all sessions together (0: what the slots need)")
        ->capture_default_str();
    sub_->add_option("--idle-timeout", sched_.idle_timeout_s,
                     "Seconds before an idle session expires")
        ->check(CLI::Range(0.1, 1e7))
        ->capture_default_str();
    sub_->add_option("-b,--batch-size", sched_.batch_tokens, "Token budget of one decode batch")
        ->check(CLI::Range(1, 65536))
        ->capture_default_str();
    sub_->add_option("--max-queue", sched_.max_queue, "Jobs waiting or running before 429")
        ->check(CLI::Range(1, 1 << 20))
        ->capture_default_str();
    sub_->add_option("--max-body", http_.max_body_bytes, "Request body bytes at most")
        ->check(CLI::Range(1024, 1 << 30))
        ->capture_default_str();
    sub_->add_option("--max-connections", http_.max_connections, "Open connections at most")
        ->check(CLI::Range(1, 1 << 20))
        ->capture_default_str();
    sub_->add_option("--max-connections-per-ip", http_.max_connections_per_ip,
                     "Open connections from one address (IPv6: one /64) at most; 0: no cap "
                     "(behind a proxy, where every client has the proxy's address)")
        ->check(CLI::Range(0, 1 << 20))
        ->capture_default_str();
    sub_->add_option("--header-timeout", http_.header_timeout_s,
                     "Seconds a request's headers may take (from the connection's start, or from "
                     "the first byte of a later request on a keep-alive connection)")
        ->check(CLI::Range(0.1, 3600.0))
        ->capture_default_str();
    sub_->add_option("--body-timeout", http_.body_timeout_s,
                     "Seconds a request's body may take after its headers")
        ->check(CLI::Range(0.1, 3600.0))
        ->capture_default_str();
    sub_->add_option("--keep-alive-timeout", http_.idle_timeout_s,
                     "Seconds an idle keep-alive connection is kept open")
        ->check(CLI::Range(0.1, 86400.0))
        ->capture_default_str();
    sub_->add_option("--max-write-queue", http_.max_write_queue_bytes,
                     "Bytes of answer waiting for one client at most; a client that reads slower "
                     "is dropped")
        ->check(CLI::Range(size_t{4096}, size_t{1} << 34))
        ->capture_default_str();
    sub_->add_option("--drain-timeout", drain_timeout_s_,
                     "Seconds SIGTERM lets running work finish; what is left is answered 503")
        ->check(CLI::Range(0.0, 86400.0))
        ->capture_default_str();
    sub_->add_option("--max-generate", api_.max_generate, "Tokens one request may generate")
        ->check(CLI::Range(1, 1 << 20))
        ->capture_default_str();
    sub_->add_option("--max-sse", api_.max_sse_clients, "Open streams at most")
        ->check(CLI::Range(1, 1 << 20))
        ->capture_default_str();
    sub_->add_option("-t,--threads", sched_.n_threads, "Engine threads (default: all cores)")
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    add_kv_cache_flags(sub_, sched_.type_k, sched_.type_v);
    sub_->add_option("--http-threads", http_threads_, "I/O threads")
        ->check(CLI::Range(1, 64))
        ->capture_default_str();
    sub_->add_option(
        "--session-prefix", sched_.session_prefix,
        "Prefix of this replica's session ids (e.g. r1-), for sticky routing by a proxy");
    sub_->add_flag("--no-repack", no_repack_,
                   "Do not keep the packed copy of the weights that batched decode multiplies "
                   "from (saves about the model's size in memory; batches get slower)");
    sub_->add_option("-a,--alias", api_.model_name,
                     "Model name for /v1/models (default: file name)");
    sub_->add_option("--prefill-chunk", sched_.prefill_chunk,
                     "While other requests run, prompt tokens per batch (one that wants logits "
                     "counts 8): a long prompt delays everyone's next token by one such chunk, "
                     "not by a whole --batch-size")
        ->check(CLI::Range(8, 1 << 20))
        ->capture_default_str();
    sub_->add_option("--max-text-bytes", api_.max_text_bytes,
                     "Bytes of text one request may ask to tokenize (prompt, messages, /tokenize)")
        ->check(CLI::Range(size_t{1}, size_t{1} << 30))
        ->capture_default_str();
    sub_->add_option("--max-request-time", api_.max_request_seconds,
                     "Seconds one request may generate for; then it ends as if at max_tokens")
        ->check(CLI::Range(0.1, 1e7))
        ->capture_default_str();
    sub_->add_option("--cpu-workers", api_.cpu_workers,
                     "Threads that tokenize and detokenize requests, off the I/O threads")
        ->check(CLI::Range(1, 64))
        ->capture_default_str();
  }

  int run() override {
    if (model_.empty()) model_ = default_model_path();
    load_keys();
    describe_keys();
    if (api_.model_name.empty()) api_.model_name = std::filesystem::path(model_).stem().string();
    if (ssl_cert_.empty() != ssl_key_.empty()) {
      throw Error("TLS needs both --ssl-cert and --ssl-key");
    }

    // Declared before the I/O context: handlers that the context destroys last still count
    // connections and requests in it.
    Metrics metrics;
    asio::io_context io;
    std::unique_ptr<asio::ssl::context> ssl;
    if (!ssl_cert_.empty()) {
      ssl = std::make_unique<asio::ssl::context>(asio::ssl::context::tls_server);
      ssl->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                       asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 |
                       asio::ssl::context::no_tlsv1_1);
      boost::system::error_code ec;
      ssl->use_certificate_chain_file(ssl_cert_, ec);
      if (ec) throw Error("--ssl-cert '" + ssl_cert_ + "': " + ec.message());
      ssl->use_private_key_file(ssl_key_, asio::ssl::context::pem, ec);
      if (ec) throw Error("--ssl-key '" + ssl_key_ + "': " + ec.message());
      http_.ssl = ssl.get();
    }

    std::atomic<Api*> api{nullptr};
    net::HttpServer server(
        io, http_,
        [&](const HttpRequest& req, std::shared_ptr<Responder> res) {
          if (Api* a = api.load()) return a->handle(req, std::move(res));
          // Still loading: say so (503, as llama.cpp's /health does).
          const bool health = req.path == "/health";
          metrics.count_request(health ? "/health" : "other", 503);
          res->send(503, "application/json",
                    health ? "{\"status\":\"loading model\"}"
                           : "{\"error\":{\"code\":\"unavailable\",\"message\":\"loading model\"}}",
                    {{"Retry-After", "1"}});
        },
        &metrics);
    server.start();
    const char* scheme = ssl ? "https" : "http";
    std::fprintf(stderr, "tandem serve: listening on %s://%s:%d\n", scheme, http_.host.c_str(),
                 server.port());
    std::fflush(stderr);

    // I/O threads answer /health (503) while the model loads.
    auto work = asio::make_work_guard(io);
    std::vector<std::thread> io_threads;
    for (int i = 0; i < http_threads_; ++i) io_threads.emplace_back([&] { io.run(); });

    std::unique_ptr<Model> model;
    std::unique_ptr<Scheduler> scheduler;
    std::unique_ptr<Api> api_impl;
    int rc = 0;
    try {
      LoadOptions lo;
      lo.repack = !no_repack_;
      model = Model::load(model_, lo);
      scheduler = std::make_unique<Scheduler>(*model, sched_, metrics);
      api_impl = std::make_unique<Api>(*scheduler, metrics, api_);
      api.store(api_impl.get());
      const auto& o = scheduler->options();
      std::fprintf(
          stderr,
          "tandem serve: %s ready: n_ctx %d, %d sessions + %d stateless slots, KV cap %.1f "
          "MiB (%llu bytes/token), batch %d tokens, %d engine threads, packed weights %.1f MiB\n",
          api_.model_name.c_str(), o.n_ctx, o.max_sessions, o.stateless_slots,
          static_cast<double>(o.kv_cap_bytes) / (1 << 20),
          static_cast<unsigned long long>(scheduler->kv_bytes_per_token()), o.batch_tokens,
          sched_.n_threads, static_cast<double>(model->info().packed_bytes) / (1 << 20));
      std::fflush(stderr);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      rc = 1;
    }

    // SIGTERM/SIGINT: stop accepting, let queued and running work finish for at most
    // --drain-timeout (then it is answered 503), let the answers go out, exit 0.
    asio::signal_set signals(io, SIGINT, SIGTERM);
    std::thread drainer;
    signals.async_wait([&](const boost::system::error_code& ec, int sig) {
      if (ec) return;
      std::fprintf(stderr, "tandem serve: signal %d, draining (at most %.1f s)\n", sig,
                   drain_timeout_s_);
      std::fflush(stderr);
      if (api_impl) api_impl->set_draining();
      server.stop_accepting();
      drainer = std::thread([&] {
        if (scheduler && !scheduler->drain(drain_timeout_s_)) {
          std::fprintf(stderr,
                       "tandem serve: --drain-timeout passed; unfinished work answered 503\n");
        }
        // Answers are posted to the I/O threads: wait (bounded) until they are written.
        if (!server.finish_answers(5.0)) {
          std::fprintf(stderr, "tandem serve: some answers were not written within 5 s\n");
        }
        work.reset();
        io.stop();
      });
    });
    if (rc != 0) {
      work.reset();
      io.stop();
    }
    for (auto& t : io_threads) t.join();
    if (drainer.joinable()) drainer.join();
    api.store(nullptr);
    api_impl.reset();
    scheduler.reset();
    if (rc == 0) std::fprintf(stderr, "tandem serve: stopped\n");
    return rc;
  }

 private:
  // Credentials from --api-key, --api-key-file and --admin-key, and the per-client quotas that
  // follow from how many clients there are.
  void load_keys() {
    KeyRing& keys = api_.keys;
    if (!api_key_.empty()) keys.add("default", api_key_, false, "--api-key");
    if (!api_key_file_.empty()) keys.merge(KeyRing::load(api_key_file_));
    if (!admin_key_.empty()) keys.add("admin", admin_key_, true, "--admin-key");
    api_.loopback_only = is_loopback_host(http_.host);
    // One client competes only with itself: the totals are its limits.
    const bool many = keys.client_count() > 1;
    if (sched_.max_sessions_per_key == 0) {
      sched_.max_sessions_per_key = many ? std::max(1, sched_.max_sessions / 4) : 0;
    }
    if (sched_.max_queue_per_key == 0) {
      sched_.max_queue_per_key = many ? std::max(1, sched_.max_queue / 4) : 0;
    }
  }

  void describe_keys() const {
    const KeyRing& keys = api_.keys;
    if (keys.empty()) {
      std::fprintf(stderr, "tandem serve: no API key: every caller is one anonymous client%s\n",
                   api_.loopback_only ? "" : "; session listing is refused (no admin key)");
      return;
    }
    const int sessions =
        sched_.max_sessions_per_key ? sched_.max_sessions_per_key : sched_.max_sessions;
    const int queue = sched_.max_queue_per_key ? sched_.max_queue_per_key : sched_.max_queue;
    std::fprintf(stderr,
                 "tandem serve: %zu client key(s)%s; each at most %d sessions and %d queued "
                 "jobs; others' idle sessions are safe from eviction for %g s\n",
                 keys.client_count(), keys.has_admin() ? " and an admin key" : ", no admin key",
                 sessions, queue, sched_.evict_grace_s);
  }

  std::string model_, api_key_, api_key_file_, admin_key_, ssl_cert_, ssl_key_;
  net::HttpServerOptions http_;
  SchedulerOptions sched_;
  ApiOptions api_;
  int http_threads_ = 2;
  double drain_timeout_s_ = 30;
  bool no_repack_ = false;
};

}  // namespace

std::unique_ptr<Command> make_serve_command(CLI::App& app) {
  return std::make_unique<ServeCommand>(app);
}

}  // namespace tandem::cli
