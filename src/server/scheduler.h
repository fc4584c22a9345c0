// The cloud's scheduler: one model, one engine Context with a sequence slot per session (plus a
// few for stateless requests), and one engine thread that merges every pending job's tokens into
// shared decode batches (continuous batching).
//
// A Job is a unit of model work on one slot: a list of tokens to feed (some of which want their
// logits back) and hooks that see those logits and may queue more tokens (one per generated
// token). Each iteration the engine thread takes, under a token budget, one row from every job
// that is generating (so decodes are never starved by a long prefill), then prefill chunks of
// the other jobs in arrival order, runs one Context::decode, and hands every job its rows.
//
// Sessions (the native protocol's stateful conversations) live here too: their history, how much
// of it is in the KV cache, when they were last used, the step that holds the session and the
// steps queued behind it (waiting_: they take a place in the queue but join pending_ only when
// their turn comes). All session state is guarded by one mutex; the engine thread is the only
// one that touches the Context.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/history_hash.h"
#include "tandem/engine.h"
#include "tandem/server.h"  // SchedulerOptions

namespace tandem::server {

class Metrics;

using Clock = std::chrono::steady_clock;

// One token a job feeds into its slot.
struct FeedToken {
  TokenId id = 0;
  bool want_logits = false;
};

// Why a job could not run; the HTTP layer turns it into a status code. Refused: a session step
// that waited behind another step failed its checks when its turn came (Job::refusal says why).
enum class JobFailure { None, NoMemory, ContextFull, Internal, Cancelled, Draining, Refused };

// Result of checking a step against its session.
enum class StepCheck { Ok, Lost, Busy, PositionMismatch, HistoryMismatch, TooLong };

// What a session step asks of the history. The scheduler checks it when the step starts: at
// once, or, for a step queued behind others of its session, when they have ended.
struct StepStart {
  int expected_pos = 0;
  int rewind_to = -1;  // cut the history to this length first (-1: no cut)
  // HistoryHash of history[0, expected_pos), after the cut (nullopt: not checked)
  std::optional<uint64_t> expected_hash;
  std::vector<TokenId> append;
  int extra_tokens = 0;  // what the step adds beyond `append` (generated tokens, drafts + 1)
};

// Where a started step stands, handed to its job's on_begin.
struct StepBegun {
  int pos = 0;                    // the history's length after the append
  int kv_len = 0;                 // how much of it is in the slot's cache
  std::vector<TokenId> uncached;  // history[kv_len, pos): what the step must feed
};

// Why a step did not start, and the position the client is told.
struct StepRefusal {
  StepCheck check = StepCheck::Ok;
  int pos = 0;
  std::string lost_reason;  // Lost: "expired", "evicted", "closed" or "unknown"
};

class Job {
 public:
  virtual ~Job() = default;

  // Session jobs run on their session's slot; stateless jobs get a free stateless slot (with the
  // longest cached common prefix of `prefix_tokens`) at admission.
  std::string session_id;           // empty: stateless
  std::vector<TokenId> prefix_key;  // stateless: the whole token sequence the job will feed
  size_t max_reuse = SIZE_MAX;      // stateless: at most this many cached tokens may be reused
  int reserve_tokens = 0;           // KV positions the job may add beyond its feed (generation)
  // Session jobs: the history's length before this step appended to it; a step refused before
  // it runs (no KV room) gives the history back to it, so that the same request can be retried.
  int history_before = -1;
  // Session jobs: what the step asks of the history (start_step checks it when the step starts).
  StepStart step;
  // Session jobs, filled by the scheduler before on_finish: the history's length once the step
  // ended (what a cancelled step's answer reports), and with JobFailure::Refused why the step
  // did not start.
  int history_after = -1;
  StepRefusal refusal;
  // The credential that queued the job: its jobs queued or running count against
  // --max-queue-per-key. Empty: counted in the total only.
  std::string owner;
  // Filled by the scheduler: the job's place in its owner's count, given back when the job ends.
  std::shared_ptr<void> owner_ticket;
  // Filled by the scheduler with a NoMemory failure: > 0 when room may appear by then (other
  // clients' idle sessions pass their eviction grace), so the answer is 429 with Retry-After
  // rather than 503.
  int retry_after_s = 0;

