#include "client/cloud_link.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace tandem {

using Clock = std::chrono::steady_clock;

CloudLink::CloudLink(std::unique_ptr<CloudBackend> backend, const Options& options)
    : backend_(std::move(backend)), options_(options) {
  chained_ = dynamic_cast<ChainedBackend*>(backend_.get());
  thread_ = std::thread([this] { worker(); });
}

CloudLink::~CloudLink() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    pending_sync_.reset();
    pending_request_.reset();
    cancels_out_.clear();
    // A step in flight would hold the join for up to the timeout: cut it (the session is then
    // left to expire on the server). An idle worker closes the session on its way out.
    const bool chain_running =
        std::any_of(chain_.begin(), chain_.end(), [](const auto& job) { return job->running; });
    if (busy_ || cancelling_ || chain_running) backend_->abort();
  }
  cv_work_.notify_all();
  cv_lane_.notify_all();
  cv_done_.notify_all();
  for (std::thread& t : lanes_) t.join();
  if (thread_.joinable()) thread_.join();
}

void CloudLink::connect_in_background() {
  {
    std::lock_guard lock(mu_);
    if (connect_ != Connect::NotAsked) return;
    connect_ = Connect::Queued;
  }
  cv_work_.notify_one();
}

CloudModelInfo CloudLink::connect() {
  connect_in_background();
  std::unique_lock lock(mu_);
  cv_done_.wait(lock, [&] { return connect_ == Connect::Settled || stop_; });
  if (connect_error_) throw *connect_error_;
  if (!connect_info_) {
    throw CloudError(CloudError::Kind::Unavailable, "the link closed before the session opened");
  }
  return *connect_info_;
}

bool CloudLink::connect_settled() const {
  std::lock_guard lock(mu_);
  return connect_ == Connect::Settled;
}

// The backend learns what the server can do (chaining, lanes) while it connects.
bool CloudLink::connecting_locked() const {
  return connect_ == Connect::Queued || connect_ == Connect::Running;
}

// On the worker, before any step: the steps queued meanwhile need the session (a plain step
// opens one itself, but the decoder waits for the cloud's limits before its first consultation).
void CloudLink::run_connect_locked(std::unique_lock<std::mutex>& lock) {
  connect_ = Connect::Running;
  busy_ = true;
  lock.unlock();
  std::optional<CloudModelInfo> info;
  std::optional<CloudError> error;
  try {
    info = backend_->connect();
  } catch (const CloudError& e) {
    error = e;
  } catch (const std::exception& e) {
    // Backends throw only CloudError; should anything else slip through, it is still a cloud
    // that failed (the caller falls back), never an error of the caller's own.
    error = CloudError(CloudError::Kind::Unavailable, e.what());
  }
  lock.lock();
  busy_ = false;
  counters_ = backend_->counters();
  if (error) {
    note_failure_locked(*error);
    // What was queued behind the opening fails with it, as it would have been refused had it
    // come after: a sync is dropped, a consultation answered with the reason.
    pending_sync_.reset();
    if (pending_request_) {
      done_id_ = pending_request_->id;
      pending_request_.reset();
      result_.reset();
      error_ = error->what();
    }
  } else {
    note_success_locked();
  }
  connect_info_ = std::move(info);
  connect_error_ = std::move(error);
  connect_ = Connect::Settled;
  // A push queued meanwhile joins the chain when the server has one, so that the consultations
  // after it need not wait for it as a plain step.
  if (pending_sync_ && chaining_locked()) {
    chain_locked(*pending_sync_, CloudOp{}, {});
    pending_sync_.reset();
  }
  cv_done_.notify_all();
}

void CloudLink::note_failure_locked(const CloudError& e) {
  ++failures_;
  last_error_ = e.what();
  if (e.kind() == CloudError::Kind::Fatal) {
    disabled_ = true;
    return;
  }
  ++consecutive_failures_;
  const double base =
      std::min(options_.backoff_max_s,
               options_.backoff_initial_s * std::pow(2.0, std::min(consecutive_failures_ - 1, 30)));
  std::uniform_real_distribution<double> jitter(0.5, 1.5);
  // CloudError keeps retry_after_s within [0, 60]: the pause is always a finite, short time.
  const double pause = std::max(base * jitter(jitter_), e.retry_after_s());
  retry_at_ = Clock::now() + std::chrono::microseconds(static_cast<int64_t>(pause * 1e6));
}

