// Hyper-parameters of a decoder-only transformer, read from GGUF metadata.
//
// One struct describes every supported architecture; a named factory per architecture fills it
// from the file's `<arch>.*` keys and sets the structural switches (biases, q/k norms, post
// norms, activation, rope style). config_from_gguf() picks the factory from
// `general.architecture`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

class GgufFile;

enum class Arch { Llama, Qwen2, Qwen3, Gemma3 };
enum class RopeStyle {
  Norm,  // rotates adjacent pairs (x[2i], x[2i+1]) — llama
  Neox,  // rotates halves (x[i], x[i + n_rot/2]) — qwen2, qwen3, gemma3
};
enum class FfnActivation { SiLU, GeluTanh };

struct ModelConfig {
  Arch arch = Arch::Llama;
  std::string arch_name;  // value of general.architecture
  std::string name;       // general.name, for display

  int n_vocab = 0;
  int n_embd = 0;
  int n_layer = 0;
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;    // key length per head
  int head_dim_v = 0;  // value length per head
  int n_ff = 0;
  int n_ctx_train = 0;
  float rms_eps = 1e-6f;

  // Rotary embeddings.
  RopeStyle rope_style = RopeStyle::Norm;
  int n_rot = 0;                   // rotated dimensions per head
  float rope_base = 10000.0f;      // global (full attention) layers
  float rope_base_swa = 10000.0f;  // sliding-window layers
  float rope_freq_scale = 1.0f;    // linear scaling (1/factor), global layers only
  bool has_rope_freqs = false;     // per-dimension divisors from rope_freqs.weight (llama3)
  // YaRN (rope.scaling.type = yarn): extrapolation mix over the dimension range where the
  // rotation wavelength crosses the original context; 0 = off.
  float yarn_ext_factor = 0.0f;
  int yarn_orig_ctx = 0;
  float yarn_beta_fast = 32.0f;
  float yarn_beta_slow = 1.0f;

  // Attention.
  float query_scale = 1.0f;          // applied to Q after RoPE (gemma3: 1/sqrt(head_dim))
  float kq_scale = 1.0f;             // applied to K·Q before softmax (others: 1/sqrt(head_dim))
  int sliding_window = 0;            // 0 = none
  std::vector<bool> layer_is_swa;    // [n_layer]
  float attn_logit_softcap = 0.0f;   // 0 = off
  float final_logit_softcap = 0.0f;  // 0 = off

  // Structure.
  bool has_qkv_bias = false;
  bool has_qk_norm = false;
  bool has_post_norms = false;  // post_attention_norm / post_ffw_norm (gemma3)
  bool tied_output = false;     // output.weight absent: logits use token_embd
  float embd_scale = 1.0f;      // input embeddings are multiplied by this (gemma3: sqrt(n_embd))
  FfnActivation ffn_act = FfnActivation::SiLU;

  int q_dim() const { return n_head * head_dim; }
  int kv_dim() const { return n_head_kv * head_dim; }
  int v_dim() const { return n_head_kv * head_dim_v; }
  int out_dim() const { return n_head * head_dim_v; }
};

// Factories, one per architecture. Each throws tandem::Error listing missing or bad keys.
ModelConfig llama_config(const GgufFile& f);
ModelConfig qwen2_config(const GgufFile& f);
ModelConfig qwen3_config(const GgufFile& f);
ModelConfig gemma3_config(const GgufFile& f);

// Dispatches on general.architecture; an unsupported one gets an error listing the supported.
ModelConfig config_from_gguf(const GgufFile& f);

std::string describe(const ModelConfig& c);  // one-line summary for logs

}  // namespace tandem
