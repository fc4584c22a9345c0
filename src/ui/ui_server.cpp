#include "ui/ui_server.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <limits>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <boost/asio/ip/address.hpp>

#include "tandem/error.h"
#include "tandem/json_guard.h"
#include "ui/assets.h"

namespace tandem::ui {

using net::HttpRequest;
using net::Responder;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// Invalid UTF-8 (a token piece that splits a character) becomes U+FFFD instead of throwing.
std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

void send_json(Responder& responder, int status, const json& body) {
  net::send_json_text(responder, status, dump(body));
}

void send_error(Responder& responder, int status, const std::string& code,
                const std::string& message, const std::string& field = "") {
  const std::string extra = field.empty() ? std::string() : dump({{"field", field}});
  net::send_json_text(responder, status, net::error_json(code, message, extra));
}

// The page's policies: the heuristics, and "router" for the command line's trained router.
const char* policy_names[] = {"confidence", "entropy", "margin", "random",
                              "always",     "never",   "router"};

// A router as the page names it.
std::string page_policy_name(const RouterConfig& r) {
  return r.policy == RouterPolicy::Mlp ? "router" : router_policy_name(r.policy);
}

const json& field_of(const json& body, const char* name) {
  static const json absent;
  const auto it = body.find(name);
  return it == body.end() ? absent : *it;
}

// A bound as people write it: 1024, not 1024.0.
std::string bound_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

double number_in(const json& value, const char* name, double lo, double hi) {
  if (!value.is_number()) throw RequestError(name, "expected a number");
  const double v = value.get<double>();
  if (!(v >= lo && v <= hi)) {
    throw RequestError(
        name, "is " + value.dump() + ", outside [" + bound_text(lo) + ", " + bound_text(hi) + "]");
  }
  return v;
}

std::optional<size_t> query_number(const std::string& query, const std::string& name) {
  size_t pos = 0;
  while (pos <= query.size()) {
    const size_t end = std::min(query.find('&', pos), query.size());
    const std::string part = query.substr(pos, end - pos);
    if (part.rfind(name + "=", 0) == 0) {
      const std::string v = part.substr(name.size() + 1);
      if (v.empty() || v.size() > 9 || v.find_first_not_of("0123456789") != std::string::npos)
        return std::nullopt;
      return std::stoul(v);
    }
    pos = end + 1;
  }
  return 0;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool listed(const std::vector<std::string>& hosts, const std::string& name) {
  return std::find(hosts.begin(), hosts.end(), lower(name)) != hosts.end();
}

// A header value fit to quote in an error: short, printable ASCII.
std::string quoted(const std::string& value) {
  std::string out;
  for (char c : value.substr(0, 100)) out += c >= 0x20 && c < 0x7f ? c : '?';
  return "'" + out + (value.size() > 100 ? "...'" : "'");
}

std::string expected_hosts(const std::vector<std::string>& hosts) {
  std::string out;
  for (size_t i = 0; i < hosts.size(); ++i) out += (i ? ", " : "") + hosts[i];
  return out;
}

// Wraps a connection's responder so that every answer carries security_headers().
class SecureResponder : public Responder {
 public:
  explicit SecureResponder(std::shared_ptr<Responder> inner) : inner_(std::move(inner)) {}
  void send(int status, const std::string& content_type, std::string body,
            const net::HeaderList& headers) override {
    inner_->send(status, content_type, std::move(body), with_security(headers));
  }
  void start_stream(int status, const std::string& content_type,
                    const net::HeaderList& headers) override {
    inner_->start_stream(status, content_type, with_security(headers));
  }
  bool write(std::string chunk) override { return inner_->write(std::move(chunk)); }
  void end() override { inner_->end(); }
  bool alive() const override { return inner_->alive(); }

 private:
  static net::HeaderList with_security(const net::HeaderList& headers) {
    net::HeaderList all = security_headers();
    all.insert(all.end(), headers.begin(), headers.end());
    return all;
  }
  std::shared_ptr<Responder> inner_;
};

}  // namespace

std::vector<std::string> allowed_hosts(int port, const std::string& bind_host) {
  std::vector<std::string> names = {"127.0.0.1", "localhost", "[::1]"};
  // A literal address the UI was bound to (not a name: a name can be rebound to another
  // address; not 0.0.0.0 or ::, which no browser addresses).
  boost::system::error_code ec;
  const auto address = boost::asio::ip::make_address(bind_host, ec);
  if (!ec && !address.is_unspecified() && !address.is_loopback()) {
    names.push_back(address.is_v6() ? "[" + address.to_string() + "]" : address.to_string());
  }
  std::vector<std::string> hosts;
  for (const auto& name : names) {
    hosts.push_back(name + ":" + std::to_string(port));
    if (port == 80) hosts.push_back(name);
  }
  return hosts;
}

std::string request_refusal(const net::HttpRequest& request,
                            const std::vector<std::string>& hosts) {
  const std::string host = request.header("host");
  if (!listed(hosts, host)) {
    return "Host " + quoted(host) + " is not this server (expected one of " +
           expected_hosts(hosts) + "): tandem ui answers only on loopback, by address";
  }
  // Browsers name the page that sent a request; it must be this server's own page.
  const std::string origin = request.header("origin");
  const bool has_origin = request.headers.count("origin") > 0;
  const bool own_origin = lower(origin).rfind("http://", 0) == 0 && listed(hosts, origin.substr(7));
  if (has_origin && !own_origin) {
    return "cross-origin request from " + quoted(origin) + " refused";
  }
  if (request.method != "POST") return "";
  if (!has_origin) return "POST needs an Origin header naming this server's page";
  // A JSON content type makes a browser ask first (CORS preflight), which this server never
  // allows, so another site's page cannot start or stop answers here.
  const std::string type = request.header("content-type");
  if (type.rfind("application/json", 0) != 0) {
    return "POST needs Content-Type: application/json (got " + quoted(type) + ")";
  }
  return "";
}

const net::HeaderList& security_headers() {
  static const net::HeaderList headers = {
      {"Content-Security-Policy",
       "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
       "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
       "frame-ancestors 'none'"},
      {"X-Frame-Options", "DENY"},
      {"X-Content-Type-Options", "nosniff"},
      {"Referrer-Policy", "no-referrer"},
  };
  return headers;
}

const EmbeddedAsset* find_asset(std::string_view path) {
  if (path == "/") path = "/index.html";
  for (size_t i = 0; i < kEmbeddedAssetCount; ++i) {
    if (path == kEmbeddedAssets[i].path) return &kEmbeddedAssets[i];
  }
  return nullptr;
}

namespace {

// parse_generate_request's steps, in the order the fields are checked (the first bad field is
// the one named in the 400). Each reads its fields of the JSON object j into r.

// The body as a JSON object whose keys are all known.
json parse_request_object(std::string_view body, const UiLimits& limits) {
  // Depth first: nothing below may meet a document that nests without bound.
  if (const std::string deep = json_depth_error(body, limits.max_json_depth); !deep.empty()) {
    throw RequestError("body", deep);
  }
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded()) throw RequestError("body", "is not valid JSON");
  if (!j.is_object()) throw RequestError("body", "expected a JSON object");
  static const char* known[] = {"prompt",    "mode", "policy",   "threshold", "target_rate",
                                "n_predict", "temp", "continue", "chat"};
  for (const auto& item : j.items()) {
    const std::string& key = item.key();  // not a structured binding: clang 14 cannot capture one
    if (std::find_if(std::begin(known), std::end(known), [&](const char* k) { return key == k; }) ==
        std::end(known)) {
      // An empty name still names something; a long one is cut.
      throw RequestError(key.empty()       ? "\"\""
                         : key.size() > 64 ? key.substr(0, 64) + "..."
                                           : key,
                         "unknown field (known: prompt, mode, policy, threshold, "
                         "target_rate, n_predict, temp, continue, chat)");
    }
  }
  return j;
}

// prompt: a non-empty string within max_prompt_bytes.
void read_prompt(const json& j, const UiLimits& limits, GenerateRequest& r) {
  const json& prompt = field_of(j, "prompt");
  if (!prompt.is_string()) throw RequestError("prompt", "expected a string");
  r.prompt = prompt.get<std::string>();
  if (r.prompt.empty()) throw RequestError("prompt", "is empty");
  if (r.prompt.size() > limits.max_prompt_bytes) {
    throw RequestError("prompt", "has " + std::to_string(r.prompt.size()) + " bytes, more than " +
                                     std::to_string(limits.max_prompt_bytes));
  }
}

// mode; then policy, threshold and target_rate into the request's RoutingSpec, checked by the
// rules every front end shares (tandem/routing.h). A policy given here starts from that policy's
// defaults (none keeps the command line's routing); a threshold replaces a target rate and the
// other way round; with the random policy, the target rate is its rate.
void read_routing(const json& j, GenerateRequest& r) {
  if (const json& mode = field_of(j, "mode"); !mode.is_null()) {
    if (!mode.is_string()) throw RequestError("mode", "expected a string");
    try {
      r.mode = parse_edge_mode(mode.get<std::string>());
    } catch (const std::invalid_argument& e) {
      throw RequestError("mode", e.what());
    }
  }
  const json& policy = field_of(j, "policy");
  const json& threshold = field_of(j, "threshold");
  const json& target = field_of(j, "target_rate");
  if (!threshold.is_null() && !target.is_null()) {
    throw RequestError("target_rate", "give a threshold or a target rate, not both");
  }
  RoutingSpec& s = r.routing;
  const std::string cli_router = s.router_file;  // r starts as the command line's defaults
  if (!policy.is_null()) {
    if (!policy.is_string()) throw RequestError("policy", "expected a string");
    const std::string name = policy.get<std::string>();
    if (std::find(std::begin(policy_names), std::end(policy_names), name) ==
        std::end(policy_names)) {
      throw RequestError("policy", "unknown policy '" + name +
                                       "' (choices: confidence, entropy, margin, random, "
                                       "always, never, router)");
    }
    if (name == "router" && cli_router.empty()) {
      throw RequestError("policy", "no trained router was given (tandem ui --router R.gguf)");
    }
    s.policy = name == "router" ? "" : name == "random" && target.is_null() ? "random:0.1" : name;
    s.router_file = name == "router" ? cli_router : "";
    s.threshold.reset();
    s.target_rate.reset();
  }
  if (!threshold.is_null()) {
    s.threshold = number_in(threshold, "threshold", std::numeric_limits<double>::lowest(),
                            std::numeric_limits<double>::max());
    s.target_rate.reset();
  }
  if (!target.is_null()) {
    s.target_rate = number_in(target, "target_rate", 0, 1);
    s.threshold.reset();
    if (s.policy.rfind("random", 0) == 0) s.policy = "random";  // the rate is the target's
  }
  try {
    check_routing(s);
  } catch (const Error& e) {
    throw RequestError(!target.is_null()      ? "target_rate"
                       : !threshold.is_null() ? "threshold"
                                              : "policy",
                       e.what());
  }
}

bool read_bool(const json& j, const char* name, bool fallback) {
  const json& v = field_of(j, name);
  if (v.is_null()) return fallback;
  if (!v.is_boolean()) throw RequestError(name, "expected true or false");
  return v.get<bool>();
}

// n_predict, temp, continue and chat.
void read_generation(const json& j, const UiLimits& limits, GenerateRequest& r) {
  if (const json& n = field_of(j, "n_predict"); !n.is_null()) {
    if (!n.is_number_integer()) throw RequestError("n_predict", "expected an integer");
    r.n_predict = static_cast<int>(number_in(n, "n_predict", 1, limits.max_predict));
  }
  if (const json& temp = field_of(j, "temp"); !temp.is_null()) {
    r.temp = static_cast<float>(number_in(temp, "temp", 0, 2));
  }
  r.continue_conversation = read_bool(j, "continue", r.continue_conversation);
  r.chat = read_bool(j, "chat", r.chat);
}

}  // namespace

