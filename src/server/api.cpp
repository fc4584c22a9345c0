// The HTTP API's front: who is calling (auth), which handler answers (the route table), the
// admin and service routes (/health, /metrics, /v1/models, /props, /tokenize, /detokenize,
// listing sessions), and what every protocol shares: the answers (JSON, SSE, errors), the CPU
// workers and log-probabilities. The protocols live beside it (api_internal.h lists the files).
#include "server/api.h"
#include "runtime/model_internals.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "server/api_internal.h"
#include "server/fair_share.h"

namespace tandem::server {

// ---------------------------------------------------------------------------------------------
// Log-probabilities

std::vector<TopEntry> top_n(std::span<const float> logits, int n, double log_z) {
  std::vector<TopEntry> out;
  for (const TokenLogProb& t : tandem::top_n(logits, n, log_z))
    out.push_back({t.id, static_cast<float>(t.log_prob)});
  return out;
}

json top_json(const std::vector<TopEntry>& top) {
  json a = json::array();
  for (const auto& e : top) a.push_back({{"id", e.id}, {"logprob", e.logprob}});
  return a;
}

// ---------------------------------------------------------------------------------------------
// Answers

std::string error_body(const std::string& code, const std::string& message, const json& extra) {
  const bool more = extra.is_object() && !extra.empty();
  return net::error_json(code, message,
                         more ? extra.dump(-1, ' ', false, json::error_handler_t::replace) : "");
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void send_json(Responder& res, int status, const json& body, const HeaderList& headers) {
  net::send_json_text(res, status, body.dump(-1, ' ', false, json::error_handler_t::replace),
                      headers);
}

void send_error(Responder& res, const ApiError& e) {
  HeaderList h;
  if (e.status == 429 || e.status == 503) {
    // An error that knows when to come back says so in error.retry_after (seconds).
    const auto it = e.extra.find("retry_after");
    const bool known = it != e.extra.end() && it->is_number_integer();
    h.push_back({"Retry-After", known ? std::to_string(it->get<int64_t>()) : "1"});
  }
  net::send_json_text(res, e.status, error_body(e.code, e.what(), e.extra), h);
}

std::string sse(const json& j) {
  return sse_text(j.dump(-1, ' ', false, json::error_handler_t::replace));
}

std::string sse_text(const std::string& json_text) {
  return "data: " + json_text + "\n\n";
}

// Records the status of every answer for /metrics.
class CountingResponder : public Responder {
 public:
  CountingResponder(std::shared_ptr<Responder> inner, Metrics& m, std::string route)
      : inner_(std::move(inner)), metrics_(m), route_(std::move(route)), t0_(Clock::now()) {}
  ~CountingResponder() override {
    if (status_ >= 0 && model_request_) {
      metrics_.request_seconds.observe(std::chrono::duration<double>(Clock::now() - t0_).count());
    }
  }
  void send(int status, const std::string& ct, std::string body,
            const HeaderList& h = {}) override {
    record(status);
    inner_->send(status, ct, std::move(body), h);
  }
  void start_stream(int status, const std::string& ct, const HeaderList& h) override {
    record(status);
    inner_->start_stream(status, ct, h);
  }
  bool write(std::string chunk) override { return inner_->write(std::move(chunk)); }
  void end() override { inner_->end(); }
  bool alive() const override { return inner_->alive(); }
  Room reserve(size_t bytes) override { return inner_->reserve(bytes); }
  void set_model_request() { model_request_ = true; }

 private:
  void record(int status) {
    if (status_ >= 0) return;
    status_ = status;
    metrics_.count_request(route_, status);
  }
  std::shared_ptr<Responder> inner_;
  Metrics& metrics_;
  std::string route_;
  Clock::time_point t0_;
  int status_ = -1;
  bool model_request_ = false;
};

namespace {

// Runs `work` and answers any request error it throws: ApiError with its own status, a JSON type
// error or another tandem::Error as 400. Used on the I/O thread and on the CPU workers alike.
template <class Work>
void answering_errors(Responder& res, Work&& work) {
  try {
    work();
  } catch (const ApiError& e) {
    send_error(res, e);
  } catch (const json::exception& e) {
    send_error(res, ApiError(400, "bad_request", std::string("bad JSON value: ") + e.what()));
  } catch (const Error& e) {
    send_error(res, ApiError(400, "bad_request", e.what()));
  }
}

}  // namespace

// Threads for the request work whose CPU grows with the body: tokenizing prompts and texts,
// rendering chat templates, detokenizing. It never runs on an I/O thread, so /health and the
// native steps stay prompt whatever text other clients send. The queue is bounded (a full one
// answers 503); tasks still queued when the server goes away are dropped, and their responders
// answer 500 as they are destroyed. The queue takes turns between keys (fair_share.h
// FairQueue): with K keys waiting, a key's oldest task starts within K tasks, however many
// another key has queued; and one key holds at most `max_per_key` places, so that on a server
// with several clients a flood leaves places for the others.
class CpuWorkers {
 public:
  CpuWorkers(int threads, size_t max_queued, size_t max_per_key)
      : max_queued_(max_queued), max_per_key_(max_per_key) {
    for (int i = 0; i < std::max(1, threads); ++i) {
      threads_.emplace_back([this] {
        yield_to_engine();
        loop();
      });
    }
  }
  ~CpuWorkers() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
      queue_.clear();
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }
  // Queues `task` in `key`'s lane; false when the queue is full.
  bool post(const std::string& key, std::function<void()> task) {
    {
      std::lock_guard lk(mu_);
      if (stop_ || queue_.size() >= max_queued_ || queue_.size_of(key) >= max_per_key_) {
        return false;
      }
      queue_.push(key, std::move(task));
    }
    wake_.notify_one();
    return true;
  }

 private:
  // Below the engine threads (Linux: a thread's nice value is its own): a burst of request work,
  // such as 60 clients' 0.8 MB /detokenize bodies at once, must not stall every session's decode
  // steps, whose threads wait for one another at each layer. Raising one's own nice value needs
  // no privilege; if it fails, the workers run as before.
  static void yield_to_engine() {
    setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), kNice);
  }
  static constexpr int kNice = 19;

  void loop() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock lk(mu_);
        wake_.wait(lk, [&] { return stop_ || !queue_.empty(); });
        if (stop_) return;
        task = queue_.pop();
      }
      task();
    }
  }

  const size_t max_queued_;
  const size_t max_per_key_;
  std::mutex mu_;
  std::condition_variable wake_;
  FairQueue<std::function<void()>> queue_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