void CloudLink::note_success_locked() {
  consecutive_failures_ = 0;
  retry_at_ = {};
}

bool CloudLink::ready() const {
  std::lock_guard lock(mu_);
  return !disabled_ && Clock::now() >= retry_at_;
}

bool CloudLink::disabled() const {
  std::lock_guard lock(mu_);
  return disabled_;
}

void CloudLink::new_conversation() {
  std::lock_guard lock(mu_);
  pending_new_conversation_ = true;
  pending_sync_.reset();
  deferred_sync_.reset();
}

void CloudLink::sync(const std::vector<TokenId>& history) {
  {
    std::lock_guard lock(mu_);
    if (disabled_ || Clock::now() < retry_at_) return;
    // A consultation queued or unanswered carries the history anyway (and a pipelined decoder's
    // history past it is not settled yet).
    if (pending_request_ || awaited_id_ != 0 || !tickets_.empty()) return;
    start_conversation_locked();
    if (chaining_locked()) {
      // One push at a time: the latest waits for the chain to drain (a consultation carries it).
      if (!chain_.empty()) {
        deferred_sync_ = history;
      } else if (consecutive_failures_ == 0) {
        chain_locked(history, CloudOp{}, {});
      }
      return;
    }
    pending_sync_ = history;
  }
  cv_work_.notify_one();
}

std::optional<CloudStepResult> CloudLink::request(const std::vector<TokenId>& history,
                                                  const CloudOp& op, std::string* why) {
  const uint64_t ticket = begin(history, op, {}, why);
  if (ticket == 0) return std::nullopt;
  return wait(ticket, why);
}

Clock::time_point CloudLink::deadline_from_now() const {
  // A little over one timeout, so that the HTTP layer reports its own error first.
  return Clock::now() +
         std::chrono::microseconds(static_cast<long>(options_.timeout_s * 1.05e6 + 50e3));
}

// Chaining needs a backend and a server that can (a session is open, the server queues a
// session's steps), no plain step running or waiting (they need the backend to themselves) and
// a free lane.
bool CloudLink::chaining_locked() const {
  if (!chained_ || busy_ || connecting_locked() || pending_request_ || awaited_id_ != 0 ||
      pending_new_conversation_) {
    return false;
  }
  const int lanes = chained_->chain_lanes();
  return lanes > 0 && chain_.size() < static_cast<size_t>(lanes);
}

// A new conversation on a backend that chains (so its server cuts a session back instead of
// opening another): nothing to send, so it need not wait for the worker, nor for the steps of
// the last conversation still out (stale from now on: the next step cuts them away).
void CloudLink::start_conversation_locked() {
  if (!pending_new_conversation_ || !chained_ || busy_ || connecting_locked() ||
      chained_->chain_lanes() == 0) {
    return;
  }
  backend_->new_conversation();
  pending_new_conversation_ = false;
  if (!chain_.empty()) ++epoch_;
}

bool CloudLink::can_begin_another() const {
  std::lock_guard lock(mu_);
  return !disabled_ && Clock::now() >= retry_at_ && consecutive_failures_ == 0 && chaining_locked();
}

uint64_t CloudLink::chain_locked(const std::vector<TokenId>& history, const CloudOp& op,
                                 std::vector<TokenId> guess) {
  const size_t lanes = static_cast<size_t>(chained_->chain_lanes());
  while (lanes_.size() < lanes) {
    const int index = static_cast<int>(lanes_.size());
    lanes_.emplace_back([this, index] { lane(index); });
  }
  auto job = std::make_shared<ChainJob>();
  job->step = chained_->chain(history, op, std::move(guess));
  job->epoch = epoch_;
  job->deadline = deadline_from_now();
  if (op.kind != CloudOpKind::Sync) {
    job->ticket = next_id_++;
    tickets_[job->ticket] = job;
  }
  chain_.push_back(job);
  cv_lane_.notify_one();
  return job->ticket;
}

