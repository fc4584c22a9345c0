// tandem's own f32 vector kernels and logits maths for the layers above the engine: the trained
// router's forward pass (tandem/router_mlp.h), the server's log-probabilities, the router's
// signal and teacher-forced scoring run through them. An entry point with no kernel types in it,
// so that the layers above include no kernel headers (src/layers.txt) and still use the SIMD
// kernels (Highway, the target chosen at run time), each tested against its scalar reference.
//
// A logits row is one float per vocabulary entry ([n_vocab], ~1 MiB for a 262k vocabulary), as
// Context::logits gives it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace tandem {

using TokenId = int32_t;

// sum_i a[i] * b[i] over n floats (the kernels' dot_f32).
float vector_dot(const float* a, const float* b, int64_t n);

// What a logits row's softmax says without writing it, from one read of the row (SIMD, exp in
// f32 lanes folded into doubles): the largest logit, log Z = log Σ exp(logits), the entropy in
// nats and the index of the first largest logit. For the per-token paths (the server's
// log-probabilities, the router's signal); log_sum_exp below is the f64 log Z for scoring text.
struct LogitStats {
  float max = 0;
  double log_z = 0;
  double entropy = 0;
  int64_t argmax = 0;
};
LogitStats logit_stats(std::span<const float> logits);  // all zero for an empty row

// The index of the first largest logit (greedy decoding); 0 for an empty row.
TokenId argmax(std::span<const float> logits);

// log Σ exp(logits) summed in f64 (exp of each logit less the largest), so that
// log p(t) = logits[t] − log_sum_exp(logits). Slower than logit_stats' log Z and not bit for bit
// the same: teacher-forced scoring (eval, router collect) is compared across runs in these bits.
double log_sum_exp(std::span<const float> logits);
// log p(token) = logits[token] − log_sum_exp(logits). Throws tandem::Error for a token outside
// the row.
float log_prob(std::span<const float> logits, TokenId token);

// One of the most likely tokens of a row: log_prob = logits[id] − log Z, in f64 (callers round
// it as they print it).
struct TokenLogProb {
  TokenId id = 0;
  double log_prob = 0;
};
// The n largest logits (all of them when n >= the row's size) as log-probabilities against
// log_z, most likely first, the lower id first among equal logits; empty for n <= 0.
std::vector<TokenLogProb> top_n(std::span<const float> logits, int n, double log_z);
// The same against logit_stats(logits).log_z.
std::vector<TokenLogProb> top_n(std::span<const float> logits, int n);

}  // namespace tandem