// ---------------------------------------------------------------------------------------------
// The API

Api::Impl::Impl(Scheduler& s, Metrics& m, const ApiOptions& o)
    : sched(s),
      metrics(m),
      options(o),
      model(s.model()),
      tok(ModelInternals::tokenizer(s.model())),
      vocab_hash(tok.fingerprint_hex()) {
  const ModelInfo& info = model.info();
  model_json = {{"name", options.model_name}, {"arch", info.arch}, {"n_vocab", info.n_vocab},
                {"vocab_hash", vocab_hash},   {"bos", tok.bos()},  {"eos", tok.eos()},
                {"eog", tok.eog_ids()}};
  limits_json = {{"n_ctx", s.options().n_ctx},
                 {"max_step_tokens", s.options().n_ctx},
                 {"max_generate", options.max_generate},
                 {"max_draft", options.max_draft},
                 {"max_top_n", options.max_top_n},
                 {"idle_timeout_s", s.options().idle_timeout_s},
                 {"max_sessions", s.options().max_sessions},
                 {"max_queued_steps", s.options().max_queued_steps}};
  // With several clients one key may hold three quarters of the tokenizer queue (at least 1).
  const auto places = static_cast<size_t>(options.max_cpu_queue);
  const size_t per_key =
      options.keys.client_count() > 1 ? std::max<size_t>(1, places * 3 / 4) : places;
  workers = std::make_unique<CpuWorkers>(options.cpu_workers, places, per_key);
}

Api::Impl::~Impl() = default;

// Runs `work(request, responder)` on a CPU worker with its own copy of the request, in the
// caller's lane of the workers' fair queue (route has authenticated it already, so this only
// finds the name again: a digest and a compare per stored key).
void Api::Impl::offload(const HttpRequest& req, ResponderPtr res, Work work) {
  auto copy = std::make_shared<HttpRequest>(req);
  const bool queued = workers->post(authenticate(req).name, [copy, res, work = std::move(work)] {
    answering_errors(*res, [&] { work(*copy, res); });
  });
  if (!queued) {
    ++metrics.rejected_overload;
    throw ApiError(503, "unavailable",
                   "the tokenizer queue (" + std::to_string(options.max_cpu_queue) +
                       " places, at most three quarters per client when there are several) "
                       "has no place for this request; retry later");
  }
}

