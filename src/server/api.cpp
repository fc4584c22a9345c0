#include "server/api.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>

#include "common/error.h"
#include "common/json_guard.h"
#include "gguf/gguf.h"
#include "kernels/kernels.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace tandem::server {

using json = nlohmann::json;

namespace {

// ---------------------------------------------------------------------------------------------
// Errors and request fields

struct ApiError : Error {
  ApiError(int status, std::string code, const std::string& message, json extra = json::object())
      : Error(message), status(status), code(std::move(code)), extra(std::move(extra)) {}
  int status;
  std::string code;
  json extra;
};

ApiError bad(const std::string& field, const std::string& what) {
  return ApiError(400, "bad_request", "'" + field + "' " + what, {{"field", field}});
}

// Every body is checked for nesting before the parser sees it: nothing after this point (reading
// fields, copying, dumping an error) can recurse deeper than kMaxJsonDepth.
json parse_body(const std::string& body) {
  if (body.empty()) return json::object();
  if (const std::string e = json_depth_error(body, kMaxJsonDepth, "the request body"); !e.empty())
    throw ApiError(400, "bad_request", e, {{"field", "body"}, {"limit", kMaxJsonDepth}});
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw ApiError(400, "bad_request", "the body is not valid JSON");
  if (!j.is_object()) throw ApiError(400, "bad_request", "the body must be a JSON object");
  return j;
}

const json* field(const json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

int64_t get_int(const json& j, const char* name, int64_t def, int64_t lo, int64_t hi) {
  const json* v = field(j, name);
  if (!v) return def;
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (d != std::floor(d)) throw bad(name, "must be an integer");
    // 2^63 rounds to INT64_MAX as a double but does not fit an int64_t: compare against the
    // first double past the range, so the cast below is always defined.
    constexpr double kInt64End = 9223372036854775808.0;  // 2^63
    if (d < static_cast<double>(lo) || d > static_cast<double>(hi) || d >= kInt64End) {
      throw bad(name, "is " + v->dump() + ", outside [" + std::to_string(lo) + ", " +
                          std::to_string(hi) + "]");
    }
    return static_cast<int64_t>(d);
  }
  if (!v->is_number_integer())
    throw bad(name, "must be an integer, found " + std::string(v->type_name()));
  const int64_t x =
      v->is_number_unsigned() && v->get<uint64_t>() > INT64_MAX ? INT64_MAX : v->get<int64_t>();
  if (x < lo || x > hi) {
    throw bad(name, "is " + std::to_string(x) + ", outside [" + std::to_string(lo) + ", " +
                        std::to_string(hi) + "]");
  }
  return x;
}

double get_num(const json& j, const char* name, double def, double lo, double hi) {
  const json* v = field(j, name);
  if (!v) return def;
  if (!v->is_number()) throw bad(name, "must be a number, found " + std::string(v->type_name()));
  const double x = v->get<double>();
  if (!(x >= lo && x <= hi)) {
    throw bad(name, "is " + v->dump() + ", outside [" + std::to_string(lo) + ", " +
                        std::to_string(hi) + "]");
  }
  return x;
}

bool get_bool(const json& j, const char* name, bool def) {
  const json* v = field(j, name);
  if (!v) return def;
  if (!v->is_boolean())
    throw bad(name, "must be true or false, found " + std::string(v->type_name()));
  return v->get<bool>();
}

std::vector<TokenId> get_ids(const json& v, const std::string& name, int n_vocab, size_t max_len) {
  if (!v.is_array()) throw bad(name, "must be an array of token ids");
  if (v.size() > max_len) {
    throw ApiError(413, "too_large",
                   "'" + name + "' has " + std::to_string(v.size()) + " tokens; the limit is " +
                       std::to_string(max_len),
                   {{"field", name}});
  }
  std::vector<TokenId> ids;
  ids.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const json& t = v[i];
    if (!t.is_number_integer()) {
      throw bad(name + "[" + std::to_string(i) + "]", "must be an integer token id");
    }
    const int64_t id =
        t.is_number_unsigned() && t.get<uint64_t>() > INT64_MAX ? INT64_MAX : t.get<int64_t>();
    if (id < 0 || id >= n_vocab) {
      throw bad(name + "[" + std::to_string(i) + "]", "is " + std::to_string(id) +
                                                          ", outside the vocabulary [0, " +
                                                          std::to_string(n_vocab) + ")");
    }
    ids.push_back(static_cast<TokenId>(id));
  }
  return ids;
}

SamplingParams get_sampling(const json& j, double default_temp, uint64_t* seed_out = nullptr) {
  SamplingParams sp;
  sp.temp = static_cast<float>(get_num(j, "temperature", default_temp, 0, 100));
  sp.top_k = static_cast<int>(get_int(j, "top_k", 0, -1, 1 << 20));
  sp.top_p = static_cast<float>(get_num(j, "top_p", 1.0, 0, 1));
  sp.min_p = static_cast<float>(get_num(j, "min_p", 0.0, 0, 1));
  sp.repeat_penalty = static_cast<float>(get_num(j, "repeat_penalty", 1.0, 0.01, 100));
  const int64_t seed = get_int(j, "seed", -1, -1, INT64_MAX);
  sp.seed = seed < 0 ? kRandomSeed : static_cast<uint64_t>(seed);
  if (seed_out) *seed_out = sp.seed;
  return sp;
}

// ---------------------------------------------------------------------------------------------
// Log-probabilities

struct TopEntry {
  TokenId id;
  float logprob;
};

// log Σ exp(logits), computed stably.
// Single-precision exps (a double exp per entry of a 262k vocabulary costs ~1 ms per token on
// the engine thread), summed in eight partial sums so the loop vectorizes; the error is far below
// what a log-probability is read for.
double log_normalizer(std::span<const float> logits) {
  return kernels::logit_stats(logits.data(), static_cast<int64_t>(logits.size())).log_z;
}

