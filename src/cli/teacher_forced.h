// Teacher forcing over text for `tandem eval --task wikitext` and `tandem router collect`: the
// WikiText-2 chunks, one model's rows over a chunk, and the cloud's prompt log-probabilities over
// HTTP (tandem serve's or vLLM's /v1/completions `prompt_logprobs`, SGLang's /generate).
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "tandem/engine.h"
#include "tandem/vector_ops.h"  // argmax, log_prob, log_sum_exp for this file's users

namespace tandem {
class Tokenizer;
namespace net {
class HttpClient;
}
}  // namespace tandem

namespace tandem::cli {

// WikiText-2 test (data_dir/wikitext-2/test.txt) as one token stream, no BOS.
// `split`: "test" (the file scored by eval and perplexity) or "valid" (for training routers:
// no article in common with test).
std::vector<TokenId> wikitext_tokens(const std::string& data_dir, const Tokenizer& tok,
                                     const std::string& split = "test");
// Chunk c of `chunk_tokens` tokens, its first token replaced by BOS where the vocabulary adds one
// (as llama-perplexity does).
std::vector<TokenId> text_chunk(const std::vector<TokenId>& all, int c, int chunk_tokens,
                                const Tokenizer& tok);

// Extends sequence 0 of ctx (which holds chunk[0, ctx.seq_length(0))) up to position `end`
// (exclusive) in one forward pass and calls fn(i, logits row, hidden row) for the new rows
// i >= want_from that have a next token.
void extend_chunk(
    Context& ctx, const std::vector<TokenId>& chunk, int end, int want_from, bool want_hidden,
    const std::function<void(int, std::span<const float>, std::span<const float>)>& fn);

// Runs a chunk through a model from position 0 and calls fn(i, logits row, hidden row) for every
// row i in [first_row, n − 1) (rows that have a next token); hidden is empty unless asked for.
// At most max_rows rows per forward pass (their logits are n_vocab floats each).
void run_chunk(Context& ctx, const std::vector<TokenId>& chunk, int first_row, bool want_hidden,
               const std::function<void(int, std::span<const float>, std::span<const float>)>& fn,
               int max_rows = 1 << 30);

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
  // `n` tokens, from a cloud this process does not hold (cloud_continuation_http).
  using CloudContinuation =
      std::function<std::vector<TokenId>(const std::vector<TokenId>& prefix, int n)>;
  // The cloud as a local model.
  OutcomeProbe(const Model& edge, const Model& cloud, int n_ctx, int n_tokens, int n_threads);
  // The cloud elsewhere.
  OutcomeProbe(const Model& edge, CloudContinuation cloud, int n_ctx, int n_tokens, int n_threads);
  float measure(const std::vector<TokenId>& chunk, int i, TokenId edge_top1, TokenId cloud_top1);

  // How an answer is judged, for measure_answer: the answer is the text from chunk position
  // `answer_from` on (the reference's first tokens, then the continuation).
  struct AnswerJudge {
    int answer_from = 0;
    int max_tokens = 256;  // answer tokens at most, the reference's included
    std::function<bool(const std::string& answer)> complete;  // true: generation may stop
    std::function<bool(const std::string& answer)> correct;
    const Tokenizer* tokenizer = nullptr;  // to turn tokens into the text
  };
  // The outcome by the task's correctness (GSM8K): from chunk[0, i], the edge continues greedily
  // twice, after its own top-1 and after the cloud's, each until judge.complete or
  // judge.max_tokens; the outcome is correct(after the cloud's) − correct(after its own), in
  // {−1, 0, 1}; 0 where the two top-1s agree. The cloud takes no part beyond its token.
  float measure_answer(const std::vector<TokenId>& chunk, int i, TokenId edge_top1,
                       TokenId cloud_top1, const AnswerJudge& judge);

 private:
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
  int n_tokens_;
  Context edge_;                                  // 2 slots: after the edge's / the cloud's token
  std::unique_ptr<Context> cloud_;                // a local cloud, or
  CloudContinuation remote_;                      // one elsewhere
  std::vector<TokenId> held_;                     // the chunk the slots hold a prefix of
  int valid_edge_[2] = {0, 0}, valid_cloud_ = 0;  // chunk tokens each slot holds
};

// The cloud's view of row i (predicting chunk[i + 1]).
struct CloudRow {
  float true_logprob = 0;                      // log p_cloud(chunk[i + 1])
  std::vector<std::pair<TokenId, float>> top;  // most likely first (empty unless asked for)
};

// Rows [first_row, n − 1) from a cloud over HTTP in one request. top_n > 0 asks for the cloud's
// top-n per row (tandem/openai API only).
std::vector<CloudRow> cloud_rows_http(net::HttpClient& http, const std::string& api,
                                      const std::vector<TokenId>& chunk, int first_row, int top_n,
                                      double timeout_s);

// The cloud's greedy continuation of `prefix` by n tokens over HTTP, for the outcome label:
// /v1/completions with the prompt as token ids, temperature 0, ignore_eos, and the tokens
// returned as ids (vLLM's return_tokens_as_token_ids, which tandem serve honours too). Throws
// naming what the server did otherwise. api: tandem or openai (SGLang's /generate is refused).
std::vector<TokenId> cloud_continuation_http(net::HttpClient& http, const std::string& api,
                                             const std::vector<TokenId>& prefix, int n,
                                             double timeout_s);

}  // namespace tandem::cli