std::shared_ptr<CloudLink::ChainJob> CloudLink::next_unsent_locked() const {
  for (const auto& job : chain_) {
    if (!job->running) return job;
  }
  return nullptr;
}

// A lane: sends the chain's steps, the earliest unsent first, on its own connection. A step
// already stale (built on a guess that did not hold, or abandoned) is not sent: it settles as
// one the server refused.
void CloudLink::lane(int index) {
  std::unique_lock lock(mu_);
  for (;;) {
    std::shared_ptr<ChainJob> job;
    cv_lane_.wait(lock, [&] { return stop_ || (job = next_unsent_locked()) != nullptr; });
    if (stop_) return;
    job->running = true;
    std::optional<CloudStepResult> answer;
    std::optional<CloudError> error;
    if (job->epoch == epoch_) {
      lock.unlock();
      try {
        answer = chained_->run_chained(index, job->step);
      } catch (const CloudError& e) {
        error = e;
      }
      lock.lock();
    }
    job->done = true;
    job->answer = std::move(answer);
    job->error = std::move(error);
    settle_locked();
    cv_done_.notify_all();
    cv_work_.notify_all();  // the worker may be waiting for the chain to drain
  }
}

// Settles the finished steps at the chain's head, in order. A step answered otherwise than
// guessed, failed or refused ends its epoch: every later step is stale (built on a guess that
// did not hold), whatever it gets back.
void CloudLink::settle_locked() {
  while (!chain_.empty() && chain_.front()->done) {
    const std::shared_ptr<ChainJob> job = chain_.front();
    chain_.pop_front();
    const bool stale = job->epoch != epoch_;
    const bool push = job->ticket == 0;
    if (!stale && job->answer) {
      chained_->settle(job->step, &*job->answer);
      job->valid = true;
      if (job->answer->tokens != job->step.guess) ++epoch_;
      note_success_locked();
      if (push) ++sync_steps_;
    } else {
      chained_->settle(job->step, nullptr);
      if (!stale) ++epoch_;
      if (!stale && job->error) {
        job->failed = true;
        note_failure_locked(*job->error);
        if (push) ++sync_failures_;
      }
    }
    job->settled = true;
  }
  if (chain_.empty() && deferred_sync_) {
    std::vector<TokenId> history = std::move(*deferred_sync_);
    deferred_sync_.reset();
    if (tickets_.empty() && consecutive_failures_ == 0 && chaining_locked()) {
      chain_locked(history, CloudOp{}, {});
    }
  }
  counters_ = backend_->counters();
}

uint64_t CloudLink::begin(const std::vector<TokenId>& history, const CloudOp& op,
                          std::vector<TokenId> guess, std::string* why) {
  std::lock_guard lock(mu_);
  if (disabled_) {
    if (why) *why = "cloud disabled: " + last_error_;
    return 0;
  }
  if (Clock::now() < retry_at_) {
    if (why) *why = "backing off after: " + last_error_;
    return 0;
  }
  if (consecutive_failures_ > 0) {
    // The cloud failed last time: find out in the background (a sync, which also warms its KV)
    // instead of making the decoder wait a whole timeout on a cloud that may still be gone.
    if (!pending_sync_ && !busy_) {
      pending_sync_ = history;
      cv_work_.notify_one();
    }
    if (why) *why = "cloud recovering, probing in the background after: " + last_error_;
    return 0;
  }
  pending_sync_.reset();  // the request carries the history: a queued push is redundant
  deferred_sync_.reset();
  start_conversation_locked();
  if (chaining_locked()) return chain_locked(history, op, std::move(guess));
  return begin_plain_locked(history, op);
}

uint64_t CloudLink::begin_plain_locked(const std::vector<TokenId>& history, const CloudOp& op) {
  const uint64_t id = next_id_++;
  pending_request_ = Pending{id, history, op};
  awaited_id_ = id;
  // The worker may first finish a sync in flight (or let the chain drain); the HTTP timeout
  // bounds that, this bounds the wait.
  awaited_deadline_ = deadline_from_now();
  cv_work_.notify_one();
  return id;
}

