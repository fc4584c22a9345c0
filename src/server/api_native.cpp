// The native session protocol (docs/protocol.md): /tandem/v1/info, creating and closing a
// session, and its steps. A step appends token ids to the session's history (after an optional
// rewind) and then syncs, generates or verifies a draft, all on token ids: nothing here
// tokenizes, so the router runs it on the I/O thread.
#include <algorithm>
#include <chrono>
#include <initializer_list>
#include <nlohmann/json.hpp>

#include "net/native_protocol.h"
#include "runtime/model_internals.h"
#include "server/api_internal.h"

namespace tandem::server {

namespace {

enum class StepKind { Sync, Generate, Verify };

struct StepRequest {
  StepStart start;     // expected_pos, rewind_to, append, and the tokens the step will add
  bool queue = false;  // wait behind a running step of the session instead of 409 session_busy
  StepKind kind = StepKind::Sync;
  int n = 0;
  SamplingParams sampling;
  std::vector<TokenId> draft;
  int top_n = 0;
};

// 400 for a field of `j` not in `known` ("a step", "a cancel": `what`), naming the known ones.
void refuse_unknown_fields(const json& j, std::initializer_list<const char*> known,
                           const std::string& what) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (std::find_if(known.begin(), known.end(), [&](const char* k) { return it.key() == k; }) !=
        known.end())
      continue;
    std::string names;
    for (const char* k : known) names += (names.empty() ? "" : ", ") + std::string(k);
    throw bad(it.key(), "is not a field of " + what + " (" + names + ")");
  }
}

StepRequest parse_step(const json& j, int n_vocab, int n_ctx, const ApiOptions& o) {
  refuse_unknown_fields(
      j,
      {protocol::kExpectedPos, protocol::kExpectedHash, protocol::kRewindTo, protocol::kAppend,
       protocol::kGenerate, protocol::kVerify, protocol::kTopN, protocol::kQueue},
      "a step");
  StepRequest r;
  StepStart& st = r.start;
  if (!field(j, protocol::kExpectedPos)) throw bad(protocol::kExpectedPos, "is required");
  st.expected_pos = static_cast<int>(get_int(j, protocol::kExpectedPos, 0, 0, n_ctx));
  if (field(j, protocol::kRewindTo)) {
    st.rewind_to = static_cast<int>(get_int(j, protocol::kRewindTo, 0, 0, n_ctx));
    if (st.expected_pos != st.rewind_to) {
      throw bad(protocol::kExpectedPos, "must equal rewind_to (" + std::to_string(st.rewind_to) +
                                            "): it counts the history after the cut");
    }
  }
  if (const json* h = field(j, protocol::kExpectedHash)) {
    st.expected_hash =
        h->is_string() ? HistoryHash::parse_hex(h->get_ref<const std::string&>()) : std::nullopt;
    if (!st.expected_hash) {
      throw bad(protocol::kExpectedHash,
                "must be 16 lowercase hex digits (the history's FNV-1a hash)");
    }
  }
  if (const json* a = field(j, protocol::kAppend))
    st.append = get_ids(*a, protocol::kAppend, n_vocab, n_ctx);
  r.top_n = static_cast<int>(get_int(j, protocol::kTopN, 0, 0, o.max_top_n));
  r.queue = get_bool(j, protocol::kQueue, false);
  const json* g = field(j, protocol::kGenerate);
  const json* v = field(j, protocol::kVerify);
  if (g && v) throw bad(protocol::kGenerate, "and 'verify' cannot be in one step");
  if (g) {
    if (!g->is_object()) throw bad(protocol::kGenerate, "must be an object");
    r.kind = StepKind::Generate;
    r.n = static_cast<int>(get_int(*g, protocol::kN, 1, 1, o.max_generate));
    r.sampling = get_sampling(*g, 0.0);
    st.extra_tokens = r.n;
  }
  if (v) {
    if (!v->is_object()) throw bad(protocol::kVerify, "must be an object");
    const json* d = field(*v, protocol::kDraft);
    if (!d) throw bad("verify.draft", "is required");
    r.draft = get_ids(*d, "verify.draft", n_vocab, static_cast<size_t>(o.max_draft));
    if (r.draft.empty()) throw bad("verify.draft", "must hold at least one token");
    r.kind = StepKind::Verify;
    st.extra_tokens = static_cast<int>(r.draft.size()) + 1;
  }
  return r;
}

// The cancel body: {"from_pos": p}.
int parse_cancel(const json& j, int n_ctx) {
  refuse_unknown_fields(j, {protocol::kFromPos}, "a cancel");
  if (!field(j, protocol::kFromPos)) throw bad(protocol::kFromPos, "is required");
  return static_cast<int>(get_int(j, protocol::kFromPos, 0, 0, n_ctx));
}

ApiError lost_session(const std::string& id, const std::string& reason) {
  return ApiError(410, "session_lost", "session " + id + " is gone (" + reason + ")",
                  {{"reason", reason}});
}