  // Filled by the scheduler.
  int slot = -1;
  int cached = 0;  // stateless: tokens of prefix_key already in the slot's cache

  std::vector<FeedToken> feed;  // tokens still to run, in order
  size_t fed = 0;               // feed[0, fed) already ran
  // Set by cancel_steps: the device abandoned the history this step builds on. Unlike a hang-up,
  // the step is answered (409 cancelled) and what it added to the history stays there.
  std::atomic<bool> cancelled{false};
  Clock::time_point enqueued = Clock::now();

  // Called on the engine thread for every fed token that wanted logits (index into feed, as it
  // was when the token ran). The span is valid only during the call.
  virtual void on_logits(size_t feed_index, std::span<const float> logits) = 0;
  // Called on the engine thread when the whole feed has run. Return true after replacing `feed`
  // (and resetting `fed` to 0) to continue, false when the job is done.
  virtual bool on_feed_done() = 0;
  // Called exactly once when the job ends (ok or not), and must not call the scheduler (it may
  // run under its lock): on the engine thread, or, for a session step that waited and never
  // started (cancelled, or refused by its checks), on the thread that ended it.
  virtual void on_finish(JobFailure failure, const std::string& message) = 0;
  // Called on the engine thread once the job has its slot (and, stateless, `cached`), before its
  // first batch: a stateless job builds its feed here.
  virtual void on_admit() {}
  // Session steps: called under the scheduler's lock when the step passes its checks and takes
  // the session, before it is queued; the job builds its feed here. Must not call the scheduler.
  virtual void on_begin(const StepBegun& begun) { (void)begun; }
  // Sessions: the slot's new KV length to keep when the job is done (verify drops rejected
  // drafts). -1 keeps everything.
  int keep_after = -1;

  // True once nobody waits for the answer (the client hung up). Read by the engine thread
  // before every batch, so it must be cheap and thread-safe.
  virtual bool abandoned() const { return false; }
  // The job is to be dropped, queued or running (JobFailure::Cancelled).
  bool dropped() const { return cancelled || abandoned(); }
};

struct SessionInfo {
  std::string id;
  std::string owner;
  int pos = 0;
  double idle_s = 0;
  uint64_t kv_bytes = 0;
};

// Result of creating a session.
struct CreateResult {
  enum class Outcome { Ok, Draining, OverQuota, NoRoom } outcome = Outcome::Ok;
  std::string id;         // Ok: the new session's id
  int retry_after_s = 1;  // NoRoom: when an eviction may be allowed (a grace period ends)
};

// Why submit refused a job.
enum class SubmitRefusal { None, Draining, QueueFull, KeyQuota };

// Seconds since `last_used` (a session's idle time).
inline double idle_seconds(Clock::time_point last_used, Clock::time_point now) {
  return std::chrono::duration<double>(now - last_used).count();
}

class Scheduler {
 public:
  Scheduler(const Model& model, const SchedulerOptions& options, Metrics& metrics);
  ~Scheduler();

  const Model& model() const { return model_; }
  const SchedulerOptions& options() const { return options_; }
  uint64_t kv_bytes_per_token() const { return kv_bytes_per_token_; }

  // ---- sessions (any thread) ----
  // Sessions belong to the credential (`owner`) that created them: to any other, a session id
  // is unknown -- every call below answers for it exactly as for an id never issued.
  //
  // Creates a session for `owner`. With no free slot it evicts the owner's own least recently
  // used idle session, else another owner's idle for at least evict_grace_s, else NoRoom.
  CreateResult create_session(const std::string& owner);
  // Closes a session; false when `owner` has no such session open.
  bool close_session(const std::string& id, const std::string& owner);
  // Why a session of `owner` is gone ("expired", "evicted", "closed", "unknown").
  std::string lost_reason(const std::string& id, const std::string& owner) const;
  std::vector<SessionInfo> list_sessions() const;
  size_t open_sessions() const;

