#include "server/scheduler.h"

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "common/error.h"
#include "server/metrics.h"

namespace tandem::server {
namespace {

constexpr size_t kLostMemory = 4096;  // how many lost session ids keep their reason

constexpr size_t kIdBytes = 16;  // 128 bits from the OS CSPRNG per session id

// Fills `out` from the kernel's CSPRNG: getrandom(2), or /dev/urandom where that call is missing.
void os_random(uint8_t* out, size_t n) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = getrandom(out + got, n - got, 0);
    if (r > 0) {
      got += static_cast<size_t>(r);
    } else if (r < 0 && errno == EINTR) {
      continue;
    } else if (r < 0 && errno == ENOSYS) {
      break;
    } else {
      throw Error(std::string("getrandom failed: ") + std::strerror(errno));
    }
  }
  if (got == n) return;
  const int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(std::string("cannot open /dev/urandom: ") + std::strerror(errno));
  while (got < n) {
    const ssize_t r = read(fd, out + got, n - got);
    if (r <= 0 && !(r < 0 && errno == EINTR)) {
      close(fd);
      throw Error("cannot read /dev/urandom");
    }
    if (r > 0) got += static_cast<size_t>(r);
  }
  close(fd);
}

// A session id: 128 random bits as 32 lowercase hex digits. Nothing in it depends on any other
// id, so holding ids of one's own tells nothing about anyone else's.
std::string random_id_hex() {
  uint8_t bytes[kIdBytes];
  os_random(bytes, kIdBytes);
  static const char digits[] = "0123456789abcdef";
  std::string out(2 * kIdBytes, '0');
  for (size_t i = 0; i < kIdBytes; ++i) {
    out[2 * i] = digits[bytes[i] >> 4];
    out[2 * i + 1] = digits[bytes[i] & 15];
  }
  return out;
}

double idle_seconds(Clock::time_point last_used, Clock::time_point now) {
  return std::chrono::duration<double>(now - last_used).count();
}

}  // namespace

Scheduler::Scheduler(const Model& model, const SchedulerOptions& options, Metrics& metrics)
    : model_(model), options_(options), metrics_(metrics) {
  if (options_.max_sessions < 1 || options_.stateless_slots < 1) {
    throw Error("the server needs at least one session slot and one stateless slot");
  }
  if (options_.batch_tokens < 1) throw Error("the batch token budget must be at least 1");
  if (options_.prefill_chunk < static_cast<int>(kLogitRowCost)) {
    throw Error("--prefill-chunk " + std::to_string(options_.prefill_chunk) + " is below " +
                std::to_string(kLogitRowCost) + ", the cost of one prompt row that wants logits");
  }
  for (char ch : options_.session_prefix) {
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '_') {
      throw Error("--session-prefix '" + options_.session_prefix +
                  "' may hold only letters, digits, '-' and '_'");
    }
  }
  if (options_.session_prefix.size() > 16)
    throw Error("--session-prefix is longer than 16 characters");
  ContextParams cp;
  cp.n_ctx = options_.n_ctx;
  cp.n_seq = options_.max_sessions + options_.stateless_slots;
  cp.n_threads = options_.n_threads;
  cp.type_k = options_.type_k;
  cp.type_v = options_.type_v;
  ctx_ = std::make_unique<Context>(model, cp);
  kv_bytes_per_token_ = ctx_->kv_bytes_per_position();
  options_.n_ctx = ctx_->n_ctx();
  const uint64_t full = kv_bytes_per_token_ * options_.n_ctx * cp.n_seq;
  if (options_.kv_cap_bytes == 0 || options_.kv_cap_bytes > full) options_.kv_cap_bytes = full;
  if (options_.kv_cap_bytes < kv_bytes_per_token_ * 2) {
    throw Error("--kv-cap " + std::to_string(options_.kv_cap_bytes) +
                " bytes holds less than two tokens (one token takes " +
                std::to_string(kv_bytes_per_token_) + " bytes)");
  }
  for (int s = options_.max_sessions - 1; s >= 0; --s) free_session_slots_.push_back(s);
  for (int i = 0; i < options_.stateless_slots; ++i) {
    stateless_.push_back({options_.max_sessions + i, {}, false, Clock::now()});
  }
  slot_len_.assign(cp.n_seq, 0);
  slot_target_.assign(cp.n_seq, 0);
  if (options_.max_sessions_per_key <= 0 || options_.max_sessions_per_key > options_.max_sessions)
    options_.max_sessions_per_key = options_.max_sessions;
  if (options_.max_queue_per_key <= 0 || options_.max_queue_per_key > options_.max_queue)
    options_.max_queue_per_key = options_.max_queue;
  if (!(options_.evict_grace_s >= 0)) throw Error("--evict-grace must be 0 or more seconds");
  engine_ = std::thread([this] { engine_loop(); });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
    draining_ = true;
  }
  wake_.notify_all();
  if (engine_.joinable()) engine_.join();
}

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

