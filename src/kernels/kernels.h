// Kernel API: dequantization, activation quantization and dot products for every supported
// tensor type, plus the f32 elementwise ops the forward pass needs.
//
// Numerics follow llama.cpp's CPU backend so that tandem reproduces its logits: before a matrix
// product with a non-f32 weight, the activation row is converted to the weight type's
// "activation type" (F16 -> f16, BF16 -> bf16, Q4_0/Q5_0/Q8_0 -> Q8_0, Q4_1/Q5_1 -> Q8_1,
// K-quants -> Q8_K) and the dot product runs on the integer/half values.
//
// Every function here dispatches at run time (Highway) to the best SIMD target of the machine;
// the scalar reference versions live in kernels_ref.h and are what the SIMD code is tested
// against.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/aligned_vector.h"
#include "common/tensor_type.h"
#include "tandem/vector_ops.h"  // LogitStats

namespace tandem::kernels {

// True when the engine can compute with weights of this type.
bool is_supported_weight_type(TensorType type);

// Dequantizes n elements (n a multiple of the type's block size) into f32.
// Bit-exact with ggml's to_float for every supported type.
void dequantize_row(TensorType type, const void* src, float* dst, int64_t n);

// Activation type used for dot products against weights of type `weight_type`.
TensorType activation_type(TensorType weight_type);

// Converts an f32 activation row into `act_type` layout; dst holds row_bytes(act_type, n).
void quantize_activation_row(TensorType act_type, const float* x, void* dst, int64_t n);

// Dot product of one weight row (type weight_type) with one activation row already converted
// to activation_type(weight_type). n elements.
float vec_dot(TensorType weight_type, int64_t n, const void* w_row, const void* act_row);

// Y[r][i] = dot(W row i, X row r) for rows i in [row_begin, row_end) of W and all n_act
// prepared activation rows. W: [n_w_rows][k] of weight_type (row stride row_bytes(weight_type,
// k)); acts: n_act rows of activation_type(weight_type), stride act_stride bytes;
// Y: [n_act][y_stride] f32. Blocked so each weight row is read once for all activation rows.
// Batch invariant: Y[r][i] is bit for bit the same for any n_act, any place of the activation
// row among them and any [row_begin, row_end) containing i (on a given SIMD target).
void matmul_rows(TensorType weight_type, int64_t k, const void* w, int64_t row_begin,
                 int64_t row_end, const void* acts, size_t act_stride, int64_t n_act, float* y,
                 int64_t y_stride);

// A quantized weight matrix copied once into the layout the batched kernels stage their weight
// tiles in ("repacking"), so that a call with a few activation rows (a server's batch of decode
// rows) skips the per-call decode of every weight, which otherwise costs about as much as the
// multiply at 32 rows. The copy is kept next to the original, which single rows and the rows
// short of a whole tile still read. Valid on the SIMD target it was made on; on any other,
// matmul_rows ignores it. Results are bit for bit those without it.
class PackedWeights {
 public:
  PackedWeights() = default;
  // Packs the whole tiles of rows [0, n_rows) of W ([n_rows][k] of `type`). Empty when the type
  // has no tiled kernel on the current target (f32/f16/bf16, the scalar target).
  static PackedWeights pack(TensorType type, int64_t k, const void* w, int64_t n_rows);

  bool empty() const { return rows_ == 0; }
  int64_t rows() const { return rows_; }  // rows held: n_rows rounded down to whole tiles
  size_t bytes() const { return data_.size(); }

