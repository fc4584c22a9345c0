// PipelineLedger's books without a model: which held tokens an agreeing answer settles, when a
// held stop stands, and what a differing answer drops (docs/client.md, "Pipelined routing").
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "client/pipeline_ledger.h"

namespace tandem {
namespace {

using Flight = PipelineLedger::Flight;
using Held = PipelineLedger::Held;

Flight flight(uint64_t ticket, size_t pos) {
  return Flight{.ticket = ticket, .pos = pos};
}

// The token produced when the history reached `history_len` (its id is the length, to tell them
// apart).
Held held_at(size_t history_len) {
  Held h;
  h.token.id = static_cast<TokenId>(history_len);
  h.history_len = history_len;
  return h;
}

std::vector<TokenId> ids(const std::vector<Held>& held) {
  std::vector<TokenId> out;
  for (const Held& h : held) out.push_back(h.token.id);
  return out;
}

TEST(PipelineLedger, StartsWithNothingOut) {
  PipelineLedger ledger;
  EXPECT_FALSE(ledger.in_flight());
  EXPECT_EQ(ledger.flights_out(), 0u);
  EXPECT_EQ(ledger.held_count(), 0u);
  EXPECT_TRUE(ledger.take_settled().empty());
  EXPECT_FALSE(ledger.take_settled_stop());
  EXPECT_TRUE(ledger.drop_all().empty());
}

TEST(PipelineLedger, FlightsSettleEarliestFirst) {
  PipelineLedger ledger;
  const Flight& first = ledger.send(flight(7, 10));
  EXPECT_EQ(first.ticket, 7u);
  ledger.send(flight(8, 12));
  EXPECT_TRUE(ledger.in_flight());
  EXPECT_EQ(ledger.flights_out(), 2u);
  EXPECT_EQ(ledger.earliest().ticket, 7u);
  EXPECT_EQ(ledger.take_earliest().pos, 10u);
  EXPECT_EQ(ledger.earliest().ticket, 8u);
  EXPECT_EQ(ledger.take_earliest().pos, 12u);
  EXPECT_FALSE(ledger.in_flight());
}

// f1 sent at 10 holds 11 and 12; f2 sent at 12 holds 13 and 14 behind it.
TEST(PipelineLedger, AnAgreeingAnswerSettlesTheTokensUpToTheNextFlight) {
  PipelineLedger ledger;
  ledger.send(flight(1, 10));
  ledger.hold(held_at(11));
  ledger.hold(held_at(12));
  ledger.send(flight(2, 12));
  ledger.hold(held_at(13));
  ledger.hold(held_at(14));
  ASSERT_EQ(ledger.held_count(), 4u);

  ledger.take_earliest();  // f1's answer agreed
  EXPECT_EQ(ids(ledger.take_settled()), (std::vector<TokenId>{11, 12}));
  EXPECT_EQ(ledger.held_count(), 2u);

  ledger.take_earliest();  // f2's too: nothing is out, every held token settles
  EXPECT_EQ(ids(ledger.take_settled()), (std::vector<TokenId>{13, 14}));
  EXPECT_EQ(ledger.held_count(), 0u);
}

TEST(PipelineLedger, AHeldStopStandsOnceNothingIsOut) {
  PipelineLedger ledger;
  ledger.send(flight(1, 10));
  ledger.hold(held_at(11));
  ledger.send(flight(2, 11));
  ledger.hold_stop(StopReason::EndOfGeneration);

  ledger.take_earliest();
  ledger.take_settled();
  EXPECT_FALSE(ledger.take_settled_stop());  // f2 may still change the answer

  ledger.take_earliest();
  ledger.take_settled();
  EXPECT_EQ(ledger.take_settled_stop(), StopReason::EndOfGeneration);
  EXPECT_FALSE(ledger.take_settled_stop());  // taken
}

TEST(PipelineLedger, DropAllVoidsTheGuessAndNamesTheFlightsToAbandon) {
  PipelineLedger ledger;
  ledger.send(flight(1, 10));
  ledger.hold(held_at(11));
  ledger.send(flight(2, 11));
  ledger.send(flight(3, 11));
  ledger.hold(held_at(12));
  ledger.hold_stop(StopReason::Length);

  ledger.take_earliest();  // f1's answer differed: f2 and f3 were built on its guess
  EXPECT_EQ(ledger.drop_all(), (std::vector<uint64_t>{2, 3}));
  EXPECT_FALSE(ledger.in_flight());
  EXPECT_EQ(ledger.held_count(), 0u);
  EXPECT_FALSE(ledger.take_settled_stop());
}

}  // namespace
}  // namespace tandem
