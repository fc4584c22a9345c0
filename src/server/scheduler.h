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
// of it is in the KV cache, when they were last used. All session state is guarded by one mutex;
// the engine thread is the only one that touches the Context.
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

// Why a job could not run; the HTTP layer turns it into a status code.
enum class JobFailure { None, NoMemory, ContextFull, Internal, Cancelled, Draining };

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
  std::atomic<bool> cancelled{false};
  Clock::time_point enqueued = Clock::now();

  // Called on the engine thread for every fed token that wanted logits (index into feed, as it
  // was when the token ran). The span is valid only during the call.
  virtual void on_logits(size_t feed_index, std::span<const float> logits) = 0;
  // Called on the engine thread when the whole feed has run. Return true after replacing `feed`
  // (and resetting `fed` to 0) to continue, false when the job is done.
  virtual bool on_feed_done() = 0;
  // Called exactly once, on the engine thread, when the job ends (ok or not).
  virtual void on_finish(JobFailure failure, const std::string& message) = 0;
  // Called on the engine thread once the job has its slot (and, stateless, `cached`), before its
  // first batch: a stateless job builds its feed here.
  virtual void on_admit() {}
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

// Result of trying to start a step on a session.
enum class StepCheck { Ok, Lost, Busy, PositionMismatch, TooLong };

// Result of creating a session.
struct CreateResult {
  enum class Outcome { Ok, Draining, OverQuota, NoRoom } outcome = Outcome::Ok;
  std::string id;         // Ok: the new session's id
  int retry_after_s = 1;  // NoRoom: when an eviction may be allowed (a grace period ends)
};

// Why submit refused a job.
enum class SubmitRefusal { None, Draining, QueueFull, KeyQuota };

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

  // Starts a step: cuts the history to `rewind_to` tokens when that is >= 0 (more than the
  // history holds is a PositionMismatch), checks the position, appends `append` to the history
  // and marks the session busy. A step refused here (any check but Ok) leaves the session as it
  // was. On Ok, `pos` is the new length and `kv_len` how much of it is cached; the caller then
  // submits a job for the session (which must call finish_step through its hooks).
  StepCheck begin_step(const std::string& id, const std::string& owner, int expected_pos,
                       int rewind_to, std::span<const TokenId> append, int extra_tokens, int* pos,
                       int* kv_len, std::vector<TokenId>* uncached);
  // Undoes begin_step when its job could not be queued: the history goes back to `length`
  // (and to what a rewind cut off).
  void abort_step(const std::string& id, int length);
  // Engine thread, from a session job's hooks: the history grew by `produced` tokens (generated
  // or accepted drafts + correction).
  void session_append(const std::string& id, std::span<const TokenId> produced);

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
    bool busy = false;
    bool close_requested = false;
    Clock::time_point last_used = Clock::now();
  };
  struct StatelessSlot {
    int slot;
    std::vector<TokenId> cached;  // tokens in the slot's cache
    bool busy = false;
    Clock::time_point last_used = Clock::now();
  };

  void engine_loop();
  void admit_locked(std::vector<std::shared_ptr<Job>>& admitted);
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
  // Ends a step of `s` that will not run: the session takes its next step, and its history goes
  // back to `length` when that is a length it can go back to (-1: keeps what was appended).
  void end_unrun_step_locked(Session& s, int length);
  void evict_locked(Session& s, const char* reason);
  void forget_locked(const std::string& id, const char* reason);
  void expire_idle_locked();
  uint64_t kv_tokens_locked() const;
  void run_batch(std::vector<std::shared_ptr<Job>>& active);
  // run_batch's steps; a BatchPlan (scheduler.cpp) is the rows of one decode batch.
  struct BatchPlan;
  void finish_unfed_jobs(std::vector<std::shared_ptr<Job>>& active);
  BatchPlan plan_batch(const std::vector<std::shared_ptr<Job>>& active);
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