// The answer for a step that did not start: at once (Api::Impl::step) or when its turn came
// after waiting (StepJob::on_finish).
ApiError step_refused(const StepRefusal& r, const StepStart& st, const std::string& id, int n_ctx) {
  const json pos = {{protocol::kPos, r.pos}};
  switch (r.check) {
    case StepCheck::Lost:
      return lost_session(id, r.lost_reason);
    case StepCheck::Busy:
      return ApiError(409, protocol::kSessionBusy, "session " + id + " is running another step",
                      pos);
    case StepCheck::PositionMismatch:
      return ApiError(
          409, "position_mismatch",
          std::string(st.rewind_to >= 0 ? protocol::kRewindTo : protocol::kExpectedPos) + " is " +
              std::to_string(st.expected_pos) + " but the session's history has " +
              std::to_string(r.pos) + " tokens",
          pos);
    case StepCheck::HistoryMismatch:
      return ApiError(409, protocol::kHistoryMismatch,
                      "the session's first " + std::to_string(r.pos) +
                          " tokens are not the history expected_hash names",
                      pos);
    case StepCheck::TooLong:
    case StepCheck::Ok:
      break;
  }
  return ApiError(413, "too_large",
                  "the history (" + std::to_string(r.pos) + ") plus " +
                      std::to_string(st.append.size()) + " appended and " +
                      std::to_string(st.extra_tokens) + " generated tokens would not fit n_ctx " +
                      std::to_string(n_ctx),
                  pos);
}

class StepJob : public Job {
 public:
  // The job of `req`: its StepStart moves into Job::step, to be checked when the step starts.
  StepJob(Scheduler& sched, Metrics& metrics, std::shared_ptr<Responder> res, StepRequest req,
          double max_seconds)
      : sched_(sched),
        metrics_(metrics),
        res_(std::move(res)),
        req_(std::move(req)),
        sampler_(req_.sampling),
        max_seconds_(max_seconds) {
    step = std::move(req_.start);
    reserve_tokens = req_.kind == StepKind::Generate ? req_.n : 0;
  }

  // The step has the session: feed what the cache lacks. The last history token stays out of
  // the cache on a sync step; generate and verify feed it with its logits (and verify the
  // drafts after it). The time budget starts now, not while the step waited.
  void on_begin(const StepBegun& begun) override {
    kv_len_ = begun.kv_len;
    pos_ = begun.pos;
    deadline_ = deadline_after(max_seconds_);
    size_t n_feed = begun.uncached.size();
    if (req_.kind == StepKind::Sync && n_feed > 0) --n_feed;
    for (size_t i = 0; i < n_feed; ++i) {
      feed.push_back({begun.uncached[i], req_.kind != StepKind::Sync && i + 1 == n_feed});
    }
    if (req_.kind == StepKind::Verify) {
      for (TokenId d : req_.draft) feed.push_back({d, true});
      targets_.resize(req_.draft.size() + 1, -1);
      target_logprob_.resize(req_.draft.size() + 1, 0);
      target_top_.resize(req_.draft.size() + 1);
    }
    prefilled_ = static_cast<int>(n_feed);
  }

