// What an HTTP server knows about all of its connections at once, from any thread: the answer
// bytes queued for each (for --max-write-queue) and in all (for --max-write-total), since when the
// oldest of them waits unread, and which connections sit idle between requests. Connections live
// on their own strands; this is the one place where one of them can be weighed against the others
// (close the slowest reader to make room, close the oldest idle connection to let a new one in).
//
// One mutex guards it all. It is taken once per answer piece and twice per request; only
// pressure (a bound reached) makes it scan the connections.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "tandem/http_server.h"

namespace tandem::net {

// A connection the ledger may close: for not reading while others need the room, or for idling
// while a new connection needs its slot. Called from any thread; the connection closes on its
// own strand.
class Evictable {
 public:
  enum class Why { SlowReader, Idle };
  virtual ~Evictable() = default;
  virtual void evict(Why why) = 0;
};

class ConnectionLedger {
 public:
  using Clock = std::chrono::steady_clock;
  struct Limits {
    size_t per_connection;      // --max-write-queue
    size_t total;               // --max-write-total
    size_t small_answer;        // a piece this small into an empty queue is always taken
    Clock::duration min_stall;  // a reader is closed for room only after this long unread
  };
  enum class Admit { Ok, OverConnection, OverTotal, Gone };

  ConnectionLedger(Limits limits, ConnectionCounters* counters);

  uint64_t add(std::weak_ptr<Evictable> who, std::string address);
  void remove(uint64_t id);
  // Accounts `n` bytes about to be queued for connection `id`, or says which bound refuses them.
  // Over the total, connections stalled longer than `id` (and at least min_stall) are closed,
  // oldest unread data first, when that makes room.
  Admit admit(uint64_t id, size_t n);
  // Holds room for an answer of at most `n` bytes that is still being built, by the same rules.
  // Held bytes count towards the bounds but never make their connection a slow reader.
  Admit reserve(uint64_t id, size_t n);
  // Swaps a reservation of `reserved` bytes for the `actual` answer: always taken when it is no
  // larger; a larger one is weighed as a new answer.
  Admit settle(uint64_t id, size_t reserved, size_t actual);
  void release(uint64_t id, size_t n);  // `n` queued bytes were written or given up
  void close(uint64_t id);              // the connection closed: its bytes no longer count
  void set_idle(uint64_t id, bool idle);
  // Closes the connection idle longest of `address`, or when null of the address with the most
  // idle connections; false when none is idle.
  bool evict_idle(const std::string* address);
  size_t total() const;

 private:
  struct Account {
    std::weak_ptr<Evictable> who;
    std::string address;
    size_t queued = 0;                 // handed to the connection, not yet written
    size_t reserved = 0;               // held for answers still being built
    Clock::time_point unread_since{};  // when the oldest unwritten piece began to wait
    Clock::time_point idle_since{};    // between requests since; epoch when busy
    bool closed = false;
  };
  using Victims = std::vector<std::weak_ptr<Evictable>>;

  Admit admit_locked(uint64_t id, Account& a, size_t n, Victims& victims);
  std::string busiest_idle_address() const;
  Account* oldest_idle(const std::string& address);
  Admit check_locked(uint64_t id, Account& a, size_t n, Victims& victims);
  bool make_room(uint64_t id, const Account& a, size_t n, Victims& victims);
  void close_locked(Account& a);
  void publish_locked();
  static void evict_all(const Victims& victims, Evictable::Why why);

  const Limits limits_;
  ConnectionCounters* const counters_;
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, Account> accounts_;
  uint64_t next_id_ = 1;
  size_t total_ = 0;
};

}  // namespace tandem::net
