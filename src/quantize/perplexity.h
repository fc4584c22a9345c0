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

#include "tandem/quantize.h"  // token_logprob, PplStats, KlStats, n_chunks, first_scored

namespace tandem::quant {

// log-softmax of a whole row (double).
void log_softmax(std::span<const float> logits, std::vector<double>& out);

}  // namespace tandem::quant