  // Starts the session step `job` (session_id, owner and step set) and queues it. Starting
  // cuts the history to step.rewind_to when that is >= 0 (more than the history holds is a
  // PositionMismatch), checks the position and n_ctx, appends step.append to the history (after
  // keeping the cut tokens that step.append repeats, with their KV) and marks the session busy;
  // the job's on_begin then builds its feed. While another step of the session is running, the
  // step is refused as Busy, or with `may_wait` queued behind it (at most max_queued_steps per
  // session; each holds a place in the queue and in its owner's quota) and started when the
  // steps before it have ended, with every check made then; one that fails them then ends with
  // JobFailure::Refused. False when refused now: `refusal` says why, or `why` when the queue
  // or the owner's quota is full or the server drains. A refused step leaves the session as it
  // was.
  bool start_step(const std::shared_ptr<Job>& job, bool may_wait, StepRefusal* refusal,
                  SubmitRefusal* why);
  // Cancels the steps of `owner`'s session `id` that build on a history position >= from_pos
  // (step.expected_pos + len(step.append) > from_pos, unless its rewind_to cuts the history to
  // from_pos or before, replacing what was abandoned): a waiting one ends at once, the running
  // one at its next token boundary, both with JobFailure::Cancelled. Never waits for the
  // running step. False when `owner` has no such session; else `*count` steps were cancelled
  // and `*pos` is the history's length.
  bool cancel_steps(const std::string& id, const std::string& owner, int from_pos, int* count,
                    int* pos);
  // Engine thread, from a session job's hooks: the history grew by `produced` tokens (generated
  // or accepted drafts + correction). False, and nothing added, once the job is cancelled: the
  // length cancel_steps reported stays the step's last.
  bool session_append(const Job& job, std::span<const TokenId> produced);

  // ---- jobs (any thread) ----
  // Queues a job. False when the queue is full, the job's owner has max_queue_per_key jobs
  // queued or running (429 both), or the scheduler is draining; `why` says which.
  bool submit(std::shared_ptr<Job> job, SubmitRefusal* why = nullptr);
  size_t queue_length() const;

  // Stops taking jobs and runs what is queued to the end, for at most `timeout_s` (negative: no
  // limit); what is still queued or running then ends with JobFailure::Draining. False when the
  // time ran out.
  bool drain(double timeout_s = -1);
  uint64_t kv_bytes_in_use() const;

 private:
  struct Session {
    std::string id;
    std::string owner;  // the credential that created it
    int slot = -1;
    std::vector<TokenId> history;
    // What the running step's rewind cut off the history; a step that never runs puts it back.
    std::vector<TokenId> cut_tail;
    int kv_len = 0;  // history[0, kv_len) is in the slot's cache
    // prefix_hashes[i] = HistoryHash of history[0, i), for i <= prefix_hashes.size() - 1 (never
    // empty: [0] is the empty history's). Filled up lazily by prefix_hash and cut with the
    // history (cut_history), so an expected_hash check at any position costs only the tokens
    // added since the last check, never a rehash from 0 under the lock. 8 bytes a token.
    std::vector<uint64_t> prefix_hashes{HistoryHash::kOffset};
    bool busy = false;
    std::shared_ptr<Job> running;  // the step that holds the session (busy), queued or running
    int waiting = 0;               // its steps in waiting_
    bool close_requested = false;
    Clock::time_point last_used = Clock::now();
  };
  struct StatelessSlot {
    int slot;
    std::vector<TokenId> cached;  // tokens in the slot's cache
    bool busy = false;
    Clock::time_point last_used = Clock::now();
    std::string owner = {};  // the key of its job while busy (fair admission)
  };

