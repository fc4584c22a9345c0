// What the files of the HTTP API share; private to src/server/ (its users include api.h). The API
// is split by protocol:
//   api.cpp              routing, auth, admin, /health /metrics /tokenize and friends, the shared
//                        answers (JSON, SSE, errors) and log-probabilities
//   api_fields.cpp       request bodies and fields: strict, typed, range-checked readers
//   api_native.cpp       the native session protocol (docs/protocol.md): create, step, cancel,
//                        close
//   api_completions.cpp  the stateless completions: OpenAI, llama.cpp and SGLang dialects
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "common/error.h"
#include "net/native_protocol.h"
#include "server/api.h"
#include "tandem/vector_ops.h"
#include "tokenizer/tokenizer.h"

namespace tandem::server {

using json = nlohmann::json;

// ---------------------------------------------------------------------------------------------
// Errors: thrown anywhere below a route, answered once by the router (api.cpp) as
// {"error": {"code", "message", ...extra}} with `status`.

struct ApiError : Error {
  ApiError(int status, std::string code, const std::string& message, json extra = json::object())
      : Error(message), status(status), code(std::move(code)), extra(std::move(extra)) {}
  int status;
  std::string code;
  json extra;
};

// 400 naming the field: "'FIELD' WHAT".
ApiError bad(const std::string& field, const std::string& what);

// ---------------------------------------------------------------------------------------------
// Request fields (api_fields.cpp). A missing or null field takes its default; any other value of
// the wrong type or out of [lo, hi] is refused with the field's name.

json parse_body(const std::string& body);
const json* field(const json& j, const char* name);  // null when absent or null
int64_t get_int(const json& j, const char* name, int64_t def, int64_t lo, int64_t hi);
double get_num(const json& j, const char* name, double def, double lo, double hi);
bool get_bool(const json& j, const char* name, bool def);
std::vector<TokenId> get_ids(const json& v, const std::string& name, int n_vocab, size_t max_len);
SamplingParams get_sampling(const json& j, double default_temp, uint64_t* seed_out = nullptr);
std::vector<std::string> get_stop(const json& j, const char* name);
std::vector<TokenId> get_prompt(const json& outer, const std::string& name, const Tokenizer& tok,
                                int n_vocab, int n_ctx, size_t max_text);
// Text over --max-text-bytes is refused (413) before any work on it.
void check_text_size(size_t bytes, const std::string& name, size_t max_bytes);
const std::string& checked_text(const json& v, const std::string& name, size_t max_bytes);
Clock::time_point deadline_after(double seconds);

// ---------------------------------------------------------------------------------------------
// Log-probabilities (api.cpp), from tandem/vector_ops.h: logit_stats gives the argmax and
// log Z = log Σ exp(logits) of a row in one read of it.

// A log-probability as the answers print it: rounded to f32 (JSON writes the shortest f32).
struct TopEntry {
  TokenId id;
  float logprob;
};
// The n largest logits as log-probabilities, best first (the lower id on ties): tandem::top_n
// rounded for the answers.
std::vector<TopEntry> top_n(std::span<const float> logits, int n, double log_z);
json top_json(const std::vector<TopEntry>& top);  // [{"id", "logprob"}...]

// ---------------------------------------------------------------------------------------------
// Answers (api.cpp)

// {"error": {"code", "message", ...extra}} as JSON text (net::error_json, the browser view's too).
std::string error_body(const std::string& code, const std::string& message, const json& extra = {});
void send_json(Responder& res, int status, const json& body, const HeaderList& headers = {});
void send_error(Responder& res, const ApiError& e);  // with Retry-After on 429 and 503
std::string sse(const json& j);                      // one server-sent event: "data: ...\n\n"
std::string sse_text(const std::string& json_text);  // the same of JSON text
int64_t unix_now();

// The completion dialects, named by the route table (api.cpp) and read and written by
// api_completions.cpp.
enum class Dialect { OpenAiText, OpenAiChat, LlamaCpp, SgLang };

class CountingResponder;  // api.cpp
class CpuWorkers;         // api.cpp

// ---------------------------------------------------------------------------------------------
// The API's state and handlers. Each handler throws ApiError (or another tandem::Error, a 400)
// for the router to answer.

struct Api::Impl {
  Scheduler& sched;
  Metrics& metrics;
  ApiOptions options;
  const Model& model;
  const Tokenizer& tok;
  std::string vocab_hash;  // the tokenizer fingerprint as the protocol writes it, made once
  json model_json;
  json limits_json;
  // Additions to protocol 1 a client may use when listed: "rewind" (a step's rewind_to),
  // "queue" (a step's queue: wait behind the session's running step), "cancel" (POST
  // /tandem/v1/sessions/{id}/cancel), "history_hash" (a step's expected_hash).
  const json features_json = json::array({protocol::kFeatureRewind, protocol::kFeatureQueue,
                                          protocol::kFeatureCancel, protocol::kFeatureHistoryHash});

  // Last, so it is destroyed first: its threads stop before anything they use goes away.
  std::unique_ptr<CpuWorkers> workers;

  Impl(Scheduler& s, Metrics& m, const ApiOptions& o);
  ~Impl();

  int n_vocab() const { return model.info().n_vocab; }
  int n_ctx() const { return sched.options().n_ctx; }

  // Routing, auth and admin (api.cpp).
  using ResponderPtr = std::shared_ptr<Responder>;
  using Work = std::function<void(const HttpRequest&, ResponderPtr)>;
  void route(const HttpRequest& req, const std::shared_ptr<CountingResponder>& res, bool draining);
  void route_session(const HttpRequest& req, const std::shared_ptr<CountingResponder>& res,
                     const Credential& who, bool draining);
  void offload(const HttpRequest& req, ResponderPtr res, Work work);
  void submit_or_refuse(const std::shared_ptr<Job>& job, const Credential& who,
                        const std::function<void()>& undo = {});
  ApiError queue_refusal(SubmitRefusal why, const Credential& who);  // counts an overload
  Credential authenticate(const HttpRequest& req) const;
  void require_admin(const Credential& who, const std::string& what) const;
  static std::string client_label(const Credential& who);
  void list(Responder& res, const Credential& who);
  void tokenize(const HttpRequest& req, Responder& res);
  void detokenize(const HttpRequest& req, Responder& res);
  void models(Responder& res);
  void props(Responder& res);

  // The native session protocol (api_native.cpp).
  void info(Responder& res);
  void create(const HttpRequest& req, Responder& res, const Credential& who);
  void step(const std::string& id, const HttpRequest& req, std::shared_ptr<Responder> res,
            const Credential& who);
  void cancel(const std::string& id, const HttpRequest& req, Responder& res, const Credential& who);
  void close(const std::string& id, Responder& res, const Credential& who);
  ApiError session_lost(const std::string& id, const Credential& who) const;

  // The stateless completions (api_completions.cpp).
  void completion(const HttpRequest& req, std::shared_ptr<Responder> res, Dialect d,
                  const Credential& who);
};

}  // namespace tandem::server
