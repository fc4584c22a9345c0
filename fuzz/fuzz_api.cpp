// libFuzzer target for `tandem serve`'s whole request handler: the code the server runs for a
// request, from routing through parsing, job creation, the model's work on the scheduler's
// engine thread, to the answer. It drives a real Api over a real Scheduler on a tiny synthetic
// model, with small limits so one input stays cheap.
//
// Input: the first byte picks a route (method and path, see kRoutes), the rest is the body.
// Every input must end in an answer (a status and a body, or a stream that ends); a crash, a
// sanitizer report, an exception escaping the handler or a request left without an answer
// (libFuzzer's -timeout) is a bug. Bodies seeded by scripts/fuzz.sh include nested, huge,
// duplicate-key and invalid UTF-8 documents.
//
// The model: $TANDEM_FUZZ_MODEL, else ../shared/testdata/models/synth-llama-Q8_0.gguf relative to
// the working directory (scripts/fuzz.sh runs targets from the repository root).
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "server/api.h"
#include "server/metrics.h"
#include "server/scheduler.h"
#include "tandem/engine.h"

namespace {

using namespace tandem::server;

// Holds what the handler answered; the fuzzer waits for it.
class CaptureResponder : public Responder {
 public:
  void send(int status, const std::string&, std::string body, const HeaderList&) override {
    finish(status, std::move(body));
  }
  void start_stream(int status, const std::string&, const HeaderList&) override {
    std::lock_guard lk(mu_);
    status_ = status;
  }
  bool write(std::string chunk) override {
    std::lock_guard lk(mu_);
    body_ += chunk;
    return true;
  }
  void end() override { finish(status_, body_); }
  bool alive() const override { return true; }

  // Waits until the handler answered, or dropped every reference to this responder without
  // answering (the HTTP layer then answers 500 itself; that is not a hang).
  int wait(const std::shared_ptr<CaptureResponder>& self) {
    std::unique_lock lk(mu_);
    while (!done_ && self.use_count() > 1) cv_.wait_for(lk, std::chrono::milliseconds(1));
    return done_ ? status_ : 500;
  }
  std::string body() const {
    std::lock_guard lk(mu_);
    return body_;
  }

 private:
  void finish(int status, std::string body) {
    std::lock_guard lk(mu_);
    if (done_) return;
    status_ = status;
    body_ = std::move(body);
    done_ = true;
    cv_.notify_all();
  }
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int status_ = 0;
  std::string body_;
  bool done_ = false;
};

struct Route {
  const char* method;
  const char* path;  // "{id}" becomes the fuzzer's own session
};
constexpr Route kRoutes[] = {
    {"POST", "/v1/completions"},
    {"POST", "/v1/chat/completions"},
    {"POST", "/completion"},
    {"POST", "/generate"},
    {"POST", "/tokenize"},
    {"POST", "/detokenize"},
    {"POST", "/tandem/v1/sessions"},
    {"POST", "/tandem/v1/sessions/{id}/step"},
    {"POST", "/tandem/v1/sessions/{id}/cancel"},
    {"DELETE", "/tandem/v1/sessions/ffffffffffffffffffffffffffffffff"},
    {"GET", "/tandem/v1/sessions"},
    {"GET", "/v1/models"},
    {"GET", "/tandem/v1/info"},
    {"GET", "/metrics"},
    {"GET", "/health"},
};
constexpr size_t kNumRoutes = sizeof kRoutes / sizeof kRoutes[0];

class Server {
 public:
  Server() {
    const char* env = std::getenv("TANDEM_FUZZ_MODEL");
    model_ = tandem::Model::load(env ? env : "../shared/testdata/models/synth-llama-Q8_0.gguf");
    SchedulerOptions so;
    so.n_ctx = 128;
    so.max_sessions = 4;
    so.stateless_slots = 2;
    so.n_threads = 1;
    so.max_queue = 16;
    sched_ = std::make_unique<Scheduler>(*model_, so, metrics_);
    ApiOptions ao;
    ao.model_name = "fuzz";
    ao.max_generate = 8;
    ao.max_text_bytes = 4096;
    ao.cpu_workers = 1;
    api_ = std::make_unique<Api>(*sched_, metrics_, ao);
  }

  // Answers one request; returns its status.
  int handle(const std::string& method, const std::string& path, const std::string& body,
             std::string* answer = nullptr) {
    HttpRequest req;
    req.method = method;
    req.path = path;
    req.headers["content-type"] = "application/json";
    req.body = body;
    auto res = std::make_shared<CaptureResponder>();
    api_->handle(req, res);
    const int status = res->wait(res);
    if (answer) *answer = res->body();
    return status;
  }

  std::string session_path(const std::string& pattern) {
    if (session_.empty()) {
      std::string answer;
      if (handle("POST", "/tandem/v1/sessions", "{}", &answer) == 201) {
        session_ = nlohmann::json::parse(answer).at("session").get<std::string>();
      }
    }
    std::string path = pattern;
    const size_t at = path.find("{id}");
    if (at != std::string::npos) path.replace(at, 4, session_.empty() ? "none" : session_);
    return path;
  }
  void forget_session() { session_.clear(); }

 private:
  std::unique_ptr<tandem::Model> model_;
  Metrics metrics_;
  std::unique_ptr<Scheduler> sched_;
  std::unique_ptr<Api> api_;
  std::string session_;
};

}  // namespace

// The server lives for the whole run (its threads keep serving). Made before the first input, so
// libFuzzer's per-input leak check does not count its start-up allocations.
std::unique_ptr<Server> server;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  server = std::make_unique<Server>();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Route& route = kRoutes[data[0] % kNumRoutes];
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  const std::string path = server->session_path(route.path);
  const int status = server->handle(route.method, path, body);
  if (status < 200 || status > 599) std::abort();
  if (status == 410 && path.find("/step") != std::string::npos) server->forget_session();
  return 0;
}
