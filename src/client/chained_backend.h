// Chained steps: how a backend keeps several steps of one cloud session in flight at once
// (docs/client.md, "Pipelined routing"; docs/protocol.md, "How the edge orders its steps").
//
// A chained step is built on the decoder's side in the order the steps are sent, on the
// assumption that every step built before it is answered as the edge guessed (a sync: applied; a
// consultation: the device's own tokens). It then runs on a lane -- a connection of its own --
// while the earlier ones are still out; the server runs a session's queued steps in the order
// they arrive. The edge settles the steps in that same order: one answered as guessed keeps the
// chain; one answered otherwise, failed or refused makes every later one stale, and the backend
// falls back to the prefix of the history it knows the server holds, cutting the session back
// there (rewind_to) with its next step -- at once, stale steps still out or not.
//
// Every step names the length and the hash of the history it builds on (expected_pos,
// expected_hash), so a step that reaches the server out of turn -- one that overtook the step it
// builds on, or a stale one that arrives after the cut -- is refused (409) instead of running on
// a history it was not built for. So the order in which the steps arrive can cost a redo, never
// a wrong answer.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tandem/client.h"

namespace tandem {

struct ChainedStep {
  std::string session;           // the session it was built for
  std::string body;              // the request (JSON)
  std::vector<TokenId> history;  // the edge's history that the step brings the session to
  std::vector<TokenId> guess;    // the answer the edge assumes (empty: a sync, or no guess)
  CloudOp op;
  size_t from = 0;  // where its append (after any cut) starts: it writes nothing before this
  uint64_t generation = 0;  // the cuts sent up to and including this step
};

class ChainedBackend {
 public:
  virtual ~ChainedBackend() = default;
  // Steps that may be in flight at once: 0 while chaining is impossible (the server does not
  // queue a session's steps or check their history's hash, or no session is open: the plain
  // step() opens one). Not while a plain step() runs.
  virtual int chain_lanes() const = 0;
  // Builds the next step of the chain, to any history (one that does not extend the chain cuts
  // the session back). Not while a plain step() runs; not thread-safe.
  virtual ChainedStep chain(std::span<const TokenId> history, const CloudOp& op,
                            std::vector<TokenId> guess) = 0;
  // One more token of the guess of `step`, the last step chain() built and not yet settled (the
  // decoder learns its own next token after the step went out). Not thread-safe.
  virtual void extend_guess(ChainedStep& step, TokenId token) = 0;
  // Runs a step on lane `lane`'s connection; any thread, one step per lane at a time. The answer
  // (checked as step() checks it); nullopt when the server refused the step as out of order or
  // the session is gone (409, 410): do it again with step(). Throws CloudError.
  virtual std::optional<CloudStepResult> run_chained(int lane, const ChainedStep& step) = 0;
  // Settles a step, in chain order: its answer, or nullptr when it failed, was refused, or is
  // stale (an earlier step was not answered as guessed). Not thread-safe.
  virtual void settle(const ChainedStep& step, const CloudStepResult* answer) = 0;
  // The decoder abandoned the steps out that build on position `from_pos` or later. Where the
  // server can cancel them (feature "cancel"), the chain falls back to the history's first
  // from_pos tokens at most, and the next step cuts the session back there (rewind_to <=
  // from_pos, which the cancel spares, whichever arrives first); the steps out settle as of an
  // older cut. False, changing nothing, where the server cannot. Not thread-safe.
  virtual bool abandon_from(size_t from_pos) = 0;
  // POST .../cancel {from_pos} for `session`, on the plain step()'s connection (so not while
  // one runs): how many steps the server stopped. Throws CloudError.
  virtual int cancel(const std::string& session, size_t from_pos) = 0;
};

}  // namespace tandem