// Queues a job for `who`; refused: 503 while draining, 429 over the client's own quota or
// when the whole queue is full. `undo` runs first when refused (a step gives its history back).
void Api::Impl::submit_or_refuse(const std::shared_ptr<Job>& job, const Credential& who,
                                 const std::function<void()>& undo) {
  job->owner = who.name;
  SubmitRefusal why = SubmitRefusal::None;
  if (sched.submit(job, &why)) return;
  if (undo) undo();
  throw queue_refusal(why, who);
}

// Why a job found no place: 503 while draining, 429 over the client's own quota or when the
// whole queue is full.
ApiError Api::Impl::queue_refusal(SubmitRefusal why, const Credential& who) {
  if (why == SubmitRefusal::Draining) {
    return ApiError(503, "unavailable", "the server is shutting down");
  }
  ++metrics.rejected_overload;
  if (why == SubmitRefusal::KeyQuota) {
    return ApiError(429, "over_quota",
                    client_label(who) + " has " +
                        std::to_string(sched.options().max_queue_per_key) +
                        " jobs queued or running, its quota (--max-queue-per-key); retry later",
                    {{"quota", "max_queue_per_key"}, {"limit", sched.options().max_queue_per_key}});
  }
  return ApiError(429, "overloaded",
                  "the work queue is full (" + std::to_string(sched.options().max_queue) +
                      " jobs); retry later");
}

std::string Api::Impl::client_label(const Credential& who) {
  return who.name.empty() ? std::string("this client") : "client '" + who.name + "'";
}

// Who is calling: the credential whose key the Bearer header holds (401 when none matches),
// or the anonymous client when the server has no keys.
Credential Api::Impl::authenticate(const HttpRequest& req) const {
  if (options.keys.empty()) return {};
  const std::string auth = req.header("authorization");
  const std::string prefix = "Bearer ";
  const Credential* who =
      auth.rfind(prefix, 0) == 0 ? options.keys.find(auth.substr(prefix.size())) : nullptr;
  if (!who) {
    throw ApiError(401, "unauthorized", "a valid 'Authorization: Bearer <key>' header is required");
  }
  return *who;
}

// Admin routes: the admin key; on a server without any key, a loopback --host instead (no
// one else can connect, unless a proxy on this host forwards to it: then set --admin-key).
void Api::Impl::require_admin(const Credential& who, const std::string& what) const {
  if (who.admin || (options.keys.empty() && options.loopback_only)) return;
  std::string why;
  if (options.keys.has_admin()) {
    why = "needs the admin key";
  } else if (!options.keys.empty()) {
    why =
        "needs an admin key, and this server has none (--admin-key, or 'admin' after a key "
        "in --api-key-file)";
  } else {
    why = "needs an admin key: a server without keys allows it only on a loopback --host";
  }
  throw ApiError(403, "forbidden", what + " " + why);
}

void Api::Impl::list(Responder& res, const Credential& who) {
  require_admin(who, "listing sessions");
  json a = json::array();
  for (const auto& s : sched.list_sessions()) {
    a.push_back({{"session", s.id},
                 {"owner", s.owner},
                 {"pos", s.pos},
                 {"idle_s", s.idle_s},
                 {"kv_bytes", s.kv_bytes}});
  }
  send_json(res, 200,
            {{"sessions", a},
             {"kv_bytes_in_use", sched.kv_bytes_in_use()},
             {"kv_cap", sched.options().kv_cap_bytes}});
}

namespace {

// At most the bytes JSON writes for `text`: ASCII as it is or escaped (2 bytes, 6 for a control
// character), any other byte at most 3 (invalid UTF-8 becomes U+FFFD's 3 bytes).
size_t json_string_bound(std::string_view text) {
  size_t n = 2;  // the quotes
  for (const char c : text) {
    const auto b = static_cast<unsigned char>(c);
    n += b >= 0x80 ? 3 : b < 0x20 ? 6 : (b == '"' || b == '\\') ? 2 : 1;
  }
  return n;
}

// Holds room in the write queues for an answer of at most `bytes` before it is built, so that a
// client that never reads cannot make the server build and hold it: 413 over what one client
// may have queued (--max-write-queue), 503 when answers waiting for slow clients fill what all
// may have (--max-write-total).
void reserve_answer(Responder& res, size_t bytes, Metrics& metrics) {
  switch (res.reserve(bytes)) {
    case Responder::Room::Ok:
      return;
    case Responder::Room::OverConnection:
      throw ApiError(413, "too_large",
                     "the answer would be up to " + std::to_string(bytes) +
                         " bytes, over what one client may have queued (--max-write-queue); "
                         "ask for less");
    case Responder::Room::OverTotal:
      ++metrics.rejected_overload;
      throw ApiError(503, "unavailable",
                     "answers waiting for slow clients fill the server's answer bytes "
                     "(--max-write-total); retry later");
  }
}

// The ids (and pieces) as JSON, written straight into one string: built as a json tree, an
// answer with pieces would cost some 25 times its bytes while it is made. The same bytes as
// nlohmann's dump of [{"id","piece"}...] (keys in order, invalid UTF-8 as U+FFFD).
std::string tokens_json(const Tokenizer& tok, const std::vector<TokenId>& ids, bool with_pieces) {
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) out += ',';
    if (!with_pieces) {
      out += std::to_string(ids[i]);
      continue;
    }
    out += "{\"id\":";
    out += std::to_string(ids[i]);
    out += ",\"piece\":";
    out += json(tok.token_to_piece(ids[i])).dump(-1, ' ', false, json::error_handler_t::replace);
    out += '}';
  }
  out += ']';
  return out;
}

}  // namespace

