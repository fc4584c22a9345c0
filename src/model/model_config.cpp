#include "model/model_config.h"

#include <cmath>
#include <string>

#include "common/error.h"
#include "gguf/gguf.h"

namespace tandem {
namespace {

// Reads `<arch>.<suffix>` keys with errors that name the file and the full key.
class Keys {
 public:
  Keys(const GgufFile& f, std::string arch) : f_(f), arch_(std::move(arch)) {}

  std::string key(const std::string& suffix) const { return arch_ + "." + suffix; }

  int required_int(const std::string& suffix) const {
    const uint64_t v = f_.get_u64(key(suffix));
    if (v == 0 || v > (1u << 24)) {
      throw Error(f_.path() + ": metadata key '" + key(suffix) + "': expected 1..16777216, found " +
                  std::to_string(v));
    }
    return static_cast<int>(v);
  }
  int optional_int(const std::string& suffix, int fallback) const {
    return f_.has(key(suffix)) ? required_int(suffix) : fallback;
  }
  float optional_float(const std::string& suffix, float fallback) const {
    auto v = f_.get_f64_opt(key(suffix));
    return v ? static_cast<float>(*v) : fallback;
  }

 private:
  const GgufFile& f_;
  std::string arch_;
};

// The parts every architecture shares.
ModelConfig base_config(const GgufFile& f, Arch arch, const std::string& arch_name) {
  ModelConfig c;
  c.arch = arch;
  c.arch_name = arch_name;
  c.name = std::string(f.get_string_opt("general.name").value_or(arch_name));
  Keys k(f, arch_name);
  c.n_embd = k.required_int("embedding_length");
  c.n_layer = k.required_int("block_count");
  c.n_ff = k.required_int("feed_forward_length");
  c.n_head = k.required_int("attention.head_count");
  c.n_head_kv = k.optional_int("attention.head_count_kv", c.n_head);
  c.n_ctx_train = k.optional_int("context_length", 2048);
  if (c.n_embd % c.n_head != 0 && !f.has(k.key("attention.key_length"))) {
    throw Error(f.path() + ": embedding_length " + std::to_string(c.n_embd) +
                " is not divisible by head_count " + std::to_string(c.n_head) +
                " and no attention.key_length is given");
  }
  c.head_dim = k.optional_int("attention.key_length", c.n_embd / c.n_head);
  c.head_dim_v = k.optional_int("attention.value_length", c.head_dim);
  if (c.n_head % c.n_head_kv != 0) {
    throw Error(f.path() + ": attention.head_count " + std::to_string(c.n_head) +
                " is not a multiple of attention.head_count_kv " + std::to_string(c.n_head_kv));
  }
  c.n_rot = k.optional_int("rope.dimension_count", c.head_dim);
  if (c.n_rot > c.head_dim || c.n_rot % 2 != 0 || c.n_rot > 1024) {
    throw Error(f.path() + ": rope.dimension_count " + std::to_string(c.n_rot) +
                " must be even, at most 1024 and at most the head size " +
                std::to_string(c.head_dim));
  }
  c.rms_eps = k.optional_float("attention.layer_norm_rms_epsilon", 1e-6f);
  c.rope_base = k.optional_float("rope.freq_base", 10000.0f);
  c.rope_base_swa = c.rope_base;
  c.kq_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));

  if (auto type = f.get_string_opt(k.key("rope.scaling.type"))) {
    const float factor = k.optional_float("rope.scaling.factor", 1.0f);
    if (!(factor > 0)) {
      throw Error(f.path() + ": " + k.key("rope.scaling.factor") + " must be positive, found " +
                  std::to_string(factor));
    }
    if (*type == "linear") {
      c.rope_freq_scale = 1.0f / factor;
    } else if (*type == "yarn") {
      c.rope_freq_scale = 1.0f / factor;
      c.yarn_ext_factor = 1.0f;
      c.yarn_orig_ctx = k.optional_int("rope.scaling.original_context_length", c.n_ctx_train);
      c.yarn_beta_fast = k.optional_float("rope.scaling.yarn_beta_fast", 32.0f);
      c.yarn_beta_slow = k.optional_float("rope.scaling.yarn_beta_slow", 1.0f);
    } else if (*type != "none" && *type != "llama3") {
      // llama3 scaling is carried by the rope_freqs.weight tensor.
      throw Error(f.path() + ": metadata key '" + k.key("rope.scaling.type") +
                  "': expected none, linear, yarn or llama3, found '" + std::string(*type) + "'");
    }
  } else if (auto scale = f.get_f64_opt(k.key("rope.scale_linear"))) {
    if (*scale > 0) c.rope_freq_scale = 1.0f / static_cast<float>(*scale);
  }
  c.attn_logit_softcap = k.optional_float("attn_logit_softcapping", 0.0f);
  c.final_logit_softcap = k.optional_float("final_logit_softcapping", 0.0f);
  c.layer_is_swa.assign(c.n_layer, false);

