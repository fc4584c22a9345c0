#include "client/branch_set.h"

#include <algorithm>
#include <utility>

#include "tandem/vector_ops.h"

namespace tandem {

namespace {

// The n most likely tokens of a logits row other than `skip` and the model's end-of-generation
// tokens, in top_n's order. The window widens until n survive (a few end-of-generation tokens
// may rank high).
std::vector<TokenId> best_others(std::span<const float> logits, TokenId skip, size_t n,
                                 const Model& model) {
  std::vector<TokenId> best;
  for (size_t want = n + 1; best.size() < n; want *= 2) {
    best.clear();
    // log_z 0: only the order is used, not the log-probabilities.
    for (const TokenLogProb& c : top_n(logits, static_cast<int>(want), 0.0)) {
      if (best.size() < n && c.id != skip && !model.is_end_of_generation(c.id)) {
        best.push_back(c.id);
      }
    }
    if (want >= logits.size()) break;
  }
  return best;
}

// Before any answer, the rank counts are a prior worth this many answers: a third of the
// answers the small model's top-1, a sixth each its second and third choice, the rest further
// down (the Qwen pair's routed positions are near it; a pair whose cloud agrees more soon shows
// it).
constexpr double kPriorAnswers = 6;
constexpr double kPriorRanks[] = {2.0 / 6, 1.0 / 6, 1.0 / 6};
// Before a step with m rows has been timed, each row is assumed to add this share of a step
// (the Qwen 0.5B's measured cost; tandem bench --n-parallel).
constexpr double kPriorRowCost = 0.25;

}  // namespace

BranchSet::BranchSet(Context& ctx, const Model& model, Router& router, std::vector<int> seqs,
                     bool signal_hidden, int top_k_signal)
    : ctx_(ctx),
      model_(model),
      router_(router),
      signal_hidden_(signal_hidden),
      top_k_signal_(top_k_signal) {
  branches_.resize(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) branches_[i].seq = seqs[i];
  rank_counts_.assign(seqs.size() + 2, 0.0);
  double rest = 1;
  for (size_t r = 0; r <= seqs.size() && r < std::size(kPriorRanks); ++r) {
    rank_counts_[r] = kPriorAnswers * kPriorRanks[r];
    rest -= kPriorRanks[r];
  }
  rank_counts_.back() += kPriorAnswers * rest;
  step_ms_.assign(seqs.size() + 1, 0.0);
  steps_.assign(seqs.size() + 1, 0);
}

void BranchSet::note_answer(std::span<const float> logits, TokenId answer) {
  if (answer < 0 || static_cast<size_t>(answer) >= logits.size()) return;
  // Its rank in top_n's order: higher logits first, ties by the lower id.
  size_t rank = 0;
  const float a = logits[answer];
  for (TokenId t = 0; t < static_cast<TokenId>(logits.size()) && rank <= branches_.size(); ++t) {
    rank += logits[t] > a || (logits[t] == a && t < answer);
  }
  rank_counts_[rank] += 1;
}

void BranchSet::note_step(size_t rows, double ms) {
  if (rows >= step_ms_.size()) return;
  ++steps_[rows];
  step_ms_[rows] += (ms - step_ms_[rows]) / static_cast<double>(steps_[rows]);
}

size_t BranchSet::rows() const {
  size_t n = 0;
  for (const Branch& b : branches_) n += has_row(b);
  return n;
}

size_t BranchSet::worth_forking() const {
  double total = 0;
  for (const double c : rank_counts_) total += c;
  size_t best = 0;
  double best_kept = 0, covered = 0;
  for (size_t m = 0; m <= branches_.size(); ++m) {
    covered += rank_counts_[m] / total;
    const double cost = steps_[m] > 0 && steps_[0] > 0 && step_ms_[0] > 0
                            ? step_ms_[m] / step_ms_[0]
                            : 1 + kPriorRowCost * static_cast<double>(m);
    const double kept = covered / cost;
    if (kept > best_kept) {
      best_kept = kept;
      best = m;
    }
  }
  return best;
}

void BranchSet::fork(uint64_t ticket, std::span<const TokenId> history, int main_seq,
                     std::span<const float> logits, TokenId guess, const Router::State& router,
                     size_t limit, size_t n_branches) {
  drop();
  const std::vector<TokenId> alternatives =
      best_others(logits, guess, std::min(n_branches, branches_.size()), model_);
  const auto pos = static_cast<int>(history.size());
  for (size_t i = 0; i < alternatives.size(); ++i) {
    Branch& b = branches_[i];
    // The slot keeps the prefix it shares with the main line (from the last fork) and copies
    // the rest: at most the tokens decoded since.
    const auto shared = std::mismatch(b.kv.begin(), b.kv.end(), history.begin(), history.end());
    const auto keep = static_cast<int>(shared.first - b.kv.begin());
    ctx_.truncate(b.seq, keep);
    ctx_.copy_positions(main_seq, b.seq, keep, pos);
    b.kv.assign(history.begin(), history.end());
    b.line = b.kv;
    b.line.push_back(alternatives[i]);
    b.alternative = alternatives[i];
    b.produced.clear();
    b.router = router;
    b.logits.clear();
    b.hidden.clear();
    b.open = b.line.size() < limit;
  }
  ticket_ = ticket;
  limit_ = limit;
}

void BranchSet::add_rows(std::vector<BatchToken>& batch) const {
  if (!active()) return;
  for (const Branch& b : branches_) {
    if (!has_row(b)) continue;
    batch.push_back(
        {b.line.back(), static_cast<int32_t>(b.kv.size()), b.seq, true, signal_hidden_});
  }
}

void BranchSet::take_rows(size_t first) {
  if (!active()) return;
  auto row = static_cast<int>(first);
  for (Branch& b : branches_) {
    if (!has_row(b)) continue;
    b.kv.push_back(b.line.back());
    const auto logits = ctx_.logits(row);
    b.logits.assign(logits.begin(), logits.end());
    if (signal_hidden_) {
      const auto hidden = ctx_.hidden(row);
      b.hidden.assign(hidden.begin(), hidden.end());
    }
    ++row;
    ++decoded_;
    extend(b);
  }
}

void BranchSet::extend(Branch& b) {
  if (b.line.size() >= limit_) {
    b.open = false;
    return;
  }
  RouterSignal s =
      router_signal_from_logits(b.logits, static_cast<int>(b.line.size()), top_k_signal_);
  if (signal_hidden_) s.hidden = b.hidden;
  // The decision on the branch's copy of the router; the decoder's own state goes back after.
  const Router::State main = router_.state();
  router_.restore(b.router);
  const RouteDecision d = router_.decide(s);
  if (!d.cloud) {
    router_.record(false, 1);
    b.router = router_.state();
  }
  router_.restore(main);
  if (d.cloud) {
    b.open = false;  // the decoder takes this decision itself after a takeover
    return;
  }
  const TokenId t = argmax(b.logits);
  b.line.push_back(t);
  b.produced.push_back(
      {EdgeToken{t, TokenSource::Local, d.score, -1, false, d.threshold}, b.router});
  if (model_.is_end_of_generation(t) || b.line.size() >= limit_) b.open = false;
}

std::optional<BranchSet::Takeover> BranchSet::take_over(uint64_t ticket, TokenId first,
                                                        int main_seq,
                                                        std::vector<TokenId>& main_kv) {
  const auto it = std::find_if(branches_.begin(), branches_.end(),
                               [&](const Branch& b) { return b.alternative == first; });
  std::optional<Takeover> out;
  if (ticket != 0 && ticket == ticket_ && it != branches_.end()) {
    out = Takeover{.seq = it->seq,
                   .logits = std::move(it->logits),
                   .hidden = std::move(it->hidden),
                   .produced = std::move(it->produced)};
    it->seq = main_seq;
    std::swap(it->kv, main_kv);
  }
  drop();
  return out;
}

void BranchSet::drop() {
  for (Branch& b : branches_) {
    b.open = false;
    b.alternative = -1;
    b.line.clear();
    b.produced.clear();
    b.logits.clear();
    b.hidden.clear();
  }
  ticket_ = 0;
}

}  // namespace tandem
