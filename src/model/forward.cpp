#include "model/forward.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "common/error.h"
#include "common/thread_pool.h"
#include "kernels/kernels.h"

namespace tandem {

Forward::Forward(const ModelConfig& config, const ModelWeights& weights, ThreadPool& pool)
    : c_(config), w_(weights), pool_(pool) {}

void Forward::ensure_scratch(int n) {
  if (n <= cap_) return;
  cap_ = n;
  const size_t N = static_cast<size_t>(n);
  x_.resize(N * c_.n_embd);
  cur_.resize(N * c_.n_embd);
  q_.resize(N * c_.q_dim());
  k_.resize(N * c_.kv_dim());
  v_.resize(N * c_.v_dim());
  attn_.resize(N * c_.out_dim());
  proj_.resize(N * c_.n_embd);
  gate_.resize(N * c_.n_ff);
  up_.resize(N * c_.n_ff);
  const size_t max_k = std::max({c_.n_embd, c_.n_ff, c_.out_dim()});
  // The widest activation layout is f32 (4 bytes per element).
  act_.resize(N * (max_k * sizeof(float) + 64));
  row_.resize(c_.n_embd);
}

void Forward::matmul(const WeightView& w, const float* x, int n, float* y, bool same_input) {
  const TensorType act_type = kernels::activation_type(w.type);
  const size_t act_stride = row_bytes(act_type, w.ne0);
  uint8_t* act = act_.data();
  const bool have = same_input && act_rows_.x == x && act_rows_.n == n && act_rows_.k == w.ne0 &&
                    act_rows_.type == act_type;
  if (!have) {
    const auto quantize_rows = [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        kernels::quantize_activation_row(act_type, x + r * w.ne0, act + r * act_stride, w.ne0);
      }
    };
    if (n >= 4) {
      pool_.parallel_for(n, 1, quantize_rows);
    } else {
      quantize_rows(0, n);
    }
    act_rows_ = {x, n, w.ne0, act_type};
  }
  // Split the weight rows across threads; each thread streams its rows once for all n
  // activation rows. Chunks are whole multiples of 16 rows, the widest weight-row tile of the
  // prefill kernels, so that no thread is left a partial tile it could have shared.
  const int64_t grain = std::max<int64_t>(16, (w.ne1 / (pool_.size() * 8) + 15) / 16 * 16);
  pool_.parallel_for(w.ne1, grain, [&](int64_t b, int64_t e) {
    kernels::matmul_rows(w.type, w.ne0, w.data, b, e, act, act_stride, n, y, w.ne1, w.packed);
  });
}

void Forward::for_rows(int64_t rows, const std::function<void(int64_t, int64_t)>& fn) {
  if (rows >= kParallelRows) {
    pool_.parallel_for(rows, kParallelRows / 2, fn);
  } else {
    fn(0, rows);
  }
}

void Forward::norm_rows(const WeightView& w, const float* x, float* out, int64_t rows,
                        int64_t len) {
  for_rows(rows, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      kernels::rms_norm(x + r * len, w.f32(), out + r * len, len, c_.rms_eps);
    }
  });
}

void Forward::add_rows(float* x, const float* y, int64_t rows, int64_t len) {
  for_rows(rows, [&](int64_t b, int64_t e) {
    for (int64_t j = b * len; j < e * len; ++j) x[j] += y[j];
  });
}

void Forward::add_bias(const WeightView& b, float* y, int n, int dim) {
  if (!b.present()) return;
  const float* bias = b.f32();
  for (int r = 0; r < n; ++r) {
    float* row = y + static_cast<size_t>(r) * dim;
    for (int i = 0; i < dim; ++i) row[i] += bias[i];
  }
}

