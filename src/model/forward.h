// The transformer forward pass over a batch of tokens from one or more sequences.
//
// Each token carries its sequence slot and position. Keys and values of every batch token are
// written to the KV cache first, then each token attends causally to its own sequence's cached
// positions (and, on sliding-window layers, only the last `sliding_window` of them). Logits and
// final hidden states are computed only for tokens that ask for them.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "common/aligned_vector.h"
#include "model/kv_cache.h"
#include "model/model_config.h"
#include "model/model_weights.h"
#include "tandem/batch.h"

namespace tandem {

class ThreadPool;

struct ForwardOutputs {
  // Row r belongs to batch token out_index[r].
  std::vector<int32_t> out_index;  // [n_out]
  // [n_out][n_vocab] (rows of tokens that want logits, else 0); 64-byte aligned, so the LM head's
  // rows (n_vocab a multiple of 16) can be written with streaming stores.
  AlignedVector<float> logits;
  std::vector<float> hidden;  // [n_out][n_embd]
};

// Called after each layer with the residual stream [n_tokens][n_embd] (for tests and probes).
using LayerProbe = std::function<void(int layer, const float* x, int n_tokens)>;

class Forward {
 public:
  Forward(const ModelConfig& config, const ModelWeights& weights, ThreadPool& pool);

  // The caller has validated the batch (token ids, slots, positions within the cache). Tokens
  // of one sequence must have increasing positions; the cache length of each touched sequence is
  // set to one past its last position.
  void run(std::span<const BatchToken> batch, KvCache& cache, ForwardOutputs& out,
           const LayerProbe* probe = nullptr);

 private:
  void ensure_scratch(int n);
  // y[n][w.ne1] = x[n][w.ne0] · wᵀ, with the activation rounding llama.cpp applies.
  // same_input: x is the input of the previous matmul, unchanged since (k and v after q, up after
  // gate); its quantized rows are taken from act_ where that call left them in this layout.
  void matmul(const WeightView& w, const float* x, int n, float* y, bool same_input = false);
  // out[r] = rms_norm(x[r]) * w for rows of `len` floats (in place when out == x).
  // Row-wise work of a batch: fn(begin, end) over [0, rows), split across the pool from
  // kParallelRows rows on (below that a handoff costs more than it saves).
  static constexpr int64_t kParallelRows = 16;
  void for_rows(int64_t rows, const std::function<void(int64_t, int64_t)>& fn);
  void norm_rows(const WeightView& w, const float* x, float* out, int64_t rows, int64_t len);
  void add_rows(float* x, const float* y, int64_t rows, int64_t len);  // x += y
  void add_bias(const WeightView& b, float* y, int n, int dim);
  void rope(float* x, int n_heads, int pos, bool swa_layer);
  void attention(int layer, std::span<const BatchToken> batch, KvCache& cache);

  const ModelConfig& c_;
  const ModelWeights& w_;
  ThreadPool& pool_;

  // Scratch, sized for the largest batch seen. n = tokens in the batch.
  int cap_ = 0;
  std::vector<float> x_;      // [n][n_embd] residual stream
  std::vector<float> cur_;    // [n][n_embd] normed input of a sub-block
  std::vector<float> q_;      // [n][q_dim]
  std::vector<float> k_;      // [n][kv_dim]
  std::vector<float> v_;      // [n][v_dim]
  std::vector<float> attn_;   // [n][out_dim]
  std::vector<float> proj_;   // [n][n_embd]
  std::vector<float> gate_;   // [n][n_ff]
  std::vector<float> up_;     // [n][n_ff]
  std::vector<uint8_t> act_;  // quantized activations, [n][row bytes]
  struct ActRows {            // what act_ holds: x's n rows of k floats as `type`
    const float* x = nullptr;
    int n = 0;
    int64_t k = 0;
    TensorType type = TensorType::F32;
  };
  ActRows act_rows_;
  struct TokenRun {
    int begin, length;
  };
  std::vector<TokenRun> runs_;  // attention: runs of consecutive tokens of one sequence
  std::vector<float> row_;      // [n_embd] dequantized embedding row
};

}  // namespace tandem
