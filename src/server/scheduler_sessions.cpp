// The scheduler's sessions (server/scheduler.h): creating, closing and listing them, starting,
// queueing, cancelling and ending their steps against the session's history, and forgetting
// them (evicted, expired, closed) with the reason a later request is told.
#include <algorithm>
#include <cassert>
#include <map>

#include "common/error.h"
#include "server/metrics.h"
#include "server/random_id.h"
#include "server/scheduler.h"

namespace tandem::server {
namespace {

constexpr size_t kLostMemory = 4096;  // how many lost session ids keep their reason

}  // namespace

// ---------------------------------------------------------------------------------------------
// Sessions

CreateResult Scheduler::create_session(const std::string& owner) {
  std::lock_guard lk(mu_);
  CreateResult out;
  if (draining_) {
    out.outcome = CreateResult::Outcome::Draining;
    return out;
  }
  expire_idle_locked();
  // A quota equal to the slots is no quota: there the slots are the limit, and a full server
  // evicts the requester's own idle sessions below.
  if (options_.max_sessions_per_key < options_.max_sessions) {
    const auto owned = std::count_if(sessions_.begin(), sessions_.end(),
                                     [&](const auto& kv) { return kv.second.owner == owner; });
    if (owned >= options_.max_sessions_per_key) {
      out.outcome = CreateResult::Outcome::OverQuota;
      return out;
    }
  }
  if (free_session_slots_.empty()) {
    Session* victim = eviction_victim_locked(owner, nullptr, false);
    if (!victim) {
      out.outcome = CreateResult::Outcome::NoRoom;
      out.retry_after_s = std::max(1, seconds_until_evictable_locked(nullptr, false));
      return out;
    }
    evict_locked(*victim, "evicted");
  }
  Session s;
  s.owner = owner;
  s.slot = free_session_slots_.back();
  free_session_slots_.pop_back();
  do {
    s.id = options_.session_prefix + random_id_hex();
  } while (sessions_.count(s.id) || lost_.count(s.id));  // 2^-128: for form's sake
  slots_to_release_.push_back(s.slot);
  out.id = s.id;
  sessions_.emplace(out.id, std::move(s));
  metrics_.sessions_open = static_cast<int64_t>(sessions_.size());
  wake_.notify_all();
  return out;
}

bool Scheduler::close_session(const std::string& id, const std::string& owner) {
  std::lock_guard lk(mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second.owner != owner) return false;
  if (it->second.busy) {
    it->second.close_requested = true;  // the running step finishes, then the session goes
    return true;
  }
  forget_locked(id, "closed");
  return true;
}

std::string Scheduler::lost_reason(const std::string& id, const std::string& owner) const {
  std::lock_guard lk(mu_);
  auto it = lost_.find(id);
  return it == lost_.end() || it->second.owner != owner ? "unknown" : it->second.reason;
}

std::vector<SessionInfo> Scheduler::list_sessions() const {
  std::lock_guard lk(mu_);
  std::vector<SessionInfo> out;
  const auto now = Clock::now();
  for (const auto& [id, s] : sessions_) {
    out.push_back({id, s.owner, static_cast<int>(s.history.size()), idle_seconds(s.last_used, now),
                   static_cast<uint64_t>(slot_len_[s.slot]) * kv_bytes_per_token_});
  }
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.idle_s < b.idle_s; });
  return out;
}

size_t Scheduler::open_sessions() const {
  std::lock_guard lk(mu_);
  return sessions_.size();
}

bool Scheduler::start_step(const std::shared_ptr<Job>& job, bool may_wait, StepRefusal* refusal,
                           SubmitRefusal* why) {
  *refusal = {};
  *why = SubmitRefusal::None;
  {
    std::lock_guard lk(mu_);
    expire_idle_locked();
    auto it = sessions_.find(job->session_id);
    if (it == sessions_.end() || it->second.owner != job->owner) {
      auto lost = lost_.find(job->session_id);
      const bool told = lost != lost_.end() && lost->second.owner == job->owner;
      *refusal = {StepCheck::Lost, 0, told ? lost->second.reason : "unknown"};
      return false;
    }
    Session& s = it->second;
    refusal->pos = static_cast<int>(s.history.size());
    if (s.busy) {
      // Behind the running step, bounded per session and counted like any queued job.
      if (!may_wait || s.waiting >= options_.max_queued_steps) {
        refusal->check = StepCheck::Busy;
        return false;
      }
      if (!take_queue_place_locked(*job, why)) return false;
      waiting_.push_back(job);
      ++s.waiting;
    } else {
      *refusal = check_step_locked(s, job->step);
      if (refusal->check != StepCheck::Ok || !take_queue_place_locked(*job, why)) return false;
      run_step_locked(s, job);
    }
    metrics_.queue_length = static_cast<int64_t>(queued_locked());
  }
  wake_.notify_all();
  return true;
}

