// The ledger of queued answer bytes and idle connections (src/net/connection_ledger.h) on its
// own, without sockets: the per-connection and total bounds, the small-answer allowance, which
// connections are closed to make room, reservations, and idle eviction.
#include "net/connection_ledger.h"

#include <gtest/gtest.h>

#include <thread>

namespace tandem::net {
namespace {

using Admit = ConnectionLedger::Admit;
using namespace std::chrono_literals;

struct Fake : Evictable {
  void evict(Why why) override { evicted.push_back(why); }
  std::vector<Why> evicted;
};

constexpr size_t kKiB = 1024;

ConnectionLedger::Limits limits(std::chrono::milliseconds grace = 0ms) {
  return {.per_connection = 100 * kKiB,
          .total = 250 * kKiB,
          .small_answer = 16 * kKiB,
          .min_stall = grace};
}

TEST(ConnectionLedger, PerConnectionBoundCountsTheFirstPieceButSmallAnswersAlwaysFit) {
  ConnectionCounters counters;
  ConnectionLedger ledger(limits(), &counters);
  auto a = std::make_shared<Fake>();
  const uint64_t id = ledger.add(a, "1.2.3.4");
  EXPECT_EQ(ledger.admit(id, 101 * kKiB), Admit::OverConnection);
  EXPECT_EQ(ledger.admit(id, 90 * kKiB), Admit::Ok);
  EXPECT_EQ(ledger.admit(id, 11 * kKiB), Admit::OverConnection)
      << "not small: the queue is not empty";
  ledger.release(id, 90 * kKiB);
  EXPECT_EQ(ledger.total(), 0u);
  EXPECT_EQ(counters.answers_refused_connection, 2u);
  EXPECT_EQ(counters.write_queued_bytes, 0);
}

TEST(ConnectionLedger, OverTheTotalTheOldestStalledReadersAreClosedFirst) {
  ConnectionCounters counters;
  ConnectionLedger ledger(limits(), &counters);
  std::vector<std::shared_ptr<Fake>> fakes;
  std::vector<uint64_t> ids;
  for (int i = 0; i < 4; ++i) {
    fakes.push_back(std::make_shared<Fake>());
    ids.push_back(ledger.add(fakes.back(), "10.0.0." + std::to_string(i)));
  }
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(ledger.admit(ids[i], 80 * kKiB), Admit::Ok);
    std::this_thread::sleep_for(2ms);  // distinct ages: 0 is the oldest
  }
  EXPECT_EQ(ledger.admit(ids[3], 90 * kKiB), Admit::Ok) << "room made by closing the oldest";
  EXPECT_EQ(fakes[0]->evicted.size(), 1u);
  EXPECT_TRUE(fakes[1]->evicted.empty());
  EXPECT_EQ(ledger.total(), 250 * kKiB);
  EXPECT_EQ(ledger.admit(ids[0], 1), Admit::Gone);
  EXPECT_EQ(counters.slow_clients_evicted, 1u);
}

TEST(ConnectionLedger, NobodyIsClosedWithinTheGraceAndTheAnswerIsRefused) {
  ConnectionCounters counters;
  ConnectionLedger ledger(limits(/*grace=*/1h), &counters);
  auto a = std::make_shared<Fake>(), b = std::make_shared<Fake>(), c = std::make_shared<Fake>();
  const uint64_t ia = ledger.add(a, "a"), ib = ledger.add(b, "b"), ic = ledger.add(c, "c");
  ASSERT_EQ(ledger.admit(ia, 100 * kKiB), Admit::Ok);
  ASSERT_EQ(ledger.admit(ib, 100 * kKiB), Admit::Ok);
  EXPECT_EQ(ledger.admit(ic, 60 * kKiB), Admit::OverTotal);
  EXPECT_EQ(ledger.admit(ic, 2 * kKiB), Admit::Ok) << "a small answer into an empty queue fits";
  EXPECT_TRUE(a->evicted.empty());
  EXPECT_EQ(counters.answers_refused_total, 1u);
}

// A reservation counts towards the bounds while its answer is built, but its connection is no
// slow reader: nobody reads what is not written yet.
TEST(ConnectionLedger, AReservationIsSwappedForItsAnswer) {
  ConnectionLedger ledger(limits(), nullptr);
  auto a = std::make_shared<Fake>(), b = std::make_shared<Fake>(), c = std::make_shared<Fake>();
  const uint64_t ia = ledger.add(a, "a"), ib = ledger.add(b, "b"), ic = ledger.add(c, "c");
  ASSERT_EQ(ledger.reserve(ia, 100 * kKiB), Admit::Ok);
  ASSERT_EQ(ledger.admit(ib, 100 * kKiB), Admit::Ok);
  EXPECT_EQ(ledger.reserve(ic, 101 * kKiB), Admit::OverConnection);
  std::this_thread::sleep_for(2ms);
  EXPECT_EQ(ledger.reserve(ic, 100 * kKiB), Admit::Ok) << "room made by closing b, not a";
  EXPECT_TRUE(a->evicted.empty());
  EXPECT_EQ(b->evicted.size(), 1u);
  EXPECT_EQ(ledger.settle(ia, 100 * kKiB, 70 * kKiB), Admit::Ok);
  EXPECT_EQ(ledger.total(), 170 * kKiB);
  ledger.remove(ia);
  ledger.remove(ic);
  EXPECT_EQ(ledger.total(), 0u);
}

TEST(ConnectionLedger, TheOldestIdleConnectionOfTheAddressMakesWay) {
  ConnectionCounters counters;
  ConnectionLedger ledger(limits(), &counters);
  auto old_x = std::make_shared<Fake>(), new_x = std::make_shared<Fake>(),
       y = std::make_shared<Fake>();
  const uint64_t i1 = ledger.add(old_x, "x"), i2 = ledger.add(new_x, "x"), i3 = ledger.add(y, "y");
  ledger.set_idle(i3, true);
  std::this_thread::sleep_for(2ms);
  ledger.set_idle(i1, true);
  std::this_thread::sleep_for(2ms);
  ledger.set_idle(i2, true);
  const std::string x = "x";
  EXPECT_TRUE(ledger.evict_idle(&x));
  EXPECT_EQ(old_x->evicted, std::vector<Evictable::Why>{Evictable::Why::Idle});
  EXPECT_TRUE(ledger.evict_idle(nullptr)) << "any address: x and y have one idle each";
  EXPECT_EQ(y->evicted.size(), 1u) << "y, the older";
  ledger.set_idle(i2, false);
  EXPECT_FALSE(ledger.evict_idle(nullptr)) << "a busy connection is never taken";
  EXPECT_EQ(counters.idle_connections_evicted, 2u);
}

// At --max-connections, the idle connections of the address holding the most go first, so a
// flood of fresh connections from a few addresses does not close a device's one connection.
TEST(ConnectionLedger, AtTheTotalCapTheBusiestAddressGivesWayFirst) {
  ConnectionLedger ledger(limits(), nullptr);
  auto device = std::make_shared<Fake>();
  ledger.set_idle(ledger.add(device, "device"), true);
  std::this_thread::sleep_for(2ms);
  std::vector<std::shared_ptr<Fake>> flood;
  for (int i = 0; i < 3; ++i) {
    flood.push_back(std::make_shared<Fake>());
    ledger.set_idle(ledger.add(flood.back(), "flood"), true);
  }
  EXPECT_TRUE(ledger.evict_idle(nullptr));
  EXPECT_TRUE(ledger.evict_idle(nullptr));
  EXPECT_TRUE(device->evicted.empty());
  EXPECT_EQ(flood[0]->evicted.size(), 1u);
  EXPECT_EQ(flood[1]->evicted.size(), 1u);
}

}  // namespace
}  // namespace tandem::net
