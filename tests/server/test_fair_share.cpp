// The rules by which the server's queues take turns between keys (src/server/fair_share.h,
// docs/server.md "Fair shares between keys"): deterministic, no sockets, no timing.
#include "server/fair_share.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tandem::server {
namespace {

TEST(FairShare, NextTurnGoesByNameAndWraps) {
  const std::vector<std::string> keys = {"a", "b", "c"};
  EXPECT_EQ(next_turn(keys, "", false), "a");
  EXPECT_EQ(next_turn(keys, "a", true), "b");
  EXPECT_EQ(next_turn(keys, "c", true), "a");
  EXPECT_EQ(next_turn(keys, "bb", true), "c");  // the key that went last has no work now
  EXPECT_EQ(next_turn(keys, "", true), "a");    // the anonymous key "" sorts first
}

TEST(FairShare, TurnOrderPutsTheNextKeyFirstAndKeepsArrivalOrderWithinAKey) {
  const std::vector<std::string> keys = {"A", "A", "B", "A", "B"};
  std::string first;
  EXPECT_EQ(turn_order(keys, "", false, &first), (std::vector<size_t>{0, 1, 3, 2, 4}));
  EXPECT_EQ(first, "A");
  EXPECT_EQ(turn_order(keys, first, true, &first), (std::vector<size_t>{2, 4, 0, 1, 3}));
  EXPECT_EQ(first, "B");
  EXPECT_EQ(turn_order(keys, first, true, &first), (std::vector<size_t>{0, 1, 3, 2, 4}));
  EXPECT_TRUE(turn_order({}, "A", true, &first).empty());
}

// The bound the docs give: over any K consecutive batches with prefill from K keys, every key
// goes first once, however many jobs each key has.
TEST(FairShare, EveryKeyGoesFirstOnceInKBatches) {
  std::vector<std::string> keys(100, "flood");  // one key with 100 prefilling jobs
  keys.push_back("device");
  keys.push_back("lab");
  std::string first;
  bool has = false;
  std::vector<std::string> firsts;
  for (int batch = 0; batch < 6; ++batch) {
    const std::vector<size_t> order = turn_order(keys, first, has, &first);
    has = true;
    ASSERT_EQ(order.size(), keys.size());
    EXPECT_EQ(keys[order.front()], first);
    firsts.push_back(first);
  }
  EXPECT_EQ(firsts, (std::vector<std::string>{"device", "flood", "lab", "device", "flood", "lab"}));
}

// Splits a per-batch prefill budget the way plan_batch does: jobs in turn_order take rows while
// the budget lasts. Key A has 8 long jobs, key B one job of `b_rows`; returns the batches B
// needs. Alone B needs ceil(b_rows / budget); with A flooding at most K = 2 times as many.
int batches_for_b(int a_jobs, int a_rows, int b_rows, int budget) {
  std::vector<std::string> keys;
  std::vector<int> left;
  for (int j = 0; j < a_jobs; ++j) {
    keys.push_back("A");
    left.push_back(a_rows);
  }
  keys.push_back("B");
  left.push_back(b_rows);
  std::string first;
  bool has = false;
  for (int batch = 1; batch < 100000; ++batch) {
    int room = budget;
    for (size_t j : turn_order(keys, first, has, &first)) {
      const int take = std::min(room, left[j]);
      left[j] -= take;
      room -= take;
    }
    has = true;
    if (left.back() == 0) return batch;
  }
  return -1;
}

TEST(FairShare, AFloodingKeyAtMostDoublesAnotherKeysPrefillBatches) {
  EXPECT_EQ(batches_for_b(0, 0, 4, 2), 2);           // alone: 4 rows at 2 a batch
  EXPECT_LE(batches_for_b(8, 3000, 4, 2), 2 * 2);    // 8 jobs of 3,000 rows: at most twice
  EXPECT_LE(batches_for_b(64, 3000, 4, 2), 2 * 2);   // independent of how many jobs A has
  EXPECT_LE(batches_for_b(8, 3000, 40, 16), 2 * 3);  // ceil(40 / 16) = 3 alone
}

TEST(FairShare, LeastServedPicksTheKeyHoldingFewestSlotsThenTakesTurns) {
  const std::vector<std::string> waiting = {"A", "A", "B", "C", "B"};
  EXPECT_EQ(least_served(waiting, {}, "", false), 0u);                    // A's oldest
  EXPECT_EQ(least_served(waiting, {{"A", 4}}, "", false), 2u);            // B's oldest
  EXPECT_EQ(least_served(waiting, {{"A", 4}, {"B", 1}}, "", false), 3u);  // C holds none
  EXPECT_EQ(least_served(waiting, {{"A", 1}, {"B", 1}, {"C", 1}}, "", false), 0u);
  // All hold as few (a slot just freed): the key after the one served last, wrapping.
  EXPECT_EQ(least_served(waiting, {}, "A", true), 2u);
  EXPECT_EQ(least_served(waiting, {}, "B", true), 3u);
  EXPECT_EQ(least_served(waiting, {}, "C", true), 0u);
  EXPECT_EQ(least_served(waiting, {{"B", 2}}, "A", true), 3u);  // B holds more: C's turn
}

// One slot, key A with 6 waiting jobs, key B with 2: as the slot frees, the keys alternate.
TEST(FairShare, OneSlotAlternatesBetweenKeys) {
  std::vector<std::string> waiting = {"A", "A", "A", "A", "A", "A", "B", "B"};
  std::string last;
  bool has = false;
  std::string served;
  while (!waiting.empty()) {
    const size_t i = least_served(waiting, {}, last, has);
    last = waiting[i];
    has = true;
    served += last;
    waiting.erase(waiting.begin() + static_cast<std::ptrdiff_t>(i));
  }
  EXPECT_EQ(served, "ABABAAAA");
}

TEST(FairShare, QueuePopsKeysInTurnAndEachKeyInArrivalOrder) {
  FairQueue<int> q;
  for (int i = 0; i < 5; ++i) q.push("A", i);
  q.push("B", 100);
  q.push("B", 101);
  q.push("", 200);
  EXPECT_EQ(q.size(), 8u);
  EXPECT_EQ(q.size_of("A"), 5u);
  std::vector<int> got;
  while (!q.empty()) got.push_back(q.pop());
  EXPECT_EQ(got, (std::vector<int>{200, 0, 100, 1, 101, 2, 3, 4}));
  EXPECT_EQ(q.size(), 0u);
}

// A key that arrives while another key's backlog is served waits at most K pops.
TEST(FairShare, QueueServesALateKeyWithinKPops) {
  FairQueue<std::string> q;
  for (int i = 0; i < 64; ++i) q.push("A", std::string("a").append(std::to_string(i)));
  EXPECT_EQ(q.pop(), "a0");
  q.push("B", "b0");
  EXPECT_EQ(q.pop(), "b0");  // B is next by name after A
  EXPECT_EQ(q.pop(), "a1");
  q.push("0", "z");  // a key sorting before A: its turn comes after the wrap, at once
  EXPECT_EQ(q.pop(), "z");
  EXPECT_EQ(q.pop(), "a2");
}

}  // namespace
}  // namespace tandem::server