// Every check a step makes before it changes anything, on the history it finds: a refused step
// leaves the session exactly as it was.
StepRefusal Scheduler::check_step_locked(Session& s, const StepStart& step) {
  const int length = static_cast<int>(s.history.size());
  if (step.rewind_to > length) return {StepCheck::PositionMismatch, length, {}};
  const int kept = step.rewind_to >= 0 ? step.rewind_to : length;
  if (step.expected_pos != kept) return {StepCheck::PositionMismatch, kept, {}};
  if (step.expected_hash && *step.expected_hash != prefix_hash(s, kept)) {
    return {StepCheck::HistoryMismatch, kept, {}};
  }
  const size_t total =
      static_cast<size_t>(kept) + step.append.size() + static_cast<size_t>(step.extra_tokens);
  if (total > static_cast<size_t>(options_.n_ctx)) return {StepCheck::TooLong, kept, {}};
  return {StepCheck::Ok, length, {}};
}

uint64_t Scheduler::prefix_hash(Session& s, int n) {
  std::vector<uint64_t>& h = s.prefix_hashes;
  const size_t want = static_cast<size_t>(n);
  while (h.size() <= want) {  // extends by the tokens appended since the last check only
    HistoryHash next(h.back());
    next.add(s.history[h.size() - 1]);
    h.push_back(next.value());
  }
  return h[want];
}

void Scheduler::cut_history(Session& s, int n) {
  s.history.resize(static_cast<size_t>(n));
  if (s.prefix_hashes.size() > s.history.size() + 1) s.prefix_hashes.resize(s.history.size() + 1);
}

// Cuts the history for a checked step, appends its tokens, gives the job its StepBegun and
// queues it as the session's running step. A rewind whose append repeats the start of what it
// cuts keeps those tokens (and their KV): the step then is rewind_to + that prefix with the rest
// appended, the same history for less prefill.
void Scheduler::run_step_locked(Session& s, const std::shared_ptr<Job>& job) {
  const StepStart& step = job->step;
  const int length = static_cast<int>(s.history.size());
  int kept = step.rewind_to >= 0 ? step.rewind_to : length;
  size_t same = 0;  // append[0, same) equals history[kept, kept + same)
  while (kept + static_cast<int>(same) < length && same < step.append.size() &&
         s.history[kept + same] == step.append[same]) {
    ++same;
  }
  kept += static_cast<int>(same);
  s.cut_tail.assign(s.history.begin() + kept, s.history.end());
  if (kept < length) {
    // The cache keeps the history but its last token (every step needs a logits row); the
    // slot itself is cut to kv_len when the step's job is admitted.
    cut_history(s, kept);
    s.kv_len = std::min(s.kv_len, std::max(kept - 1, 0));
  }
  s.history.insert(s.history.end(), step.append.begin() + static_cast<std::ptrdiff_t>(same),
                   step.append.end());
  s.busy = true;
  s.running = job;
  s.last_used = Clock::now();
  assert(s.kv_len >= 0 && s.kv_len <= static_cast<int>(s.history.size()));
  job->history_before = kept;
  StepBegun begun;
  begun.pos = static_cast<int>(s.history.size());
  begun.kv_len = s.kv_len;
  begun.uncached.assign(s.history.begin() + s.kv_len, s.history.end());
  job->on_begin(begun);
  pending_.push_back(job);
}

bool Scheduler::cancel_steps(const std::string& id, const std::string& owner, int from_pos,
                             int* count, int* pos) {
  // A step that cuts the history back to from_pos or before builds on nothing abandoned (it
  // replaces it): the device's next step after the cancel, which may overtake it on the way.
  const auto abandons = [from_pos](const Job& job) {
    if (job.step.rewind_to >= 0 && job.step.rewind_to <= from_pos) return false;
    return job.step.expected_pos + static_cast<int64_t>(job.step.append.size()) > from_pos;
  };
  {
    std::lock_guard lk(mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end() || it->second.owner != owner) return false;
    Session& s = it->second;
    *pos = static_cast<int>(s.history.size());
    *count = 0;
    for (size_t i = 0; i < waiting_.size();) {
      const std::shared_ptr<Job> job = waiting_[i];
      if (job->session_id != id || !abandons(*job)) {
        ++i;
        continue;
      }
      waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(i));
      --s.waiting;
      job->cancelled = true;
      job->history_after = *pos;
      defer_answer_locked(job, JobFailure::Cancelled, "cancelled");
      ++*count;
    }
    // The running step stops at its next token boundary; session_append adds nothing after
    // this, so *pos is its last length.
    if (s.running && !s.running->cancelled && abandons(*s.running)) {
      s.running->cancelled = true;
      ++*count;
    }
    metrics_.cancelled_steps += static_cast<uint64_t>(*count);
    metrics_.queue_length = static_cast<int64_t>(queued_locked());
  }
  answer_deferred();
  wake_.notify_all();
  return true;
}

// Takes a place in the queue for `job` and, when it has an owner, one in the owner's quota
// (given back when the job is destroyed, however it ended).
bool Scheduler::take_queue_place_locked(Job& job, SubmitRefusal* why) {
  auto refuse = [&](SubmitRefusal r) {
    if (why) *why = r;
    return false;
  };
  if (draining_) return refuse(SubmitRefusal::Draining);
  if (queued_locked() >= static_cast<size_t>(options_.max_queue))
    return refuse(SubmitRefusal::QueueFull);
  if (!job.owner.empty()) {
    auto& count = jobs_per_owner_[job.owner];
    if (!count) count = std::make_shared<std::atomic<int>>(0);
    if (count->load() >= options_.max_queue_per_key) return refuse(SubmitRefusal::KeyQuota);
    ++*count;
    job.owner_ticket = std::shared_ptr<void>(nullptr, [count](void*) { --*count; });
  }
  job.enqueued = Clock::now();
  return true;
}

