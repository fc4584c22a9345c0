// Teacher forcing over text and trace collection, for training and scoring routers offline
// (`tandem router collect`, `tandem eval --task wikitext`): the WikiText-2 chunks, one model's
// rows over a chunk, the outcome probe, and the collector that writes a trace of the edge's and
// the cloud's views of every position (docs/router.md). The cloud is a local model here, or
// rows fetched by the caller (over HTTP: tandem/cloud_rows.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "tandem/engine.h"
#include "tandem/vector_ops.h"  // argmax, log_prob, log_sum_exp for this file's users

namespace tandem {

// WikiText-2 test (data_dir/wikitext-2/test.txt) as one token stream, no BOS.
// `split`: "test" (the file scored by eval and perplexity) or "valid" (for training routers:
// no article in common with test).
std::vector<TokenId> wikitext_tokens(const std::string& data_dir, const Model& model,
                                     const std::string& split = "test");
// Chunk c of `chunk_tokens` tokens, its first token replaced by BOS where the vocabulary adds one
// (as llama-perplexity does).
std::vector<TokenId> text_chunk(const std::vector<TokenId>& all, int c, int chunk_tokens,
                                const Model& model);

// fn(i, logits row, hidden row) for row i of a chunk (hidden empty unless asked for).
using RowFn = std::function<void(int, std::span<const float>, std::span<const float>)>;

// Extends sequence 0 of ctx (which holds chunk[0, ctx.seq_length(0))) up to position `end`
// (exclusive) in one forward pass and calls fn for the new rows i >= want_from that have a next
// token.
void extend_chunk(Context& ctx, const std::vector<TokenId>& chunk, int end, int want_from,
                  bool want_hidden, const RowFn& fn);

// Runs a chunk through a model from position 0 and calls fn for every row i in
// [first_row, n − 1) (rows that have a next token); hidden is empty unless asked for.
// At most max_rows rows per forward pass (their logits are n_vocab floats each).
void run_chunk(Context& ctx, const std::vector<TokenId>& chunk, int first_row, bool want_hidden,
               const RowFn& fn, int max_rows = 1 << 30);

// Longest common subsequence of two token lists, in tokens.
int common_subsequence(const std::vector<TokenId>& a, const std::vector<TokenId>& b);

// The outcome of routing one position of a chunk (the outcome label, `router collect
// --outcome-share`): greedy continuations of n_tokens from chunk[0, i] — the cloud's alone (its
// own top-1 first), the edge's after the cloud's top-1, the edge's after its own top-1 — and how
// much closer the second comes to the first than the third does, in tokens of their longest
// common subsequence over n_tokens: in [-1, 1], 0 where the two top-1s agree. A subsequence, not
// a prefix, so that a different word that the continuations then step around ("a" for "the")
// scores near 0 and a different answer near 1.
class OutcomeProbe {
 public:
  // The cloud's greedy continuation of `prefix` (which ends with the cloud's first token) by
  // `n` tokens, from a cloud this process does not hold (HttpCloudRows::continuation).
  using CloudContinuation =
      std::function<std::vector<TokenId>(const std::vector<TokenId>& prefix, int n)>;
  // The cloud as a local model.
  OutcomeProbe(const Model& edge, const Model& cloud, int n_ctx, int n_tokens, int n_threads);
  // The cloud elsewhere (or none: measure_answer only).
  OutcomeProbe(const Model& edge, CloudContinuation cloud, int n_ctx, int n_tokens, int n_threads);
  ~OutcomeProbe();
  OutcomeProbe(const OutcomeProbe&) = delete;
  OutcomeProbe& operator=(const OutcomeProbe&) = delete;
  float measure(const std::vector<TokenId>& chunk, int i, TokenId edge_top1, TokenId cloud_top1);

  // How an answer is judged, for measure_answer: the answer is the text from chunk position
  // `answer_from` on (the reference's first tokens, then the continuation), detokenized by the
  // edge model.
  struct AnswerJudge {
    int answer_from = 0;
    int max_tokens = 256;  // answer tokens at most, the reference's included
    std::function<bool(const std::string& answer)> complete;  // true: generation may stop
    std::function<bool(const std::string& answer)> correct;
  };
  // The outcome by the task's correctness (GSM8K): from chunk[0, i], the edge continues greedily
  // twice, after its own top-1 and after the cloud's, each until judge.complete or
  // judge.max_tokens; the outcome is correct(after the cloud's) − correct(after its own), in
  // {−1, 0, 1}; 0 where the two top-1s agree. The cloud takes no part beyond its token.
  float measure_answer(const std::vector<TokenId>& chunk, int i, TokenId edge_top1,
                       TokenId cloud_top1, const AnswerJudge& judge);

 private:
  // The two contexts and what they hold, kept in teacher_forced.cpp.
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The cloud's view of row i (predicting chunk[i + 1]).
struct CloudRow {
  float true_logprob = 0;                      // log p_cloud(chunk[i + 1])
  std::vector<std::pair<TokenId, float>> top;  // most likely first (empty unless asked for)
};

// One sequence to trace: its tokens, teacher-forced, and the rows recorded.
struct TraceSource {
  uint64_t id = 0;  // the sequence id in the trace (a chunk's or a task item's index)
  std::vector<TokenId> tokens;
  int first = 0;        // first row recorded
  int answer_from = 0;  // a task's item: where its answer starts
};

// What `router collect` writes and how it asks the cloud.
struct TraceCollection {
  std::string out;     // the trace file
  bool resume = true;  // keep the sequences a trace there already holds
  int top_k = 8;       // edge log-probabilities per position in the features
  int n_threads = 0;
  // The cloud: a local model, or its rows [first, n − 1) of a chunk with its top-n per row
  // (HttpCloudRows::rows with the collection's top-n).
  const Model* cloud_model = nullptr;
  std::function<std::vector<CloudRow>(const std::vector<TokenId>& chunk, int first)> cloud_rows;
  // The outcome label on this fraction of the sequences (chosen by a fixed hash of their id),
  // with continuations of outcome_tokens tokens: the cloud's through cloud_model or
  // cloud_continuation, or, when judge_answer is set (GSM8K), the task's verdict on the edge's
  // two continuations (OutcomeProbe::measure_answer, the judge for a sequence).
  double outcome_share = 0;
  int outcome_tokens = 16;
  OutcomeProbe::CloudContinuation cloud_continuation;
  std::function<OutcomeProbe::AnswerJudge(const TraceSource&)> judge_answer;
};

// Traces the sources that the trace file does not hold yet: per recorded row the edge's
// features (signal, hidden state), its top-1 and log-probability of the true token, the cloud's
// top-1, log-probabilities of the true and the edge's token, KL(cloud || edge), and the outcome
// where asked. Writes each sequence whole as it is done and reports progress on stderr.
void collect_traces(const Model& edge, const std::vector<TraceSource>& sources,
                    const TraceCollection& collection);

}  // namespace tandem