GenerateRequest parse_generate_request(std::string_view body, const GenerateRequest& defaults,
                                       const UiLimits& limits) {
  const json j = parse_request_object(body, limits);
  GenerateRequest r = defaults;
  read_prompt(j, limits, r);
  read_routing(j, r);
  read_generation(j, limits, r);
  return r;
}

std::string sse_event(std::string_view type, uint64_t id, const json& data) {
  std::string out = "id: " + std::to_string(id) + "\nevent: ";
  out += type;
  out += "\ndata: " + dump(data) + "\n\n";  // dump() never has a raw newline
  return out;
}

// ---- UiServer ----

struct UiServer::Impl {
  struct Turn {
    uint64_t id = 0;
    GenerateRequest request;
    std::vector<json> events;  // each {"type", ...}; the last of a finished turn is "done" or
                               // "error"
    bool finished = false;
    std::vector<std::shared_ptr<Responder>> streams;
  };

  Impl(const Model& edge_model, UiOptions options, BackendFactory make_backend);
  ~Impl();  // stops a running turn and joins the worker

  void route(const HttpRequest& request, const std::shared_ptr<Responder>& responder);
  void serve_asset(const HttpRequest& request, Responder& responder) const;
  void start_turn(const HttpRequest& request, const std::shared_ptr<Responder>& responder);
  void attach(uint64_t turn_id, size_t after, const std::shared_ptr<Responder>& responder);
  json info() const;
  json turns_json() const;

