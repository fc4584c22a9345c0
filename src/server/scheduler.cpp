#include "server/scheduler.h"

#include <algorithm>
#include <cassert>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <map>

#include "common/error.h"
#include "server/fair_share.h"
#include "server/metrics.h"
#include "server/random_id.h"

namespace tandem::server {

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
    stateless_.push_back({options_.max_sessions + i, {}, false, Clock::now(), {}});
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
// Jobs

bool Scheduler::submit(std::shared_ptr<Job> job, SubmitRefusal* why) {
  if (why) *why = SubmitRefusal::None;
  {
    std::lock_guard lk(mu_);
    if (!take_queue_place_locked(*job, why)) return false;
    pending_.push_back(std::move(job));
    metrics_.queue_length = static_cast<int64_t>(queued_locked());
  }
  wake_.notify_all();
  return true;
}

size_t Scheduler::queue_length() const {
  std::lock_guard lk(mu_);
  return queued_locked();
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
  best->owner = job.owner;
  job.cached = static_cast<int>(best_common);
  metrics_.cached_prompt_tokens += best_common;
  slot_target_[best->slot] = static_cast<int>(best_common + need);
  return StatelessPick::Reserved;
}

// Frees the slots closed sessions left, drops waiting steps whose client left, then goes through
// the queue: session steps (each has its own slot) and jobs whose client is gone in arrival
// order, then stateless jobs as stateless slots are free, fairly between keys. A job whose
// client is gone or whose session was lost ends; one that gets KV room moves to `active`; one
// that cannot get room is refused. A session step that ends here lets the session's next
// waiting step join the queue's end, where this same pass reaches it.
void Scheduler::admit_locked(std::vector<std::shared_ptr<Job>>& active) {
  for (int slot : slots_to_release_) {
    ctx_->release(slot);
    slot_len_[slot] = 0;
  }
  slots_to_release_.clear();
  drop_abandoned_waiting_locked();
  const uint64_t cap_tokens = options_.kv_cap_bytes / kv_bytes_per_token_;
  for (size_t i = 0; i < pending_.size();) {
    std::shared_ptr<Job> job = pending_[i];
    if (job->session_id.empty() && !job->dropped()) {
      ++i;  // waits for admit_stateless_locked
      continue;
    }
    admit_at_locked(i, admit_one_locked(*job, cap_tokens), active);
  }
  admit_stateless_locked(active, cap_tokens);
  metrics_.kv_bytes_in_use = static_cast<int64_t>(kv_tokens_locked() * kv_bytes_per_token_);
}

// Stateless jobs, while a stateless slot is free: the next one is the oldest job of the key that
// holds the fewest busy stateless slots, the keys holding equally few taking turns (fair_share.h
// least_served), so a key with many waiting requests cannot take every slot as it frees while
// another key's request waits.
void Scheduler::admit_stateless_locked(std::vector<std::shared_ptr<Job>>& active,
                                       uint64_t cap_tokens) {
  for (;;) {
    std::vector<size_t> waiting;    // pending_ indices of stateless jobs, in arrival order
    std::vector<std::string> keys;  // [waiting.size()] their owners
    for (size_t i = 0; i < pending_.size(); ++i) {
      if (!pending_[i]->session_id.empty()) continue;
      waiting.push_back(i);
      keys.push_back(pending_[i]->owner);
    }
    if (waiting.empty()) return;
    std::map<std::string, int> held;  // key -> its busy stateless slots
    for (const StatelessSlot& st : stateless_) {
      if (st.busy) ++held[st.owner];
    }
    size_t i = waiting[least_served(keys, held, stateless_last_key_, stateless_served_)];
    const std::string key = pending_[i]->owner;
    const Admission admission = admit_one_locked(*pending_[i], cap_tokens);
    if (admission == Admission::Wait) return;  // every stateless slot is busy
    if (admission == Admission::Admitted) {
      stateless_last_key_ = key;
      stateless_served_ = true;
    }
    admit_at_locked(i, admission, active);
  }
}

// Moves pending_[i] on as `admission` says: it stays (Wait, ++i), leaves the queue (Ended), or
// leaves it for `active` (Admitted).
void Scheduler::admit_at_locked(size_t& i, Admission admission,
                                std::vector<std::shared_ptr<Job>>& active) {
  if (admission == Admission::Wait) {
    ++i;
    return;
  }
  std::shared_ptr<Job> job = pending_[i];
  pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
  if (admission == Admission::Ended) return;
  job->on_admit();
  active.push_back(job);
  ++active_count_;
}

// admit_locked for one queued job: Admitted (it has its slot and KV room), Ended (answered here)
// or Wait (every stateless slot is busy).
Scheduler::Admission Scheduler::admit_one_locked(Job& job, uint64_t cap_tokens) {
  const auto sit = job.session_id.empty() ? sessions_.end() : sessions_.find(job.session_id);
  if (job.dropped()) {
    // A hang-up gives the session's history back as it was before the step, so that the device
    // can send the same step again; a cancelled step keeps what it appended.
    if (sit != sessions_.end()) {
      job.history_after = static_cast<int>(sit->second.history.size());
      end_unrun_step_locked(sit->second, job.cancelled ? -1 : job.history_before);
    }
    if (!job.cancelled) ++metrics_.cancelled_jobs;
    job.on_finish(JobFailure::Cancelled, "cancelled");
    return Admission::Ended;
  }
  if (!job.session_id.empty()) {
    if (sit == sessions_.end()) {  // closed or evicted while queued
      job.on_finish(JobFailure::Internal, "the session was lost while its step waited");
      return Admission::Ended;
    }
    if (!reserve_session_room_locked(job, sit->second, cap_tokens)) {
      ++metrics_.rejected_overload;
      job.on_finish(JobFailure::NoMemory, "the KV memory cap leaves no room for this step");
      return Admission::Ended;
    }
    return Admission::Admitted;
  }
  const StatelessPick pick = reserve_stateless_slot_locked(job, cap_tokens);
  if (pick == StatelessPick::AllBusy) return Admission::Wait;
  if (pick == StatelessPick::NoRoom) {
    ++metrics_.rejected_overload;
    job.on_finish(JobFailure::NoMemory, "the KV memory cap leaves no room for this request");
    return Admission::Ended;
  }
  return Admission::Admitted;
}

void Scheduler::finish_job(const std::shared_ptr<Job>& job, JobFailure failure,
                           const std::string& msg) {
  last_job_end_ = Clock::now();
  {
    std::lock_guard lk(mu_);
    const int slot = job->slot;
    if (!job->session_id.empty()) {
      auto it = sessions_.find(job->session_id);
      if (it != sessions_.end()) end_session_job_locked(it->second, *job, failure);
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
    metrics_.queue_length = static_cast<int64_t>(queued_locked());
    metrics_.kv_bytes_in_use = static_cast<int64_t>(kv_tokens_locked() * kv_bytes_per_token_);
  }
  if (failure == JobFailure::Cancelled && !job->cancelled) ++metrics_.cancelled_jobs;
  job->on_finish(failure, msg);
  answer_deferred();  // the steps that waited behind this one and did not start
  drained_.notify_all();
}

// The session's side of a step that ran (finish_job): the cache cut to a prefix of the history,
// the history as the answer leaves it, and the session handed to its next waiting step.
void Scheduler::end_session_job_locked(Session& s, Job& job, JobFailure failure) {
  const int slot = job.slot;
  if (failure == JobFailure::None && job.keep_after >= 0) ctx_->truncate(slot, job.keep_after);
  // A step that ends without an answer (client gone, failed, cut by shutdown) leaves the
  // history as it was before the step: the device never saw its tokens and resends it. A
  // cancelled step keeps what it appended and generated (its answer says how far it got).
  if (failure != JobFailure::None && !job.cancelled && job.history_before >= 0 &&
      job.history_before <= static_cast<int>(s.history.size())) {
    cut_history(s, job.history_before);
  }
  // Whatever happened, the cache holds a prefix of the history (drafts beyond it dropped) but
  // never its last token, so that the next step has a logits row to feed even with an empty
  // append: a step stopped by a cancel, or rolled back after a hang-up, may have fed it.
  const int keep =
      std::min(ctx_->seq_length(slot), std::max(0, static_cast<int>(s.history.size()) - 1));
  ctx_->truncate(slot, keep);
  s.kv_len = keep;
  s.last_used = Clock::now();
  job.history_after = static_cast<int>(s.history.size());
  step_ended_locked(s);  // `s` may be gone after it (a close waited for this step)
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

// Decoding jobs first (one token left to feed), in arrival order; then prefill chunks within
// --batch-tokens and the prefill budget, the keys (job owners) taking turns at going first
// (fair_share.h turn_order), each key's jobs in arrival order.
Scheduler::BatchPlan Scheduler::plan_batch(const std::vector<std::shared_ptr<Job>>& active) {
  BatchPlan plan;
  int budget = options_.batch_tokens;
  std::vector<size_t> order = prefill_order(active);
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

// active's indices: the decoding jobs in arrival order, then the prefilling ones in turn_order,
// the key after the one that went first last batch going first now.
std::vector<size_t> Scheduler::prefill_order(const std::vector<std::shared_ptr<Job>>& active) {
  std::vector<size_t> order;
  std::vector<size_t> prefilling;
  std::vector<std::string> keys;  // [prefilling.size()] their owners
  for (size_t j = 0; j < active.size(); ++j) {
    if (active[j]->feed.size() - active[j]->fed <= 1) {
      order.push_back(j);
    } else {
      prefilling.push_back(j);
      keys.push_back(active[j]->owner);
    }
  }
  std::string first;
  for (size_t i : turn_order(keys, prefill_first_, prefill_turned_, &first)) {
    order.push_back(prefilling[i]);
  }
  if (!prefilling.empty()) {
    prefill_first_ = first;
    prefill_turned_ = true;
  }
  return order;
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
      metrics_.queue_length = static_cast<int64_t>(queued_locked());
    }
    answer_deferred();
    if (expired) {
      fail_all_for_shutdown(active);
    } else if (!active.empty()) {
      run_batch(active);
    }
    drained_.notify_all();
  }
  for (auto& job : active) job->on_finish(JobFailure::Draining, "the server is shutting down");
  {
    std::lock_guard lk(mu_);
    for (auto& job : waiting_) defer_answer_locked(job, JobFailure::Draining, "shutting down");
    waiting_.clear();
  }
  answer_deferred();
}

// --drain-timeout passed: every queued and running job ends now with a 503.
void Scheduler::fail_all_for_shutdown(std::vector<std::shared_ptr<Job>>& active) {
  static const std::string why = "the server is shutting down and its drain time ran out";
  std::deque<std::shared_ptr<Job>> queued;
  {
    std::lock_guard lk(mu_);
    // The waiting steps first, so that no step ending below starts one of them; they never
    // began, so their sessions have nothing to undo for them.
    for (auto& job : waiting_) {
      auto it = sessions_.find(job->session_id);
      if (it != sessions_.end()) --it->second.waiting;
    }
    metrics_.drain_failed_jobs += waiting_.size() + pending_.size() + active.size();
    queued.swap(waiting_);
    for (auto& job : pending_) {
      auto it = sessions_.find(job->session_id);
      if (it != sessions_.end()) end_unrun_step_locked(it->second, job->history_before);
      queued.push_back(job);
    }
    pending_.clear();
  }
  for (auto& job : queued) job->on_finish(JobFailure::Draining, why);
  for (auto& job : active) finish_job(job, JobFailure::Draining, why);
  active.clear();
}

bool Scheduler::drain(double timeout_s) {
  std::unique_lock lk(mu_);
  draining_ = true;
  auto idle = [&] { return pending_.empty() && active_count_ == 0 && waiting_.empty(); };
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
