// The native session protocol (docs/protocol.md): /tandem/v1/info, creating and closing a
// session, and its steps. A step appends token ids to the session's history (after an optional
// rewind) and then syncs, generates or verifies a draft, all on token ids: nothing here
// tokenizes, so the router runs it on the I/O thread.
#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>

#include "server/api_internal.h"

namespace tandem::server {

namespace {

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
    const LogitStats st = logit_stats(logits);
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

}  // namespace

void Api::Impl::info(Responder& res) {
  send_json(res, 200,
            {{"protocol", 1},
             {"features", features_json},
             {"model", model_json},
             {"limits", limits_json}});
}

void Api::Impl::create(const HttpRequest& req, Responder& res, const Credential& who) {
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

void Api::Impl::step(const std::string& id, const HttpRequest& req, std::shared_ptr<Responder> res,
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
ApiError Api::Impl::session_lost(const std::string& id, const Credential& who) const {
  const std::string reason = sched.lost_reason(id, who.name);
  return ApiError(410, "session_lost", "session " + id + " is gone (" + reason + ")",
                  {{"reason", reason}});
}

void Api::Impl::close(const std::string& id, Responder& res, const Credential& who) {
  if (!sched.close_session(id, who.name)) throw session_lost(id, who);
  send_json(res, 200, {{"closed", true}});
}

}  // namespace tandem::server
