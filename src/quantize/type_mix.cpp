// Per-tensor type rules of llama.cpp's quantizer; see type_mix.h.
#include "quantize/type_mix.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "common/error.h"
#include "gguf/gguf.h"

namespace tandem::quant {
namespace {

struct Entry {
  const char* name;
  uint32_t ftype;
  TensorType type;
};

// LLAMA_FTYPE_* numbers from llama.h.
constexpr Entry kFileTypes[] = {
    {"F32", 0, TensorType::F32},      {"F16", 1, TensorType::F16},
    {"Q4_0", 2, TensorType::Q4_0},    {"Q4_1", 3, TensorType::Q4_1},
    {"Q8_0", 7, TensorType::Q8_0},    {"Q5_0", 8, TensorType::Q5_0},
    {"Q5_1", 9, TensorType::Q5_1},    {"Q2_K", 10, TensorType::Q2_K},
    {"Q3_K_S", 11, TensorType::Q3_K}, {"Q3_K_M", 12, TensorType::Q3_K},
    {"Q3_K_L", 13, TensorType::Q3_K}, {"Q4_K_S", 14, TensorType::Q4_K},
    {"Q4_K_M", 15, TensorType::Q4_K}, {"Q5_K_S", 16, TensorType::Q5_K},
    {"Q5_K_M", 17, TensorType::Q5_K}, {"Q6_K", 18, TensorType::Q6_K},
    {"BF16", 32, TensorType::BF16},
};

std::string upper(std::string_view s) {
  std::string r(s);
  for (char& c : r) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return r;
}

bool contains(const std::string& s, const char* what) {
  return s.find(what) != std::string::npos;
}

bool use_more_bits(int i, int n) {
  return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

int layer_of(const std::string& name) {
  int layer = -1;
  if (std::sscanf(name.c_str(), "blk.%d.", &layer) != 1) return -1;
  return layer;
}

}  // namespace

std::optional<FileType> parse_file_type(std::string_view name) {
  std::string n = upper(name);
  if (n == "Q3_K") n = "Q3_K_M";
  if (n == "Q4_K") n = "Q4_K_M";
  if (n == "Q5_K") n = "Q5_K_M";
  for (const auto& e : kFileTypes) {
    if (n == e.name) return FileType{e.name, e.ftype, e.type};
  }
  return std::nullopt;
}

std::vector<std::string> file_type_names() {
  std::vector<std::string> r;
  for (const auto& e : kFileTypes) r.push_back(e.name);
  r.push_back("Q3_K (=Q3_K_M)");
  r.push_back("Q4_K (=Q4_K_M)");
  r.push_back("Q5_K (=Q5_K_M)");
  return r;
}

std::string_view tensor_type_name(TensorType type) {
  return traits(type).name;
}

bool is_quantizable(const std::string& name, uint32_t n_dims) {
  if (name.size() < 6 || name.compare(name.size() - 6, 6, "weight") != 0) return false;
  if (n_dims < 2) return false;
  for (const char* skip : {"_norm.weight", "ffn_gate_inp.weight", "ssm_conv1d.weight",
                           "attn_rel_b.weight", "altup", "laurel", "shortconv.conv.weight"}) {
    if (contains(name, skip)) return false;
  }
  if (name == "position_embd.weight" || name == "token_types.weight") return false;
  return true;
}

TensorType fallback_type(TensorType type, int64_t ne0, std::string* why) {
  const int64_t bs = traits(type).block_size;
  if (ne0 % bs == 0) return type;
  TensorType nt;
  switch (type) {
    case TensorType::Q2_K:
    case TensorType::Q3_K:
      nt = TensorType::Q4_0;  // llama.cpp: IQ4_NL (not supported by tandem)
      break;
    case TensorType::Q4_K:
      nt = TensorType::Q5_0;
      break;
    case TensorType::Q5_K:
      nt = TensorType::Q5_1;
      break;
    case TensorType::Q6_K:
      nt = TensorType::Q8_0;
      break;
    default:
      nt = TensorType::F16;
      break;
  }
  if (ne0 % traits(nt).block_size != 0) nt = TensorType::F16;
  if (why) {
    *why = "row length " + std::to_string(ne0) + " is not a multiple of the " +
           std::string(traits(type).name) + " block size " + std::to_string(bs) + ": using " +
           std::string(traits(nt).name);
    if (type == TensorType::Q2_K || type == TensorType::Q3_K) {
      *why += " (llama.cpp uses IQ4_NL, which tandem does not support)";
    }
  }
  return nt;
}

TensorType mix_type(const FileType& ft, const MixModel& m, const std::string& name, int64_t ne0,
                    int i_attn_v, int n_attn_v, int i_ffn_down, bool has_output) {
  TensorType t = ft.default_type;
  const std::string& f = ft.name;
  if (name == "output.weight" || (!has_output && name == "token_embd.weight")) {
    if (ne0 % traits(t).block_size != 0) {
      t = TensorType::Q8_0;
    } else if (t != TensorType::Q8_0) {
      t = TensorType::Q6_K;
    }
    return t;
  }
  if (name == "token_embd.weight") return t;
  const int n_layer = m.n_layer;
  if (contains(name, "attn_v.weight")) {
    const int gqa = m.n_head_kv > 0 ? m.n_head / m.n_head_kv : 1;
    if (f == "Q2_K") {
      t = gqa >= 4 ? TensorType::Q4_K : TensorType::Q3_K;
    } else if (f == "Q3_K_M") {
      t = i_attn_v < 2 ? TensorType::Q5_K : TensorType::Q4_K;
    } else if (f == "Q3_K_L") {
      t = TensorType::Q5_K;
    } else if ((f == "Q4_K_M" || f == "Q5_K_M") && use_more_bits(i_attn_v, n_attn_v)) {
      t = TensorType::Q6_K;
    } else if (f == "Q4_K_S" && i_attn_v < 4) {
      t = TensorType::Q5_K;
    }
  } else if (contains(name, "ffn_down")) {
    const int i = i_ffn_down;
    if (f == "Q2_K") {
      t = TensorType::Q3_K;
    } else if (f == "Q3_K_M") {
      t = i < n_layer / 16 ? TensorType::Q5_K : TensorType::Q4_K;
    } else if (f == "Q3_K_L") {
      t = TensorType::Q5_K;
    } else if (f == "Q4_K_M") {
      if (use_more_bits(i, n_layer)) t = TensorType::Q6_K;
    } else if (f == "Q5_K_M" && use_more_bits(i, n_layer)) {
      t = TensorType::Q6_K;
    } else if (f == "Q4_K_S" && i < n_layer / 8) {
      t = TensorType::Q5_K;
    }
  } else if (contains(name, "attn_output.weight")) {
    if (f == "Q2_K") {
      t = TensorType::Q3_K;
    } else if (f == "Q3_K_M") {
      t = TensorType::Q4_K;
    } else if (f == "Q3_K_L") {
      t = TensorType::Q5_K;
    }
  } else if (contains(name, "attn_qkv.weight")) {
    if (f == "Q3_K_M" || f == "Q3_K_L") {
      t = TensorType::Q4_K;
    } else if (f == "Q4_K_M") {
      t = TensorType::Q5_K;
    } else if (f == "Q5_K_M") {
      t = TensorType::Q6_K;
    }
  }
  return t;
}

MixModel mix_model_from_file(const GgufFile& f) {
  MixModel m;
  if (auto a = f.get_string_opt("general.architecture")) m.arch = std::string(*a);
  auto get_int = [&](const std::string& key) -> int {
    const GgufValue* v = f.find(key);
    if (!v) return 0;
    if (v->is_integer()) return static_cast<int>(v->i64);
    if (v->type == GgufValueType::ARRAY && v->count > 0) {
      const auto arr = f.get_int_array(key);  // per-layer counts: use the first
      return arr.empty() ? 0 : static_cast<int>(arr[0]);
    }
    return 0;
  };
  m.n_layer = get_int(m.arch + ".block_count");
  m.n_head = get_int(m.arch + ".attention.head_count");
  m.n_head_kv = get_int(m.arch + ".attention.head_count_kv");
  if (m.n_head_kv == 0) m.n_head_kv = m.n_head;
  return m;
}

std::vector<TensorPlan> plan_tensor_types(const GgufFile& f, const FileType& ft, bool pure) {
  std::vector<TensorDesc> ds;
  for (const auto& t : f.tensors()) ds.push_back({t.name, t.n_dims, t.ne[0], t.type});
  return plan_tensor_types(ds, mix_model_from_file(f), ft, pure);
}

std::vector<TensorPlan> plan_tensor_types(const std::vector<TensorDesc>& ts, const MixModel& m,
                                          const FileType& ft, bool pure) {
  // llama.cpp's order: by layer number (non-layer tensors first), then by name.
  std::vector<size_t> order(ts.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const int la = layer_of(ts[a].name), lb = layer_of(ts[b].name);
    if (la != lb) return la < lb;
    return ts[a].name < ts[b].name;
  });

