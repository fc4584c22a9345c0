// CloudLink: a worker thread that owns the CloudBackend (and so its connection), so that
// background syncs and consultations of one session run strictly one after another while the
// decoder keeps decoding. Also holds the retry policy: after a failure, the cloud is left alone
// for an exponentially growing, jittered pause.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "client/chained_backend.h"
#include "tandem/client.h"

namespace tandem {

class CloudLink {
 public:
  struct Options {
    double timeout_s = 10;
    double backoff_initial_s = 0.25;
    double backoff_max_s = 8;
  };
  CloudLink(std::unique_ptr<CloudBackend> backend, const Options& options);
  ~CloudLink();

  // Begins opening the session on the worker and returns at once, so that the caller can
  // prefill meanwhile. Everything queued later (syncs, consultations) goes out after it.
  void connect_in_background();
  // Opens the session -- or waits for the one connect_in_background() began -- and returns the
  // cloud's model. Throws the CloudError it failed with (each call, once it has failed).
  CloudModelInfo connect();
  // True once the session's opening has an outcome: connect() would return (or throw) at once.
  bool connect_settled() const;

  // Pushes the history in the background (latest wins; dropped while backing off).
  void sync(const std::vector<TokenId>& history);

  // The conversation starts over (the backend opens a fresh session before its next step).
  void new_conversation();

  // Runs a consultation and waits for it up to the timeout (the worker first finishes a sync in
  // flight). Returns nullopt on any failure, with the reason in *why; a late answer is dropped.
  // After a failure it returns nullopt at once until the pause is over, then sends a sync as a
  // probe in the background; consultations resume when a step succeeds again.
  std::optional<CloudStepResult> request(const std::vector<TokenId>& history, const CloudOp& op,
                                         std::string* why);

  // request() in two halves, so that the decoder can go on decoding while the cloud thinks:
  // begin() queues the consultation and returns its ticket (0, with *why, when it is refused at
  // once: disabled, backing off, recovering); wait() collects its answer, waiting at most until
  // the timeout counted from begin(). `guess` is the answer the decoder assumes while it waits.
  // A server that queues a session's steps lets several consultations be out at once, each
  // on its own connection (chained, client/chained_backend.h; can_begin_another() says when);
  // otherwise one at a time: a begin() replaces one that nobody waited for.
  uint64_t begin(const std::vector<TokenId>& history, const CloudOp& op, std::vector<TokenId> guess,
                 std::string* why);
  std::optional<CloudStepResult> wait(uint64_t ticket, std::string* why);
  // True when wait(ticket) would return at once (answered, failed, timed out or replaced).
  bool answered(uint64_t ticket) const;
  // The decoder no longer wants ticket's answer (it went back past its position). A chained
  // step that the server may still run for nobody is cancelled there in the background (one
  // cancel for the steps abandoned together), where the server can; its failure changes
  // nothing but the counts.
  void abandon(uint64_t ticket);
  // One more token of the guess of the consultation begun last (`ticket`), which the decoder
  // learned after begin(): the next step then builds on it too. Nothing once the answer is
  // settled (it was then taken as not guessed) or for a plain consultation.
  void extend_guess(uint64_t ticket, TokenId token);
  // True when another consultation may begin while the ones begun are still out.
  bool can_begin_another() const;

  // False while backing off after a failure or after a fatal error.
  bool ready() const;
  bool disabled() const;  // a fatal error: never again
  CloudCounters counters() const;
  int sync_steps() const;
  int sync_failures() const;
  int failures() const;
  int cancels() const;          // cancels asked for (sent, or about to be)
  int cancelled_steps() const;  // steps the server said the cancels stopped
  std::string last_error() const;