// Rotates the first n_rot dimensions of each head of x ([n_heads][head_dim]) by position pos.
// The angle for pair i is pos * scale * base^(-2i/n_rot) / freq_factor[i], built by repeated
// multiplication in f32 the way ggml builds its rope cache.
void Forward::rope(float* x, int n_heads, int pos, bool swa_layer) {
  const int n_rot = c_.n_rot;
  const float base = swa_layer ? c_.rope_base_swa : c_.rope_base;
  const float freq_scale = swa_layer ? 1.0f : c_.rope_freq_scale;
  const float theta_scale = std::pow(base, -2.0f / static_cast<float>(n_rot));
  const float* factors = w_.rope_freqs.present() ? w_.rope_freqs.f32() : nullptr;
  // YaRN: dimensions below corr_lo keep the extrapolated angle, above corr_hi the interpolated
  // one, with a linear ramp between; magnitudes grow by 1 + 0.1 ln(1/freq_scale).
  const float ext_factor = swa_layer ? 0.0f : c_.yarn_ext_factor;
  float corr_lo = 0, corr_hi = 0, mscale = 1.0f;
  if (ext_factor != 0.0f) {
    auto corr_dim = [&](float n_rotations) {
      return n_rot * std::log(c_.yarn_orig_ctx / (n_rotations * 2 * static_cast<float>(M_PI))) /
             (2 * std::log(base));
    };
    corr_lo = std::max(0.0f, std::floor(corr_dim(c_.yarn_beta_fast)));
    corr_hi = std::min(static_cast<float>(n_rot - 1), std::ceil(corr_dim(c_.yarn_beta_slow)));
    mscale *= 1.0f + 0.1f * std::log(1.0f / freq_scale);
  }
  float cos_sin[2 * 512];  // n_rot <= 1024 is enforced by the config
  float theta = static_cast<float>(pos);
  for (int i = 0; i < n_rot / 2; ++i) {
    const float extrap = factors ? theta / factors[i] : theta;
    float t = freq_scale * extrap;
    if (ext_factor != 0.0f) {
      const float y = (i - corr_lo) / std::max(0.001f, corr_hi - corr_lo);
      const float ramp = (1.0f - std::min(1.0f, std::max(0.0f, y))) * ext_factor;
      t = t * (1 - ramp) + extrap * ramp;
    }
    cos_sin[2 * i] = std::cos(t) * mscale;
    cos_sin[2 * i + 1] = std::sin(t) * mscale;
    theta *= theta_scale;
  }
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + static_cast<size_t>(h) * c_.head_dim;
    if (c_.rope_style == RopeStyle::Norm) {
      for (int i = 0; i < n_rot / 2; ++i) {
        const float cs = cos_sin[2 * i], sn = cos_sin[2 * i + 1];
        const float x0 = v[2 * i], x1 = v[2 * i + 1];
        v[2 * i] = x0 * cs - x1 * sn;
        v[2 * i + 1] = x0 * sn + x1 * cs;
      }
    } else {
      const int half = n_rot / 2;
      for (int i = 0; i < half; ++i) {
        const float cs = cos_sin[2 * i], sn = cos_sin[2 * i + 1];
        const float x0 = v[i], x1 = v[i + half];
        v[i] = x0 * cs - x1 * sn;
        v[i + half] = x0 * sn + x1 * cs;
      }
    }
  }
}

// Causal attention of every batch token over its sequence's cached keys/values.
// q_: [n][n_head][head_dim] -> attn_: [n][n_head][head_dim_v].
// The batch is cut into runs of consecutive tokens of one sequence at consecutive positions
// (prefill). One job per (run, KV head): all query heads of the run that share the KV head (GQA)
// go through kernels::attention_rows together, which reads each cached key and value row once
// for all of them. A run of one token (decode) takes the same kernel: its arithmetic per query
// row does not depend on the other rows of the run, so a token gets the same attention output
// alone, in a prefill chunk or next to other sequences' tokens (batch invariance).
void Forward::attention(int layer, std::span<const BatchToken> batch, KvCache& cache) {
  const int n = static_cast<int>(batch.size());
  const int n_head = c_.n_head, n_kv = c_.n_head_kv, hd = c_.head_dim, hdv = c_.head_dim_v;
  const int group = n_head / n_kv;
  const bool swa = c_.layer_is_swa[layer] && c_.sliding_window > 0;
  const int window = c_.sliding_window;
  const int kv_stride = cache.kv_dim(), v_stride = cache.v_dim();
  const size_t key_size = cache.key_size(), value_size = cache.value_size();
  // A key at position p0 is visible to a query at p1 iff p0 <= p1 and, on sliding-window layers,
  // p1 - p0 < window.
  const auto first_key = [&](int pos) { return swa ? std::max(0, pos - window + 1) : 0; };
  // Tokens per run: enough query rows to fill 16 lanes a whole number of times.
  const int run_max = 16 / std::gcd(16, group);
  runs_.clear();
  for (int i = 0; i < n;) {
    int e = i + 1;
    while (e < n && e - i < run_max && batch[e].seq == batch[i].seq &&
           batch[e].pos == batch[e - 1].pos + 1)
      ++e;
    runs_.push_back({i, e - i});
    i = e;
  }
  const int n_runs = static_cast<int>(runs_.size());
  pool_.run([&](int t, int n_threads) {
    std::vector<const float*> q_rows;
    std::vector<float*> out_rows;
    std::vector<int32_t> lo, hi;
    for (int job = t; job < n_runs * n_kv; job += n_threads) {
      const auto [i0, len] = runs_[job / n_kv];
      const int kvh = job % n_kv;
      const BatchToken& bt = batch[i0];
      const int j0 = first_key(bt.pos);  // the run's first visible key
      // This KV head's rows from key j0 on (elements of key_size / value_size bytes).
      const std::byte* keys0 = static_cast<const std::byte*>(cache.keys(layer, bt.seq)) +
                               (static_cast<size_t>(j0) * kv_stride + kvh * hd) * key_size;
      const std::byte* vals0 = static_cast<const std::byte*>(cache.values(layer, bt.seq)) +
                               (static_cast<size_t>(j0) * v_stride + kvh * hdv) * value_size;
      const size_t head0 = static_cast<size_t>(kvh) * group;
      q_rows.clear();
      out_rows.clear();
      lo.clear();
      hi.clear();
      for (int i = i0; i < i0 + len; ++i) {
        for (int g = 0; g < group; ++g) {
          const size_t head = static_cast<size_t>(i) * n_head + head0 + g;
          q_rows.push_back(q_.data() + head * hd);
          out_rows.push_back(attn_.data() + head * hdv);
          lo.push_back(first_key(batch[i].pos) - j0);
          hi.push_back(batch[i].pos - j0 + 1);
        }
      }
      kernels::attention_rows(q_rows.data(), out_rows.data(), len * group, lo.data(), hi.data(),
                              cache.key_type(), keys0, kv_stride, cache.value_type(), vals0,
                              v_stride, hd, hdv, c_.kq_scale, c_.attn_logit_softcap);
    }
  });
}