void Api::Impl::tokenize(const HttpRequest& req, Responder& res) {
  const json j = parse_body(req.body);
  const json* c = field(j, "content");
  if (!c) c = field(j, "text");
  if (!c || !c->is_string()) throw bad("content", "must be a string");
  const bool add_special = get_bool(j, "add_special", true);
  const bool parse_special = get_bool(j, "parse_special", true);
  const bool with_pieces = get_bool(j, "with_pieces", false);
  const auto ids =
      tok.encode(checked_text(*c, "content", options.max_text_bytes), add_special, parse_special);
  // An id is at most 11 bytes with its comma; with its piece, an object of 24 bytes more.
  size_t bound = 64 + vocab_hash.size();
  for (TokenId id : ids)
    bound += 11 + (with_pieces ? 24 + json_string_bound(tok.token_to_piece(id)) : 0);
  reserve_answer(res, bound, metrics);
  std::string out = "{\"n_vocab\":" + std::to_string(n_vocab()) + ",\"tokens\":";
  out += tokens_json(tok, ids, with_pieces);
  out += ",\"vocab_hash\":" + json(vocab_hash).dump();
  out += '}';
  net::send_json_text(res, 200, std::move(out));
}

void Api::Impl::detokenize(const HttpRequest& req, Responder& res) {
  const json j = parse_body(req.body);
  const json* t = field(j, "tokens");
  if (!t) throw bad("tokens", "is required");
  const auto ids = get_ids(*t, "tokens", n_vocab(), 1 << 20);
  // The decoded text is at most its pieces joined (decode only removes spaces).
  size_t bound = 16;
  for (TokenId id : ids) bound += json_string_bound(tok.token_to_piece(id)) - 2;
  reserve_answer(res, bound, metrics);
  send_json(res, 200, {{"content", tok.decode(ids)}});
}

void Api::Impl::models(Responder& res) {
  const ModelInfo& info = model.info();
  json m = {{"id", options.model_name},
            {"object", "model"},
            {"created", unix_now()},
            {"owned_by", "tandem"},
            {"meta",
             {{"arch", info.arch},
              {"n_vocab", info.n_vocab},
              {"n_ctx", n_ctx()},
              {"n_ctx_train", info.n_ctx_train},
              {"n_embd", info.n_embd},
              {"n_params", info.n_params},
              {"size", info.file_bytes},
              {"vocab_hash", vocab_hash}}}};
  send_json(res, 200, {{"object", "list"}, {"data", json::array({m})}});
}

void Api::Impl::props(Responder& res) {  // llama.cpp's /props, for vocabulary checks
  send_json(res, 200,
            {{"model_path", model.info().path},
             {"n_ctx", n_ctx()},
             {"vocab_hash", vocab_hash},
             {"n_vocab", n_vocab()},
             {"total_slots", sched.options().stateless_slots}});
}

Api::Api(Scheduler& scheduler, Metrics& metrics, const ApiOptions& options)
    : impl_(std::make_shared<Impl>(scheduler, metrics, options)) {}