 private:
  struct Pending {
    uint64_t id = 0;
    std::vector<TokenId> history;
    CloudOp op;
  };
  // A step of the chain, from begin() (or sync()) until its ticket is collected.
  struct ChainJob {
    uint64_t ticket = 0;
    ChainedStep step;
    uint64_t epoch = 0;  // the chain it belongs to: stale once epoch_ moved on
    bool running = false, done = false, settled = false;
    std::optional<CloudStepResult> answer;  // done: the answer, or nullopt (refused or failed)
    std::optional<CloudError> error;        // done without answer and not refused: the failure
    bool valid = false;                     // settled: the answer stands
    bool failed = false;                    // settled: the step itself failed (not stale)
    std::chrono::steady_clock::time_point deadline{};
  };
  // A cancel the worker sends: the session's steps from from_pos on.
  struct Cancel {
    std::string session;
    size_t from_pos = 0;
  };
  void worker();
  void run_connect_locked(std::unique_lock<std::mutex>& lock);
  bool connecting_locked() const;
  void send_cancel_locked(std::unique_lock<std::mutex>& lock);
  void lane(int index);
  std::shared_ptr<ChainJob> next_unsent_locked() const;
  bool chaining_locked() const;
  void start_conversation_locked();
  uint64_t chain_locked(const std::vector<TokenId>& history, const CloudOp& op,
                        std::vector<TokenId> guess);
  void settle_locked();
  std::optional<CloudStepResult> collect_locked(std::unique_lock<std::mutex>& lock,
                                                const std::shared_ptr<ChainJob>& job,
                                                std::string* why);
  std::chrono::steady_clock::time_point deadline_from_now() const;
  uint64_t begin_plain_locked(const std::vector<TokenId>& history, const CloudOp& op);
  std::optional<CloudStepResult> timed_out_locked(std::string* why);
  std::optional<CloudStepResult> wait_plain_locked(std::unique_lock<std::mutex>& lock, uint64_t id,
                                                   std::string* why);
  void note_failure_locked(const CloudError& e);
  void note_success_locked();

  std::unique_ptr<CloudBackend> backend_;
  Options options_;
  mutable std::mutex mu_;
  std::condition_variable cv_work_, cv_done_;
  std::optional<std::vector<TokenId>> pending_sync_;
  std::optional<Pending> pending_request_;
  uint64_t next_id_ = 1;
  uint64_t done_id_ = 0;  // id of the request whose outcome is in result_/error_
  std::optional<CloudStepResult> result_;
  std::string error_;
  bool stop_ = false;
  bool pending_new_conversation_ = false;
  // Opening the session: not asked for, queued for the worker, being run, or settled (with
  // connect_info_ or connect_error_).
  enum class Connect { NotAsked, Queued, Running, Settled };
  Connect connect_ = Connect::NotAsked;
  std::optional<CloudModelInfo> connect_info_;
  std::optional<CloudError> connect_error_;
  bool busy_ = false;        // the worker is inside a backend call (a step, the connect)
  bool cancelling_ = false;  // the worker is inside a backend call (a cancel)
  std::deque<Cancel> cancels_out_;
  int cancels_ = 0, cancelled_steps_ = 0;
  uint64_t awaited_id_ = 0;  // the request begin() queued and wait() will collect, 0 for none
  std::chrono::steady_clock::time_point awaited_deadline_{};
  bool disabled_ = false;
  int consecutive_failures_ = 0, failures_ = 0, sync_steps_ = 0, sync_failures_ = 0;
  std::chrono::steady_clock::time_point retry_at_{};
  std::string last_error_;
  CloudCounters counters_;
  std::mt19937_64 jitter_{std::random_device{}()};
  // Chained steps: the backend's chaining side (null: none), the steps not yet settled in chain
  // order, the tickets the decoder may still collect, the chain's epoch, the lane threads.
  ChainedBackend* chained_ = nullptr;
  std::deque<std::shared_ptr<ChainJob>> chain_;
  std::optional<std::vector<TokenId>> deferred_sync_;  // the latest push, until the chain drains
  std::map<uint64_t, std::shared_ptr<ChainJob>> tickets_;
  uint64_t epoch_ = 0;
  std::condition_variable cv_lane_;
  std::vector<std::thread> lanes_;
  std::thread thread_;
};

}  // namespace tandem
