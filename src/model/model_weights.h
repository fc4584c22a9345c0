// The weight table: every tensor an architecture uses, looked up by GGUF name and checked
// against the shape the config implies. Tensors are views into the memory-mapped file (no
// copies).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/tensor_type.h"
#include "kernels/kernels.h"
#include "model/model_config.h"

namespace tandem {

class GgufFile;

// A 1-D or 2-D weight. For a matrix, rows are output features: ne0 = input length (contiguous),
// ne1 = number of rows, as GGUF/ggml store them.
struct WeightView {
  const char* name = nullptr;  // points into the owning table's name storage
  TensorType type = TensorType::F32;
  int64_t ne0 = 0;
  int64_t ne1 = 1;
  const uint8_t* data = nullptr;
  size_t row_stride = 0;                           // bytes per row
  const kernels::PackedWeights* packed = nullptr;  // the batched kernels' copy (pack_weights)

  bool present() const { return data != nullptr; }
  const float* f32() const { return reinterpret_cast<const float*>(data); }
  const uint8_t* row(int64_t i) const { return data + static_cast<size_t>(i) * row_stride; }
};

struct LayerWeights {
  WeightView attn_norm;         // [n_embd] F32
  WeightView wq, wk, wv, wo;    // [n_embd -> q_dim], [-> kv_dim], [-> v_dim], [out_dim -> n_embd]
  WeightView bq, bk, bv;        // biases (qwen2)
  WeightView q_norm, k_norm;    // [head_dim] (qwen3, gemma3)
  WeightView post_attn_norm;    // [n_embd] (gemma3)
  WeightView ffn_norm;          // [n_embd]
  WeightView ffn_gate, ffn_up;  // [n_embd -> n_ff]
  WeightView ffn_down;          // [n_ff -> n_embd]
  WeightView post_ffn_norm;     // [n_embd] (gemma3)
};

struct ModelWeights {
  WeightView token_embd;   // [n_embd x n_vocab]
  WeightView output_norm;  // [n_embd]
  WeightView output;       // [n_embd x n_vocab]; equals token_embd when tied
  WeightView rope_freqs;   // [n_rot/2] optional (llama3 scaling)
  std::vector<LayerWeights> layers;
};

// Binds every tensor the config needs. Throws tandem::Error listing each missing tensor, each
// wrong shape (expected vs found) and each type the engine cannot compute with.
ModelWeights bind_weights(const GgufFile& f, const ModelConfig& c);

// Replaces every matrix with an f32 copy held in `storage` (exact dequantization).
void dequantize_weights(ModelWeights& w, std::vector<std::vector<float>>& storage);

// Gives every quantized matrix the batched kernels multiply (the layers' projections and the
// output) a packed copy held in `storage` (kernels::PackedWeights); the views keep the original
// for the rest. Matrices without a tiled kernel on this CPU are left as they are.
void pack_weights(ModelWeights& w, std::vector<std::unique_ptr<kernels::PackedWeights>>& storage);

}  // namespace tandem