  bool has_output = false;
  int n_attn_v = 0;
  for (const auto& t : ts) {
    if (contains(t.name, "attn_v.weight") || contains(t.name, "attn_qkv.weight") ||
        contains(t.name, "attn_kv_b.weight")) {
      ++n_attn_v;
    } else if (t.name == "output.weight") {
      has_output = true;
    }
  }

  const bool mix = !pure && traits(ft.default_type).is_quantized;
  int i_attn_v = 0;
  int i_ffn_down = 0;
  std::vector<TensorPlan> plans;
  for (size_t idx : order) {
    const auto& t = ts[idx];
    TensorPlan p;
    p.index = idx;
    p.name = t.name;
    p.src_type = t.type;
    p.dst_type = t.type;
    if (is_quantizable(t.name, t.n_dims)) {
      TensorType nt = ft.default_type;
      if (mix) {
        nt = mix_type(ft, m, t.name, t.ne0, i_attn_v, n_attn_v, i_ffn_down, has_output);
        if (contains(t.name, "attn_v.weight")) ++i_attn_v;
        if (contains(t.name, "ffn_down")) ++i_ffn_down;
      }
      if (traits(nt).is_quantized) nt = fallback_type(nt, t.ne0, &p.fallback);
      p.dst_type = nt;
      p.quantize = nt != t.type;
    }
    plans.push_back(std::move(p));
  }
  return plans;
}

}  // namespace tandem::quant