  void engine_loop();
  void admit_locked(std::vector<std::shared_ptr<Job>>& admitted);
  // One queued job: it gets its slot and KV room (Admitted), is answered and leaves the queue
  // (Ended: client gone, session lost, no room), or stays queued (Wait: stateless slots busy).
  enum class Admission { Admitted, Ended, Wait };
  Admission admit_one_locked(Job& job, uint64_t cap_tokens);
  void admit_stateless_locked(std::vector<std::shared_ptr<Job>>& active, uint64_t cap_tokens);
  // The key whose job took a stateless slot last (fair_share.h least_served's turn).
  std::string stateless_last_key_;
  bool stateless_served_ = false;
  void admit_at_locked(size_t& i, Admission admission, std::vector<std::shared_ptr<Job>>& active);
  // admit_locked's steps for one queued job. A session's step gets KV room in its own slot
  // (false: no room; its history is already put back). A stateless request gets the free slot
  // whose cache shares the longest prefix with its tokens, and KV room there.
  bool reserve_session_room_locked(Job& job, Session& s, uint64_t cap_tokens);
  enum class StatelessPick { Reserved, AllBusy, NoRoom };
  StatelessPick reserve_stateless_slot_locked(Job& job, uint64_t cap_tokens);
  // Frees KV room for `requester`'s job; on false, `*retry_after_s` (at least 1) says when an
  // eviction may be allowed.
  bool make_room_locked(uint64_t need_tokens, const Session* keep, const std::string& requester,
                        int* retry_after_s);
  // The session to evict for `requester`: its own least recently used idle session, else the
  // least recently used idle session of another owner idle for at least evict_grace_s. `keep`
  // and busy sessions never qualify; with `holding_kv`, only sessions with cached tokens do.
  Session* eviction_victim_locked(const std::string& requester, const Session* keep,
                                  bool holding_kv);
  // Seconds until some other owner's idle session passes the grace period (at least 1), or 0
  // when none is idle.
  int seconds_until_evictable_locked(const Session* keep, bool holding_kv) const;
  // start_step's parts. check_step_locked makes a step's checks on the session as it is;
  // run_step_locked, for a step that passed them, changes the history, hands the job its
  // StepBegun and queues it. take_queue_place_locked holds a place for the job in the queue
  // and its owner's quota, or says why not.
  StepRefusal check_step_locked(Session& s, const StepStart& step);
  // HistoryHash of s.history[0, n); cut_history shortens the history (and drops the prefix
  // hashes past it).
  static uint64_t prefix_hash(Session& s, int n);
  static void cut_history(Session& s, int n);
  void run_step_locked(Session& s, const std::shared_ptr<Job>& job);
  bool take_queue_place_locked(Job& job, SubmitRefusal* why);
  size_t queued_locked() const { return pending_.size() + active_count_ + waiting_.size(); }
  // Ends a step of `s` that will not run: the session takes its next step, and its history goes
  // back to `length` when that is a length it can go back to (-1: keeps what was appended).
  // `s` may be gone after it, as after step_ended_locked.
  void end_unrun_step_locked(Session& s, int length);
  // The session's step has ended: the first of its waiting steps that passes its checks takes
  // the session and joins pending_; the others end (Refused, or Cancelled when their client
  // left). With none, the session is idle. A session whose close waited for the step is
  // forgotten instead (`s` is then gone) and its waiting steps are answered as lost.
  void step_ended_locked(Session& s);
  std::shared_ptr<Job> pop_waiting_locked(Session& s);
  // Waiting steps whose client hung up end as cancelled (each engine iteration).
  void drop_abandoned_waiting_locked();
  // Answers given under the lock wait in deferred_ and are given by answer_deferred, after it.
  void defer_answer_locked(std::shared_ptr<Job> job, JobFailure failure, std::string message);
  void answer_deferred();
  void evict_locked(Session& s, const char* reason);
  void forget_locked(std::string id, const char* reason);
  void expire_idle_locked();
  uint64_t kv_tokens_locked() const;
  void run_batch(std::vector<std::shared_ptr<Job>>& active);
  // run_batch's steps; a BatchPlan (scheduler.cpp) is the rows of one decode batch.
  struct BatchPlan;
  void finish_unfed_jobs(std::vector<std::shared_ptr<Job>>& active);
  BatchPlan plan_batch(const std::vector<std::shared_ptr<Job>>& active);
  std::vector<size_t> prefill_order(const std::vector<std::shared_ptr<Job>>& active);
  // The key whose prefilling jobs went first in the last batch with prefill (engine thread):
  // the next batch starts with the key after it by name (fair_share.h turn_order).
  std::string prefill_first_;
  bool prefill_turned_ = false;
  bool decode_or_fail(std::vector<std::shared_ptr<Job>>& active, const BatchPlan& plan);
  void note_cached_tokens(const std::vector<std::shared_ptr<Job>>& active, const BatchPlan& plan);
  void deliver_batch(std::vector<std::shared_ptr<Job>>& active, const BatchPlan& plan);
  // What the prompt work (prefill) of one batch may cost. A prompt row that wants logits costs
  // a vocabulary-sized logits row (1 MiB for Gemma), an LM-head row and a log-softmax on the
  // engine thread: on Gemma 3 270M about as much as kLogitRowCost rows without. Prefill takes at
  // most kMaxPrefillLogitRows such rows per batch (a prompt asking for its log-probabilities
  // would otherwise size the logits buffer to the whole batch: 512 MiB at -b 512), and while
  // other jobs run, are queued or just ended, at most --prefill-chunk cost units, so that one
  // long prompt cannot make every device's next token wait for a whole --batch-size of prompt
  // (chunked prefill).
  static constexpr size_t kMaxPrefillLogitRows = 32;
  static constexpr size_t kLogitRowCost = 8;
  bool others_waiting(size_t active_jobs) const;
  Clock::time_point last_job_end_;  // engine thread
  struct PrefillBudget {
    size_t cost_cap = SIZE_MAX;  // --prefill-chunk while others wait
    size_t cost = 0;
    size_t logit_rows = 0;
    // How many of the next `take` feed tokens of a prefilling job fit; counts them.
    size_t fit(const Job& job, size_t take);
  };
  void finish_job(const std::shared_ptr<Job>& job, JobFailure failure, const std::string& msg);
  void end_session_job_locked(Session& s, Job& job, JobFailure failure);
  void release_slot(int slot);
  void fail_all_for_shutdown(std::vector<std::shared_ptr<Job>>& active);