  void on_logits(size_t index, std::span<const float> logits) override {
    // One read of the row for argmax and log Z together (greedy), one more for the top-n.
    const LogitStats st = logit_stats(logits);
    if (req_.kind == StepKind::Generate) {
      const TokenId t =
          sampler_.greedy() ? static_cast<TokenId>(st.argmax) : sampler_.sample(logits);
      produced_.assign(1, t);
      if (!sched_.session_append(*this, produced_)) return;  // cancelled: the history stops
      sampler_.accept(t);
      tokens_.push_back(t);
      logprobs_.push_back(static_cast<float>(logits[t] - st.log_z));
      if (req_.top_n > 0) tops_.push_back(top_n(logits, req_.top_n, st.log_z));
      ++pos_;
      if (ModelInternals::tokenizer(sched_.model()).is_eog(t)) stop_ = "eog";
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
      // A cancel may stop the history before the first token (the job then ends cancelled).
      if (!stop_.empty() || tokens_.empty()) return false;
      if (static_cast<int>(tokens_.size()) >= req_.n) return false;
      if (pos_ >= n_ctx) {
        stop_ = "context";
        return false;
      }
      if (Clock::now() >= deadline_) {
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
      if (!sched_.session_append(*this, tokens_)) return false;  // cancelled: answered 409
      pos_ += static_cast<int>(tokens_.size());
      metrics_.accepted_drafts += acc;
      if (ModelInternals::tokenizer(sched_.model()).is_eog(tokens_.back())) stop_ = "eog";
    }
    return false;
  }

  // A step whose client hung up is dropped, queued or running (the scheduler rolls the
  // session's history back, so the device can send the step again).
  bool abandoned() const override { return !res_->alive(); }

  void on_finish(JobFailure failure, const std::string& message) override {
    metrics_.step_seconds.observe(std::chrono::duration<double>(Clock::now() - enqueued).count());
    if (failure != JobFailure::None) return send_error(*res_, failure_error(failure, message));
    metrics_.generated_tokens += tokens_.size();
    json out = {{protocol::kPos, pos_},
                {protocol::kTokens, tokens_},
                {protocol::kLogprobs, logprobs_},
                {protocol::kPrefilled, prefilled_},
                {protocol::kStop, stop_.empty() ? "length" : stop_}};
    if (req_.kind == StepKind::Verify) out[protocol::kAccepted] = accepted_;
    if (req_.top_n > 0) {
      json t = json::array();
      for (const auto& e : tops_) t.push_back(top_json(e));
      out["top"] = t;
    }
    send_json(*res_, 200, out);
  }

 private:
  ApiError failure_error(JobFailure failure, const std::string& message) const {
    switch (failure) {
      case JobFailure::Refused:  // it waited, and its checks failed when its turn came
        return step_refused(refusal, step, session_id, sched_.options().n_ctx);
      case JobFailure::Cancelled:  // by POST .../cancel (after a hang-up nobody reads this)
        return ApiError(409, protocol::kCancelled,
                        "the step was cancelled: its device abandoned the history it builds on",
                        {{protocol::kPos, history_after}});
      case JobFailure::NoMemory:
        // Room frees up when running steps end or other clients' idle sessions pass their
        // grace.
        if (retry_after_s > 0) {
          return ApiError(429, "overloaded",
                          message +
                              " now (busy sessions, or other clients' idle ones within "
                              "--evict-grace); retry later",
                          {{"retry_after", retry_after_s}});
        }
        return ApiError(503, "unavailable", message);
      case JobFailure::Draining:
        return ApiError(503, "unavailable", message);
      default:
        return ApiError(500, "internal", message.empty() ? "the step failed" : message);
    }
  }

  Scheduler& sched_;
  Metrics& metrics_;
  std::shared_ptr<Responder> res_;
  StepRequest req_;
  Sampler sampler_;
  double max_seconds_;
  Clock::time_point deadline_ = Clock::time_point::max();  // generation stops here ("time")
  int kv_len_ = 0;
  int pos_ = 0;
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

}  // namespace

void Api::Impl::info(Responder& res) {
  send_json(res, 200,
            {{protocol::kProtocol, protocol::kVersion},
             {protocol::kFeatures, features_json},
             {protocol::kModel, model_json},
             {protocol::kLimits, limits_json}});
}

void Api::Impl::create(const HttpRequest& req, Responder& res, const Credential& who) {
  const json j = parse_body(req.body);
  const int64_t proto = get_int(j, protocol::kProtocol, protocol::kVersion, 0, 1000);
  if (proto != protocol::kVersion) {
    throw bad(protocol::kProtocol, "is " + std::to_string(proto) +
                                       "; this server speaks protocol " +
                                       std::to_string(protocol::kVersion));
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
            {{protocol::kSession, id},
             {protocol::kPos, 0},
             {protocol::kProtocol, protocol::kVersion},
             {protocol::kFeatures, features_json},
             {protocol::kModel, model_json},
             {protocol::kLimits, limits_json}});
}

// Starts the step now, or with "queue": true behind the session's running step; either way the
// answer comes from the job's on_finish, never from a waiting I/O thread.
void Api::Impl::step(const std::string& id, const HttpRequest& req, std::shared_ptr<Responder> res,
                     const Credential& who) {
  StepRequest sr = parse_step(parse_body(req.body), n_vocab(), n_ctx(), options);
  if (sr.kind != StepKind::Sync && sr.start.expected_pos == 0 && sr.start.append.empty()) {
    throw bad(protocol::kAppend,
              "is empty and so is the session: there is nothing to continue from");
  }
  const bool may_wait = sr.queue;
  auto job =
      std::make_shared<StepJob>(sched, metrics, res, std::move(sr), options.max_request_seconds);
  job->session_id = id;
  job->owner = who.name;
  StepRefusal refusal;
  SubmitRefusal why = SubmitRefusal::None;
  if (sched.start_step(job, may_wait, &refusal, &why)) return;
  if (refusal.check != StepCheck::Ok) throw step_refused(refusal, job->step, id, n_ctx());
  throw queue_refusal(why, who);
}

// The device abandoned its history from `from_pos` on: the session's steps that build on it
// end 409 cancelled; this answer does not wait for them.
void Api::Impl::cancel(const std::string& id, const HttpRequest& req, Responder& res,
                       const Credential& who) {
  const int from_pos = parse_cancel(parse_body(req.body), n_ctx());
  int count = 0, pos = 0;
  if (!sched.cancel_steps(id, who.name, from_pos, &count, &pos)) throw session_lost(id, who);
  send_json(res, 200, {{protocol::kCancelled, count}, {protocol::kPos, pos}});
}

// The answer for a session `who` does not hold: the same for an id never issued, another
// client's session and one of its own that is gone (then with the reason).
ApiError Api::Impl::session_lost(const std::string& id, const Credential& who) const {
  return lost_session(id, sched.lost_reason(id, who.name));
}

void Api::Impl::close(const std::string& id, Responder& res, const Credential& who) {
  if (!sched.close_session(id, who.name)) throw session_lost(id, who);
  send_json(res, 200, {{"closed", true}});
}

}  // namespace tandem::server
