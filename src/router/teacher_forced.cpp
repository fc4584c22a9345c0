// Teacher forcing over text and the outcome probe (tandem/router_tools.h).
#include <algorithm>
#include <fstream>

#include "tandem/error.h"
#include "tandem/router_tools.h"

namespace tandem {

int common_subsequence(const std::vector<TokenId>& a, const std::vector<TokenId>& b) {
  // One row of the dynamic programme at a time: row[j] = LCS(a[0, i), b[0, j)).
  std::vector<int> row(b.size() + 1, 0), next(b.size() + 1, 0);
  for (size_t i = 0; i < a.size(); ++i) {
    for (size_t j = 0; j < b.size(); ++j)
      next[j + 1] = a[i] == b[j] ? row[j] + 1 : std::max(row[j + 1], next[j]);
    std::swap(row, next);
  }
  return row[b.size()];
}

struct OutcomeProbe::Impl {
  Impl(const Model& edge, int n_ctx, int n_tokens, int n_threads)
      : edge_model_(edge),
        n_tokens_(n_tokens),
        edge_(edge, {.n_ctx = n_ctx + n_tokens, .n_seq = 2, .n_threads = n_threads}) {
    if (n_tokens < 1) throw Error("the outcome continuation needs at least one token");
  }

  float measure(const std::vector<TokenId>& chunk, int i, TokenId edge_top1, TokenId cloud_top1);
  float measure_answer(const std::vector<TokenId>& chunk, int i, TokenId edge_top1,
                       TokenId cloud_top1, const AnswerJudge& judge);

  // A new chunk: the slots keep only the prefix it shares with the one before.
  void switch_chunk(const std::vector<TokenId>& chunk);
  // Makes slot `slot` of ctx hold exactly chunk[0, n) (what it holds past the part shared with
  // the chunk is dropped).
  void hold(Context& ctx, int slot, const std::vector<TokenId>& chunk, int n);
  // Whether a continuation (its tokens so far) may stop early.
  using StopWhen = std::function<bool(const std::vector<TokenId>&)>;
  // Greedy continuations, one per slot, each starting with its token in `first` at position
  // `pos`: n tokens each (the first included), fewer for a slot once `stop` says so.
  std::vector<std::vector<TokenId>> continue_greedy(Context& ctx, const std::vector<TokenId>& first,
                                                    int pos, int n, const StopWhen& stop = {});