  void worker_loop();
  void run_turn(Turn& turn);
  std::vector<TokenId> turn_context(const GenerateRequest& request) const;
  // Makes the decoder for the request's settings, reusing the last one when they are the same
  // (its cloud session and target-rate controller carry over). Returns the cloud line.
  std::string prepare_decoder(const GenerateRequest& request);
  // resolve_routing of `spec` over the command line's options; throws tandem::Error.
  RouterConfig resolved_router(const RoutingSpec& spec) const;
  void publish(Turn& turn, json event);

  const Model& model_;
  UiOptions options_;
  std::vector<std::string> hosts_;  // allowed_hosts(), set before requests are served
  BackendFactory make_backend_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Turn>> turns_;  // oldest first, at most limits.kept_turns
  std::shared_ptr<Turn> pending_;            // queued for the worker
  bool busy_ = false;                        // a turn is queued or running
  bool quit_ = false;
  uint64_t next_turn_id_ = 1;
  std::atomic<bool> stop_requested_{false};

  // Worker thread only.
  std::unique_ptr<EdgeDecoder> decoder_;
  std::string decoder_key_, cloud_line_;
  std::vector<TokenId> conversation_;

  std::thread worker_;
};

UiServer::UiServer(const Model& edge_model, UiOptions options, BackendFactory make_backend)
    : impl_(std::make_unique<Impl>(edge_model, std::move(options), std::move(make_backend))) {}