StepCheck Scheduler::begin_step(const std::string& id, const std::string& owner, int expected_pos,
                                int rewind_to, std::span<const TokenId> append, int extra_tokens,
                                int* pos, int* kv_len, std::vector<TokenId>* uncached) {
  std::lock_guard lk(mu_);
  expire_idle_locked();
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second.owner != owner) return StepCheck::Lost;
  Session& s = it->second;
  const int length = static_cast<int>(s.history.size());
  *pos = length;
  if (s.busy) return StepCheck::Busy;
  if (rewind_to > length) return StepCheck::PositionMismatch;
  // Every check runs on the length after the cut before anything changes, so a refused step
  // leaves the session exactly as it was.
  const int kept = rewind_to >= 0 ? rewind_to : length;
  if (expected_pos != kept) {
    *pos = kept;
    return StepCheck::PositionMismatch;
  }
  const size_t total =
      static_cast<size_t>(kept) + append.size() + static_cast<size_t>(extra_tokens);
  if (total > static_cast<size_t>(options_.n_ctx)) {
    *pos = kept;
    return StepCheck::TooLong;
  }
  s.cut_tail.assign(s.history.begin() + kept, s.history.end());
  if (kept < length) {
    // The cache keeps the history but its last token (every step needs a logits row); the
    // slot itself is cut to kv_len when the step's job is admitted.
    s.history.resize(kept);
    s.kv_len = std::min(s.kv_len, std::max(kept - 1, 0));
  }
  s.history.insert(s.history.end(), append.begin(), append.end());
  s.busy = true;
  s.last_used = Clock::now();
  *pos = static_cast<int>(s.history.size());
  *kv_len = s.kv_len;
  assert(s.kv_len >= 0 && s.kv_len <= static_cast<int>(s.history.size()));
  uncached->assign(s.history.begin() + s.kv_len, s.history.end());
  return StepCheck::Ok;
}

void Scheduler::abort_step(const std::string& id, int length) {
  std::lock_guard lk(mu_);
  auto it = sessions_.find(id);
  if (it != sessions_.end()) end_unrun_step_locked(it->second, length);
}

void Scheduler::end_unrun_step_locked(Session& s, int length) {
  if (length >= s.kv_len && length <= static_cast<int>(s.history.size())) {
    s.history.resize(length);
    s.history.insert(s.history.end(), s.cut_tail.begin(), s.cut_tail.end());
  }
  s.cut_tail.clear();
  s.busy = false;
}