std::optional<CloudStepResult> CloudLink::wait(uint64_t id, std::string* why) {
  std::unique_lock lock(mu_);
  if (const auto it = tickets_.find(id); it != tickets_.end()) {
    const std::shared_ptr<ChainJob> job = it->second;
    return collect_locked(lock, job, why);
  }
  return wait_plain_locked(lock, id, why);
}

// A chained consultation's outcome: its answer; a failure; or, when the server refused it as
// out of order or an earlier step's failure made it stale, the same consultation again as a
// plain step once the chain has drained.
std::optional<CloudStepResult> CloudLink::collect_locked(std::unique_lock<std::mutex>& lock,
                                                         const std::shared_ptr<ChainJob>& job,
                                                         std::string* why) {
  cv_done_.wait_until(lock, job->deadline, [&] { return job->settled || stop_; });
  tickets_.erase(job->ticket);
  if (!job->settled) {
    ++epoch_;  // its answer, when it comes, no longer counts; nor does any later step's
    return timed_out_locked(why);
  }
  if (job->valid) return std::move(job->answer);
  // A failure with time left (a connection cut by a restarting server) gets one plain try too,
  // within the same deadline: the plain path reconnects and replays a lost session.
  if (stop_ || disabled_ || (job->failed && Clock::now() >= job->deadline)) {
    if (why) *why = job->error ? job->error->what() : "the cloud link is closing";
    return std::nullopt;
  }
  const uint64_t again = begin_plain_locked(job->step.history, job->step.op);
  awaited_deadline_ = job->deadline;
  return wait_plain_locked(lock, again, why);
}

// A consultation that ran past its deadline: a failure (the link backs off), told in *why.
std::optional<CloudStepResult> CloudLink::timed_out_locked(std::string* why) {
  const CloudError e(CloudError::Kind::Unavailable, "the cloud did not answer within " +
                                                        std::to_string(options_.timeout_s) + " s");
  note_failure_locked(e);
  if (why) *why = e.what();
  return std::nullopt;
}

void CloudLink::extend_guess(uint64_t id, TokenId token) {
  std::lock_guard lock(mu_);
  const auto it = tickets_.find(id);
  // A job on the chain is not settled yet; only the last one's guess may grow.
  if (it == tickets_.end() || chain_.empty() || chain_.back() != it->second) return;
  chained_->extend_guess(it->second->step, token);
}

void CloudLink::abandon(uint64_t id) {
  std::lock_guard lock(mu_);
  const auto it = tickets_.find(id);
  if (it == tickets_.end()) return;
  const std::shared_ptr<ChainJob> job = it->second;
  tickets_.erase(it);
  // Only a step the chain still counts on runs on the server for nobody: a stale one (an
  // earlier answer was not the guess) fails its history check there at no cost. The later
  // steps abandoned with this one build on it, so this one's cancel covers them.
  if (stop_ || job->done || job->epoch != epoch_ || job->step.history.empty()) return;
  // The server cancels the steps whose history reaches past from_pos; a verify that appends
  // nothing ends where its history does, so from_pos is the last position of that history.
  const size_t from_pos = job->step.history.size() - 1;
  if (!chained_->abandon_from(from_pos)) return;
  ++epoch_;  // the steps out are void: not sent if they have not gone yet
  cancels_out_.push_back({job->step.session, from_pos});
  ++cancels_;
  cv_work_.notify_one();
  cv_lane_.notify_all();
}

// The worker sends a cancel on the plain connection, so that no lane is held up by it. It
// decides nothing: the chain already fell back to the cut the next step makes, so a cancel that
// fails (an error, 404, a cut connection) only leaves the stale steps to run, as without it.
void CloudLink::send_cancel_locked(std::unique_lock<std::mutex>& lock) {
  const Cancel c = std::move(cancels_out_.front());
  cancels_out_.pop_front();
  cancelling_ = true;
  lock.unlock();
  int stopped = 0;
  try {
    stopped = chained_->cancel(c.session, c.from_pos);
  } catch (const std::exception&) {
  }
  lock.lock();
  cancelling_ = false;
  cancelled_steps_ += stopped;
}