UiServer::~UiServer() = default;

void UiServer::set_address(const std::string& bind_host, int port) {
  impl_->options_.bind_host = bind_host;
  impl_->options_.port = port;
  impl_->hosts_ = allowed_hosts(port, bind_host);
}

void UiServer::handle(const HttpRequest& request, std::shared_ptr<Responder> responder) {
  const auto secure = std::make_shared<SecureResponder>(std::move(responder));
  if (const std::string refused = request_refusal(request, impl_->hosts_); !refused.empty()) {
    return send_error(*secure, 403, "forbidden", refused);
  }
  impl_->route(request, secure);
}

UiServer::Impl::Impl(const Model& edge_model, UiOptions options, BackendFactory make_backend)
    : model_(edge_model),
      options_(std::move(options)),
      hosts_(allowed_hosts(options_.port, options_.bind_host)),
      make_backend_(std::move(make_backend)) {
  options_.defaults.router = resolved_router(options_.defaults.routing);
  worker_ = std::thread([this] { worker_loop(); });
}

UiServer::Impl::~Impl() {
  {
    std::lock_guard lock(mutex_);
    quit_ = true;
  }
  stop_requested_ = true;
  wake_.notify_all();
  worker_.join();
}

void UiServer::Impl::route(const HttpRequest& request,
                           const std::shared_ptr<Responder>& responder) {
  const std::string& path = request.path;
  if (path.rfind("/api/", 0) != 0) {
    if (request.method != "GET") {
      return send_error(*responder, 405, "method_not_allowed", "the page is read with GET");
    }
    return serve_asset(request, *responder);
  }
  const bool get = request.method == "GET", post = request.method == "POST";
  if (path == "/api/info" && get) return send_json(*responder, 200, info());
  if (path == "/api/turns" && get) return send_json(*responder, 200, turns_json());
  if (path == "/api/generate" && post) return start_turn(request, responder);
  if (path == "/api/stop" && post) {
    bool running;
    {
      std::lock_guard lock(mutex_);
      running = busy_;
    }
    if (running) stop_requested_ = true;
    return send_json(*responder, 200, {{"stopping", running}});
  }
  // /api/turns/ID/events
  const std::string prefix = "/api/turns/", suffix = "/events";
  if (get && path.rfind(prefix, 0) == 0 && path.size() > prefix.size() + suffix.size() &&
      path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0) {
    const std::string id = path.substr(prefix.size(), path.size() - prefix.size() - suffix.size());
    const auto after = query_number(request.query, "after");
    if (id.empty() || id.size() > 18 || id.find_first_not_of("0123456789") != std::string::npos) {
      return send_error(*responder, 404, "not_found", "no turn '" + id + "'");
    }
    if (!after)
      return send_error(*responder, 400, "bad_request", "after: expected a count", "after");
    return attach(std::stoull(id), *after, responder);
  }
  const bool known =
      path == "/api/info" || path == "/api/turns" || path == "/api/generate" || path == "/api/stop";
  if (known) return send_error(*responder, 405, "method_not_allowed", request.method + " " + path);
  send_error(*responder, 404, "not_found", "no endpoint " + path);
}