  const Model& model_;
  SchedulerOptions options_;
  Metrics& metrics_;
  uint64_t kv_bytes_per_token_ = 0;
  std::unique_ptr<Context> ctx_;

  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable drained_;
  std::deque<std::shared_ptr<Job>> pending_;
  // Session steps queued behind a running step of their session, in arrival order.
  std::deque<std::shared_ptr<Job>> waiting_;
  struct DeferredAnswer {
    std::shared_ptr<Job> job;
    JobFailure failure;
    std::string message;
  };
  std::vector<DeferredAnswer> deferred_;
  size_t active_count_ = 0;
  bool draining_ = false;
  bool drain_expired_ = false;  // --drain-timeout passed: every job ends with Draining
  bool stop_ = false;
  std::unordered_map<std::string, Session> sessions_;
  struct Lost {
    std::string reason;
    std::string owner;  // only its owner learns why; to anyone else the id is unknown
  };
  std::unordered_map<std::string, Lost> lost_;  // bounded (kLostMemory)
  std::deque<std::string> lost_order_;
  std::vector<int> free_session_slots_;
  std::vector<StatelessSlot> stateless_;
  std::vector<int> slot_len_;     // [n_slots] KV length per slot (engine thread writes, under mu_)
  std::vector<int> slot_target_;  // [n_slots] the most a running job may grow its slot to
  std::vector<int> slots_to_release_;  // freed slots whose cache the engine thread must drop
  Clock::time_point last_expiry_ = Clock::now();
  // Jobs queued or running per owner (entries are never erased: owners are credential names).
  std::unordered_map<std::string, std::shared_ptr<std::atomic<int>>> jobs_per_owner_;
  std::thread engine_;
};

}  // namespace tandem::server
