#include "model/model_weights.h"

#include <memory>
#include <string>

#include "common/error.h"
#include "gguf/gguf.h"
#include "kernels/kernels.h"

namespace tandem {
namespace {

enum class Need { Required, Optional };

// Collects problems across all tensors so the error lists every one, not just the first.
class Binder {
 public:
  Binder(const GgufFile& f) : f_(f) {}

  WeightView bind(const std::string& name, Need need, int64_t ne0, int64_t ne1 = 1,
                  bool matrix = false) {
    WeightView w;
    const GgufTensorInfo* t = f_.find_tensor(name);
    if (!t) {
      if (need == Need::Required) {
        problems_ += "\n  missing tensor '" + name + "' (expected shape [" + std::to_string(ne0) +
                     (ne1 > 1 || matrix ? ", " + std::to_string(ne1) : std::string()) + "])";
      }
      return w;
    }
    const int64_t found_ne1 = t->ne[1] * t->ne[2] * t->ne[3];
    if (t->ne[0] != ne0 || found_ne1 != ne1 || t->ne[2] != 1 || t->ne[3] != 1) {
      problems_ += "\n  tensor '" + name + "': expected shape [" + std::to_string(ne0) +
                   (ne1 > 1 || matrix ? ", " + std::to_string(ne1) : std::string()) + "], found " +
                   t->shape_string();
      return w;
    }
    if (matrix ? !kernels::is_supported_weight_type(t->type) : t->type != TensorType::F32) {
      problems_ += "\n  tensor '" + name + "': type " + std::string(traits(t->type).name) +
                   (matrix ? " is not supported for matrices" : " (expected F32 for a vector)");
      return w;
    }
    w.name = t->name.c_str();
    w.type = t->type;
    w.ne0 = t->ne[0];
    w.ne1 = found_ne1;
    w.data = t->data;
    w.row_stride = row_bytes(t->type, t->ne[0]);
    return w;
  }

  WeightView matrix(const std::string& name, Need need, int64_t ne0, int64_t ne1) {
    return bind(name, need, ne0, ne1, true);
  }

  void finish() const {
    if (!problems_.empty()) {
      throw Error(f_.path() + ": the model's tensors do not match its " +
                  std::string(f_.get_string("general.architecture")) + " metadata:" + problems_);
    }
  }

 private:
  const GgufFile& f_;
  std::string problems_;
};

}  // namespace

void dequantize_weights(ModelWeights& w, std::vector<std::vector<float>>& storage) {
  auto to_f32 = [&](WeightView& v) {
    if (!v.present() || v.type == TensorType::F32) return;
    std::vector<float> buf(static_cast<size_t>(v.ne0) * v.ne1);
    for (int64_t r = 0; r < v.ne1; ++r) {
      kernels::dequantize_row(v.type, v.row(r), buf.data() + r * v.ne0, v.ne0);
    }
    v.type = TensorType::F32;
    v.data = reinterpret_cast<const uint8_t*>(buf.data());
    v.row_stride = static_cast<size_t>(v.ne0) * sizeof(float);
    storage.push_back(std::move(buf));
  };
  const bool tied = w.output.data == w.token_embd.data;
  to_f32(w.token_embd);
  if (tied) {
    w.output = w.token_embd;
  } else {
    to_f32(w.output);
  }
  for (LayerWeights& l : w.layers) {
    for (WeightView* v : {&l.wq, &l.wk, &l.wv, &l.wo, &l.ffn_gate, &l.ffn_up, &l.ffn_down}) {
      to_f32(*v);
    }
  }
}

void pack_weights(ModelWeights& w, std::vector<std::unique_ptr<kernels::PackedWeights>>& storage) {
  auto pack = [&](WeightView& v) {
    if (!v.present() || v.packed != nullptr) return;
    auto p = std::make_unique<kernels::PackedWeights>(
        kernels::PackedWeights::pack(v.type, v.ne0, v.data, v.ne1));
    if (p->empty()) return;
    v.packed = p.get();
    storage.push_back(std::move(p));
  };
  // The output only: a tied token_embd is looked up row by row from the original.
  pack(w.output);
  for (LayerWeights& l : w.layers) {
    for (WeightView* v : {&l.wq, &l.wk, &l.wv, &l.wo, &l.ffn_gate, &l.ffn_up, &l.ffn_down}) {
      pack(*v);
    }
  }
}

ModelWeights bind_weights(const GgufFile& f, const ModelConfig& c) {
  Binder b(f);
  ModelWeights w;
  w.token_embd = b.matrix("token_embd.weight", Need::Required, c.n_embd, c.n_vocab);
  w.output_norm = b.bind("output_norm.weight", Need::Required, c.n_embd);
  w.output =
      c.tied_output ? w.token_embd : b.matrix("output.weight", Need::Required, c.n_embd, c.n_vocab);
  w.rope_freqs = b.bind("rope_freqs.weight", Need::Optional, c.n_rot / 2);
  const Need bias = c.has_qkv_bias ? Need::Required : Need::Optional;
  const Need qk_norm = c.has_qk_norm ? Need::Required : Need::Optional;
  const Need post = c.has_post_norms ? Need::Required : Need::Optional;
  w.layers.resize(c.n_layer);
  for (int il = 0; il < c.n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    LayerWeights& l = w.layers[il];
    l.attn_norm = b.bind(p + "attn_norm.weight", Need::Required, c.n_embd);
    l.wq = b.matrix(p + "attn_q.weight", Need::Required, c.n_embd, c.q_dim());
    l.wk = b.matrix(p + "attn_k.weight", Need::Required, c.n_embd, c.kv_dim());
    l.wv = b.matrix(p + "attn_v.weight", Need::Required, c.n_embd, c.v_dim());
    l.wo = b.matrix(p + "attn_output.weight", Need::Required, c.out_dim(), c.n_embd);
    l.bq = b.bind(p + "attn_q.bias", bias, c.q_dim());
    l.bk = b.bind(p + "attn_k.bias", bias, c.kv_dim());
    l.bv = b.bind(p + "attn_v.bias", bias, c.v_dim());
    l.q_norm = b.bind(p + "attn_q_norm.weight", qk_norm, c.head_dim);
    l.k_norm = b.bind(p + "attn_k_norm.weight", qk_norm, c.head_dim);
    l.post_attn_norm = b.bind(p + "post_attention_norm.weight", post, c.n_embd);
    l.ffn_norm = b.bind(p + "ffn_norm.weight", Need::Required, c.n_embd);
    l.ffn_gate = b.matrix(p + "ffn_gate.weight", Need::Required, c.n_embd, c.n_ff);
    l.ffn_up = b.matrix(p + "ffn_up.weight", Need::Required, c.n_embd, c.n_ff);
    l.ffn_down = b.matrix(p + "ffn_down.weight", Need::Required, c.n_ff, c.n_embd);
    l.post_ffn_norm = b.bind(p + "post_ffw_norm.weight", post, c.n_embd);
  }
  b.finish();
  return w;
}

}  // namespace tandem
