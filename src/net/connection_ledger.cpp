#include "net/connection_ledger.h"

#include <algorithm>

namespace tandem::net {

ConnectionLedger::ConnectionLedger(Limits limits, ConnectionCounters* counters)
    : limits_(limits), counters_(counters) {}

uint64_t ConnectionLedger::add(std::weak_ptr<Evictable> who, std::string address) {
  std::lock_guard lk(mu_);
  const uint64_t id = next_id_++;
  Account& a = accounts_[id];
  a.who = std::move(who);
  a.address = std::move(address);
  return id;
}

void ConnectionLedger::remove(uint64_t id) {
  std::lock_guard lk(mu_);
  auto it = accounts_.find(id);
  if (it == accounts_.end()) return;
  close_locked(it->second);
  accounts_.erase(it);
  publish_locked();
}

ConnectionLedger::Admit ConnectionLedger::admit(uint64_t id, size_t n) {
  Victims victims;
  Admit result;
  {
    std::lock_guard lk(mu_);
    auto it = accounts_.find(id);
    result = it == accounts_.end() ? Admit::Gone : admit_locked(id, it->second, n, victims);
  }
  evict_all(victims, Evictable::Why::SlowReader);
  return result;
}

ConnectionLedger::Admit ConnectionLedger::reserve(uint64_t id, size_t n) {
  Victims victims;
  Admit result = Admit::Gone;
  {
    std::lock_guard lk(mu_);
    auto it = accounts_.find(id);
    if (it != accounts_.end()) result = check_locked(id, it->second, n, victims);
    if (result == Admit::Ok) {
      it->second.reserved += n;
      total_ += n;
      publish_locked();
    }
  }
  evict_all(victims, Evictable::Why::SlowReader);
  return result;
}

ConnectionLedger::Admit ConnectionLedger::settle(uint64_t id, size_t reserved, size_t actual) {
  Victims victims;
  Admit result = Admit::Ok;
  {
    std::lock_guard lk(mu_);
    auto it = accounts_.find(id);
    if (it == accounts_.end() || it->second.closed) return Admit::Gone;
    Account& a = it->second;
    const size_t back = std::min(reserved, a.reserved);
    a.reserved -= back;
    total_ -= back;
    if (actual <= reserved) {  // within its own room: taken as it is
      if (a.queued == 0) a.unread_since = Clock::now();
      a.queued += actual;
      total_ += actual;
    } else {
      result = admit_locked(id, a, actual, victims);
    }
    publish_locked();
  }
  evict_all(victims, Evictable::Why::SlowReader);
  return result;
}

void ConnectionLedger::release(uint64_t id, size_t n) {
  std::lock_guard lk(mu_);
  auto it = accounts_.find(id);
  if (it == accounts_.end() || it->second.closed) return;
  Account& a = it->second;
  n = std::min(n, a.queued);
  a.queued -= n;
  total_ -= n;
  // The client read a whole piece: what waits now has waited only from here.
  a.unread_since = Clock::now();
  publish_locked();
}

void ConnectionLedger::close(uint64_t id) {
  std::lock_guard lk(mu_);
  auto it = accounts_.find(id);
  if (it == accounts_.end()) return;
  close_locked(it->second);
  publish_locked();
}

void ConnectionLedger::set_idle(uint64_t id, bool idle) {
  std::lock_guard lk(mu_);
  auto it = accounts_.find(id);
  if (it != accounts_.end()) it->second.idle_since = idle ? Clock::now() : Clock::time_point{};
}

bool ConnectionLedger::evict_idle(const std::string* address) {
  std::weak_ptr<Evictable> victim;
  {
    std::lock_guard lk(mu_);
    Account* oldest = oldest_idle(address ? *address : busiest_idle_address());
    if (!oldest) return false;
    // Taken off the books at once, so that the next newcomer picks another one.
    close_locked(*oldest);
    victim = oldest->who;
    if (counters_) ++counters_->idle_connections_evicted;
  }
  evict_all({victim}, Evictable::Why::Idle);
  return true;
}

// The address with the most idle connections (on a tie, the one idle longest): one that opens
// connections fast makes its own the ones to go, not the single idle connection of a device
// that was there before it.
std::string ConnectionLedger::busiest_idle_address() const {
  struct Idle {
    int n = 0;
    Clock::time_point oldest = Clock::time_point::max();
  };
  std::unordered_map<std::string, Idle> idle;
  for (const auto& [id, a] : accounts_) {
    if (a.closed || a.idle_since == Clock::time_point{}) continue;
    Idle& i = idle[a.address];
    ++i.n;
    i.oldest = std::min(i.oldest, a.idle_since);
  }
  const std::pair<const std::string, Idle>* busiest = nullptr;
  for (const auto& entry : idle) {
    const Idle& i = entry.second;
    if (!busiest || i.n > busiest->second.n ||
        (i.n == busiest->second.n && i.oldest < busiest->second.oldest))
      busiest = &entry;
  }
  return busiest ? busiest->first : std::string();
}

ConnectionLedger::Account* ConnectionLedger::oldest_idle(const std::string& address) {
  Account* oldest = nullptr;
  for (auto& [id, a] : accounts_) {
    if (a.closed || a.idle_since == Clock::time_point{} || a.address != address) continue;
    if (!oldest || a.idle_since < oldest->idle_since) oldest = &a;
  }
  return oldest;
}

size_t ConnectionLedger::total() const {
  std::lock_guard lk(mu_);
  return total_;
}

ConnectionLedger::Admit ConnectionLedger::admit_locked(uint64_t id, Account& a, size_t n,
                                                       Victims& victims) {
  const Admit checked = check_locked(id, a, n, victims);
  if (checked != Admit::Ok) return checked;
  if (a.queued == 0) a.unread_since = Clock::now();
  a.queued += n;
  total_ += n;
  publish_locked();
  return Admit::Ok;
}

// Whether `n` more bytes fit connection `a` and the total (closing stalled readers for room).
ConnectionLedger::Admit ConnectionLedger::check_locked(uint64_t id, Account& a, size_t n,
                                                       Victims& victims) {
  if (a.closed) return Admit::Gone;
  // A small answer into an empty queue is always taken: an error, /health or a short answer
  // never fails for the bounds (at most small_answer x connections beyond --max-write-total).
  const bool small = n <= limits_.small_answer && a.queued + a.reserved == 0;
  if (!small && a.queued + a.reserved + n > limits_.per_connection) {
    if (counters_) ++counters_->answers_refused_connection;
    return Admit::OverConnection;
  }
  if (!small && total_ + n > limits_.total && !make_room(id, a, n, victims)) {
    if (counters_) ++counters_->answers_refused_total;
    return Admit::OverTotal;
  }
  return Admit::Ok;
}

// Closes the connections that have left answer bytes unread longest, oldest first, until `n`
// more bytes fit; only connections stalled for min_stall and longer than the requester, so that
// a slow reader cannot push out a faster one. Nothing is closed when that would not make room.
bool ConnectionLedger::make_room(uint64_t id, const Account& a, size_t n, Victims& victims) {
  const Clock::time_point now = Clock::now();
  Clock::time_point cutoff = now - limits_.min_stall;
  if (a.queued > 0) cutoff = std::min(cutoff, a.unread_since);
  std::vector<Account*> stalled;
  for (auto& [other, b] : accounts_) {
    if (other != id && !b.closed && b.queued > 0 && b.unread_since < cutoff) stalled.push_back(&b);
  }
  std::sort(stalled.begin(), stalled.end(),
            [](const Account* x, const Account* y) { return x->unread_since < y->unread_since; });
  size_t freed = 0, take = 0;
  while (take < stalled.size() && total_ - freed + n > limits_.total) {
    freed += stalled[take]->queued + stalled[take]->reserved;
    ++take;
  }
  if (total_ - freed + n > limits_.total) return false;
  for (size_t i = 0; i < take; ++i) {
    close_locked(*stalled[i]);
    victims.push_back(stalled[i]->who);
    if (counters_) ++counters_->slow_clients_evicted;
  }
  return true;
}

void ConnectionLedger::close_locked(Account& a) {
  total_ -= a.queued + a.reserved;
  a.queued = 0;
  a.reserved = 0;
  a.closed = true;
  a.idle_since = {};
}

void ConnectionLedger::publish_locked() {
  if (counters_) counters_->write_queued_bytes = static_cast<int64_t>(total_);
}

// Outside the lock: a connection's last reference may go here, and its destructor removes it.
void ConnectionLedger::evict_all(const Victims& victims, Evictable::Why why) {
  for (const auto& weak : victims) {
    if (auto who = weak.lock()) who->evict(why);
  }
}

}  // namespace tandem::net