std::vector<TopEntry> top_n(std::span<const float> logits, int n, double log_z) {
  std::vector<TopEntry> out;
  if (n <= 0 || logits.empty()) return out;
  n = std::min<int>(n, static_cast<int>(logits.size()));
  // One pass with the n best so far in a heap whose top is the worst of them (larger logit
  // first, the lower id on ties): no 1 MiB index array and no sort of the vocabulary per row.
  const auto better = [&](int a, int b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::vector<int> best;
  best.reserve(static_cast<size_t>(n));
  for (int i = 0; i < static_cast<int>(logits.size()); ++i) {
    if (static_cast<int>(best.size()) < n) {
      best.push_back(i);
      std::push_heap(best.begin(), best.end(), better);
    } else if (better(i, best.front())) {
      std::pop_heap(best.begin(), best.end(), better);
      best.back() = i;
      std::push_heap(best.begin(), best.end(), better);
    }
  }
  std::sort(best.begin(), best.end(), better);
  for (int i : best) out.push_back({i, static_cast<float>(logits[i] - log_z)});
  return out;
}

json top_json(const std::vector<TopEntry>& top) {
  json a = json::array();
  for (const auto& e : top) a.push_back({{"id", e.id}, {"logprob", e.logprob}});
  return a;
}

json error_body(const std::string& code, const std::string& message, const json& extra = {}) {
  json e = {{"code", code}, {"message", message}};
  if (extra.is_object()) e.update(extra);
  return {{"error", e}};
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
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

void send_json(Responder& res, int status, const json& body, const HeaderList& headers = {}) {
  res.send(status, "application/json", body.dump(-1, ' ', false, json::error_handler_t::replace),
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
  send_json(res, e.status, error_body(e.code, e.what(), e.extra), h);
}

std::string sse(const json& j) {
  return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

// ---------------------------------------------------------------------------------------------
// Native protocol: one step of a session

enum class StepKind { Sync, Generate, Verify };

struct StepRequest {
  int expected_pos = 0;
  int rewind_to = -1;  // cut the history to this length first (-1: no cut)
  std::vector<TokenId> append;
  StepKind kind = StepKind::Sync;
  int n = 0;
  SamplingParams sampling;
  std::vector<TokenId> draft;
  int top_n = 0;
  Clock::time_point deadline = Clock::time_point::max();  // generation stops here ("time")
};

Clock::time_point deadline_after(double seconds) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// Text the server is asked to tokenize is refused before any work when it is over the cap.
void check_text_size(size_t bytes, const std::string& name, size_t max_bytes) {
  if (bytes <= max_bytes) return;
  throw ApiError(413, "too_large",
                 "'" + name + "' has " + std::to_string(bytes) + " bytes of text; the limit is " +
                     std::to_string(max_bytes) + " (--max-text-bytes)",
                 {{"field", name}, {"limit", max_bytes}});
}

const std::string& checked_text(const json& v, const std::string& name, size_t max_bytes) {
  const std::string& text = v.get_ref<const std::string&>();
  check_text_size(text.size(), name, max_bytes);
  return text;
}

StepRequest parse_step(const json& j, int n_vocab, int n_ctx, const ApiOptions& o) {
  static const char* known[] = {"expected_pos", "rewind_to", "append",
                                "generate",     "verify",    "top_n"};
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (std::find_if(std::begin(known), std::end(known),
                     [&](const char* k) { return it.key() == k; }) == std::end(known)) {
      throw bad(it.key(),
                "is not a field of a step (expected_pos, rewind_to, append, generate, verify, "
                "top_n)");
    }
  }
  StepRequest r;
  r.deadline = deadline_after(o.max_request_seconds);
  if (!field(j, "expected_pos")) throw bad("expected_pos", "is required");
  r.expected_pos = static_cast<int>(get_int(j, "expected_pos", 0, 0, n_ctx));
  if (field(j, "rewind_to")) {
    r.rewind_to = static_cast<int>(get_int(j, "rewind_to", 0, 0, n_ctx));
    if (r.expected_pos != r.rewind_to) {
      throw bad("expected_pos", "must equal rewind_to (" + std::to_string(r.rewind_to) +
                                    "): it counts the history after the cut");
    }
  }
  if (const json* a = field(j, "append")) r.append = get_ids(*a, "append", n_vocab, n_ctx);
  r.top_n = static_cast<int>(get_int(j, "top_n", 0, 0, o.max_top_n));
  const json* g = field(j, "generate");
  const json* v = field(j, "verify");
  if (g && v) throw bad("generate", "and 'verify' cannot be in one step");
  if (g) {
    if (!g->is_object()) throw bad("generate", "must be an object");
    r.kind = StepKind::Generate;
    r.n = static_cast<int>(get_int(*g, "n", 1, 1, o.max_generate));
    r.sampling = get_sampling(*g, 0.0);
  }
  if (v) {
    if (!v->is_object()) throw bad("verify", "must be an object");
    const json* d = field(*v, "draft");
    if (!d) throw bad("verify.draft", "is required");
    r.draft = get_ids(*d, "verify.draft", n_vocab, static_cast<size_t>(o.max_draft));
    if (r.draft.empty()) throw bad("verify.draft", "must hold at least one token");
    r.kind = StepKind::Verify;
  }
  return r;
}

class StepJob : public Job {
 public:
  StepJob(Scheduler& sched, Metrics& metrics, std::shared_ptr<Responder> res, StepRequest req,
          std::vector<TokenId> uncached, int kv_len, int pos)
      : sched_(sched),
        metrics_(metrics),
        res_(std::move(res)),
        req_(std::move(req)),
        sampler_(req_.sampling),
        kv_len_(kv_len),
        pos_(pos) {
    // The last history token stays out of the cache on a sync step; generate and verify feed it
    // with its logits (and verify the drafts after it).
    size_t n_feed = uncached.size();
    if (req_.kind == StepKind::Sync && n_feed > 0) --n_feed;
    for (size_t i = 0; i < n_feed; ++i) {
      feed.push_back({uncached[i], req_.kind != StepKind::Sync && i + 1 == n_feed});
    }
    if (req_.kind == StepKind::Verify) {
      for (TokenId d : req_.draft) feed.push_back({d, true});
      targets_.resize(req_.draft.size() + 1, -1);
      target_logprob_.resize(req_.draft.size() + 1, 0);
      target_top_.resize(req_.draft.size() + 1);
    }
    prefilled_ = static_cast<int>(n_feed);
    reserve_tokens = req_.kind == StepKind::Generate ? req_.n : 0;
  }

  void on_logits(size_t index, std::span<const float> logits) override {
    // One read of the row for argmax and log Z together (greedy), one more for the top-n.
    const kernels::LogitStats st =
        kernels::logit_stats(logits.data(), static_cast<int64_t>(logits.size()));
    if (req_.kind == StepKind::Generate) {
      const TokenId t =
          sampler_.greedy() ? static_cast<TokenId>(st.argmax) : sampler_.sample(logits);
      sampler_.accept(t);
      tokens_.push_back(t);
      logprobs_.push_back(static_cast<float>(logits[t] - st.log_z));
      if (req_.top_n > 0) tops_.push_back(top_n(logits, req_.top_n, st.log_z));
      produced_.assign(1, t);
      sched_.session_append(session_id, produced_);
      ++pos_;
      if (sched_.model().tokenizer().is_eog(t)) stop_ = "eog";
      return;
    }
    // Verify: row k (0 = the last history token, k = draft k-1) predicts draft k.
    const size_t k = index - (feed.size() - req_.draft.size() - 1);
    if (k >= targets_.size()) return;
    targets_[k] = static_cast<TokenId>(st.argmax);
    target_logprob_[k] = static_cast<float>(logits[targets_[k]] - st.log_z);
    if (req_.top_n > 0) target_top_[k] = top_n(logits, req_.top_n, st.log_z);
  }

  bool on_feed_done() override {
    if (req_.kind == StepKind::Generate) {
      const int n_ctx = sched_.options().n_ctx;
      if (!stop_.empty()) return false;
      if (static_cast<int>(tokens_.size()) >= req_.n) return false;
      if (pos_ >= n_ctx) {
        stop_ = "context";
        return false;
      }
      if (Clock::now() >= req_.deadline) {
        stop_ = "time";
        return false;
      }
      feed.assign(1, {tokens_.back(), true});
      fed = 0;
      return true;
    }
    if (req_.kind == StepKind::Verify) {
      size_t acc = 0;
      while (acc < req_.draft.size() && targets_[acc] == req_.draft[acc]) ++acc;
      accepted_ = static_cast<int>(acc);
      for (size_t i = 0; i <= acc; ++i) {
        tokens_.push_back(i < acc ? req_.draft[i] : targets_[acc]);
        logprobs_.push_back(target_logprob_[i]);
        if (req_.top_n > 0) tops_.push_back(target_top_[i]);
      }
      // Keep the history and the accepted drafts in the cache; the correction is fed next time.
      keep_after = kv_len_ + static_cast<int>(feed.size() - req_.draft.size()) + accepted_;
      sched_.session_append(session_id, tokens_);
      pos_ += static_cast<int>(tokens_.size());
      metrics_.accepted_drafts += acc;
      if (sched_.model().tokenizer().is_eog(tokens_.back())) stop_ = "eog";
    }
    return false;
  }

  // A step whose client hung up is dropped, queued or running (the scheduler rolls the
  // session's history back, so the device can send the step again).
  bool abandoned() const override { return !res_->alive(); }

  void on_finish(JobFailure failure, const std::string& message) override {
    metrics_.step_seconds.observe(std::chrono::duration<double>(Clock::now() - enqueued).count());
    if (failure == JobFailure::NoMemory && retry_after_s > 0) {
      // Room frees up when running steps end or other clients' idle sessions pass their grace.
      send_error(*res_, ApiError(429, "overloaded",
                                 message + " now (busy sessions, or other clients' idle ones "
                                           "within --evict-grace); retry later",
                                 {{"retry_after", retry_after_s}}));
      return;
    }
    if (failure == JobFailure::NoMemory) {
      send_error(*res_, ApiError(503, "unavailable", message));
      return;
    }
    if (failure != JobFailure::None) {
      send_error(*res_, ApiError(failure == JobFailure::Draining ? 503 : 500,
                                 failure == JobFailure::Draining ? "unavailable" : "internal",
                                 message.empty() ? "the step failed" : message));
      return;
    }
    metrics_.generated_tokens += tokens_.size();
    json out = {{"pos", pos_},
                {"tokens", tokens_},
                {"logprobs", logprobs_},
                {"prefilled", prefilled_},
                {"stop", stop_.empty() ? "length" : stop_}};
    if (req_.kind == StepKind::Verify) out["accepted"] = accepted_;
    if (req_.top_n > 0) {
      json t = json::array();
      for (const auto& e : tops_) t.push_back(top_json(e));
      out["top"] = t;
    }
    send_json(*res_, 200, out);
  }

 private:
  Scheduler& sched_;
  Metrics& metrics_;
  std::shared_ptr<Responder> res_;
  StepRequest req_;
  Sampler sampler_;
  int kv_len_;
  int pos_;
  int prefilled_ = 0;
  int accepted_ = 0;
  std::string stop_;
  std::vector<TokenId> tokens_, produced_;
  std::vector<float> logprobs_;
  std::vector<std::vector<TopEntry>> tops_;
  std::vector<TokenId> targets_;
  std::vector<float> target_logprob_;
  std::vector<std::vector<TopEntry>> target_top_;
};

// ---------------------------------------------------------------------------------------------
// Stateless completions: OpenAI /v1/completions and /v1/chat/completions, llama.cpp /completion,
// SGLang /generate. One job type; the dialects differ in how they read the request and write
// the answer.

enum class Dialect { OpenAiText, OpenAiChat, LlamaCpp, SgLang };

struct CompletionRequest {
  Dialect dialect = Dialect::OpenAiText;
  std::vector<TokenId> prompt;
  int max_tokens = 16;
  SamplingParams sampling;
  std::vector<std::string> stop;
  int top_n = 0;  // logprobs per generated token (0: none)
  bool want_logprobs = false;
  int prompt_logprobs_from = -1;  // -1: none; else positions >= this get logprobs
  int prompt_top_n = 0;
  bool prompt_logprobs_field = false;  // vLLM's prompt_logprobs was asked for by name
  bool echo = false;
  bool stream = false;
  bool return_tokens = false;
  bool tokens_as_ids = false;  // vLLM's return_tokens_as_token_ids: logprob tokens as "token_id:N"
  bool ignore_eos = false;     // vLLM's and llama.cpp's: generate on through end-of-generation
  std::string model_name;
  std::optional<std::string> prompt_text;  // the prompt as the client wrote it, for echo
  Clock::time_point deadline = Clock::time_point::max();  // generation stops here ("length")
};

std::vector<std::string> get_stop(const json& j, const char* name) {
  std::vector<std::string> out;
  const json* v = field(j, name);
  if (!v) return out;
  if (v->is_string()) {
    if (!v->get<std::string>().empty()) out.push_back(v->get<std::string>());
    return out;
  }
  if (!v->is_array() || v->size() > 16)
    throw bad(name, "must be a string or an array of at most 16 strings");
  for (size_t i = 0; i < v->size(); ++i) {
    if (!(*v)[i].is_string())
      throw bad(std::string(name) + "[" + std::to_string(i) + "]", "must be a string");
    if (!(*v)[i].get<std::string>().empty()) out.push_back((*v)[i].get<std::string>());
  }
  return out;
}

// A prompt given as a string, an array of ids, or (llama.cpp) a mix of strings and ids. A prompt
// wrapped in one-element arrays ([["text"]], [[1,2,3]]) is unwrapped in a loop, never by
// recursion (the body's nesting is bounded before this runs, but the loop holds regardless).
std::vector<TokenId> get_prompt(const json& outer, const std::string& name, const Tokenizer& tok,
                                int n_vocab, int n_ctx, size_t max_text) {
  const json* v = &outer;
  while (v->is_array() && v->size() == 1 && ((*v)[0].is_string() || (*v)[0].is_array())) {
    v = &(*v)[0];
  }
  if (v->is_string()) return tok.encode(checked_text(*v, name, max_text), true, false);
  if (!v->is_array()) throw bad(name, "must be a string or an array of token ids");
  const bool all_ids =
      std::all_of(v->begin(), v->end(), [](const json& x) { return x.is_number_integer(); });
  if (all_ids) return get_ids(*v, name, n_vocab, static_cast<size_t>(n_ctx));
  std::vector<TokenId> out;
  for (size_t i = 0; i < v->size(); ++i) {
    const json& part = (*v)[i];
    const std::string at = name + "[" + std::to_string(i) + "]";
    if (part.is_string()) {
      auto ids = tok.encode(checked_text(part, at, max_text), i == 0, false);
      out.insert(out.end(), ids.begin(), ids.end());
    } else if (part.is_number_integer()) {
      out.push_back(get_ids(json::array({part}), at, n_vocab, 1)[0]);
    } else {
      throw bad(at, "must be a string or a token id");
    }
    if (out.size() > static_cast<size_t>(n_ctx)) break;  // too long: refused by the caller
  }
  return out;
}

class CompletionJob : public Job {
 public:
  CompletionJob(const Model& model, Metrics& metrics, std::shared_ptr<Responder> res,
                CompletionRequest req, int n_ctx)
      : tok_(model.tokenizer()),
        metrics_(metrics),
        res_(std::move(res)),
        req_(std::move(req)),
        sampler_(req_.sampling),
        stream_(tok_),
        n_ctx_(n_ctx) {
    prefix_key = req_.prompt;
    reserve_tokens = req_.max_tokens;
    if (req_.prompt_logprobs_from >= 0) {
      // Logits of position i-1 give the log-probability of prompt token i: those rows must run.
      max_reuse = static_cast<size_t>(std::max(0, req_.prompt_logprobs_from - 1));
    }
    for (TokenId t : req_.prompt) sampler_.accept(t);
    created_ = unix_now();
    char id[32];
    std::snprintf(id, sizeof id, "cmpl-%016llx",
                  static_cast<unsigned long long>(std::hash<const void*>()(this) ^ created_));
    id_ = id;
    for (const auto& s : req_.stop) max_stop_ = std::max(max_stop_, s.size());
  }

  void on_admit() override {
    const size_t n = req_.prompt.size();
    for (size_t i = static_cast<size_t>(cached); i < n; ++i) {
      const bool prompt_row = req_.prompt_logprobs_from >= 0 &&
                              static_cast<int>(i) + 1 >= req_.prompt_logprobs_from && i + 1 < n;
      feed.push_back({req_.prompt[i], prompt_row || i + 1 == n});
    }
    prompt_lp_.assign(n, std::nullopt);
    if (req_.stream) start_stream();
  }

  void on_logits(size_t index, std::span<const float> logits) override {
    const size_t n = req_.prompt.size();
    if (generated_.empty() && cached + index + 1 < n) {
      // A prompt row: the distribution of the next prompt token.
      const TokenId next = req_.prompt[cached + index + 1];
      const double log_z = log_normalizer(logits);
      prompt_lp_[cached + index + 1] = PromptLp{static_cast<float>(logits[next] - log_z),
                                                top_n(logits, req_.prompt_top_n, log_z)};
      return;
    }
    if (req_.max_tokens == 0) {  // prompt log-probabilities (echo) only
      finish_ = "length";
      return;
    }
    // Greedy with log-probabilities: argmax and log Z from one read of the row (logit_stats).
    const bool want_log_z = req_.want_logprobs || req_.top_n > 0;
    std::optional<kernels::LogitStats> stats;
    if (want_log_z && sampler_.greedy())
      stats = kernels::logit_stats(logits.data(), static_cast<int64_t>(logits.size()));
    const TokenId t = stats ? static_cast<TokenId>(stats->argmax) : sampler_.sample(logits);
    if (tok_.is_eog(t) && !req_.ignore_eos) {
      finish_ = "stop";
      eog_ = true;
      return;
    }
    sampler_.accept(t);
    const double log_z = !want_log_z ? 0 : stats ? stats->log_z : log_normalizer(logits);
    generated_.push_back(t);
    gen_lp_.push_back(req_.want_logprobs ? static_cast<float>(logits[t] - log_z) : 0.f);
    gen_top_.push_back(top_n(logits, req_.top_n, log_z));
    const size_t before = text_.size();
    text_ += stream_.push(t);
    piece_ends_.push_back(text_.size());
    cut_at_stop_string(before);
    if (req_.stream) flush_text(false);
  }

  // Streaming or not, a request whose client hung up is dropped, queued or running.
  bool abandoned() const override { return !res_->alive(); }

  bool on_feed_done() override {
    if (!finish_.empty()) return false;
    if (static_cast<int>(generated_.size()) >= req_.max_tokens) {
      finish_ = "length";
      return false;
    }
    if (static_cast<int>(req_.prompt.size() + generated_.size()) >= n_ctx_) {
      finish_ = "length";
      return false;
    }
    if (Clock::now() >= req_.deadline) {  // the per-request time budget (--max-request-time)
      finish_ = "length";
      return false;
    }
    feed.assign(1, {generated_.back(), true});
    fed = 0;
    return true;
  }

  void on_finish(JobFailure failure, const std::string& message) override {
    if (failure != JobFailure::None) {
      if (failure == JobFailure::Cancelled) return;
      const int status =
          failure == JobFailure::NoMemory || failure == JobFailure::Draining ? 503 : 500;
      if (streamed_) {
        res_->write(sse(error_body(status == 503 ? "unavailable" : "internal", message)));
        res_->end();
      } else {
        send_error(*res_, ApiError(status, status == 503 ? "unavailable" : "internal", message));
      }
      return;
    }
    if (finish_.empty()) finish_ = "length";
    if (finish_ != "stop" || stop_word_.empty()) {
      text_ += stream_.flush();
    }
    metrics_.generated_tokens += generated_.size();
    if (req_.stream) {
      flush_text(true);
      finish_stream();
    } else {
      send_json(*res_, 200, whole_answer());
    }
  }

 private:
  struct PromptLp {
    float logprob;
    std::vector<TopEntry> top;
  };

  // Stop strings: cuts the text at the earliest match. Only a match that ends in the bytes this
  // token added (text_[before, end)) is new, so each token costs its own bytes plus the longest
  // stop string, not a rescan of the whole text.
  void cut_at_stop_string(size_t before) {
    size_t best = std::string::npos;
    const std::string* word = nullptr;
    for (const auto& s : req_.stop) {
      const size_t from = before >= s.size() - 1 ? before - (s.size() - 1) : 0;
      const size_t at = text_.find(s, from);
      if (at < best) {
        best = at;
        word = &s;
      }
    }
    if (!word) return;
    text_.resize(best);
    finish_ = "stop";
    stop_word_ = *word;
  }

  std::string piece(TokenId t) const { return tok_.token_to_piece(t); }
  std::string echoed_prompt() const {
    return req_.prompt_text ? *req_.prompt_text : tok_.decode(req_.prompt, /*remove_special=*/true);
  }

  json openai_logprobs(size_t from_token, size_t to_token, size_t text_offset0) const {
    json lp = {{"tokens", json::array()},
               {"token_logprobs", json::array()},
               {"top_logprobs", json::array()},
               {"text_offset", json::array()}};
    size_t off = text_offset0;
    auto label = [&](TokenId t) {
      return req_.tokens_as_ids ? "token_id:" + std::to_string(t) : piece(t);
    };
    auto add = [&](TokenId t, std::optional<float> l, const std::vector<TopEntry>* top) {
      const std::string p = piece(t);
      lp["tokens"].push_back(label(t));
      lp["token_logprobs"].push_back(l ? json(*l) : json(nullptr));
      if (top && !top->empty()) {
        json m = json::object();
        for (const auto& e : *top) m[label(e.id)] = e.logprob;
        lp["top_logprobs"].push_back(m);
      } else {
        lp["top_logprobs"].push_back(nullptr);
      }
      lp["text_offset"].push_back(off);
      off += p.size();
    };
    if (from_token == 0 && req_.echo) {
      for (size_t i = 0; i < req_.prompt.size(); ++i) {
        if (prompt_lp_[i]) {
          add(req_.prompt[i], prompt_lp_[i]->logprob, &prompt_lp_[i]->top);
        } else {
          add(req_.prompt[i], std::nullopt, nullptr);
        }
      }
    }
    for (size_t i = from_token; i < to_token && i < generated_.size(); ++i) {
      add(generated_[i], gen_lp_[i], &gen_top_[i]);
    }
    return lp;
  }

  json usage() const {
    const int p = static_cast<int>(req_.prompt.size());
    const int c = static_cast<int>(generated_.size());
    return {{"prompt_tokens", p},
            {"completion_tokens", c},
            {"total_tokens", p + c},
            {"prompt_tokens_details", {{"cached_tokens", cached}}}};
  }

  json llama_probs(size_t from, size_t to) const {
    json a = json::array();
    for (size_t i = from; i < to && i < generated_.size(); ++i) {
      json top = json::array();
      for (const auto& e : gen_top_[i]) {
        top.push_back({{"id", e.id}, {"token", piece(e.id)}, {"logprob", e.logprob}});
      }
      a.push_back({{"id", generated_[i]},
                   {"token", piece(generated_[i])},
                   {"logprob", gen_lp_[i]},
                   {"top_logprobs", top}});
    }
    return a;
  }

  json sglang_meta() const {
    json meta = {{"id", id_},
                 {"prompt_tokens", req_.prompt.size()},
                 {"completion_tokens", generated_.size()},
                 {"cached_tokens", cached},
                 {"finish_reason",
                  finish_ == "stop" ? json{{"type", "stop"},
                                           {"matched", eog_ ? json(tok_.eos()) : json(stop_word_)}}
                                    : json{{"type", "length"}, {"length", generated_.size()}}}};
    if (req_.want_logprobs) {
      json in = json::array(), in_top = json::array(), out = json::array(), out_top = json::array();
      const size_t from = static_cast<size_t>(std::max(0, req_.prompt_logprobs_from));
      if (req_.prompt_logprobs_from >= 0) {
        for (size_t i = from; i < req_.prompt.size(); ++i) {
          if (prompt_lp_[i]) {
            in.push_back({prompt_lp_[i]->logprob, req_.prompt[i], nullptr});
            json t = json::array();
            for (const auto& e : prompt_lp_[i]->top) t.push_back({e.logprob, e.id, nullptr});
            in_top.push_back(req_.prompt_top_n > 0 ? t : json(nullptr));
          } else {
            in.push_back({nullptr, req_.prompt[i], nullptr});
            in_top.push_back(nullptr);
          }
        }
      }
      for (size_t i = 0; i < generated_.size(); ++i) {
        out.push_back({gen_lp_[i], generated_[i], nullptr});
        json t = json::array();
        for (const auto& e : gen_top_[i]) t.push_back({e.logprob, e.id, nullptr});
        out_top.push_back(req_.top_n > 0 ? t : json(nullptr));
      }
      meta["input_token_logprobs"] = in;
      meta["output_token_logprobs"] = out;
      meta["input_top_logprobs"] = in_top;
      meta["output_top_logprobs"] = out_top;
    }
    return meta;
  }

  json whole_answer() const {
    const std::string prompt_text = req_.echo ? echoed_prompt() : "";
    switch (req_.dialect) {
      case Dialect::OpenAiText: {
        json choice = {{"index", 0},
                       {"text", prompt_text + text_},
                       {"finish_reason", finish_},
                       {"logprobs", nullptr}};
        if (req_.want_logprobs) choice["logprobs"] = openai_logprobs(0, generated_.size(), 0);
        if (req_.prompt_logprobs_field) {
          json pl = json::array();
          for (size_t i = 0; i < req_.prompt.size(); ++i) {
            if (!prompt_lp_[i]) {
              pl.push_back(nullptr);
              continue;
            }
            json m = json::object();
            m[std::to_string(req_.prompt[i])] = {{"logprob", prompt_lp_[i]->logprob},
                                                 {"decoded_token", piece(req_.prompt[i])}};
            int rank = 1;
            for (const auto& e : prompt_lp_[i]->top) {
              m[std::to_string(e.id)] = {
                  {"logprob", e.logprob}, {"rank", rank++}, {"decoded_token", piece(e.id)}};
            }
            pl.push_back(m);
          }
          choice["prompt_logprobs"] = pl;
        }
        return {{"id", id_},
                {"object", "text_completion"},
                {"created", created_},
                {"model", req_.model_name},
                {"choices", json::array({choice})},
                {"usage", usage()}};
      }
      case Dialect::OpenAiChat: {
        json choice = {{"index", 0},
                       {"message", {{"role", "assistant"}, {"content", text_}}},
                       {"finish_reason", finish_},
                       {"logprobs", nullptr}};
        if (req_.want_logprobs) choice["logprobs"] = chat_logprobs(0, generated_.size());
        return {
            {"id", "chat" + id_},       {"object", "chat.completion"},      {"created", created_},
            {"model", req_.model_name}, {"choices", json::array({choice})}, {"usage", usage()}};
      }
      case Dialect::LlamaCpp: {
        json out = {{"content", prompt_text + text_},
                    {"tokens", req_.return_tokens ? json(generated_) : json::array()},
                    {"id_slot", 0},
                    {"stop", true},
                    {"model", req_.model_name},
                    {"tokens_predicted", generated_.size()},
                    {"tokens_evaluated", req_.prompt.size()},
                    {"tokens_cached", cached},
                    {"stop_type", finish_ == "length" ? "limit" : (eog_ ? "eos" : "word")},
                    {"stopping_word", stop_word_},
                    {"truncated", false}};
        if (req_.top_n > 0 || req_.want_logprobs) {
          out["completion_probabilities"] = llama_probs(0, generated_.size());
        }
        return out;
      }
      case Dialect::SgLang:
        return {{"text", text_}, {"output_ids", generated_}, {"meta_info", sglang_meta()}};
    }
    return {};
  }

  json chat_logprobs(size_t from, size_t to) const {
    json content = json::array();
    for (size_t i = from; i < to && i < generated_.size(); ++i) {
      json top = json::array();
      for (const auto& e : gen_top_[i])
        top.push_back({{"token", piece(e.id)}, {"logprob", e.logprob}});
      content.push_back(
          {{"token", piece(generated_[i])}, {"logprob", gen_lp_[i]}, {"top_logprobs", top}});
    }
    return {{"content", content}};
  }

  void start_stream() {
    streamed_ = true;
    res_->start_stream(200, "text/event-stream");
    if (req_.dialect == Dialect::OpenAiChat) {
      json delta = {{"role", "assistant"}, {"content", ""}};
      res_->write(sse(chat_chunk(delta, nullptr)));
    }
    if (req_.echo && req_.dialect == Dialect::OpenAiText) {
      res_->write(sse(text_chunk(echoed_prompt(), nullptr, json(nullptr))));
    }
  }

  json text_chunk(const std::string& text, const json& finish, const json& logprobs) const {
    return {
        {"id", id_},
        {"object", "text_completion"},
        {"created", created_},
        {"model", req_.model_name},
        {"choices",
         json::array(
             {{{"index", 0}, {"text", text}, {"logprobs", logprobs}, {"finish_reason", finish}}})}};
  }
  json chat_chunk(const json& delta, const json& finish) const {
    return {{"id", "chat" + id_},
            {"object", "chat.completion.chunk"},
            {"created", created_},
            {"model", req_.model_name},
            {"choices", json::array({{{"index", 0},
                                      {"delta", delta},
                                      {"logprobs", nullptr},
                                      {"finish_reason", finish}}})}};
  }

  // Streams the text decided so far, holding back what could still become a stop string.
  void flush_text(bool final) {
    size_t safe = text_.size();
    if (!final && max_stop_ > 0)
      safe = text_.size() > max_stop_ - 1 ? text_.size() - (max_stop_ - 1) : 0;
    // Never cut a UTF-8 character in two.
    while (!final && safe > sent_ && safe < text_.size() &&
           (static_cast<unsigned char>(text_[safe]) & 0xC0) == 0x80) {
      --safe;
    }
    if (safe <= sent_) {
      if (!final) return;
    }
    const std::string piece_text = safe > sent_ ? text_.substr(sent_, safe - sent_) : std::string();
    // Tokens whose text is now fully sent.
    size_t tok_to = tokens_sent_;
    while (tok_to < generated_.size() && (final || piece_ends_[tok_to] <= safe)) ++tok_to;
    if (!piece_text.empty() || tok_to > tokens_sent_) {
      switch (req_.dialect) {
        case Dialect::OpenAiText:
          res_->write(sse(text_chunk(
              piece_text, nullptr,
              req_.want_logprobs ? openai_logprobs(tokens_sent_, tok_to, sent_) : json(nullptr))));
          break;
        case Dialect::OpenAiChat:
          if (!piece_text.empty()) {
            json c = chat_chunk({{"content", piece_text}}, nullptr);
            if (req_.want_logprobs)
              c["choices"][0]["logprobs"] = chat_logprobs(tokens_sent_, tok_to);
            res_->write(sse(c));
          }
          break;
        case Dialect::LlamaCpp: {
          json c = {{"content", piece_text},
                    {"stop", false},
                    {"id_slot", 0},
                    {"tokens", std::vector<TokenId>(generated_.begin() + tokens_sent_,
                                                    generated_.begin() + tok_to)}};
          if (req_.top_n > 0 || req_.want_logprobs)
            c["completion_probabilities"] = llama_probs(tokens_sent_, tok_to);
          res_->write(sse(c));
          break;
        }
        case Dialect::SgLang:
          // SGLang's chunks repeat everything so far. Sent after every token that is quadratic
          // (~80 MB of JSON for 4,096 tokens); after the first 16 tokens a chunk goes out only
          // once the answer has grown by a sixteenth, so a stream costs at most ~17 times its
          // final answer (docs/server.md).
          if (!final && tok_to < tokens_sent_ + std::max<size_t>(1, tok_to / 16)) return;
          res_->write(sse({{"text", text_.substr(0, safe)},
                           {"output_ids",
                            std::vector<TokenId>(generated_.begin(), generated_.begin() + tok_to)},
                           {"meta_info", {{"id", id_}, {"completion_tokens", tok_to}}}}));
          break;
      }
    }
    sent_ = std::max(sent_, safe);
    tokens_sent_ = tok_to;
  }

  void finish_stream() {
    switch (req_.dialect) {
      case Dialect::OpenAiText: {
        json c = text_chunk("", finish_, nullptr);
        c["usage"] = usage();
        res_->write(sse(c));
        res_->write("data: [DONE]\n\n");
        break;
      }
      case Dialect::OpenAiChat: {
        json c = chat_chunk(json::object(), finish_);
        c["usage"] = usage();
        res_->write(sse(c));
        res_->write("data: [DONE]\n\n");
        break;
      }
      case Dialect::LlamaCpp: {
        json out = whole_answer();
        out["content"] = "";
        out["tokens"] = json::array();
        out.erase("completion_probabilities");
        res_->write(sse(out));
        break;
      }
      case Dialect::SgLang: {
        res_->write(sse(whole_answer()));
        res_->write("data: [DONE]\n\n");
        break;
      }
    }
    res_->end();
  }

  const Tokenizer& tok_;
  Metrics& metrics_;
  std::shared_ptr<Responder> res_;
  CompletionRequest req_;
  Sampler sampler_;
  StreamDecoder stream_;
  int n_ctx_;
  int64_t created_ = 0;
  std::string id_;
  std::vector<TokenId> generated_;
  std::vector<float> gen_lp_;
  std::vector<std::vector<TopEntry>> gen_top_;
  std::vector<size_t> piece_ends_;  // text_ length after each generated token
  std::vector<std::optional<PromptLp>> prompt_lp_;
  std::string text_;
  size_t sent_ = 0, tokens_sent_ = 0, max_stop_ = 0;
  std::string finish_, stop_word_;
  bool eog_ = false;
  bool streamed_ = false;
};

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

// Threads for the request work whose CPU grows with the body: tokenizing prompts and texts,
// rendering chat templates, detokenizing. It never runs on an I/O thread, so /health and the
// native steps stay prompt whatever text other clients send. The queue is bounded (a full one
// answers 503); tasks still queued when the server goes away are dropped, and their responders
// answer 500 as they are destroyed.
class CpuWorkers {
 public:
  CpuWorkers(int threads, size_t max_queued) : max_queued_(max_queued) {
    for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { loop(); });
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
  // False when the queue is full.
  bool post(std::function<void()> task) {
    {
      std::lock_guard lk(mu_);
      if (stop_ || queue_.size() >= max_queued_) return false;
      queue_.push_back(std::move(task));
    }
    wake_.notify_one();
    return true;
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock lk(mu_);
        wake_.wait(lk, [&] { return stop_ || !queue_.empty(); });
        if (stop_) return;
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task();
    }
  }

  const size_t max_queued_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace

// ---------------------------------------------------------------------------------------------

struct Api::Impl {
  Scheduler& sched;
  Metrics& metrics;
  ApiOptions options;
  const Model& model;
  const Tokenizer& tok;
  std::string vocab_hash;  // the tokenizer fingerprint as the protocol writes it, made once
  json model_json;
  json limits_json;
  // Additions to protocol 1 a client may use when listed ("rewind": a step's rewind_to).
  const json features_json = json::array({"rewind"});

  // Last, so it is destroyed first: its threads stop before anything they use goes away.
  std::unique_ptr<CpuWorkers> workers;

  Impl(Scheduler& s, Metrics& m, const ApiOptions& o)
      : sched(s),
        metrics(m),
        options(o),
        model(s.model()),
        tok(s.model().tokenizer()),
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
                   {"max_sessions", s.options().max_sessions}};
    workers = std::make_unique<CpuWorkers>(options.cpu_workers,
                                           static_cast<size_t>(options.max_cpu_queue));
  }

  // Runs `work(request, responder)` on a CPU worker with its own copy of the request.
  using ResponderPtr = std::shared_ptr<Responder>;
  using Work = std::function<void(const HttpRequest&, ResponderPtr)>;
  void offload(const HttpRequest& req, ResponderPtr res, Work work) {
    auto copy = std::make_shared<HttpRequest>(req);
    const bool queued = workers->post(
        [copy, res, work = std::move(work)] { answering_errors(*res, [&] { work(*copy, res); }); });
    if (!queued) {
      ++metrics.rejected_overload;
      throw ApiError(503, "unavailable",
                     "all " + std::to_string(options.max_cpu_queue) +
                         " places in the tokenizer queue are taken; retry later");
    }
  }

  void route(const HttpRequest& req, const std::shared_ptr<CountingResponder>& res, bool draining);
  int n_vocab() const { return model.info().n_vocab; }
  int n_ctx() const { return sched.options().n_ctx; }

  // Queues a job for `who`; refused: 503 while draining, 429 over the client's own quota or
  // when the whole queue is full. `undo` runs first when refused (a step gives its history back).
  void submit_or_refuse(const std::shared_ptr<Job>& job, const Credential& who,
                        const std::function<void()>& undo = {}) {
    job->owner = who.name;
    SubmitRefusal why = SubmitRefusal::None;
    if (sched.submit(job, &why)) return;
    if (undo) undo();
    if (why == SubmitRefusal::Draining) {
      throw ApiError(503, "unavailable", "the server is shutting down");
    }
    ++metrics.rejected_overload;
    if (why == SubmitRefusal::KeyQuota) {
      throw ApiError(
          429, "over_quota",
          client_label(who) + " has " + std::to_string(sched.options().max_queue_per_key) +
              " jobs queued or running, its quota (--max-queue-per-key); retry later",
          {{"quota", "max_queue_per_key"}, {"limit", sched.options().max_queue_per_key}});
    }
    throw ApiError(429, "overloaded",
                   "the work queue is full (" + std::to_string(sched.options().max_queue) +
                       " jobs); retry later");
  }

  void info(Responder& res) {
    send_json(res, 200,
              {{"protocol", 1},
               {"features", features_json},
               {"model", model_json},
               {"limits", limits_json}});
  }

  void create(const HttpRequest& req, Responder& res, const Credential& who) {
    const json j = parse_body(req.body);
    const int64_t proto = get_int(j, "protocol", 1, 0, 1000);
    if (proto != 1) {
      throw bad("protocol", "is " + std::to_string(proto) + "; this server speaks protocol 1");
    }
    const CreateResult created = sched.create_session(who.name);
    switch (created.outcome) {
      case CreateResult::Outcome::Ok:
        break;
      case CreateResult::Outcome::Draining:
        throw ApiError(503, "unavailable", "the server is shutting down");
      case CreateResult::Outcome::OverQuota:
        ++metrics.rejected_overload;
        throw ApiError(
            429, "over_quota",
            client_label(who) + " has " + std::to_string(sched.options().max_sessions_per_key) +
                " sessions open, its quota (--max-sessions-per-key); close one or "
                "retry when one expires",
            {{"quota", "max_sessions_per_key"}, {"limit", sched.options().max_sessions_per_key}});
      case CreateResult::Outcome::NoRoom:
        ++metrics.rejected_overload;
        throw ApiError(429, "overloaded",
                       "all " + std::to_string(sched.options().max_sessions) +
                           " session slots are taken and none may be evicted (other clients' "
                           "idle sessions are kept for --evict-grace " +
                           json(sched.options().evict_grace_s).dump() + " s); retry later",
                       {{"retry_after", created.retry_after_s}});
    }
    const std::string& id = created.id;
    send_json(res, 201,
              {{"session", id},
               {"pos", 0},
               {"protocol", 1},
               {"features", features_json},
               {"model", model_json},
               {"limits", limits_json}});
  }

  void step(const std::string& id, const HttpRequest& req, std::shared_ptr<Responder> res,
            const Credential& who) {
    StepRequest sr = parse_step(parse_body(req.body), n_vocab(), n_ctx(), options);
    if (sr.kind != StepKind::Sync && sr.expected_pos == 0 && sr.append.empty()) {
      throw bad("append", "is empty and so is the session: there is nothing to continue from");
    }
    const int extra = sr.kind == StepKind::Generate ? sr.n
                      : sr.kind == StepKind::Verify ? static_cast<int>(sr.draft.size()) + 1
                                                    : 0;
    int pos = 0, kv_len = 0;
    std::vector<TokenId> uncached;
    const StepCheck check = sched.begin_step(id, who.name, sr.expected_pos, sr.rewind_to, sr.append,
                                             extra, &pos, &kv_len, &uncached);
    switch (check) {
      case StepCheck::Ok:
        break;
      case StepCheck::Lost:
        throw session_lost(id, who);
      case StepCheck::Busy:
        throw ApiError(409, "session_busy", "session " + id + " is running another step",
                       {{"pos", pos}});
      case StepCheck::PositionMismatch:
        throw ApiError(409, "position_mismatch",
                       std::string(sr.rewind_to >= 0 ? "rewind_to" : "expected_pos") + " is " +
                           std::to_string(sr.expected_pos) + " but the session's history has " +
                           std::to_string(pos) + " tokens",
                       {{"pos", pos}});
      case StepCheck::TooLong:
        throw ApiError(413, "too_large",
                       "the history (" + std::to_string(pos) + ") plus " +
                           std::to_string(sr.append.size()) + " appended and " +
                           std::to_string(extra) + " generated tokens would not fit n_ctx " +
                           std::to_string(n_ctx()),
                       {{"pos", pos}});
    }
    const int appended = static_cast<int>(sr.append.size());
    auto job = std::make_shared<StepJob>(sched, metrics, res, std::move(sr), std::move(uncached),
                                         kv_len, pos);
    job->session_id = id;
    job->history_before = pos - appended;
    submit_or_refuse(job, who, [&] { sched.abort_step(id, job->history_before); });
  }

  // The answer for a session `who` does not hold: the same for an id never issued, another
  // client's session and one of its own that is gone (then with the reason).
  ApiError session_lost(const std::string& id, const Credential& who) const {
    const std::string reason = sched.lost_reason(id, who.name);
    return ApiError(410, "session_lost", "session " + id + " is gone (" + reason + ")",
                    {{"reason", reason}});
  }

  static std::string client_label(const Credential& who) {
    return who.name.empty() ? std::string("this client") : "client '" + who.name + "'";
  }

  void close(const std::string& id, Responder& res, const Credential& who) {
    if (!sched.close_session(id, who.name)) throw session_lost(id, who);
    send_json(res, 200, {{"closed", true}});
  }

  void completion(const HttpRequest& req, std::shared_ptr<Responder> res, Dialect d,
                  const Credential& who) {
    const json j = parse_body(req.body);
    CompletionRequest r;
    r.dialect = d;
    r.model_name = options.model_name;
    if (const json* m = field(j, "model"); m && m->is_string())
      r.model_name = m->get<std::string>();
    r.stream = get_bool(j, "stream", false);
    r.deadline = deadline_after(options.max_request_seconds);
    switch (d) {
      case Dialect::OpenAiText: {
        const json* p = field(j, "prompt");
        if (!p) throw bad("prompt", "is required");
        r.prompt = get_prompt(*p, "prompt", tok, n_vocab(), n_ctx(), options.max_text_bytes);
        if (p->is_string()) r.prompt_text = p->get<std::string>();
        r.max_tokens = static_cast<int>(get_int(j, "max_tokens", 16, 0, options.max_generate));
        r.sampling = get_sampling(j, 1.0);
        r.stop = get_stop(j, "stop");
        if (const json* lp = field(j, "logprobs")) {
          r.top_n = static_cast<int>(get_int(j, "logprobs", 0, 0, options.max_top_n));
          r.want_logprobs = true;
          (void)lp;
        }
        r.echo = get_bool(j, "echo", false);
        r.tokens_as_ids = get_bool(j, "return_tokens_as_token_ids", false);
        if (field(j, "prompt_logprobs")) {
          r.prompt_top_n = static_cast<int>(get_int(j, "prompt_logprobs", 0, 0, options.max_top_n));
          r.prompt_logprobs_from = 1;
          r.prompt_logprobs_field = true;
        }
        if (r.echo && r.want_logprobs && r.prompt_logprobs_from < 0) r.prompt_logprobs_from = 1;
        break;
      }
      case Dialect::OpenAiChat: {
        const json* msgs = field(j, "messages");
        if (!msgs || !msgs->is_array() || msgs->empty()) {
          throw bad("messages", "must be a non-empty array of {role, content}");
        }
        std::vector<ChatMessage> chat;
        size_t chat_bytes = 0;  // all messages' text together count against --max-text-bytes
        for (size_t i = 0; i < msgs->size(); ++i) {
          const json& m = (*msgs)[i];
          const std::string at = "messages[" + std::to_string(i) + "]";
          if (!m.is_object()) throw bad(at, "must be an object");
          const json* role = field(m, "role");
          const json* content = field(m, "content");
          if (!role || !role->is_string()) throw bad(at + ".role", "must be a string");
          std::string text;
          if (content && content->is_string()) {
            text = content->get<std::string>();
          } else if (content && content->is_array()) {  // [{"type":"text","text":...}]
            for (const auto& part : *content) {
              if (part.is_object() && part.value("type", "") == "text" && part.contains("text") &&
                  part["text"].is_string()) {
                text += part["text"].get<std::string>();
              } else {
                throw bad(at + ".content", "parts must be {\"type\":\"text\",\"text\":...}");
              }
            }
          } else if (content) {
            throw bad(at + ".content", "must be a string or an array of text parts");
          }
          chat_bytes += text.size();
          check_text_size(chat_bytes, "messages", options.max_text_bytes);
          chat.push_back({role->get<std::string>(), text});
        }
        const std::string prompt = apply_chat_template(model.file(), chat, true);
        r.prompt = tok.encode(prompt, true, true);
        const int64_t mt = get_int(j, "max_completion_tokens", -1, -1, options.max_generate);
        r.max_tokens =
            static_cast<int>(mt >= 0 ? mt : get_int(j, "max_tokens", 256, 0, options.max_generate));
        r.sampling = get_sampling(j, 1.0);
        r.stop = get_stop(j, "stop");
        r.want_logprobs = get_bool(j, "logprobs", false);
        if (r.want_logprobs)
          r.top_n = static_cast<int>(get_int(j, "top_logprobs", 0, 0, options.max_top_n));
        break;
      }
      case Dialect::LlamaCpp: {
        const json* p = field(j, "prompt");
        if (!p) throw bad("prompt", "is required");
        r.prompt = get_prompt(*p, "prompt", tok, n_vocab(), n_ctx(), options.max_text_bytes);
        const int64_t n = get_int(j, "n_predict", -1, -1, options.max_generate);
        r.max_tokens = n < 0 ? options.max_generate : static_cast<int>(n);
        r.sampling = get_sampling(j, 0.8);
        if (!field(j, "top_k")) r.sampling.top_k = 40;
        r.stop = get_stop(j, "stop");
        r.top_n = static_cast<int>(get_int(j, "n_probs", 0, 0, options.max_top_n));
        r.want_logprobs = r.top_n > 0;
        r.return_tokens = get_bool(j, "return_tokens", false);
        break;
      }
      case Dialect::SgLang: {
        const json* ids = field(j, "input_ids");
        const json* text = field(j, "text");
        if (ids) {
          r.prompt = get_ids(*ids, "input_ids", n_vocab(), static_cast<size_t>(n_ctx()));
        } else if (text && text->is_string()) {
          r.prompt = tok.encode(checked_text(*text, "text", options.max_text_bytes), true, false);
        } else {
          throw bad("input_ids", "or 'text' is required");
        }
        static const json kNoParams = json::object();
        const json* s = field(j, "sampling_params");
        if (s && !s->is_object()) throw bad("sampling_params", "must be an object");
        const json& sp = s ? *s : kNoParams;  // read in place: client JSON is never copied
        r.max_tokens =
            static_cast<int>(get_int(sp, "max_new_tokens", 128, 0, options.max_generate));
        r.sampling = get_sampling(sp, 1.0);
        r.stop = get_stop(sp, "stop");
        r.ignore_eos = get_bool(sp, "ignore_eos", false);
        r.want_logprobs = get_bool(j, "return_logprob", false);
        if (r.want_logprobs) {
          const int64_t start = get_int(j, "logprob_start_len", -1, -1, n_ctx());
          if (start >= 0) r.prompt_logprobs_from = static_cast<int>(start);
          r.top_n = static_cast<int>(get_int(j, "top_logprobs_num", 0, 0, options.max_top_n));
          r.prompt_top_n = r.top_n;
        }
        break;
      }
    }
    // vLLM and llama.cpp take ignore_eos beside the other sampling fields; SGLang inside
    // sampling_params (above).
    if (d != Dialect::SgLang) r.ignore_eos = get_bool(j, "ignore_eos", false);
    if (r.prompt.empty()) throw bad("prompt", "is empty after tokenization");
    if (static_cast<int>(r.prompt.size()) >= n_ctx()) {
      throw ApiError(413, "too_large",
                     "the prompt has " + std::to_string(r.prompt.size()) +
                         " tokens; the context holds " + std::to_string(n_ctx()),
                     {{"field", "prompt"}});
    }
    r.max_tokens = std::min(r.max_tokens, n_ctx() - static_cast<int>(r.prompt.size()));
    if (r.stream && metrics.sse_clients >= options.max_sse_clients) {
      ++metrics.rejected_overload;
      throw ApiError(429, "overloaded", "too many open streams; retry later");
    }
    std::shared_ptr<Responder> out = res;
    if (r.stream) {
      // Counts the stream while it is open.
      struct StreamGuard : Responder {
        StreamGuard(std::shared_ptr<Responder> in, Metrics& m) : in(std::move(in)), m(m) {
          ++m.sse_clients;
        }
        ~StreamGuard() override { --m.sse_clients; }
        void send(int s, const std::string& ct, std::string b, const HeaderList& h) override {
          in->send(s, ct, std::move(b), h);
        }
        void start_stream(int s, const std::string& ct, const HeaderList& h) override {
          in->start_stream(s, ct, h);
        }
        bool write(std::string c) override { return in->write(std::move(c)); }
        void end() override { in->end(); }
        bool alive() const override { return in->alive(); }
        std::shared_ptr<Responder> in;
        Metrics& m;
      };
      out = std::make_shared<StreamGuard>(res, metrics);
    }
    auto job = std::make_shared<CompletionJob>(model, metrics, out, std::move(r), n_ctx());
    submit_or_refuse(job, who);
  }

  void tokenize(const HttpRequest& req, Responder& res) {
    const json j = parse_body(req.body);
    const json* c = field(j, "content");
    if (!c) c = field(j, "text");
    if (!c || !c->is_string()) throw bad("content", "must be a string");
    const bool add_special = get_bool(j, "add_special", true);
    const bool parse_special = get_bool(j, "parse_special", true);
    const bool with_pieces = get_bool(j, "with_pieces", false);
    const auto ids =
        tok.encode(checked_text(*c, "content", options.max_text_bytes), add_special, parse_special);
    json tokens = json::array();
    for (TokenId id : ids) {
      if (with_pieces) {
        tokens.push_back({{"id", id}, {"piece", tok.token_to_piece(id)}});
      } else {
        tokens.push_back(id);
      }
    }
    send_json(res, 200, {{"tokens", tokens}, {"vocab_hash", vocab_hash}, {"n_vocab", n_vocab()}});
  }

  void detokenize(const HttpRequest& req, Responder& res) {
    const json j = parse_body(req.body);
    const json* t = field(j, "tokens");
    if (!t) throw bad("tokens", "is required");
    const auto ids = get_ids(*t, "tokens", n_vocab(), 1 << 20);
    send_json(res, 200, {{"content", tok.decode(ids)}});
  }

  void models(Responder& res) {
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

  void props(Responder& res) {  // llama.cpp's /props, for vocabulary checks
    send_json(res, 200,
              {{"model_path", model.info().path},
               {"n_ctx", n_ctx()},
               {"vocab_hash", vocab_hash},
               {"n_vocab", n_vocab()},
               {"total_slots", sched.options().stateless_slots}});
  }

  void list(Responder& res, const Credential& who) {
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

  // Admin routes: the admin key; on a server without any key, a loopback --host instead (no
  // one else can connect, unless a proxy on this host forwards to it: then set --admin-key).
  void require_admin(const Credential& who, const std::string& what) const {
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

  // Who is calling: the credential whose key the Bearer header holds (401 when none matches),
  // or the anonymous client when the server has no keys.
  Credential authenticate(const HttpRequest& req) const {
    if (options.keys.empty()) return {};
    const std::string auth = req.header("authorization");
    const std::string prefix = "Bearer ";
    const Credential* who =
        auth.rfind(prefix, 0) == 0 ? options.keys.find(auth.substr(prefix.size())) : nullptr;
    if (!who) {
      throw ApiError(401, "unauthorized",
                     "a valid 'Authorization: Bearer <key>' header is required");
    }
    return *who;
  }
};

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
                                "/tandem/v1/info",
                                "/tandem/v1/sessions"};
  for (const char* k : known) {
    if (path == k) return k;
  }
  if (path.rfind("/tandem/v1/sessions/", 0) == 0) {
    return path.size() > 5 && path.compare(path.size() - 5, 5, "/step") == 0
               ? "/tandem/v1/sessions/{id}/step"
               : "/tandem/v1/sessions/{id}";
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
  if (p == "/tandem/v1/info" && get) return m.info(*res);
  if (p == "/tandem/v1/sessions" && get) return m.list(*res, who);
  if (p == "/tokenize" && post) {
    return m.offload(req, res,
                     [&m](const HttpRequest& r, ResponderPtr out) { m.tokenize(r, *out); });
  }
  if (p == "/detokenize" && post) {
    return m.offload(req, res,
                     [&m](const HttpRequest& r, ResponderPtr out) { m.detokenize(r, *out); });
  }
  if (draining && post) throw ApiError(503, "unavailable", "the server is shutting down");
  if (p == "/tandem/v1/sessions" && post) return m.create(req, *res, who);
  const std::string prefix = "/tandem/v1/sessions/";
  if (p.rfind(prefix, 0) == 0) {
    std::string rest = p.substr(prefix.size());
    const bool is_step = rest.size() > 5 && rest.compare(rest.size() - 5, 5, "/step") == 0;
    const std::string id = is_step ? rest.substr(0, rest.size() - 5) : rest;
    if (id.empty() || id.size() > 64 || id.find('/') != std::string::npos) {
      throw ApiError(404, "not_found", "no such path: " + p);
    }
    if (is_step && post) {
      res->set_model_request();
      return m.step(id, req, res, who);
    }
    if (!is_step && req.method == "DELETE") return m.close(id, *res, who);
    throw ApiError(405, "bad_method", req.method + " is not allowed on " + p);
  }
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

}  // namespace tandem::server