  const GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
  if (!embd) throw Error(f.path() + ": missing required tensor 'token_embd.weight'");
  c.n_vocab = static_cast<int>(embd->ne[1]);
  c.tied_output = f.find_tensor("output.weight") == nullptr;
  c.has_rope_freqs = f.find_tensor("rope_freqs.weight") != nullptr;
  return c;
}

}  // namespace

ModelConfig llama_config(const GgufFile& f) {
  ModelConfig c = base_config(f, Arch::Llama, "llama");
  c.rope_style = RopeStyle::Norm;
  c.rope_base_swa = c.rope_base;
  return c;
}

ModelConfig qwen2_config(const GgufFile& f) {
  ModelConfig c = base_config(f, Arch::Qwen2, "qwen2");
  c.rope_style = RopeStyle::Neox;
  c.has_qkv_bias = true;
  return c;
}

ModelConfig qwen3_config(const GgufFile& f) {
  ModelConfig c = base_config(f, Arch::Qwen3, "qwen3");
  c.rope_style = RopeStyle::Neox;
  c.has_qk_norm = true;
  return c;
}

ModelConfig gemma3_config(const GgufFile& f) {
  ModelConfig c = base_config(f, Arch::Gemma3, "gemma3");
  Keys k(f, "gemma3");
  c.rope_style = RopeStyle::Neox;
  c.has_qk_norm = true;
  c.has_post_norms = true;
  c.ffn_act = FfnActivation::GeluTanh;
  c.embd_scale = std::sqrt(static_cast<float>(c.n_embd));
  // Gemma 3 scales queries by 1/sqrt(head_dim) after RoPE and uses no further K·Q scale.
  c.query_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  c.kq_scale = 1.0f;
  c.rope_base_swa = k.optional_float("rope.freq_base_swa", 10000.0f);
  c.sliding_window = k.optional_int("attention.sliding_window", 0);
  // Every sixth layer attends globally; the rest use the sliding window. A file may override the
  // pattern with attention.sliding_window_pattern (period as an integer).
  int period = 6;
  if (f.has(k.key("attention.sliding_window_pattern"))) {
    const GgufValue* v = f.find(k.key("attention.sliding_window_pattern"));
    if (v->is_integer() && v->u64 > 0 && v->u64 <= 1024) {
      period = static_cast<int>(v->u64);
    } else if (v->type == GgufValueType::ARRAY && v->count == static_cast<uint64_t>(c.n_layer)) {
      const auto flags = f.get_int_array(k.key("attention.sliding_window_pattern"));
      for (int il = 0; il < c.n_layer; ++il) c.layer_is_swa[il] = flags[il] != 0;
      period = 0;
    } else {
      throw Error(f.path() + ": metadata key '" + k.key("attention.sliding_window_pattern") +
                  "': expected a positive period or one flag per layer");
    }
  }
  if (period > 0 && c.sliding_window > 0) {
    for (int il = 0; il < c.n_layer; ++il) c.layer_is_swa[il] = (il % period) < (period - 1);
  }
  return c;
}

ModelConfig config_from_gguf(const GgufFile& f) {
  const std::string arch(f.get_string("general.architecture"));
  if (arch == "llama") return llama_config(f);
  if (arch == "qwen2") return qwen2_config(f);
  if (arch == "qwen3") return qwen3_config(f);
  if (arch == "gemma3") return gemma3_config(f);
  throw Error(f.path() + ": unsupported architecture '" + arch +
              "' (general.architecture); supported: llama, qwen2, qwen3, gemma3");
}

std::string describe(const ModelConfig& c) {
  return c.arch_name + " '" + c.name + "': " + std::to_string(c.n_layer) + " layers, n_embd " +
         std::to_string(c.n_embd) + ", heads " + std::to_string(c.n_head) + "/" +
         std::to_string(c.n_head_kv) + " x " + std::to_string(c.head_dim) + ", n_ff " +
         std::to_string(c.n_ff) + ", vocab " + std::to_string(c.n_vocab);
}

}  // namespace tandem
