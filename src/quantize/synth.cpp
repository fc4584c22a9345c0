// Random-weight models with real shapes; see synth.h.
#include "quantize/synth.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>

#include "common/error.h"
#include "common/splitmix.h"
#include "common/thread_pool.h"
#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "quantize/quantize.h"

namespace tandem::quant {
namespace {

// Fills n normal(mean, std) values from a stream seeded by (seed, tensor, row).
void fill_normal(float* x, int64_t n, float mean, float std, uint64_t seed, uint64_t tensor,
                 uint64_t row) {
  uint64_t s = seed * 0x100000001B3ull ^ (tensor << 40) ^ row;
  splitmix64(s);
  for (int64_t i = 0; i < n; i += 2) {
    const double u1 = (static_cast<double>(splitmix64(s) >> 11) + 0.5) * 0x1.0p-53;
    const double u2 = unit_interval(splitmix64(s));
    const double r = std::sqrt(-2.0 * std::log(u1));
    x[i] = static_cast<float>(mean + std * r * std::cos(2 * M_PI * u2));
    if (i + 1 < n) x[i + 1] = static_cast<float>(mean + std * r * std::sin(2 * M_PI * u2));
  }
}

struct TensorSpec {
  std::string name;
  int64_t ne0, ne1;  // ne1 = 1 for vectors
  float mean, std;
};

std::vector<TensorSpec> tensor_specs(const SynthShape& s) {
  std::vector<TensorSpec> t;
  const int64_t q_dim = static_cast<int64_t>(s.n_head) * s.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(s.n_head_kv) * s.head_dim;
  t.push_back({"token_embd.weight", s.n_embd, s.n_vocab, 0, 0.02f});
  for (int il = 0; il < s.n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    t.push_back({p + "attn_norm.weight", s.n_embd, 1, 1, 0.02f});
    t.push_back({p + "attn_q.weight", s.n_embd, q_dim, 0, 0.02f});
    t.push_back({p + "attn_k.weight", s.n_embd, kv_dim, 0, 0.02f});
    t.push_back({p + "attn_v.weight", s.n_embd, kv_dim, 0, 0.02f});
    if (s.qkv_bias) {
      t.push_back({p + "attn_q.bias", q_dim, 1, 0, 0.02f});
      t.push_back({p + "attn_k.bias", kv_dim, 1, 0, 0.02f});
      t.push_back({p + "attn_v.bias", kv_dim, 1, 0, 0.02f});
    }
    if (s.qk_norm) {
      t.push_back({p + "attn_q_norm.weight", s.head_dim, 1, 1, 0.02f});
      t.push_back({p + "attn_k_norm.weight", s.head_dim, 1, 1, 0.02f});
    }
    t.push_back({p + "attn_output.weight", q_dim, s.n_embd, 0, 0.02f});
    if (s.post_norms) t.push_back({p + "post_attention_norm.weight", s.n_embd, 1, 1, 0.02f});
    t.push_back({p + "ffn_norm.weight", s.n_embd, 1, 1, 0.02f});
    t.push_back({p + "ffn_gate.weight", s.n_embd, s.n_ff, 0, 0.02f});
    t.push_back({p + "ffn_up.weight", s.n_embd, s.n_ff, 0, 0.02f});
    t.push_back({p + "ffn_down.weight", s.n_ff, s.n_embd, 0, 0.02f});
    if (s.post_norms) t.push_back({p + "post_ffw_norm.weight", s.n_embd, 1, 1, 0.02f});
  }
  t.push_back({"output_norm.weight", s.n_embd, 1, 1, 0.02f});
  if (!s.tied) t.push_back({"output.weight", s.n_embd, s.n_vocab, 0, 0.02f});
  return t;
}

// A SentencePiece-style vocab: <unk>, <s>, </s>, 256 byte tokens, then unique pieces.
void write_synthetic_vocab(GgufWriter& w, int n_vocab) {
  if (n_vocab < 3 + 256 + 1) throw Error("synth: n_vocab must be at least 260");
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;
  tokens.reserve(n_vocab);
  tokens.push_back("<unk>");
  types.push_back(2);
  tokens.push_back("<s>");
  types.push_back(3);
  tokens.push_back("</s>");
  types.push_back(3);
  char buf[16];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    tokens.push_back(buf);
    types.push_back(6);
  }
  // Unique pieces: "▁" + a base-26 word for even indices, the bare word for odd ones.
  for (int i = 0; static_cast<int>(tokens.size()) < n_vocab; ++i) {
    std::string word;
    int v = i / 2;
    do {
      word.push_back(static_cast<char>('a' + v % 26));
      v = v / 26 - 1;
    } while (v >= 0);
    tokens.push_back((i % 2 == 0 ? std::string("\xE2\x96\x81") : std::string()) + word);
    types.push_back(1);
  }
  scores.assign(tokens.size(), 0.f);
  for (size_t i = 3 + 256; i < tokens.size(); ++i) scores[i] = -static_cast<float>(i);
  w.set_string("tokenizer.ggml.model", "llama");
  w.set_string("tokenizer.ggml.pre", "default");
  w.set_string_array("tokenizer.ggml.tokens", std::span<const std::string>(tokens));
  w.set_array("tokenizer.ggml.scores", scores);
  w.set_array("tokenizer.ggml.token_type", types);
  w.set_u32("tokenizer.ggml.unknown_token_id", 0);
  w.set_u32("tokenizer.ggml.bos_token_id", 1);
  w.set_u32("tokenizer.ggml.eos_token_id", 2);
  w.set_bool("tokenizer.ggml.add_bos_token", true);
  w.set_bool("tokenizer.ggml.add_eos_token", false);
}

}  // namespace

