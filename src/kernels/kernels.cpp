// Public kernel API: run-time dispatch (Highway) to the per-target code in kernels-inl.h, with
// the scalar reference (kernels_ref.cpp) for operations that have no SIMD version yet.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/kernels.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/kernels-inl.h"

#if HWY_ONCE
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/kernels_ref.h"

namespace tandem::kernels {

HWY_EXPORT(MatmulRowsT);
HWY_EXPORT(DotF32T);
HWY_EXPORT(QuantizeActivationRowT);
HWY_EXPORT(AxpyT);
HWY_EXPORT(SwigluT);
HWY_EXPORT(SoftmaxT);
HWY_EXPORT(LogitStatsT);
HWY_EXPORT(ArgmaxT);
HWY_EXPORT(GegluT);
HWY_EXPORT(AttentionScoresT);
HWY_EXPORT(AttentionValuesT);
HWY_EXPORT(RmsNormT);
HWY_EXPORT(TargetNameT);
HWY_EXPORT(AttentionRowsT);
HWY_EXPORT(AttentionRowsK16T);
HWY_EXPORT(AttentionRowsV16T);
HWY_EXPORT(AttentionRowsK16V16T);
HWY_EXPORT(TargetIdT);
HWY_EXPORT(PackTileBytesT);
HWY_EXPORT(TileWidthT);
HWY_EXPORT(PackTilesT);

bool is_supported_weight_type(TensorType type) {
  switch (type) {
    case TensorType::F32:
    case TensorType::F16:
    case TensorType::BF16:
    case TensorType::Q4_0:
    case TensorType::Q4_1:
    case TensorType::Q5_0:
    case TensorType::Q5_1:
    case TensorType::Q8_0:
    case TensorType::Q2_K:
    case TensorType::Q3_K:
    case TensorType::Q4_K:
    case TensorType::Q5_K:
    case TensorType::Q6_K:
      return true;
    default:
      return false;
  }
}

TensorType activation_type(TensorType weight_type) {
  switch (weight_type) {
    case TensorType::F32:
      return TensorType::F32;
    case TensorType::F16:
      return TensorType::F16;
    case TensorType::BF16:
      return TensorType::BF16;
    case TensorType::Q4_0:
    case TensorType::Q5_0:
    case TensorType::Q8_0:
      return TensorType::Q8_0;
    case TensorType::Q4_1:
    case TensorType::Q5_1:
      return TensorType::Q8_1;
    case TensorType::Q2_K:
    case TensorType::Q3_K:
    case TensorType::Q4_K:
    case TensorType::Q5_K:
    case TensorType::Q6_K:
      return TensorType::Q8_K;
    default:
      throw std::invalid_argument("tandem::kernels: no activation type for weight type " +
                                  std::string(traits(weight_type).name));
  }
}

namespace {
// Rows must hold whole blocks (a K-quant row of 640 elements does not exist).
void check_row(const char* what, TensorType type, int64_t n) {
  const uint32_t bs = traits(type).block_size;
  if (n < 0 || n % bs != 0)
    throw std::invalid_argument(std::string("tandem::kernels::") + what +
                                ": n=" + std::to_string(n) + " is not a multiple of the " +
                                std::string(traits(type).name) + " block size " +
                                std::to_string(bs));
}
}  // namespace

void dequantize_row(TensorType type, const void* src, float* dst, int64_t n) {
  check_row("dequantize_row", type, n);
  ref::dequantize_row(type, src, dst, n);
}

void quantize_activation_row(TensorType act_type, const float* x, void* dst, int64_t n) {
  check_row("quantize_activation_row", act_type, n);
  if (!HWY_DYNAMIC_DISPATCH(QuantizeActivationRowT)(act_type, x, dst, n))
    ref::quantize_activation_row(act_type, x, dst, n);
}

float vec_dot(TensorType weight_type, int64_t n, const void* w_row, const void* act_row) {
  check_row("vec_dot", weight_type, n);
  float out = 0;
  if (!HWY_DYNAMIC_DISPATCH(MatmulRowsT)(weight_type, n, w_row, 0, 1, act_row, 0, 1, &out, 1,
                                         nullptr, 0))
    return ref::vec_dot(weight_type, n, w_row, act_row);
  return out;
}

void matmul_rows(TensorType weight_type, int64_t k, const void* w, int64_t row_begin,
                 int64_t row_end, const void* acts, size_t act_stride, int64_t n_act, float* y,
                 int64_t y_stride) {
  matmul_rows(weight_type, k, w, row_begin, row_end, acts, act_stride, n_act, y, y_stride, nullptr);
}

void matmul_rows(TensorType weight_type, int64_t k, const void* w, int64_t row_begin,
                 int64_t row_end, const void* acts, size_t act_stride, int64_t n_act, float* y,
                 int64_t y_stride, const PackedWeights* packed) {
  check_row("matmul_rows", weight_type, k);
  if (row_end <= row_begin || n_act <= 0) return;
  const uint8_t* tiles = nullptr;
  size_t tile_bytes = 0;
  if (packed != nullptr && !packed->empty()) {
    if (packed->type_ != weight_type || packed->k_ != k || row_end > packed->n_rows_)
      throw std::invalid_argument(
          "matmul_rows: the packed copy is of " + std::to_string(packed->n_rows_) + " " +
          std::string(traits(packed->type_).name) + " rows of " + std::to_string(packed->k_) +
          ", called for rows up to " + std::to_string(row_end) + " of " +
          std::string(traits(weight_type).name) + " rows of " + std::to_string(k));
    if (packed->target_ == HWY_DYNAMIC_DISPATCH(TargetIdT)()) {
      tiles = packed->data_.data();
      tile_bytes = packed->tile_bytes_;
    }
  }
  if (!HWY_DYNAMIC_DISPATCH(MatmulRowsT)(weight_type, k, w, row_begin, row_end, acts, act_stride,
                                         n_act, y, y_stride, tiles, tile_bytes))
    ref::matmul_rows(weight_type, k, w, row_begin, row_end, acts, act_stride, n_act, y, y_stride);
}

PackedWeights PackedWeights::pack(TensorType type, int64_t k, const void* w, int64_t n_rows) {
  check_row("PackedWeights::pack", type, k);
  PackedWeights p;
  const size_t tile_bytes = HWY_DYNAMIC_DISPATCH(PackTileBytesT)(type, k);
  const int64_t tile_w = HWY_DYNAMIC_DISPATCH(TileWidthT)();
  if (tile_bytes == 0 || tile_w == 0 || n_rows < tile_w) return p;
  const int64_t n_tiles = n_rows / tile_w;
  p.type_ = type;
  p.k_ = k;
  p.n_rows_ = n_rows;
  p.rows_ = n_tiles * tile_w;
  p.target_ = HWY_DYNAMIC_DISPATCH(TargetIdT)();
  p.tile_bytes_ = tile_bytes;
  p.data_.resize(static_cast<size_t>(n_tiles) * tile_bytes);
  HWY_DYNAMIC_DISPATCH(PackTilesT)(type, k, w, 0, n_tiles, p.data_.data());
  return p;
}

void rms_norm(const float* x, const float* w, float* out, int64_t n, float eps) {
  HWY_DYNAMIC_DISPATCH(RmsNormT)(x, w, out, n, eps);
}
void swiglu(const float* gate, const float* up, float* out, int64_t n) {
  HWY_DYNAMIC_DISPATCH(SwigluT)(gate, up, out, n);
}
void geglu(const float* gate, const float* up, float* out, int64_t n) {
  HWY_DYNAMIC_DISPATCH(GegluT)(gate, up, out, n);
}
void softmax(float* x, int64_t n) {
  HWY_DYNAMIC_DISPATCH(SoftmaxT)(x, n);
}
LogitStats logit_stats(const float* x, int64_t n) {
  return HWY_DYNAMIC_DISPATCH(LogitStatsT)(x, n);
}
int64_t argmax(const float* x, int64_t n) {
  return HWY_DYNAMIC_DISPATCH(ArgmaxT)(x, n);
}
float dot_f32(const float* a, const float* b, int64_t n) {
  return HWY_DYNAMIC_DISPATCH(DotF32T)(a, b, n);
}
void axpy(float a, const float* x, float* y, int64_t n) {
  HWY_DYNAMIC_DISPATCH(AxpyT)(a, x, y, n);
}

void attention_scores(const float* queries, int64_t n_q, const float* keys, size_t key_stride,
                      int64_t n_k, int64_t hd, float scale, float* scores, size_t score_stride) {
  HWY_DYNAMIC_DISPATCH(AttentionScoresT)
  (queries, n_q, keys, key_stride, n_k, hd, scale, scores, score_stride);
}
void attention_values(const float* weights, size_t weight_stride, int64_t n_q, const float* values,
                      size_t value_stride, int64_t n_k, int64_t hdv, float* out,
                      size_t out_stride) {
  HWY_DYNAMIC_DISPATCH(AttentionValuesT)
  (weights, weight_stride, n_q, values, value_stride, n_k, hdv, out, out_stride);
}
void attention_rows(const float* const* q, float* const* out, int64_t n_q, const int32_t* lo,
                    const int32_t* hi, const float* keys, size_t key_stride, const float* values,
                    size_t value_stride, int64_t hd, int64_t hdv, float scale, float softcap) {
  attention_rows(q, out, n_q, lo, hi, TensorType::F32, keys, key_stride, TensorType::F32, values,
                 value_stride, hd, hdv, scale, softcap);
}
void attention_rows(const float* const* q, float* const* out, int64_t n_q, const int32_t* lo,
                    const int32_t* hi, TensorType key_type, const void* keys, size_t key_stride,
                    TensorType value_type, const void* values, size_t value_stride, int64_t hd,
                    int64_t hdv, float scale, float softcap) {
  for (int64_t a = 0; a < n_q; ++a) {
    if (lo[a] < 0 || hi[a] <= lo[a])
      throw std::invalid_argument("attention_rows: row " + std::to_string(a) + " sees keys [" +
                                  std::to_string(lo[a]) + ", " + std::to_string(hi[a]) +
                                  "), expected 0 <= lo < hi");
  }
  const auto is_kv = [](TensorType t) { return t == TensorType::F32 || t == TensorType::F16; };
  if (!is_kv(key_type) || !is_kv(value_type))
    throw std::invalid_argument(
        std::string("attention_rows: cache types ") + std::string(traits(key_type).name) + "/" +
        std::string(traits(value_type).name) + ", expected f32 or f16 each");
  const bool k16 = key_type == TensorType::F16, v16 = value_type == TensorType::F16;
  const auto kernel =
      k16 ? (v16 ? HWY_DYNAMIC_DISPATCH(AttentionRowsK16V16T)
                 : HWY_DYNAMIC_DISPATCH(AttentionRowsK16T))
          : (v16 ? HWY_DYNAMIC_DISPATCH(AttentionRowsV16T) : HWY_DYNAMIC_DISPATCH(AttentionRowsT));
  kernel(q, out, n_q, lo, hi, keys, key_stride, values, value_stride, hd, hdv, scale, softcap);
}

float f16_to_f32(uint16_t h) {
  return ref::f16_to_f32(h);
}
uint16_t f32_to_f16(float f) {
  return ref::f32_to_f16(f);
}
float bf16_to_f32(uint16_t h) {
  return ref::bf16_to_f32(h);
}
uint16_t f32_to_bf16(float f) {
  return ref::f32_to_bf16(f);
}

const char* simd_target_name() {
  return HWY_DYNAMIC_DISPATCH(TargetNameT)();
}

namespace {
int64_t g_pinned_target = 0;  // 0: dispatch picks the best target

// Every compiled target the CPU supports, whatever is pinned.
std::vector<int64_t> AllTargets() {
  hwy::SetSupportedTargetsForTest(0);
  std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  hwy::SetSupportedTargetsForTest(g_pinned_target);
  return targets;
}
}  // namespace

std::vector<std::string> simd_targets() {
  std::vector<std::string> names;
  for (int64_t t : AllTargets()) names.emplace_back(hwy::TargetName(t));
  return names;
}

void set_simd_target(const std::string& name) {
  std::string choices;
  for (int64_t t : AllTargets()) {
    if (name.empty() || name == hwy::TargetName(t)) {
      g_pinned_target = name.empty() ? 0 : t;
      hwy::SetSupportedTargetsForTest(g_pinned_target);
      return;
    }
    choices += std::string(choices.empty() ? "" : ", ") + hwy::TargetName(t);
  }
  throw std::invalid_argument("SIMD target '" + name + "' is not one this build and CPU support (" +
                              choices + ")");
}

}  // namespace tandem::kernels
#endif  // HWY_ONCE