void UiServer::Impl::serve_asset(const HttpRequest& request, Responder& responder) const {
  const EmbeddedAsset* asset = find_asset(request.path);
  if (!asset) return send_error(responder, 404, "not_found", "no page " + request.path);
  // no-cache: a rebuilt binary's page is picked up on reload.
  responder.send(200, asset->content_type, std::string(asset->data, asset->size),
                 {{"Cache-Control", "no-cache"}});
}

json UiServer::Impl::info() const {
  const GenerateRequest& d = options_.defaults;
  json defaults = {{"mode", edge_mode_name(d.mode)},
                   {"policy", page_policy_name(d.router)},
                   {"threshold", d.router.threshold},
                   {"n_predict", d.n_predict},
                   {"temp", d.temp},
                   {"chat", d.chat}};
  if (d.router.target_rate) defaults["target_rate"] = *d.router.target_rate;
  if (d.router.policy == RouterPolicy::Random) defaults["target_rate"] = d.router.random_rate;
  std::lock_guard lock(mutex_);
  return {{"model", options_.model_name},
          {"router", d.routing.router_file.empty()
                         ? json(nullptr)
                         : json(std::filesystem::path(d.routing.router_file).filename().string())},
          {"cloud", options_.cloud_url},
          {"cloud_api", options_.cloud_api},
          {"defaults", defaults},
          {"limits",
           {{"max_predict", options_.limits.max_predict},
            {"max_prompt_bytes", options_.limits.max_prompt_bytes},
            {"entropy_threshold_max", threshold_range(RouterPolicy::Entropy).second}}},
          {"busy", busy_},
          {"turn", turns_.empty() ? json(nullptr) : json(turns_.back()->id)}};
}

json UiServer::Impl::turns_json() const {
  std::lock_guard lock(mutex_);
  json out = json::array();
  for (const auto& t : turns_) {
    out.push_back({{"id", t->id}, {"finished", t->finished}, {"events", t->events}});
  }
  return {{"busy", busy_}, {"turns", out}};
}

void UiServer::Impl::start_turn(const HttpRequest& request,
                                const std::shared_ptr<Responder>& responder) {
  GenerateRequest parsed;
  try {
    parsed = parse_generate_request(request.body, options_.defaults, options_.limits);
  } catch (const RequestError& e) {
    return send_error(*responder, 400, "bad_request", e.problem(), e.field());
  }
  try {
    // The command line's routing was resolved once at start; only another spec is resolved
    // again (a trained router's file is read then, not on every turn).
    parsed.router = parsed.routing == options_.defaults.routing ? options_.defaults.router
                                                                : resolved_router(parsed.routing);
  } catch (const Error& e) {  // e.g. the command line's router file is gone
    return send_error(*responder, 400, "bad_request", e.what(), "policy");
  }
  std::lock_guard lock(mutex_);
  if (busy_) {
    return send_error(*responder, 409, "busy",
                      "a generation is running (one at a time): stop it or wait for it");
  }
  auto turn = std::make_shared<Turn>();
  turn->id = next_turn_id_++;
  turn->request = std::move(parsed);
  responder->start_stream(200, "text/event-stream", {{"X-Accel-Buffering", "no"}});
  turn->streams.push_back(responder);
  turns_.push_back(turn);
  while (turns_.size() > options_.limits.kept_turns) turns_.pop_front();
  pending_ = turn;
  busy_ = true;
  stop_requested_ = false;
  wake_.notify_all();
}