std::optional<CloudStepResult> CloudLink::wait_plain_locked(std::unique_lock<std::mutex>& lock,
                                                            uint64_t id, std::string* why) {
  const bool done = id == awaited_id_ && cv_done_.wait_until(lock, awaited_deadline_, [&] {
    return done_id_ >= id || stop_;
  });
  if (id == awaited_id_) awaited_id_ = 0;
  if (!done || done_id_ != id) {
    if (pending_request_ && pending_request_->id == id) pending_request_.reset();
    return timed_out_locked(why);
  }
  if (!result_) {
    if (why) *why = error_;
    return std::nullopt;
  }
  return std::move(result_);
}

bool CloudLink::answered(uint64_t id) const {
  std::lock_guard lock(mu_);
  if (const auto it = tickets_.find(id); it != tickets_.end()) {
    return it->second->settled || stop_ || Clock::now() >= it->second->deadline;
  }
  return id != awaited_id_ || done_id_ >= id || stop_ || Clock::now() >= awaited_deadline_;
}

void CloudLink::worker() {
  std::unique_lock lock(mu_);
  for (;;) {
    // Plain steps wait until no chained step is out: they need the backend to themselves.
    cv_work_.wait(lock, [&] {
      return stop_ || connect_ == Connect::Queued || !cancels_out_.empty() ||
             ((pending_request_ || pending_sync_) && chain_.empty());
    });
    if (stop_) break;
    if (connect_ == Connect::Queued) {
      run_connect_locked(lock);
      continue;
    }
    if (!cancels_out_.empty()) {
      send_cancel_locked(lock);
      continue;
    }
    if (pending_request_) {
      Pending job = std::move(*pending_request_);
      pending_request_.reset();
      busy_ = true;
      const bool fresh = std::exchange(pending_new_conversation_, false);
      lock.unlock();
      if (fresh) backend_->new_conversation();
      std::optional<CloudStepResult> result;
      std::optional<CloudError> error;
      try {
        result = backend_->step(job.history, job.op);
      } catch (const CloudError& e) {
        error = e;
      } catch (const std::exception& e) {
        error = CloudError(CloudError::Kind::Unavailable, e.what());
      }
      lock.lock();
      busy_ = false;
      counters_ = backend_->counters();
      if (job.id != awaited_id_) {
        // Nobody waits for this answer any more (it came after the timeout): a slow cloud
        // stays in backoff instead of costing every later consultation a whole timeout.
      } else if (error) {
        note_failure_locked(*error);
        error_ = error->what();
      } else {
        note_success_locked();
      }
      result_ = std::move(result);
      done_id_ = job.id;
      cv_done_.notify_all();
      continue;
    }
    std::vector<TokenId> history = std::move(*pending_sync_);
    pending_sync_.reset();
    if (disabled_ || Clock::now() < retry_at_) continue;
    busy_ = true;
    const bool fresh = std::exchange(pending_new_conversation_, false);
    lock.unlock();
    if (fresh) backend_->new_conversation();
    std::optional<CloudError> error;
    try {
      backend_->step(history, CloudOp{});
    } catch (const CloudError& e) {
      error = e;
    } catch (const std::exception& e) {
      error = CloudError(CloudError::Kind::Unavailable, e.what());
    }
    lock.lock();
    busy_ = false;
    counters_ = backend_->counters();
    if (error) {
      ++sync_failures_;
      note_failure_locked(*error);
    } else {
      ++sync_steps_;
      note_success_locked();
    }
  }
  lock.unlock();
  backend_->close_at_exit();
}

CloudCounters CloudLink::counters() const {
  std::lock_guard lock(mu_);
  return counters_;
}
int CloudLink::sync_steps() const {
  std::lock_guard lock(mu_);
  return sync_steps_;
}
int CloudLink::sync_failures() const {
  std::lock_guard lock(mu_);
  return sync_failures_;
}
int CloudLink::failures() const {
  std::lock_guard lock(mu_);
  return failures_;
}
int CloudLink::cancels() const {
  std::lock_guard lock(mu_);
  return cancels_;
}
int CloudLink::cancelled_steps() const {
  std::lock_guard lock(mu_);
  return cancelled_steps_;
}
std::string CloudLink::last_error() const {
  std::lock_guard lock(mu_);
  return last_error_;
}

}  // namespace tandem