void Scheduler::end_unrun_step_locked(Session& s, int length) {
  if (length >= s.kv_len && length <= static_cast<int>(s.history.size())) {
    cut_history(s, length);
    s.history.insert(s.history.end(), s.cut_tail.begin(), s.cut_tail.end());
  }
  s.cut_tail.clear();
  step_ended_locked(s);
}

void Scheduler::step_ended_locked(Session& s) {
  s.running.reset();
  s.busy = false;
  if (s.close_requested) {
    forget_locked(s.id, "closed");  // answers its waiting steps 410; `s` is gone
    return;
  }
  while (std::shared_ptr<Job> next = pop_waiting_locked(s)) {
    if (next->dropped()) {  // its client hung up
      ++metrics_.cancelled_jobs;
      defer_answer_locked(next, JobFailure::Cancelled, "cancelled");
      continue;
    }
    next->refusal = check_step_locked(s, next->step);
    if (next->refusal.check == StepCheck::Ok) {
      run_step_locked(s, next);
      wake_.notify_all();
      return;
    }
    defer_answer_locked(next, JobFailure::Refused, "");
  }
}

std::shared_ptr<Job> Scheduler::pop_waiting_locked(Session& s) {
  if (s.waiting == 0) return nullptr;
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
    if ((*it)->session_id != s.id) continue;
    std::shared_ptr<Job> job = *it;
    waiting_.erase(it);
    --s.waiting;
    return job;
  }
  return nullptr;
}

void Scheduler::drop_abandoned_waiting_locked() {
  for (size_t i = 0; i < waiting_.size();) {
    const std::shared_ptr<Job> job = waiting_[i];
    auto sit = sessions_.find(job->session_id);
    if (!job->abandoned() || sit == sessions_.end()) {
      ++i;
      continue;
    }
    waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(i));
    --sit->second.waiting;
    ++metrics_.cancelled_jobs;
    defer_answer_locked(job, JobFailure::Cancelled, "cancelled");
  }
}

void Scheduler::defer_answer_locked(std::shared_ptr<Job> job, JobFailure failure,
                                    std::string message) {
  deferred_.push_back({std::move(job), failure, std::move(message)});
}

void Scheduler::answer_deferred() {
  std::vector<DeferredAnswer> answers;
  {
    std::lock_guard lk(mu_);
    answers.swap(deferred_);
    metrics_.queue_length = static_cast<int64_t>(queued_locked());
  }
  for (DeferredAnswer& a : answers) a.job->on_finish(a.failure, a.message);
  if (!answers.empty()) drained_.notify_all();
}

bool Scheduler::session_append(const Job& job, std::span<const TokenId> produced) {
  std::lock_guard lk(mu_);
  if (job.cancelled) return false;
  auto it = sessions_.find(job.session_id);
  if (it == sessions_.end()) return false;
  it->second.history.insert(it->second.history.end(), produced.begin(), produced.end());
  return true;
}

void Scheduler::evict_locked(Session& s, const char* reason) {
  ++metrics_.evictions;
  forget_locked(s.id, reason);
}

// `id` is taken by value: the caller's string may live in the session erased below.
void Scheduler::forget_locked(std::string id, const char* reason) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  // Steps still waiting for the session are answered as steps on a lost session.
  while (std::shared_ptr<Job> job = pop_waiting_locked(it->second)) {
    job->refusal = {StepCheck::Lost, 0, reason};
    defer_answer_locked(std::move(job), JobFailure::Refused, "");
  }
  const int slot = it->second.slot;
  std::string owner = std::move(it->second.owner);
  sessions_.erase(it);
  free_session_slots_.push_back(slot);
  assert(free_session_slots_.size() <= static_cast<size_t>(options_.max_sessions));
  slots_to_release_.push_back(slot);
  slot_target_[slot] = 0;
  lost_[id] = {reason, std::move(owner)};
  lost_order_.push_back(id);
  while (lost_order_.size() > kLostMemory) {
    lost_.erase(lost_order_.front());
    lost_order_.pop_front();
  }
  metrics_.sessions_open = static_cast<int64_t>(sessions_.size());
}

void Scheduler::expire_idle_locked() {
  const auto now = Clock::now();
  if (now - last_expiry_ < std::chrono::milliseconds(200)) return;
  last_expiry_ = now;
  std::vector<std::string> expired;
  for (const auto& [id, s] : sessions_) {
    if (!s.busy &&
        std::chrono::duration<double>(now - s.last_used).count() > options_.idle_timeout_s) {
      expired.push_back(id);
    }
  }
  for (const auto& id : expired) {
    ++metrics_.expirations;
    forget_locked(id, "expired");
  }
}

}  // namespace tandem::server