void UiServer::Impl::attach(uint64_t turn_id, size_t after,
                            const std::shared_ptr<Responder>& responder) {
  std::lock_guard lock(mutex_);
  std::shared_ptr<Turn> turn;
  for (const auto& t : turns_) {
    if (t->id == turn_id) turn = t;
  }
  if (!turn) {
    return send_error(*responder, 404, "not_found", "no turn " + std::to_string(turn_id));
  }
  responder->start_stream(200, "text/event-stream", {{"X-Accel-Buffering", "no"}});
  for (size_t i = after; i < turn->events.size(); ++i) {
    responder->write(sse_event(turn->events[i]["type"].get<std::string>(), i, turn->events[i]));
  }
  if (turn->finished) return responder->end();
  turn->streams.push_back(responder);
}

void UiServer::Impl::publish(Turn& turn, json event) {
  const std::string type = event["type"].get<std::string>();
  const bool last = type == "done" || type == "error";
  // The event joins the log and the streams are listed under the lock; the writes happen outside
  // it, so a slow stream never holds up a request. A stream attached in between has replayed
  // this event from the log already and is not in the list.
  std::vector<std::shared_ptr<Responder>> streams;
  std::string text;
  {
    std::lock_guard lock(mutex_);
    text = sse_event(type, turn.events.size(), event);
    turn.events.push_back(std::move(event));
    streams = turn.streams;
    if (last) {
      turn.finished = true;
      turn.streams.clear();
    }
  }
  std::vector<Responder*> gone;
  for (const auto& s : streams) {
    if (!s->write(text)) gone.push_back(s.get());
    if (last) s->end();
  }
  // A stream whose browser went away is dropped; the turn goes on for a reconnecting page.
  if (!gone.empty() && !last) {
    std::lock_guard lock(mutex_);
    std::erase_if(turn.streams, [&](const auto& s) {
      return std::find(gone.begin(), gone.end(), s.get()) != gone.end();
    });
  }
}

void UiServer::Impl::worker_loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return quit_ || pending_; });
    if (quit_) break;
    std::shared_ptr<Turn> turn = std::move(pending_);
    pending_.reset();
    lock.unlock();
    try {
      run_turn(*turn);
    } catch (const std::exception& e) {
      // Decoder errors (a prompt over the context, a refused cloud) end the turn, not the UI.
      decoder_.reset();
      decoder_key_.clear();
      publish(*turn, {{"type", "error"}, {"turn", turn->id}, {"message", e.what()}});
    }
    lock.lock();
    busy_ = false;
  }
  // Streams still open at shutdown get an end.
  for (const auto& t : turns_) {
    for (const auto& s : t->streams) s->end();
    t->streams.clear();
  }
}

RouterConfig UiServer::Impl::resolved_router(const RoutingSpec& spec) const {
  EdgeOptions o = options_.edge;
  resolve_routing(spec, model_, options_.model_path, o);
  return o.router;
}

std::string UiServer::Impl::prepare_decoder(const GenerateRequest& r) {
  const RouterConfig& rc = r.router;
  const std::string key = edge_mode_name(r.mode) + "|" + router_policy_name(rc.policy) + "|" +
                          std::to_string(rc.threshold) + "|" +
                          (rc.target_rate ? std::to_string(*rc.target_rate) : std::string("-")) +
                          "|" + std::to_string(rc.random_rate) + "|" + std::to_string(r.temp);
  if (decoder_ && key == decoder_key_) return cloud_line_;
  decoder_.reset();  // closes the old cloud session before the new one opens
  EdgeOptions o = options_.edge;
  o.mode = r.mode;
  o.router = rc;
  o.sampling.temp = r.temp;
  auto backend = r.mode == EdgeMode::Local ? nullptr : make_backend_();
  decoder_ = std::make_unique<EdgeDecoder>(model_, o, std::move(backend));
  decoder_key_ = key;
  cloud_line_ = decoder_->start();
  return cloud_line_;
}