// The forward pass of a batch: embeddings, then per layer the attention block and the
// feed-forward block (each on [n][D] rows in x_), then the final norm and the LM head for the
// rows that want outputs.
//
// Kept as one function (about 135 lines) on purpose: like llama2.c's forward, it reads as the
// model's one page, in the order the weights are applied, and the scratch buffers (x_, cur_, q_,
// k_, v_, attn_, proj_, gate_, up_) flow from step to step without being passed around. The work
// itself is already in named helpers (norm_rows, matmul, rope, attention, the kernels); what
// is left here is the order, and the order is what a reader checks against the reference.
void Forward::run(std::span<const BatchToken> batch, KvCache& cache, ForwardOutputs& out,
                  const LayerProbe* probe) {
  const int n = static_cast<int>(batch.size());
  if (n == 0) return;
  ensure_scratch(n);
  act_rows_ = {};
  const int D = c_.n_embd;
  const size_t Dz = static_cast<size_t>(D);

  // Input embeddings: x[i] = dequant(token_embd row) * embd_scale.
  for (int i = 0; i < n; ++i) {
    float* xi = x_.data() + i * Dz;
    kernels::dequantize_row(w_.token_embd.type, w_.token_embd.row(batch[i].token), xi, D);
    if (c_.embd_scale != 1.0f) {
      for (int d = 0; d < D; ++d) xi[d] *= c_.embd_scale;
    }
  }

  for (int il = 0; il < c_.n_layer; ++il) {
    const LayerWeights& L = w_.layers[il];
    const bool swa = c_.layer_is_swa[il] && c_.sliding_window > 0;

    // --- attention block ---
    norm_rows(L.attn_norm, x_.data(), cur_.data(), n, D);
    matmul(L.wq, cur_.data(), n, q_.data());
    matmul(L.wk, cur_.data(), n, k_.data(), /*same_input=*/true);
    matmul(L.wv, cur_.data(), n, v_.data(), /*same_input=*/true);
    add_bias(L.bq, q_.data(), n, c_.q_dim());
    add_bias(L.bk, k_.data(), n, c_.kv_dim());
    add_bias(L.bv, v_.data(), n, c_.v_dim());
    // q/k norms act on each head of each token: [n * n_head][head_dim] rows.
    if (L.q_norm.present()) norm_rows(L.q_norm, q_.data(), q_.data(), n * c_.n_head, c_.head_dim);
    if (L.k_norm.present()) {
      norm_rows(L.k_norm, k_.data(), k_.data(), n * c_.n_head_kv, c_.head_dim);
    }
    for_rows(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        float* q = q_.data() + static_cast<size_t>(i) * c_.q_dim();
        float* k = k_.data() + static_cast<size_t>(i) * c_.kv_dim();
        rope(q, c_.n_head, batch[i].pos, swa);
        rope(k, c_.n_head_kv, batch[i].pos, swa);
        if (c_.query_scale != 1.0f) {
          for (int d = 0; d < c_.q_dim(); ++d) q[d] *= c_.query_scale;
        }
        // Store this token's key and value at its position.
        cache.store(il, batch[i].seq, batch[i].pos, k,
                    v_.data() + static_cast<size_t>(i) * c_.v_dim());
      }
    });
    attention(il, batch, cache);
    matmul(L.wo, attn_.data(), n, proj_.data());
    if (L.post_attn_norm.present()) norm_rows(L.post_attn_norm, proj_.data(), proj_.data(), n, D);
    add_rows(x_.data(), proj_.data(), n, D);

    // --- feed-forward block ---
    norm_rows(L.ffn_norm, x_.data(), cur_.data(), n, D);
    matmul(L.ffn_gate, cur_.data(), n, gate_.data());
    matmul(L.ffn_up, cur_.data(), n, up_.data(), /*same_input=*/true);
    // One call per token row: the gates' vector/tail split then falls on the same elements of a
    // row wherever the row sits in the batch (swiglu's tail is not bit-identical to its vectors).
    for_rows(n, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const size_t off = static_cast<size_t>(r) * c_.n_ff;
        if (c_.ffn_act == FfnActivation::GeluTanh) {
          kernels::geglu(gate_.data() + off, up_.data() + off, gate_.data() + off, c_.n_ff);
        } else {
          kernels::swiglu(gate_.data() + off, up_.data() + off, gate_.data() + off, c_.n_ff);
        }
      }
    });
    matmul(L.ffn_down, gate_.data(), n, proj_.data());
    if (L.post_ffn_norm.present()) norm_rows(L.post_ffn_norm, proj_.data(), proj_.data(), n, D);
    add_rows(x_.data(), proj_.data(), n, D);
    if (probe && *probe) (*probe)(il, x_.data(), n);
  }

  for (const BatchToken& bt : batch) {
    cache.set_length(bt.seq, std::max(cache.length(bt.seq), bt.pos + 1));
  }

  // --- outputs: final norm for requested rows, LM head only where logits are wanted ---
  out.out_index.clear();
  for (int i = 0; i < n; ++i) {
    if (batch[i].want_logits || batch[i].want_hidden) out.out_index.push_back(i);
  }
  const int n_out = static_cast<int>(out.out_index.size());
  out.hidden.resize(static_cast<size_t>(n_out) * D);
  for (int r = 0; r < n_out; ++r) {
    kernels::rms_norm(x_.data() + out.out_index[r] * Dz, w_.output_norm.f32(),
                      out.hidden.data() + r * Dz, D, c_.rms_eps);
  }
  // Pack the rows that want logits so the LM head runs only on them.
  std::vector<int> logit_rows;
  for (int r = 0; r < n_out; ++r) {
    if (batch[out.out_index[r]].want_logits) logit_rows.push_back(r);
  }
  const size_t V = static_cast<size_t>(c_.n_vocab);
  // Rows that asked only for the hidden state get zeros; the others are written by the LM head
  // (zero-filling all of [n_out x 262k] first cost a 33 MB memset per 32-row server batch).
  out.logits.resize(static_cast<size_t>(n_out) * V);
  // One batch with many logits rows (a server prefill with prompt log-probabilities) must not
  // keep its memory for good: the buffer gives it back once it is over 4x what a batch needs.
  if (out.logits.capacity() > 4 * out.logits.size() &&
      out.logits.capacity() * sizeof(float) > (size_t{64} << 20)) {
    out.logits.shrink_to_fit();
  }
  for (int r = 0, j = 0; r < n_out; ++r) {
    if (j < static_cast<int>(logit_rows.size()) && logit_rows[j] == r) {
      ++j;
    } else {
      std::fill_n(out.logits.data() + r * V, V, 0.0f);
    }
  }
  if (!logit_rows.empty()) {
    const int m = static_cast<int>(logit_rows.size());
    std::vector<float> packed_hidden(static_cast<size_t>(m) * D);
    for (int j = 0; j < m; ++j) {
      std::memcpy(packed_hidden.data() + j * Dz, out.hidden.data() + logit_rows[j] * Dz,
                  Dz * sizeof(float));
    }
    if (m == n_out) {
      matmul(w_.output, packed_hidden.data(), m, out.logits.data());
    } else {
      AlignedVector<float> packed_logits(static_cast<size_t>(m) * V);
      matmul(w_.output, packed_hidden.data(), m, packed_logits.data());
      for (int j = 0; j < m; ++j) {
        std::memcpy(out.logits.data() + logit_rows[j] * V, packed_logits.data() + j * V,
                    V * sizeof(float));
      }
    }
    if (c_.final_logit_softcap > 0) {
      const float cap = c_.final_logit_softcap;
      for (float& l : out.logits) l = cap * std::tanh(l / cap);
    }
  }
}

}  // namespace tandem
