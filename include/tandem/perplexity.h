// The statistics of `tandem perplexity`, computed as llama.cpp's llama-perplexity does.
//
//   log p(token)   log-softmax of the logits row, max-subtracted, accumulated in double
//   PPL            exp(mean NLL) over all scored tokens
//   PPL error      ppl * sqrt((mean(NLL^2) - mean(NLL)^2) / (count - 1))
//   KL(base||q)    sum_v p_base(v) (log p_base(v) - log p_q(v)) per token; mean and its standard
//                  error sqrt((mean(KL^2) - mean(KL)^2) / (count - 1))
//   top-1 agree    fraction of tokens whose argmax agrees, error sqrt(p (1 - p) / (count - 1))
//
// Chunking (llama-perplexity): the token stream is cut into floor(n_tokens / n_ctx)
// non-overlapping chunks of n_ctx tokens; the first token of each chunk is replaced by BOS when
// the vocabulary adds one; logits at positions first = n_ctx / 2 .. n_ctx - 2 score the tokens at
// positions first + 1 .. n_ctx - 1 (n_ctx - 1 - first tokens per chunk).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace tandem::eval {

// log p(token) under softmax(logits), in double.
double token_logprob(std::span<const float> logits, int token);

struct PplStats {
  double sum_nll = 0;
  double sum_nll2 = 0;
  int64_t count = 0;
  void add_logprob(double logprob) {
    sum_nll -= logprob;
    sum_nll2 += logprob * logprob;
    ++count;
  }
  double mean_nll() const { return count ? sum_nll / count : 0; }
  double ppl() const;
  double ppl_error() const;  // 0 when fewer than 2 tokens
};

struct KlStats {
  double sum_kl = 0;
  double sum_kl2 = 0;
  int64_t n_same_top = 0;
  int64_t count = 0;
  // Adds one position: base and model logits rows over the same vocabulary.
  void add(std::span<const float> base, std::span<const float> model);
  double mean_kl() const { return count ? sum_kl / count : 0; }
  double kl_error() const;
  double top1() const { return count ? static_cast<double>(n_same_top) / count : 0; }
  double top1_error() const;

 private:
  std::vector<double> lb_, lm_;
};

// Chunk geometry: number of chunks for n_tokens tokens (capped by max_chunks when > 0).
int n_chunks(int64_t n_tokens, int n_ctx, int max_chunks);
inline int first_scored(int n_ctx) {
  return n_ctx / 2;
}

// log-softmax of a whole row (double).
void log_softmax(std::span<const float> logits, std::vector<double>& out);

}  // namespace tandem::eval
