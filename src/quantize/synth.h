// Random-weight GGUF files with the exact shapes of named real models, for measuring speed at
// real sizes without the real weights (`tandem synth`).
//
// Weights: seeded normal random numbers (std 0.02 for matrices and biases, 1 + N(0, 0.02^2)
// for norm gains), quantized with tandem's quantizers under the file type's mix rules (the same
// rules as `tandem quantize`, including the row-length fallbacks: gemma3-270m's n_embd 640 is not
// a multiple of 256). Deterministic for a given seed and thread count independent.
// Vocabulary: a synthetic SentencePiece vocab of n_vocab tokens (<unk>, <s>, </s>, the 256
// byte tokens <0x00>..<0xFF>, then unique pieces), or the tokenizer.* keys of another GGUF
// (vocab_from), whose token count must equal the shape's n_vocab.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "quantize/type_mix.h"

namespace tandem::quant {

struct SynthShape {
  std::string name;  // "gemma3-270m"
  std::string arch;  // "gemma3", "qwen2", "llama", "qwen3"
  int n_vocab = 0, n_embd = 0, n_layer = 0, n_head = 0, n_head_kv = 0, head_dim = 0, n_ff = 0;
  bool tied = true;
  bool qkv_bias = false;
  bool qk_norm = false;
  bool post_norms = false;
  float rope_base = 10000.f;
  float rope_base_swa = 10000.f;
  int sliding_window = 0;
  int context_length = 4096;
  float rms_eps = 1e-6f;
};

// Known shapes: gemma3-270m, qwen2.5-0.5b, qwen2.5-1.5b.
const std::vector<SynthShape>& synth_shapes();
const SynthShape* find_synth_shape(const std::string& name);

struct SynthOptions {
  FileType file_type;
  bool pure = false;
  uint64_t seed = 1;
  int n_threads = 0;
  std::string vocab_from;  // optional GGUF whose tokenizer.* keys are copied
  std::function<void(size_t, size_t, const TensorPlan&)> on_tensor;
};

struct SynthReport {
  std::vector<TensorPlan> plans;
  uint64_t n_params = 0;
  uint64_t file_bytes = 0;
  double seconds = 0;
};

SynthReport write_synth_model(const SynthShape& shape, const std::string& out_path,
                              const SynthOptions& opt);

}  // namespace tandem::quant
