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

struct SchedulerOptions {
  int n_ctx = 4096;
  int max_sessions = 64;
  int stateless_slots = 8;
  int batch_tokens = 512;       // token budget of one decode batch
  int max_queue = 256;          // jobs waiting or running; more are refused (429)
  uint64_t kv_cap_bytes = 0;    // 0: as much as n_ctx × slots needs
  double idle_timeout_s = 600;  // sessions unused this long expire
  int n_threads = 0;
  KvCacheType type_k = KvCacheType::F32;  // --cache-type-k / -ctk
  KvCacheType type_v = KvCacheType::F32;  // --cache-type-v / -ctv
  // Prepended to session ids, so a proxy in front of several replicas can route a session's
  // steps to the replica that holds it by the id alone (docs/deploy.md).
  std::string session_prefix;
};

struct SessionInfo {
  std::string id;
  int pos = 0;
  double idle_s = 0;
  uint64_t kv_bytes = 0;
};

// Result of trying to start a step on a session.
enum class StepCheck { Ok, Lost, Busy, PositionMismatch, TooLong };

class Scheduler {
 public:
  Scheduler(const Model& model, const SchedulerOptions& options, Metrics& metrics);
  ~Scheduler();

  const Model& model() const { return model_; }
  const SchedulerOptions& options() const { return options_; }
  uint64_t kv_bytes_per_token() const { return kv_bytes_per_token_; }

  // ---- sessions (any thread) ----
  // Creates a session; nullopt when max_sessions are open and none is idle to evict.
  std::optional<std::string> create_session();
  // Closes a session; false when it was not open.
  bool close_session(const std::string& id);
  // Why a session is gone ("expired", "evicted", "closed", "unknown").
  std::string lost_reason(const std::string& id) const;
  std::vector<SessionInfo> list_sessions() const;
  size_t open_sessions() const;

  // Starts a step: cuts the history to `rewind_to` tokens when that is >= 0 (more than the
  // history holds is a PositionMismatch), checks the position, appends `append` to the history
  // and marks the session busy. On Ok, `pos` is the new length and `kv_len` how much of it is
  // cached; the caller then submits a job for the session (which must call finish_step through
  // its hooks).
  StepCheck begin_step(const std::string& id, int expected_pos, int rewind_to,
                       std::span<const TokenId> append, int extra_tokens, int* pos, int* kv_len,
                       std::vector<TokenId>* uncached);
  // Undoes begin_step when its job could not be queued: the history goes back to `length`.
  void abort_step(const std::string& id, int length);
  // Engine thread, from a session job's hooks: the history grew by `produced` tokens (generated
  // or accepted drafts + correction).
  void session_append(const std::string& id, std::span<const TokenId> produced);

  // ---- jobs (any thread) ----
  // Queues a job. False when the queue is full (429) or the scheduler is draining.
  bool submit(std::shared_ptr<Job> job);
  size_t queue_length() const;

  // Stops taking jobs and runs what is queued to the end, for at most `timeout_s` (negative: no
  // limit); what is still queued or running then ends with JobFailure::Draining. False when the
  // time ran out.
  bool drain(double timeout_s = -1);
  uint64_t kv_bytes_in_use() const;

 private:
  struct Session {
    std::string id;
    int slot = -1;
    std::vector<TokenId> history;
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
  bool make_room_locked(uint64_t need_tokens, const Session* keep);
  // Ends a step of `s` that will not run: the session takes its next step, and its history goes
  // back to `length` when that is a length it can go back to (-1: keeps what was appended).
  void end_unrun_step_locked(Session& s, int length);
  void evict_locked(Session& s, const char* reason);
  void forget_locked(const std::string& id, const char* reason);
  void expire_idle_locked();
  uint64_t kv_tokens_locked() const;
  void run_batch(std::vector<std::shared_ptr<Job>>& active);
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
  std::unordered_map<std::string, std::string> lost_;  // id -> reason, bounded
  std::deque<std::string> lost_order_;
  std::vector<int> free_session_slots_;
  std::vector<StatelessSlot> stateless_;
  std::vector<int> slot_len_;     // [n_slots] KV length per slot (engine thread writes, under mu_)
  std::vector<int> slot_target_;  // [n_slots] the most a running job may grow its slot to
  std::vector<int> slots_to_release_;  // freed slots whose cache the engine thread must drop
  Clock::time_point last_expiry_ = Clock::now();
  uint64_t next_id_ = 0;
  uint64_t id_salt_ = 0;
  std::thread engine_;
};

}  // namespace tandem::server
