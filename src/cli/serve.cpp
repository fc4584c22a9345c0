// tandem serve: the cloud side. Hosts one model for many devices: native sessions
// (docs/protocol.md), OpenAI-, llama.cpp- and SGLang-compatible endpoints, /health, /metrics.
#include "cli/commands.h"
#include "cli/model_flag.h"
#include "tandem/server.h"

namespace tandem::cli {
namespace {

class ServeCommand : public Command {
 public:
  explicit ServeCommand(CLI::App& app)
      : Command(app.add_subcommand(
            "serve",
            "The cloud server: native sessions (docs/protocol.md), /v1/completions, "
            "/v1/chat/completions, /v1/models, /completion, /generate, /tokenize, /detokenize, "
            "/health, /metrics")) {
    // --help lists the flags in the order they are added; the groups keep that order.
    add_model_flags();
    add_client_flags();
    add_tls_flags();
    add_capacity_flags();
    add_connection_flags();
    add_output_flags();
    add_engine_flags();
    add_request_cost_flags();
  }

  int run() override {
    o_.model = model_flag_.resolve(ModelRole::Cloud);
    o_.repack = !no_repack_;
    return server::serve(o_);
  }

 private:
  // The model, and the address to listen on.
  void add_model_flags() {
    model_flag_.add_to(*sub_, ModelRole::Cloud, "GGUF model file");
    sub_->add_option("--host", o_.http.host, "Address to bind (default: loopback only)")
        ->capture_default_str();
    sub_->add_option("--port", o_.http.port, "Port (0: any free port, printed on stderr)")
        ->check(CLI::Range(0, 65535))
        ->capture_default_str();
  }

  // Clients: their keys (one client per key), admin, and their quotas.
  void add_client_flags() {
    sub_->add_option("--api-key", o_.api_key,
                     "Require 'Authorization: Bearer KEY' (one client, named 'default')");
    sub_->add_option("--api-key-file", o_.api_key_file,
                     "Key file: one client per line, 'NAME KEY' or 'NAME KEY admin' ('#' "
                     "comments); a file of one bare key is one client (docs/server.md)");
    // Admin and fairness between clients (docs/server.md, "Keys, sessions and fairness").
    sub_->add_option("--admin-key", o_.admin_key,
                     "Admin key (client 'admin'): may also list every session");
    sub_->add_option("--max-sessions-per-key", o_.scheduler.max_sessions_per_key,
                     "Sessions one client may hold open (0: --max-sessions with one client, "
                     "else a quarter of it)")
        ->check(CLI::Range(0, 4096))
        ->capture_default_str();
    sub_->add_option("--max-queue-per-key", o_.scheduler.max_queue_per_key,
                     "Jobs one client may have queued or running (0: --max-queue with one "
                     "client, else a quarter of it)")
        ->check(CLI::Range(0, 1 << 20))
        ->capture_default_str();
    sub_->add_option("--evict-grace", o_.scheduler.evict_grace_s,
                     "Seconds another client's idle session is safe from eviction")
        ->check(CLI::Range(0.0, 1e7))
        ->capture_default_str();
  }

  // HTTPS instead of HTTP: both or neither (server::serve checks).
  void add_tls_flags() {
    sub_->add_option("--ssl-cert", o_.http.tls_cert_file, "TLS certificate chain (PEM)");
    sub_->add_option("--ssl-key", o_.http.tls_key_file, "TLS private key (PEM)");
  }

  // What the engine holds at once: context, sessions, stateless slots, KV cache, batch, queue.
  void add_capacity_flags() {
    sub_->add_option("-c,--ctx-size", o_.scheduler.n_ctx,
                     "Context per session (0: model default, at most 4096)")
        ->check(CLI::Range(0, 1 << 20))
        ->capture_default_str();
    sub_->add_option("--max-sessions", o_.scheduler.max_sessions, "Open native sessions at most")
        ->check(CLI::Range(1, 4096))
        ->capture_default_str();
    sub_->add_option("--parallel,--np", o_.scheduler.stateless_slots,
                     "Slots for stateless requests (OpenAI, /completion, /generate)")
        ->check(CLI::Range(1, 256))
        ->capture_default_str();
    sub_->add_option("--kv-cap", o_.scheduler.kv_cap_bytes,
                     "KV cache bytes for all sessions together (0: what the slots need)")
        ->capture_default_str();
    sub_->add_option("--idle-timeout", o_.scheduler.idle_timeout_s,
                     "Seconds before an idle session expires")
        ->check(CLI::Range(0.1, 1e7))
        ->capture_default_str();
    sub_->add_option("-b,--batch-size", o_.scheduler.batch_tokens,
                     "Token budget of one decode batch")
        ->check(CLI::Range(1, 65536))
        ->capture_default_str();
    sub_->add_option("--max-queue", o_.scheduler.max_queue, "Jobs waiting or running before 429")
        ->check(CLI::Range(1, 1 << 20))
        ->capture_default_str();
  }

