// The books of pipelined routing (docs/client.md, "Pipelined routing"): the consultations out,
// earliest first, and the tokens produced past them, held back until the answers agree.
//
//   flights   f1 sent at p1, f2 sent at p2                (p1 < p2; a few at most)
//   history   ... p1 | a b c | p2 | d e                   (a..e held: decoded past p1)
//   f1 agrees   a b c are published; d e stay held behind f2
//   f1 differs  everything is dropped, f2's ticket is abandoned, the decoder goes back to p1
//
// Bookkeeping only: the ledger says which tokens are settled and which consultations are void;
// putting the decoder back (history, router, sampler, the small model's KV) is the decoder's.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

#include "tandem/client.h"

namespace tandem {

class PipelineLedger {
 public:
  // A consultation whose answer is still out (pipelined route or speculative mode), and the
  // decoder as it was at its position: the router after its decision, the sampler, the small
  // model's logits (and hidden state) there. An answer other than `guess` puts all of it back,
  // so the decoder then goes on exactly as the blocking mode would have.
  struct Flight {
    uint64_t ticket = 0;  // CloudLink's
    size_t pos = 0;       // history length at the consulted position
    Router::State router{};
    Sampler::State sampler{};
    std::vector<float> logits{}, hidden{};  // [n_vocab], [n_embd] or empty (not kept)
    float score = 0;
    double threshold = 0;
    TokenId edge_guess = -1;        // route: the small model's top-1 at pos
    std::vector<TokenId> guess{};   // what the device assumes the cloud answers
    std::vector<TokenId> drafts{};  // speculative: the block out for verification (empty: route)
    std::chrono::steady_clock::time_point sent{};
  };

  // A token decoded past an unanswered consultation: published once the answer agrees. The
  // router, sampler and history length as they were right after it, for a callback that stops
  // the answer there (the blocking mode would have stopped in that state).
  struct Held {
    EdgeToken token{};
    Router::State router{};
    Sampler::State sampler{};
    size_t history_len = 0;
  };

  // Whether a consultation is out: every token produced meanwhile is held, not published.
  bool in_flight() const { return !flights_.empty(); }
  size_t flights_out() const { return flights_.size(); }
  // The consultation sent first, whose answer settles next (in_flight() only).
  const Flight& earliest() const { return flights_.front(); }

  // Tracks a consultation just sent; returns it as kept.
  const Flight& send(Flight flight);
  // Takes the earliest consultation off the books, to settle its answer.
  Flight take_earliest();

  // A token produced while a consultation is out.
  void hold(Held held) { held_.push_back(std::move(held)); }
  size_t held_count() const { return held_.size(); }
  // How the assumed answer ends (the length, the context, an end-of-generation token); it
  // stands once no consultation out can change it.
  void hold_stop(StopReason why) { held_stop_ = why; }

  // After the earliest answer agreed (take_earliest): the held tokens it settles, in order --
  // those up to where the next consultation was sent, or every one when none is out; later
  // ones stay held.
  std::vector<Held> take_settled();
  // The held stop, taken, once no consultation is out; nullopt while one is (or none is held).
  std::optional<StopReason> take_settled_stop();

  // An answer differed from its guess (or the callback stopped at a held token): the held
  // tokens, the held stop and the consultations still out, all built on the guess, are void.
  // Returns those consultations' tickets, for the link to abandon.
  std::vector<uint64_t> drop_all();

 private:
  std::deque<Flight> flights_;  // earliest first
  std::vector<Held> held_;      // in the order produced
  std::optional<StopReason> held_stop_;
};

}  // namespace tandem