namespace {

// The route label for metrics: session ids folded away, unknown paths as one label.
std::string route_label(const std::string& path) {
  static const char* known[] = {"/health",
                                "/metrics",
                                "/v1/models",
                                "/v1/completions",
                                "/v1/chat/completions",
                                "/completion",
                                "/completions",
                                "/generate",
                                "/tokenize",
                                "/detokenize",
                                "/props",
                                protocol::kInfoPath,
                                protocol::kSessionsPath};
  for (const char* k : known) {
    if (path == k) return k;
  }
  if (path.rfind(protocol::kSessionPrefix, 0) == 0) {
    for (const char* action : {protocol::kStep, protocol::kCancel}) {
      if (path.size() > std::strlen(protocol::kSessionPrefix) + std::strlen(action) &&
          path.ends_with(action))
        return std::string("/tandem/v1/sessions/{id}") + action;
    }
    return "/tandem/v1/sessions/{id}";
  }
  return "other";
}

}  // namespace

void Api::handle(const HttpRequest& req, std::shared_ptr<Responder> raw) {
  auto res = std::make_shared<CountingResponder>(raw, impl_->metrics, route_label(req.path));
  answering_errors(*res, [&] { impl_->route(req, res, draining_); });
}

// Picks the handler of a request. Cheap work (auth, info, native steps: token ids only) runs here
// on the I/O thread; anything that tokenizes goes to the CPU workers.
void Api::Impl::route(const HttpRequest& req, const std::shared_ptr<CountingResponder>& res,
                      bool draining) {
  Impl& m = *this;
  const std::string& p = req.path;
  const bool get = req.method == "GET";
  const bool post = req.method == "POST";
  if (p == "/health") {
    if (draining) throw ApiError(503, "unavailable", "the server is shutting down");
    return send_json(*res, 200, {{"status", "ok"}});
  }
  const Credential who = m.authenticate(req);
  if (p == "/metrics" && get) {
    return res->send(200, "text/plain; version=0.0.4", m.metrics.render());
  }
  if (p == "/v1/models" && get) return m.models(*res);
  if (p == "/props" && get) return m.props(*res);
  if (p == protocol::kInfoPath && get) return m.info(*res);
  if (p == protocol::kSessionsPath && get) return m.list(*res, who);
  if (p == "/tokenize" && post) {
    return m.offload(req, res,
                     [&m](const HttpRequest& r, ResponderPtr out) { m.tokenize(r, *out); });
  }
  if (p == "/detokenize" && post) {
    return m.offload(req, res,
                     [&m](const HttpRequest& r, ResponderPtr out) { m.detokenize(r, *out); });
  }
  if (p.rfind(protocol::kSessionPrefix, 0) == 0) return m.route_session(req, res, who, draining);
  if (draining && post) throw ApiError(503, "unavailable", "the server is shutting down");
  if (p == protocol::kSessionsPath && post) return m.create(req, *res, who);
  if (post) {
    static const std::pair<const char*, Dialect> kCompletions[] = {
        {"/v1/completions", Dialect::OpenAiText},
        {"/v1/chat/completions", Dialect::OpenAiChat},
        {"/completion", Dialect::LlamaCpp},
        {"/completions", Dialect::LlamaCpp},
        {"/generate", Dialect::SgLang}};
    for (const auto& [path, dialect] : kCompletions) {
      if (p != path) continue;
      res->set_model_request();
      return m.offload(req, res, [&m, d = dialect, who](const HttpRequest& r, ResponderPtr out) {
        m.completion(r, std::move(out), d, who);
      });
    }
  }
  throw ApiError(404, "not_found", "no such path: " + req.method + " " + p);
}

// /tandem/v1/sessions/{id}[/step|/cancel]. A cancel is taken while the server drains: it only
// takes work away.
void Api::Impl::route_session(const HttpRequest& req, const std::shared_ptr<CountingResponder>& res,
                              const Credential& who, bool draining) {
  const std::string& p = req.path;
  std::string id = p.substr(std::strlen(protocol::kSessionPrefix));
  std::string action;
  for (const char* a : {protocol::kStep, protocol::kCancel}) {
    if (id.size() > std::strlen(a) && id.ends_with(a)) {
      action = a;
      id.resize(id.size() - action.size());
      break;
    }
  }
  const bool post = req.method == "POST";
  if (draining && post && action != protocol::kCancel) {
    throw ApiError(503, "unavailable", "the server is shutting down");
  }
  if (id.empty() || id.size() > 64 || id.find('/') != std::string::npos) {
    throw ApiError(404, "not_found", "no such path: " + p);
  }
  if (action == protocol::kStep && post) {
    res->set_model_request();
    return step(id, req, res, who);
  }
  if (action == protocol::kCancel && post) return cancel(id, req, *res, who);
  if (action.empty() && req.method == "DELETE") return close(id, *res, who);
  throw ApiError(405, "bad_method", req.method + " is not allowed on " + p);
}

}  // namespace tandem::server