const std::vector<SynthShape>& synth_shapes() {
  static const std::vector<SynthShape> shapes = [] {
    std::vector<SynthShape> v;
    SynthShape g;
    g.name = "gemma3-270m";
    g.arch = "gemma3";
    g.n_vocab = 262144;
    g.n_embd = 640;
    g.n_layer = 18;
    g.n_head = 4;
    g.n_head_kv = 1;
    g.head_dim = 256;
    g.n_ff = 2048;
    g.tied = true;
    g.qk_norm = true;
    g.post_norms = true;
    g.rope_base = 1e6f;
    g.rope_base_swa = 1e4f;
    g.sliding_window = 512;
    g.context_length = 32768;
    v.push_back(g);
    SynthShape q;
    q.name = "qwen2.5-0.5b";
    q.arch = "qwen2";
    q.n_vocab = 151936;
    q.n_embd = 896;
    q.n_layer = 24;
    q.n_head = 14;
    q.n_head_kv = 2;
    q.head_dim = 64;
    q.n_ff = 4864;
    q.tied = true;
    q.qkv_bias = true;
    q.rope_base = 1e6f;
    q.context_length = 32768;
    v.push_back(q);
    SynthShape q15 = q;
    q15.name = "qwen2.5-1.5b";
    q15.n_embd = 1536;
    q15.n_layer = 28;
    q15.n_head = 12;
    q15.n_head_kv = 2;
    q15.head_dim = 128;
    q15.n_ff = 8960;
    v.push_back(q15);
    return v;
  }();
  return shapes;
}