  const Model& edge_model_;  // detokenizes answers
  int n_tokens_;
  Context edge_;                                  // 2 slots: after the edge's / the cloud's token
  std::unique_ptr<Context> cloud_;                // a local cloud, or
  CloudContinuation remote_;                      // one elsewhere
  std::vector<TokenId> held_;                     // the chunk the slots hold a prefix of
  int valid_edge_[2] = {0, 0}, valid_cloud_ = 0;  // chunk tokens each slot holds
};

OutcomeProbe::OutcomeProbe(const Model& edge, const Model& cloud, int n_ctx, int n_tokens,
                           int n_threads)
    : impl_(std::make_unique<Impl>(edge, n_ctx, n_tokens, n_threads)) {
  impl_->cloud_ = std::make_unique<Context>(
      cloud, ContextParams{.n_ctx = n_ctx + n_tokens, .n_seq = 1, .n_threads = n_threads});
}

OutcomeProbe::OutcomeProbe(const Model& edge, CloudContinuation cloud, int n_ctx, int n_tokens,
                           int n_threads)
    : impl_(std::make_unique<Impl>(edge, n_ctx, n_tokens, n_threads)) {
  impl_->remote_ = std::move(cloud);
}

OutcomeProbe::~OutcomeProbe() = default;

float OutcomeProbe::measure(const std::vector<TokenId>& chunk, int i, TokenId edge_top1,
                            TokenId cloud_top1) {
  return impl_->measure(chunk, i, edge_top1, cloud_top1);
}

float OutcomeProbe::measure_answer(const std::vector<TokenId>& chunk, int i, TokenId edge_top1,
                                   TokenId cloud_top1, const AnswerJudge& judge) {
  return impl_->measure_answer(chunk, i, edge_top1, cloud_top1, judge);
}

void OutcomeProbe::Impl::hold(Context& ctx, int slot, const std::vector<TokenId>& chunk, int n) {
  int& valid = &ctx == cloud_.get() ? valid_cloud_ : valid_edge_[slot];
  valid = std::min(valid, n);
  ctx.truncate(slot, valid);
  constexpr int kChunk = 512;  // prefill rows per pass
  while (valid < n) {
    std::vector<BatchToken> batch;
    for (int p = valid; p < std::min(n, valid + kChunk); ++p)
      batch.push_back({chunk[p], p, slot, false, false});
    ctx.decode(batch);
    valid += static_cast<int>(batch.size());
  }
}

std::vector<std::vector<TokenId>> OutcomeProbe::Impl::continue_greedy(
    Context& ctx, const std::vector<TokenId>& first, int pos, int n, const StopWhen& stop) {
  std::vector<std::vector<TokenId>> out;
  for (TokenId t : first) out.push_back({t});
  std::vector<bool> done(out.size(), false);
  for (int k = 1; k < n; ++k) {
    // Only the slots still going take part: a batch row's logits are its batch index's.
    std::vector<BatchToken> batch;
    std::vector<size_t> slots;
    for (size_t s = 0; s < out.size(); ++s) {
      if (!done[s] && stop) done[s] = stop(out[s]);
      if (done[s]) continue;
      batch.push_back({out[s].back(), pos + k - 1, static_cast<int32_t>(s), true, false});
      slots.push_back(s);
    }
    if (batch.empty()) break;
    ctx.decode(batch);
    for (size_t b = 0; b < slots.size(); ++b)
      out[slots[b]].push_back(argmax(ctx.logits(static_cast<int>(b))));
  }
  return out;
}

void OutcomeProbe::Impl::switch_chunk(const std::vector<TokenId>& chunk) {
  if (chunk == held_) return;
  size_t shared = 0;
  while (shared < chunk.size() && shared < held_.size() && chunk[shared] == held_[shared]) ++shared;
  const int keep = static_cast<int>(shared);
  for (int& v : valid_edge_) v = std::min(v, keep);
  valid_cloud_ = std::min(valid_cloud_, keep);
  held_ = chunk;
}

float OutcomeProbe::Impl::measure_answer(const std::vector<TokenId>& chunk, int i,
                                         TokenId edge_top1, TokenId cloud_top1,
                                         const AnswerJudge& judge) {
  if (edge_top1 == cloud_top1) return 0.0f;
  if (i + 1 < judge.answer_from) throw Error("measure_answer: position before the answer");
  switch_chunk(chunk);
  hold(edge_, 0, chunk, i + 1);
  hold(edge_, 1, chunk, i + 1);
  // The answer so far (the reference's tokens up to i), then each row's continuation.
  const std::vector<TokenId> so_far(chunk.begin() + judge.answer_from, chunk.begin() + i + 1);
  const int budget = std::max(1, judge.max_tokens - static_cast<int>(so_far.size()));
  const int room = edge_.n_ctx() - (i + 1);
  auto text_of = [&](const std::vector<TokenId>& row) {
    std::vector<TokenId> all = so_far;
    all.insert(all.end(), row.begin(), row.end());
    return edge_model_.detokenize(all);
  };
  const auto rows = continue_greedy(
      edge_, {edge_top1, cloud_top1}, i + 1, std::min(budget, room),
      [&](const std::vector<TokenId>& row) { return judge.complete(text_of(row)); });
  const int own = judge.correct(text_of(rows[0])), routed = judge.correct(text_of(rows[1]));
  return static_cast<float>(routed - own);
}

float OutcomeProbe::Impl::measure(const std::vector<TokenId>& chunk, int i, TokenId edge_top1,
                                  TokenId cloud_top1) {
  if (edge_top1 == cloud_top1) return 0.0f;
  if (!cloud_ && !remote_) throw Error("the outcome probe has no cloud to continue with");
  switch_chunk(chunk);
  // Slots hold chunk[0, i] (i + 1 tokens); the continuations start at position i + 1.
  std::vector<TokenId> cloud = {cloud_top1};
  if (cloud_) {
    hold(*cloud_, 0, chunk, i + 1);
    cloud = continue_greedy(*cloud_, {cloud_top1}, i + 1, n_tokens_)[0];
  } else if (n_tokens_ > 1) {
    std::vector<TokenId> prefix(chunk.begin(), chunk.begin() + i + 1);
    prefix.push_back(cloud_top1);
    const std::vector<TokenId> more = remote_(prefix, n_tokens_ - 1);
    cloud.insert(cloud.end(), more.begin(), more.end());
  }
  hold(edge_, 0, chunk, i + 1);
  hold(edge_, 1, chunk, i + 1);
  const auto edge = continue_greedy(edge_, {edge_top1, cloud_top1}, i + 1, n_tokens_);
  const int own = common_subsequence(edge[0], cloud), routed = common_subsequence(edge[1], cloud);
  return static_cast<float>(routed - own) / static_cast<float>(n_tokens_);
}

std::vector<TokenId> wikitext_tokens(const std::string& data_dir, const Model& model,
                                     const std::string& split) {
  const std::string path = data_dir + "/wikitext-2/" + split + ".txt";
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read " + path);
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  return model.tokenize(text, false, false);
}

std::vector<TokenId> text_chunk(const std::vector<TokenId>& all, int c, int L, const Model& model) {
  std::vector<TokenId> chunk(all.begin() + static_cast<std::ptrdiff_t>(c) * L,
                             all.begin() + static_cast<std::ptrdiff_t>(c + 1) * L);
  if (model.adds_bos()) chunk[0] = model.bos();
  return chunk;
}

void extend_chunk(Context& ctx, const std::vector<TokenId>& chunk, int end, int want_from,
                  bool want_hidden, const RowFn& fn) {
  const int n = static_cast<int>(chunk.size());
  const int start = ctx.seq_length(0);
  std::vector<BatchToken> batch;
  for (int i = start; i < end; ++i) {
    const bool want = i >= want_from && i + 1 < n;
    batch.push_back({chunk[i], i, 0, want, want && want_hidden});
  }
  if (batch.empty()) return;
  ctx.decode(batch);
  for (int i = std::max(start, want_from); i < end && i + 1 < n; ++i) {
    const int b = i - start;
    fn(i, ctx.logits(b), want_hidden ? ctx.hidden(b) : std::span<const float>());
  }
}

void run_chunk(Context& ctx, const std::vector<TokenId>& chunk, int first_row, bool want_hidden,
               const RowFn& fn, int max_rows) {
  ctx.clear(0);
  const int n = static_cast<int>(chunk.size());
  // Forward passes end after every max_rows wanted rows; the first one also holds the unwanted
  // prefix [0, first_row).
  while (ctx.seq_length(0) < n) {
    const int end = std::min(n, std::max(ctx.seq_length(0), first_row) + max_rows);
    extend_chunk(ctx, chunk, end, first_row, want_hidden, fn);
  }
}

}  // namespace tandem