// A continued turn appends the new text to the whole conversation so far (the cloud session
// receives only the new tokens); otherwise the prompt starts a conversation of its own. In chat
// form the new text is a user turn in the model's template (after the close of the last answer).
std::vector<TokenId> UiServer::Impl::turn_context(const GenerateRequest& r) const {
  const bool cont = r.continue_conversation && !conversation_.empty();
  std::vector<TokenId> context = cont ? conversation_ : std::vector<TokenId>{};
  std::vector<TokenId> more;
  if (r.chat && cont) {
    more = model_.tokenize(model_.chat_continuation(r.prompt), false, true);
  } else if (r.chat) {
    std::vector<ChatMessage> messages;
    if (!options_.system.empty()) messages.push_back({"system", options_.system});
    messages.push_back({"user", r.prompt});
    more = model_.tokenize(model_.chat_prompt(messages, true), true, true);
  } else {
    more = model_.tokenize(r.prompt, !cont, false);
  }
  context.insert(context.end(), more.begin(), more.end());
  return context;
}

void UiServer::Impl::run_turn(Turn& turn) {
  const GenerateRequest& r = turn.request;
  const std::string cloud_line = prepare_decoder(r);

  const std::vector<TokenId> context = turn_context(r);
  publish(turn,
          {{"type", "start"},
           {"turn", turn.id},
           {"prompt", r.prompt},
           {"mode", edge_mode_name(r.mode)},
           {"policy", page_policy_name(r.router)},
           {"threshold", r.router.threshold},
           {"target_rate", r.router.target_rate                      ? json(*r.router.target_rate)
                           : r.router.policy == RouterPolicy::Random ? json(r.router.random_rate)
                                                                     : json(nullptr)},
           {"n_predict", r.n_predict},
           {"continue", r.continue_conversation},
           {"chat", r.chat},
           {"context_tokens", context.size()},
           {"cloud", cloud_line}});

  // Running counts, so the page's stats move with every token; the done event has the
  // decoder's own figures.
  int index = 0, cloud_tokens = 0, fallbacks = 0;
  double ms_by_source[2] = {0, 0};
  auto last = Clock::now();
  const bool routed = r.mode == EdgeMode::Route;
  auto on_token = [&](const EdgeToken& t, std::string_view piece) {
    const auto now = Clock::now();
    const double ms = std::chrono::duration<double, std::milli>(now - last).count();
    last = now;
    if (t.id < 0) {  // the tail of an incomplete UTF-8 character at the end
      publish(turn, {{"type", "text"}, {"text", std::string(piece)}});
      return true;
    }
    const bool cloud = t.source == TokenSource::Cloud;
    cloud_tokens += cloud;
    fallbacks += t.fallback;
    ms_by_source[cloud] += ms;
    json e = {{"type", "token"},
              {"i", index++},
              {"id", t.id},
              {"text", piece},
              {"source", cloud ? "cloud" : "local"},
              {"ms", ms},
              {"fallback", t.fallback},
              {"cloud_tokens", cloud_tokens},
              {"fallbacks", fallbacks},
              {"local_ms", ms_by_source[0]},
              {"cloud_ms", ms_by_source[1]}};
    if (routed) {
      e["score"] = t.score;
      e["threshold"] = std::isfinite(t.threshold) ? json(t.threshold) : json(nullptr);
    }
    if (t.edge_top1 >= 0) {
      e["edge_top1"] = {{"id", t.edge_top1}, {"text", model_.token_piece(t.edge_top1)}};
    }
    publish(turn, std::move(e));
    return !stop_requested_.load();
  };
  const EdgeResult result = decoder_->generate(context, r.n_predict, on_token);
  conversation_ = decoder_->history();

  json stats = json::parse(edge_stats_json(result.stats));
  publish(turn, {{"type", "done"},
                 {"stop", stop_reason_name(result.stop)},
                 {"text", result.text},
                 {"stats", stats},
                 {"cloud_unavailable", r.mode != EdgeMode::Local && (result.stats.fallbacks > 0 ||
                                                                     result.stats.cloud_lost)}});
}

}  // namespace tandem::ui