const SynthShape* find_synth_shape(const std::string& name) {
  for (const auto& s : synth_shapes()) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

namespace {

// general.* and the architecture's hyperparameters, as llama.cpp names them.
void set_synth_metadata(GgufWriter& w, const SynthShape& s, const SynthOptions& opt) {
  const std::string a = s.arch;
  w.set_string("general.architecture", a);
  w.set_string("general.type", "model");
  w.set_string("general.name", s.name + " (tandem synth, random weights)");
  w.set_u32("general.quantization_version", 2);
  w.set_u32("general.file_type", opt.file_type.llama_ftype);
  w.set_string("general.quantized_by", "tandem");
  w.set_string("tandem.quantize.type", opt.file_type.name);
  w.set_bool("tandem.quantize.pure", opt.pure);
  w.set_string("tandem.synth.shape", s.name);
  w.set_u64("tandem.synth.seed", opt.seed);
  w.set_u32(a + ".context_length", s.context_length);
  w.set_u32(a + ".embedding_length", s.n_embd);
  w.set_u32(a + ".block_count", s.n_layer);
  w.set_u32(a + ".feed_forward_length", s.n_ff);
  w.set_u32(a + ".attention.head_count", s.n_head);
  w.set_u32(a + ".attention.head_count_kv", s.n_head_kv);
  w.set_f32(a + ".rope.freq_base", s.rope_base);
  w.set_f32(a + ".attention.layer_norm_rms_epsilon", s.rms_eps);
  if (s.arch == "gemma3" || s.head_dim * s.n_head != s.n_embd) {
    w.set_u32(a + ".attention.key_length", s.head_dim);
    w.set_u32(a + ".attention.value_length", s.head_dim);
  }
  if (s.sliding_window > 0) {
    w.set_u32(a + ".attention.sliding_window", s.sliding_window);
    w.set_f32(a + ".rope.freq_base_swa", s.rope_base_swa);
  }
}

// The tokenizer.* keys of --vocab-from (which must have the shape's vocabulary size), else a
// synthetic vocabulary.
void set_synth_vocab(GgufWriter& w, const SynthShape& s, const SynthOptions& opt) {
  if (!opt.vocab_from.empty()) {
    auto vf = GgufFile::open(opt.vocab_from);
    const auto& toks = vf->get_string_array("tokenizer.ggml.tokens");
    if (toks.size() != static_cast<size_t>(s.n_vocab)) {
      throw Error("synth: --vocab-from '" + opt.vocab_from + "' has " +
                  std::to_string(toks.size()) + " tokens, the " + s.name + " shape needs " +
                  std::to_string(s.n_vocab));
    }
    for (const auto& [key, value] : vf->metadata()) {
      if (key.rfind("tokenizer.", 0) == 0) w.set_value(key, value);
    }
  } else {
    write_synthetic_vocab(w, s.n_vocab);
  }
}

// Every tensor of the shape, its type planned as `tandem quantize` would, rows of seeded normal
// values quantized in parallel (row r of tensor i depends only on seed, i and r, so the file
// is the same for any thread count). Fills rep.plans and rep.n_params.
void add_synth_tensors(GgufWriter& w, const SynthShape& s, const SynthOptions& opt,
                       SynthReport& rep) {
  const auto specs = tensor_specs(s);
  std::vector<TensorDesc> descs;
  for (const auto& t : specs)
    descs.push_back({t.name, t.ne1 > 1 ? 2u : 1u, t.ne0, TensorType::F32});
  MixModel mm{s.arch, s.n_layer, s.n_head, s.n_head_kv};
  rep.plans = plan_tensor_types(descs, mm, opt.file_type, opt.pure);

  ThreadPool pool(opt.n_threads > 0 ? opt.n_threads : default_thread_count());
  size_t i = 0;
  for (const auto& p : rep.plans) {
    const auto& t = specs[p.index];
    const TensorType type = p.dst_type;
    const size_t rb = row_bytes(type, t.ne0);
    std::vector<uint8_t> data(rb * static_cast<size_t>(t.ne1));
    const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, t.ne0 / 64));
    pool.parallel_for(t.ne1, grain, [&](int64_t r0, int64_t r1) {
      std::vector<float> row(static_cast<size_t>(t.ne0));
      for (int64_t r = r0; r < r1; ++r) {
        fill_normal(row.data(), t.ne0, t.mean, t.std, opt.seed, p.index, static_cast<uint64_t>(r));
        quantize_row(type, row.data(), data.data() + r * rb, t.ne0);
      }
    });
    const int64_t ne[2] = {t.ne0, t.ne1};
    w.add_tensor(t.name, type, std::span<const int64_t>(ne, t.ne1 > 1 ? 2 : 1), data);
    rep.n_params += static_cast<uint64_t>(t.ne0) * t.ne1;
    if (opt.on_tensor) opt.on_tensor(i, rep.plans.size(), p);
    ++i;
  }
}

}  // namespace

SynthReport write_synth_model(const SynthShape& s, const std::string& out_path,
                              const SynthOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  GgufWriter w;
  set_synth_metadata(w, s, opt);
  set_synth_vocab(w, s, opt);
  SynthReport rep;
  add_synth_tensors(w, s, opt, rep);
  w.write(out_path);
  rep.file_bytes = std::filesystem::file_size(out_path);
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

}  // namespace tandem::quant