void Scheduler::session_append(const std::string& id, std::span<const TokenId> produced) {
  std::lock_guard lk(mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  it->second.history.insert(it->second.history.end(), produced.begin(), produced.end());
}

void Scheduler::evict_locked(Session& s, const char* reason) {
  ++metrics_.evictions;
  forget_locked(s.id, reason);
}

void Scheduler::forget_locked(const std::string& id_ref, const char* reason) {
  const std::string id = id_ref;  // id_ref may live in the session erased below
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
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

// ---------------------------------------------------------------------------------------------
// Jobs

bool Scheduler::submit(std::shared_ptr<Job> job, SubmitRefusal* why) {
  auto refuse = [&](SubmitRefusal r) {
    if (why) *why = r;
    return false;
  };
  {
    std::lock_guard lk(mu_);
    if (draining_) return refuse(SubmitRefusal::Draining);
    if (pending_.size() + active_count_ >= static_cast<size_t>(options_.max_queue))
      return refuse(SubmitRefusal::QueueFull);
    if (!job->owner.empty()) {
      auto& count = jobs_per_owner_[job->owner];
      if (!count) count = std::make_shared<std::atomic<int>>(0);
      if (count->load() >= options_.max_queue_per_key) return refuse(SubmitRefusal::KeyQuota);
      ++*count;
      // Given back when the job is destroyed, however it ended.
      job->owner_ticket = std::shared_ptr<void>(nullptr, [count](void*) { --*count; });
    }
    job->enqueued = Clock::now();
    pending_.push_back(std::move(job));
    metrics_.queue_length = static_cast<int64_t>(pending_.size() + active_count_);
  }
  wake_.notify_all();
  if (why) *why = SubmitRefusal::None;
  return true;
}

size_t Scheduler::queue_length() const {
  std::lock_guard lk(mu_);
  return pending_.size() + active_count_;
}

uint64_t Scheduler::kv_tokens_locked() const {
  uint64_t n = 0;
  for (size_t s = 0; s < slot_len_.size(); ++s) {
    n += static_cast<uint64_t>(std::max(slot_len_[s], slot_target_[s]));
  }
  return n;
}

uint64_t Scheduler::kv_bytes_in_use() const {
  std::lock_guard lk(mu_);
  return kv_tokens_locked() * kv_bytes_per_token_;
}

Scheduler::Session* Scheduler::eviction_victim_locked(const std::string& requester,
                                                      const Session* keep, bool holding_kv) {
  const auto now = Clock::now();
  Session* own = nullptr;
  Session* other = nullptr;
  for (auto& [id, s] : sessions_) {
    if (s.busy || &s == keep || (holding_kv && slot_len_[s.slot] == 0)) continue;
    if (s.owner == requester) {
      if (!own || s.last_used < own->last_used) own = &s;
    } else if (idle_seconds(s.last_used, now) >= options_.evict_grace_s) {
      if (!other || s.last_used < other->last_used) other = &s;
    }
  }
  return own ? own : other;
}

int Scheduler::seconds_until_evictable_locked(const Session* keep, bool holding_kv) const {
  const auto now = Clock::now();
  double soonest = -1;
  for (const auto& [id, s] : sessions_) {
    if (s.busy || &s == keep || (holding_kv && slot_len_[s.slot] == 0)) continue;
    const double wait = options_.evict_grace_s - idle_seconds(s.last_used, now);
    if (soonest < 0 || wait < soonest) soonest = wait;
  }
  if (soonest < 0) return 0;
  return std::max(1, static_cast<int>(std::ceil(soonest)));
}

// Frees KV positions until `need_tokens` more fit under the cap: first cached prefixes of idle
// stateless slots, then idle sessions as eviction_victim_locked picks them. `keep` is never
// evicted.
bool Scheduler::make_room_locked(uint64_t need_tokens, const Session* keep,
                                 const std::string& requester, int* retry_after_s) {
  const uint64_t cap = options_.kv_cap_bytes / kv_bytes_per_token_;
  while (kv_tokens_locked() + need_tokens > cap) {
    StatelessSlot* lru_slot = nullptr;
    for (auto& st : stateless_) {
      if (!st.busy && slot_len_[st.slot] > 0 && (!lru_slot || st.last_used < lru_slot->last_used)) {
        lru_slot = &st;
      }
    }
    if (lru_slot) {
      lru_slot->cached.clear();
      ctx_->release(lru_slot->slot);
      slot_len_[lru_slot->slot] = 0;
      continue;
    }
    Session* victim = eviction_victim_locked(requester, keep, true);
    if (!victim) {
      *retry_after_s = std::max(1, seconds_until_evictable_locked(keep, true));
      return false;
    }
    const int slot = victim->slot;
    evict_locked(*victim, "evicted");
    ctx_->release(slot);
    slot_len_[slot] = 0;
  }
  return true;
}

bool Scheduler::reserve_session_room_locked(Job& job, Session& s, uint64_t cap_tokens) {
  job.slot = s.slot;
  ctx_->truncate(s.slot, s.kv_len);
  slot_len_[s.slot] = ctx_->seq_length(s.slot);
  const uint64_t need = job.feed.size() + job.reserve_tokens;
  if (need > cap_tokens || !make_room_locked(need, &s, s.owner, &job.retry_after_s)) {
    end_unrun_step_locked(s, job.history_before);
    return false;
  }
  slot_target_[s.slot] = slot_len_[s.slot] + static_cast<int>(need);
  return true;
}

Scheduler::StatelessPick Scheduler::reserve_stateless_slot_locked(Job& job, uint64_t cap_tokens) {
  // The free stateless slot whose cache shares the longest prefix with the job's tokens (the
  // least recently used among equals).
  StatelessSlot* best = nullptr;
  size_t best_common = 0;
  for (auto& st : stateless_) {
    if (st.busy) continue;
    size_t common = 0;
    const size_t limit = std::min({st.cached.size(), job.prefix_key.size() - 1, job.max_reuse});
    while (common < limit && st.cached[common] == job.prefix_key[common]) ++common;
    if (!best || common > best_common ||
        (common == best_common && st.last_used < best->last_used)) {
      best = &st;
      best_common = common;
    }
  }
  if (!best) return StatelessPick::AllBusy;
  const uint64_t need = job.prefix_key.size() - best_common + job.reserve_tokens;
  best->busy = true;  // keeps make_room from dropping this slot
  ctx_->truncate(best->slot, static_cast<int>(best_common));
  best->cached.resize(best_common);
  slot_len_[best->slot] = static_cast<int>(best_common);
  if (need > cap_tokens || !make_room_locked(need, nullptr, job.owner, &job.retry_after_s)) {
    best->busy = false;
    return StatelessPick::NoRoom;
  }
  job.slot = best->slot;
  job.cached = static_cast<int>(best_common);
  metrics_.cached_prompt_tokens += best_common;
  slot_target_[best->slot] = static_cast<int>(best_common + need);
  return StatelessPick::Reserved;
}

// Frees the slots closed sessions left, then goes through the queue in order: a job whose
// client is gone or whose session was lost ends; one that gets KV room moves to `active`; a
// stateless one waits while every stateless slot is busy; one that cannot get room is refused.
void Scheduler::admit_locked(std::vector<std::shared_ptr<Job>>& active) {
  for (int slot : slots_to_release_) {
    ctx_->release(slot);
    slot_len_[slot] = 0;
  }
  slots_to_release_.clear();
  const uint64_t cap_tokens = options_.kv_cap_bytes / kv_bytes_per_token_;
  for (auto it = pending_.begin(); it != pending_.end();) {
    std::shared_ptr<Job> job = *it;
    const auto sit = job->session_id.empty() ? sessions_.end() : sessions_.find(job->session_id);
    if (job->dropped()) {
      // The client is gone: the session's history goes back to before the step, so that the
      // device can send the same step again.
      if (sit != sessions_.end()) end_unrun_step_locked(sit->second, job->history_before);
      it = pending_.erase(it);
      ++metrics_.cancelled_jobs;
      job->on_finish(JobFailure::Cancelled, "cancelled");
      continue;
    }
    if (!job->session_id.empty()) {
      if (sit == sessions_.end()) {  // closed or evicted while queued
        it = pending_.erase(it);
        job->on_finish(JobFailure::Internal, "the session was lost while its step waited");
        continue;
      }
      if (!reserve_session_room_locked(*job, sit->second, cap_tokens)) {
        it = pending_.erase(it);
        ++metrics_.rejected_overload;
        job->on_finish(JobFailure::NoMemory, "the KV memory cap leaves no room for this step");
        continue;
      }
    } else {
      const StatelessPick pick = reserve_stateless_slot_locked(*job, cap_tokens);
      if (pick == StatelessPick::AllBusy) {
        ++it;  // every stateless slot is busy: wait
        continue;
      }
      if (pick == StatelessPick::NoRoom) {
        it = pending_.erase(it);
        ++metrics_.rejected_overload;
        job->on_finish(JobFailure::NoMemory, "the KV memory cap leaves no room for this request");
        continue;
      }
    }
    it = pending_.erase(it);
    job->on_admit();
    active.push_back(job);
    ++active_count_;
  }
  metrics_.kv_bytes_in_use = static_cast<int64_t>(kv_tokens_locked() * kv_bytes_per_token_);
}

void Scheduler::finish_job(const std::shared_ptr<Job>& job, JobFailure failure,
                           const std::string& msg) {
  last_job_end_ = Clock::now();
  {
    std::lock_guard lk(mu_);
    const int slot = job->slot;
    if (!job->session_id.empty()) {
      auto it = sessions_.find(job->session_id);
      if (it != sessions_.end()) {
        Session& s = it->second;
        if (failure == JobFailure::None && job->keep_after >= 0) {
          ctx_->truncate(slot, job->keep_after);
        }
        // A step that ends without an answer (cancelled, failed, cut by shutdown) leaves the
        // history as it was before the step: the device never saw its tokens and resends it.
        if (failure != JobFailure::None && job->history_before >= 0 &&
            job->history_before <= static_cast<int>(s.history.size())) {
          s.history.resize(job->history_before);
        }
        // Whatever happened, the cache holds a prefix of the history (drafts beyond it dropped).
        const int keep = std::min<int>(ctx_->seq_length(slot), static_cast<int>(s.history.size()));
        ctx_->truncate(slot, keep);
        s.kv_len = keep;
        s.busy = false;
        s.last_used = Clock::now();
        if (s.close_requested) forget_locked(s.id, "closed");
      }
    } else if (slot >= 0) {
      for (auto& st : stateless_) {
        if (st.slot != slot) continue;
        st.busy = false;
        st.last_used = Clock::now();
        if (failure != JobFailure::None) {  // do not trust a half-run cache
          st.cached.clear();
          ctx_->truncate(slot, 0);
        }
      }
    }
    if (slot >= 0) {
      slot_len_[slot] = ctx_->seq_length(slot);
      slot_target_[slot] = 0;
    }
    --active_count_;
    metrics_.queue_length = static_cast<int64_t>(pending_.size() + active_count_);
    metrics_.kv_bytes_in_use = static_cast<int64_t>(kv_tokens_locked() * kv_bytes_per_token_);
  }
  if (failure == JobFailure::Cancelled) ++metrics_.cancelled_jobs;
  job->on_finish(failure, msg);
  drained_.notify_all();
}

size_t Scheduler::PrefillBudget::fit(const Job& job, size_t take) {
  size_t n = 0;
  for (; n < take; ++n) {
    const bool logits = job.feed[job.fed + n].want_logits;
    const size_t c = logits ? kLogitRowCost : 1;
    if (logits && logit_rows >= kMaxPrefillLogitRows) break;
    if (cost + c > cost_cap) break;
    cost += c;
    logit_rows += logits ? 1 : 0;
  }
  return n;
}

// The rows of one decode batch: batch[i] is a token of the job active[takes[t].job]; a take is
// the count feed tokens from `begin` of one job; rows maps each batch row that wants logits, in
// batch order, to (take, feed index).
struct Scheduler::BatchPlan {
  struct Take {
    size_t job;
    size_t begin, count;
  };
  std::vector<Take> takes;
  std::vector<BatchToken> batch;
  std::vector<std::pair<size_t, size_t>> rows;
};

// Jobs whose client is gone finish as cancelled; jobs with nothing (left) to feed finish
// without a batch: a sync step whose tokens are all cached already.
void Scheduler::finish_unfed_jobs(std::vector<std::shared_ptr<Job>>& active) {
  for (size_t j = 0; j < active.size();) {
    if (active[j]->dropped()) {
      std::shared_ptr<Job> job = active[j];
      active.erase(active.begin() + static_cast<std::ptrdiff_t>(j));
      finish_job(job, JobFailure::Cancelled, "cancelled");
      continue;
    }
    ++j;
  }
  for (size_t j = 0; j < active.size();) {
    if (active[j]->fed == active[j]->feed.size() && !active[j]->on_feed_done()) {
      std::shared_ptr<Job> job = active[j];
      active.erase(active.begin() + static_cast<std::ptrdiff_t>(j));
      finish_job(job, JobFailure::None, "");
      continue;
    }
    ++j;
  }
}

// Decoding jobs first (one token left to feed), then prefill chunks in arrival order, within
// --batch-tokens and the prefill budget.
Scheduler::BatchPlan Scheduler::plan_batch(const std::vector<std::shared_ptr<Job>>& active) {
  BatchPlan plan;
  int budget = options_.batch_tokens;
  std::vector<size_t> order(active.size());
  for (size_t j = 0; j < active.size(); ++j) order[j] = j;
  const auto decoding = [&](size_t j) { return active[j]->feed.size() - active[j]->fed <= 1; };
  std::stable_partition(order.begin(), order.end(), decoding);
  PrefillBudget prefill;
  if (others_waiting(active.size())) prefill.cost_cap = static_cast<size_t>(options_.prefill_chunk);
  for (size_t j : order) {
    Job& job = *active[j];
    const size_t left = job.feed.size() - job.fed;
    size_t take = std::min<size_t>(left, static_cast<size_t>(budget));
    if (left > 1) take = prefill.fit(job, take);
    if (take == 0) {
      if (budget == 0) break;
      continue;
    }
    const int pos0 = ctx_->seq_length(job.slot);
    for (size_t i = 0; i < take; ++i) {
      const FeedToken& f = job.feed[job.fed + i];
      if (f.want_logits) plan.rows.push_back({plan.takes.size(), job.fed + i});
      plan.batch.push_back({f.id, pos0 + static_cast<int32_t>(i), job.slot, f.want_logits, false});
    }
    plan.takes.push_back({j, job.fed, take});
    budget -= static_cast<int>(take);
  }
  return plan;
}

// Runs the batch; false when it failed, after failing its jobs (validation happened at
// admission, so a failure here is a bug: the jobs fail, the server keeps serving).
bool Scheduler::decode_or_fail(std::vector<std::shared_ptr<Job>>& active, const BatchPlan& plan) {
  try {
    ctx_->decode(plan.batch);
  } catch (const std::exception& e) {
    std::vector<std::shared_ptr<Job>> failed;
    for (const BatchPlan::Take& t : plan.takes) failed.push_back(active[t.job]);
    for (auto& job : failed) {
      active.erase(std::find(active.begin(), active.end(), job));
      finish_job(job, JobFailure::Internal, e.what());
    }
    return false;
  }
  return true;
}

// The slots' new lengths, and the tokens now in each stateless slot's cache.
void Scheduler::note_cached_tokens(const std::vector<std::shared_ptr<Job>>& active,
                                   const BatchPlan& plan) {
  std::lock_guard lk(mu_);
  for (const BatchPlan::Take& t : plan.takes) {
    Job& job = *active[t.job];
    slot_len_[job.slot] = ctx_->seq_length(job.slot);
    if (job.session_id.empty()) {
      for (StatelessSlot& st : stateless_) {
        if (st.slot != job.slot) continue;
        for (size_t i = 0; i < t.count; ++i) st.cached.push_back(job.feed[t.begin + i].id);
      }
    }
  }
}

// Hands each logits row to its job, advances every job by what it fed, and finishes the jobs
// that are done. A hook that throws fails its own job only; the engine thread keeps serving
// the others.
void Scheduler::deliver_batch(std::vector<std::shared_ptr<Job>>& active, const BatchPlan& plan) {
  std::vector<std::pair<std::shared_ptr<Job>, std::string>> failed;
  auto failed_already = [&](const Job* j) {
    return std::any_of(failed.begin(), failed.end(), [&](auto& f) { return f.first.get() == j; });
  };
  size_t row_of_batch = 0;
  for (size_t b = 0; b < plan.batch.size(); ++b) {
    if (!plan.batch[b].want_logits) continue;
    const auto [take, feed_index] = plan.rows[row_of_batch++];
    const std::shared_ptr<Job>& job = active[plan.takes[take].job];
    if (failed_already(job.get())) continue;
    try {
      job->on_logits(feed_index, ctx_->logits(static_cast<int>(b)));
    } catch (const std::exception& e) {
      failed.push_back({job, e.what()});
    }
  }
  std::vector<std::shared_ptr<Job>> done;
  for (const BatchPlan::Take& t : plan.takes) {
    const std::shared_ptr<Job>& job = active[t.job];
    if (failed_already(job.get())) continue;
    job->fed += t.count;
    if (job->fed == job->feed.size()) {
      try {
        if (job->dropped() || !job->on_feed_done()) done.push_back(job);
      } catch (const std::exception& e) {
        failed.push_back({job, e.what()});
      }
    }
  }
  for (auto& [job, what] : failed) {
    active.erase(std::find(active.begin(), active.end(), job));
    finish_job(job, JobFailure::Internal, what);
  }
  for (auto& job : done) {
    active.erase(std::find(active.begin(), active.end(), job));
    finish_job(job, job->dropped() ? JobFailure::Cancelled : JobFailure::None, "");
  }
}

// One decode batch: a row from every job that is generating (one token left to feed), then
// prefill chunks in arrival order, within the token budget.
void Scheduler::run_batch(std::vector<std::shared_ptr<Job>>& active) {
  finish_unfed_jobs(active);
  const BatchPlan plan = plan_batch(active);
  if (plan.batch.empty()) return;

  metrics_.batch_tokens.observe(static_cast<double>(plan.batch.size()));
  metrics_.batch_jobs.observe(static_cast<double>(plan.takes.size()));
  metrics_.queue_depth.observe(static_cast<double>(metrics_.queue_length.load()));
  if (!decode_or_fail(active, plan)) return;
  metrics_.prompt_tokens += plan.batch.size();
  note_cached_tokens(active, plan);
  deliver_batch(active, plan);
}

// Whether a prompt's work should leave room for others: other jobs are running or queued, or one
// ended in the last second (a device between two steps of its session comes back within a round
// trip, and its next token should not wait behind a whole --batch-size of someone's prompt).
bool Scheduler::others_waiting(size_t active_jobs) const {
  if (active_jobs > 1) return true;
  {
    std::lock_guard lk(mu_);
    if (!pending_.empty()) return true;
  }
  return Clock::now() - last_job_end_ < std::chrono::seconds(1);
}

void Scheduler::engine_loop() {
  std::vector<std::shared_ptr<Job>> active;
  for (;;) {
    bool expired = false;
    {
      std::unique_lock lk(mu_);
      expire_idle_locked();
      if (active.empty()) {
        wake_.wait_for(lk, std::chrono::milliseconds(500),
                       [&] { return stop_ || !pending_.empty() || !slots_to_release_.empty(); });
      }
      if (stop_ && pending_.empty() && active.empty()) break;
      expired = drain_expired_;
      if (!expired) admit_locked(active);
      if (!expired && active.empty() && !pending_.empty()) {
        // Everything is free and these still do not fit: they never will.
        while (!pending_.empty()) {
          auto job = pending_.front();
          pending_.pop_front();
          lk.unlock();
          job->on_finish(JobFailure::NoMemory, "no slot or KV memory for this request");
          lk.lock();
        }
      }
      metrics_.queue_length = static_cast<int64_t>(pending_.size() + active_count_);
    }
    if (expired) {
      fail_all_for_shutdown(active);
    } else if (!active.empty()) {
      run_batch(active);
    }
    drained_.notify_all();
  }
  for (auto& job : active) job->on_finish(JobFailure::Draining, "the server is shutting down");
}

// --drain-timeout passed: every queued and running job ends now with a 503.
void Scheduler::fail_all_for_shutdown(std::vector<std::shared_ptr<Job>>& active) {
  static const std::string why = "the server is shutting down and its drain time ran out";
  std::deque<std::shared_ptr<Job>> queued;
  {
    std::lock_guard lk(mu_);
    queued.swap(pending_);
    for (auto& job : queued) {
      auto it = sessions_.find(job->session_id);
      if (it != sessions_.end()) end_unrun_step_locked(it->second, job->history_before);
    }
    metrics_.drain_failed_jobs += queued.size() + active.size();
  }
  for (auto& job : queued) job->on_finish(JobFailure::Draining, why);
  for (auto& job : active) finish_job(job, JobFailure::Draining, why);
  active.clear();
}

bool Scheduler::drain(double timeout_s) {
  std::unique_lock lk(mu_);
  draining_ = true;
  auto idle = [&] { return pending_.empty() && active_count_ == 0; };
  if (timeout_s < 0) {
    drained_.wait(lk, idle);
    return true;
  }
  if (drained_.wait_for(lk, std::chrono::duration<double>(timeout_s), idle)) return true;
  drain_expired_ = true;  // the engine thread sees it after its current batch
  drained_.wait(lk, idle);
  return false;
}

}  // namespace tandem::server
