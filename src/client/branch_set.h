// Alternatives decoded while a consultation is out (docs/client.md, "Branches"). At a routed
// position the pipelined decoder assumes the small model's top-1 and goes on; when the cloud
// answers otherwise, every token decoded on that guess is thrown away. A decode step is bound by
// reading the weights, so the small model's next choices at that position can ride in the same
// forward passes, each in a KV slot of its own; when the answer is one of them, the decoder takes
// that line over instead of decoding it again.
//
//   main line   ... p | g  x  y  z      (the decoder's slot: the guess g and what follows it)
//   branch 1    ... p | a1 u  v         (slot s1: the prefix copied from the main slot)
//   branch 2    ... p | a2 w            (slot s2)
//   answer a1   the decoder's main slot becomes s1, and u v are produced without a decode
//
// A branch holds what the blocking decoder would produce after the cloud answered its
// alternative: greedy tokens, each one decided local by the router on the branch's own copy of
// the router state. A position the router would route ends the branch before it (the decoder
// takes that decision itself after a takeover), and so do an end-of-generation token and the
// answer's length. Greedy sampling only: a sampled token would need the sampler's draws too.
//
// How many branches a fork takes is chosen to pay: a branch row makes every step of the flight
// dearer, and only helps when the cloud answers its alternative. The set learns both as it goes
// -- how often the answer is the small model's k-th choice (rank counts over the consultations
// answered, from a prior), and what a step costs with m rows riding on it (a running mean) --
// and forks the m that keeps the most decodes per unit of step time:
//
//   kept(m) = (P(rank 1) + ... + P(rank m + 1)) / (step(m) / step(0))
//
// m = 0 when the guess alone does best (a pair whose cloud rarely disagrees).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "tandem/client.h"
#include "tandem/engine.h"
#include "tandem/router.h"

namespace tandem {

class BranchSet {
 public:
  // A token a branch produced past its alternative, and the router's state right after its
  // decision (what the decoder's router is put to when the token is taken over).
  struct Produced {
    EdgeToken token{};
    Router::State router{};
  };

  // What a takeover hands the decoder: the slot, the logits (and hidden state) after what it
  // holds -- empty when its last token was never decoded -- and the tokens produced past the
  // alternative, in order.
  struct Takeover {
    int seq = 0;
    std::vector<float> logits, hidden;
    std::vector<Produced> produced;
  };

  // Slots `seqs` of ctx are the branches'; the router decides each branch position (its state
  // is put back after every decision); signal_hidden and top_k_signal as EdgeOptions'.
  BranchSet(Context& ctx, const Model& model, Router& router, std::vector<int> seqs,
            bool signal_hidden, int top_k_signal);

  bool active() const { return ticket_ != 0; }
  uint64_t ticket() const { return ticket_; }

  // At the consultation `ticket`, sent at position history.size(): forks n_branches branches
  // (at most the slots), each on one of the small model's next choices there (`logits`, the main
  // slot `main_seq` holding `history`) other than `guess` and end-of-generation tokens, best first.
  // `router` is the state the blocking decoder has after the cloud's one-token answer; a branch's
  // line grows to `limit` positions at most.
  void fork(uint64_t ticket, std::span<const TokenId> history, int main_seq,
            std::span<const float> logits, TokenId guess, const Router::State& router, size_t limit,
            size_t n_branches);

  // A decode step of the main line: each open branch's next token joins the batch (one row
  // each, after the rows already there); take_rows then reads their outputs, rows from `first`.
  void add_rows(std::vector<BatchToken>& batch) const;
  void take_rows(size_t first);

  // The answer to `ticket` is `first`: the branch that took that alternative is handed over in
  // exchange for the decoder's main slot (`main_seq`, holding `main_kv`, which then holds what
  // the branch's slot does), and the old main slot becomes a spare. nullopt when no open
  // consultation's branch took that alternative. Every branch is closed either way.
  std::optional<Takeover> take_over(uint64_t ticket, TokenId first, int main_seq,
                                    std::vector<TokenId>& main_kv);
  // The consultation settled otherwise: every branch is closed (its slot keeps what it holds,
  // for the next fork's prefix).
  void drop();

  // Tokens decoded in branches so far (every one a row of some main-line step).
  uint64_t decoded() const { return decoded_; }

  // What the choice of m learns from: a consultation's answer against the small model's logits
  // at its position (the answer's rank there), and a main-line step's time with `rows` branch
  // rows riding on it.
  void note_answer(std::span<const float> logits, TokenId answer);
  void note_step(size_t rows, double ms);
  // The number of branches a fork takes now (0..the slots), by kept(m) above.
  size_t worth_forking() const;
  // Branch rows the next step carries (its cost is noted against this count).
  size_t rows() const;

 private:
  struct Branch {
    int seq = 0;
    TokenId alternative = -1;   // the token it assumes the cloud answers; -1: not forked
    std::vector<TokenId> kv;    // what the slot holds
    std::vector<TokenId> line;  // the history it assumes: kv, then at most one token to decode
    std::vector<Produced> produced;
    Router::State router{};
    std::vector<float> logits, hidden;  // after kv (empty until its first row)
    bool open = false;
  };

  // An open branch whose line's last token is still to decode: it rides in the next step.
  static bool has_row(const Branch& b) { return b.open && b.line.size() > b.kv.size(); }
  // Decides the branch's next position after a decoded row: a token produced, or the branch
  // closed (the router routes there, the token ends the answer, or the line is full).
  void extend(Branch& b);

  Context& ctx_;
  const Model& model_;
  Router& router_;
  std::vector<Branch> branches_;
  bool signal_hidden_;
  int top_k_signal_;
  uint64_t ticket_ = 0;  // the consultation the open branches answer for; 0: none
  size_t limit_ = 0;     // longest line a branch may grow to
  uint64_t decoded_ = 0;
  // The answer's rank among the small model's choices: [0] its top-1, ..., [slots] its choice
  // after every branch's, [slots + 1] any other; seeded with a prior worth a few answers.
  std::vector<double> rank_counts_;
  // Mean step time (ms) by branch rows carried, and how many steps each mean has seen.
  std::vector<double> step_ms_;
  std::vector<uint64_t> steps_;
};

}  // namespace tandem