  // Connections: how many, how large, how slow, and the drain on SIGTERM.
  void add_connection_flags() {
    sub_->add_option("--max-body", o_.http.max_body_bytes, "Request body bytes at most")
        ->check(CLI::Range(1024, 1 << 30))
        ->capture_default_str();
    sub_->add_option("--max-connections", o_.http.max_connections, "Open connections at most")
        ->check(CLI::Range(1, 1 << 20))
        ->capture_default_str();
    sub_->add_option("--max-connections-per-ip", o_.http.max_connections_per_ip,
                     "Open connections from one address (IPv6: one /64) at most; 0: no cap "
                     "(behind a proxy, where every client has the proxy's address)")
        ->check(CLI::Range(0, 1 << 20))
        ->capture_default_str();
    sub_->add_option("--header-timeout", o_.http.header_timeout_s,
                     "Seconds a request's headers may take (from the connection's start, or from "
                     "the first byte of a later request on a keep-alive connection)")
        ->check(CLI::Range(0.1, 3600.0))
        ->capture_default_str();
    sub_->add_option("--body-timeout", o_.http.body_timeout_s,
                     "Seconds a request's body may take after its headers")
        ->check(CLI::Range(0.1, 3600.0))
        ->capture_default_str();
    sub_->add_option("--keep-alive-timeout", o_.http.idle_timeout_s,
                     "Seconds an idle keep-alive connection is kept open")
        ->check(CLI::Range(0.1, 86400.0))
        ->capture_default_str();
    sub_->add_option("--max-write-queue", o_.http.max_write_queue_bytes,
                     "Bytes of answer waiting for one client at most (any answer of 16 KiB or "
                     "less always fits); a stream read slower is dropped, a larger answer gets 413")
        ->check(CLI::Range(size_t{4096}, size_t{1} << 34))
        ->capture_default_str();
    sub_->add_option("--max-write-total", o_.http.max_write_total_bytes,
                     "Bytes of answer waiting for all clients together at most; clients that "
                     "left bytes unread longest are closed to make room, else 503")
        ->check(CLI::Range(size_t{65536}, size_t{1} << 40))
        ->capture_default_str();
    sub_->add_option("--slow-reader-grace", o_.http.slow_reader_grace_s,
                     "Seconds a client may leave answer bytes unread before it may be closed to "
                     "make room under --max-write-total")
        ->check(CLI::Range(0.0, 3600.0))
        ->capture_default_str();
    sub_->add_option("--drain-timeout", o_.drain_timeout_s,
                     "Seconds SIGTERM lets running work finish; what is left is answered 503")
        ->check(CLI::Range(0.0, 86400.0))
        ->capture_default_str();
  }

  // What one request may generate: tokens, and open streams.
  void add_output_flags() {
    sub_->add_option("--max-generate", o_.api.max_generate, "Tokens one request may generate")
        ->check(CLI::Range(1, 1 << 20))
        ->capture_default_str();
    sub_->add_option("--max-sse", o_.api.max_sse_clients, "Open streams at most")
        ->check(CLI::Range(1, 1 << 20))
        ->capture_default_str();
  }

  // The engine and its naming: threads, cache types, packed weights, session ids, the model's
  // name, prefill chunking.
  void add_engine_flags() {
    sub_->add_option("-t,--threads", o_.scheduler.n_threads, "Engine threads (default: all cores)")
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    add_kv_cache_flags(sub_, o_.scheduler.type_k, o_.scheduler.type_v);
    sub_->add_option("--http-threads", o_.http.io_threads, "I/O threads")
        ->check(CLI::Range(1, 64))
        ->capture_default_str();
    sub_->add_option(
        "--session-prefix", o_.scheduler.session_prefix,
        "Prefix of this replica's session ids (e.g. r1-), for sticky routing by a proxy");
    sub_->add_flag("--no-repack", no_repack_,
                   "Do not keep the packed copy of the weights that batched decode multiplies "
                   "from (saves about the model's size in memory; batches get slower)");
    sub_->add_option("-a,--alias", o_.api.model_name,
                     "Model name for /v1/models (default: file name)");
    sub_->add_option("--prefill-chunk", o_.scheduler.prefill_chunk,
                     "While other requests run, prompt tokens per batch (one that wants logits "
                     "counts 8): a long prompt delays everyone's next token by one such chunk, "
                     "not by a whole --batch-size")
        ->check(CLI::Range(8, 1 << 20))
        ->capture_default_str();
  }

  // The text and time one request may cost, and the threads that tokenize it.
  void add_request_cost_flags() {
    sub_->add_option("--max-text-bytes", o_.api.max_text_bytes,
                     "Bytes of text one request may ask to tokenize (prompt, messages, /tokenize)")
        ->check(CLI::Range(size_t{1}, size_t{1} << 30))
        ->capture_default_str();
    sub_->add_option("--max-request-time", o_.api.max_request_seconds,
                     "Seconds one request may generate for; then it ends as if at max_tokens")
        ->check(CLI::Range(0.1, 1e7))
        ->capture_default_str();
    sub_->add_option("--cpu-workers", o_.api.cpu_workers,
                     "Threads that tokenize and detokenize requests, off the I/O threads")
        ->check(CLI::Range(1, 64))
        ->capture_default_str();
  }

  server::ServeOptions o_;
  ModelFlag model_flag_;
  bool no_repack_ = false;
};

}  // namespace

std::unique_ptr<Command> make_serve_command(CLI::App& app) {
  return std::make_unique<ServeCommand>(app);
}

}  // namespace tandem::cli