 private:
  friend void matmul_rows(TensorType, int64_t, const void*, int64_t, int64_t, const void*, size_t,
                          int64_t, float*, int64_t, const PackedWeights*);
  TensorType type_ = TensorType::F32;
  int64_t k_ = 0;
  int64_t n_rows_ = 0;  // rows of the original matrix
  int64_t rows_ = 0;
  int64_t target_ = 0;     // the Highway target that made it
  size_t tile_bytes_ = 0;  // bytes per tile of tile-width rows
  HugePageVector<uint8_t> data_;
};

// matmul_rows with W's packed copy (or null): the same results, faster for n_act >= 2.
void matmul_rows(TensorType weight_type, int64_t k, const void* w, int64_t row_begin,
                 int64_t row_end, const void* acts, size_t act_stride, int64_t n_act, float* y,
                 int64_t y_stride, const PackedWeights* packed);

// ---- f32 elementwise ops (x: [n]) ----

// out = x / sqrt(mean(x^2) + eps) * w (sum of squares accumulated in double, as ggml does).
void rms_norm(const float* x, const float* w, float* out, int64_t n, float eps);
// out[i] = silu(gate[i]) * up[i]
void swiglu(const float* gate, const float* up, float* out, int64_t n);
// out[i] = gelu_tanh(gate[i]) * up[i], using ggml's f16 lookup-table GELU.
void geglu(const float* gate, const float* up, float* out, int64_t n);
// In-place softmax over n values.
void softmax(float* x, int64_t n);
// What a logits row's softmax says without writing it: the largest logit, log Z = log sum
// exp(x) and the entropy in nats, in one read of the row (a vocabulary row is ~1 MiB, read per
// generated token by the server's log-probabilities and the router's signal).
// The index of the first largest logit comes with them (argmax's answer), found in the same
// read, so that greedy decoding with log-probabilities reads the row twice, not four times.
// The struct is the public one (tandem/vector_ops.h), which hands these out unchanged.
using LogitStats = tandem::LogitStats;
LogitStats logit_stats(const float* x, int64_t n);
// Index of the first largest of x[0..n) (greedy sampling over a vocabulary row); 0 for n <= 0.
// For finite inputs and -inf; with NaNs, some index in range.
int64_t argmax(const float* x, int64_t n);
// sum_i a[i] * b[i]
float dot_f32(const float* a, const float* b, int64_t n);
// y[i] += a * x[i]
void axpy(float a, const float* x, float* y, int64_t n);

// ---- attention (f32) ----

// scores[q * score_stride + j] = scale * dot(queries[q], keys[j]) for n_q query rows (hd floats
// each, consecutive) and n_k key rows (hd floats at key_stride floats apart).
void attention_scores(const float* queries, int64_t n_q, const float* keys, size_t key_stride,
                      int64_t n_k, int64_t hd, float scale, float* scores, size_t score_stride);
// out[q * out_stride + d] = sum_j weights[q * weight_stride + j] * values[j][d], summed in order
// of j (the same f32 result as n_k axpy calls); values: n_k rows of hdv floats, value_stride apart.
void attention_values(const float* weights, size_t weight_stride, int64_t n_q, const float* values,
                      size_t value_stride, int64_t n_k, int64_t hdv, float* out, size_t out_stride);

// Attention of n_q query rows over one run of cached keys/values (prefill: the query heads of
// several tokens that share a KV head). Row a sees the keys [lo[a], hi[a]) of the run
// (0 <= lo < hi): out[a] = sum_j p[a][j] * values[j] with p[a] = softmax over those keys of
// s = scale * dot(q[a], keys[j]), taken through softcap * tanh(s / softcap) first when
// softcap > 0. q[a] / out[a] point at hd / hdv floats; key and value rows are key_stride /
// value_stride floats apart. Throws std::invalid_argument on an empty or negative range.
// Batch invariant: out[a] is bit for bit the same whatever the other rows of the call (n_q = 1
// included), on a given SIMD target.
void attention_rows(const float* const* q, float* const* out, int64_t n_q, const int32_t* lo,
                    const int32_t* hi, const float* keys, size_t key_stride, const float* values,
                    size_t value_stride, int64_t hd, int64_t hdv, float scale, float softcap);
// The same over a cache whose keys and values are each f32 or f16 (key_type, value_type:
// TensorType::F32 or F16; f16 rows are IEEE binary16 bits, strides count elements). f16 rows are
// widened to f32 as they load; the arithmetic is the f32 kernel's, so the result equals
// attention_rows over the widened rows, bit for bit on a given target. Throws
// std::invalid_argument for any other type.
void attention_rows(const float* const* q, float* const* out, int64_t n_q, const int32_t* lo,
                    const int32_t* hi, TensorType key_type, const void* keys, size_t key_stride,
                    TensorType value_type, const void* values, size_t value_stride, int64_t hd,
                    int64_t hdv, float scale, float softcap);

// Half-precision conversions (IEEE binary16 and bfloat16), bit-exact with ggml.
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);

// Name of the SIMD target that dispatch selected on this machine (e.g. "AVX3_DL").
const char* simd_target_name();
// Names of the compiled targets this CPU supports, best first (e.g. AVX3_DL AVX3 AVX2 ...).
std::vector<std::string> simd_targets();
// Restricts dispatch to one of simd_targets() (benchmarks of older CPUs, debugging); "" restores
// the best one. Throws std::invalid_argument naming the choices for any other name. Call it
// before kernels run, not while they do.
void set_simd_target(const std::string& name);

}  // namespace tandem::kernels
