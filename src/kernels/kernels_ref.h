// Scalar reference kernels. These follow ggml's generic (non-SIMD) C code operation by
// operation, so dequantization is bit-exact and dot products use the same integer arithmetic
// (results differ from ggml only by float summation order). The SIMD kernels behind
// kernels.h are tested against these.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/tensor_type.h"
#include "kernels/kernels.h"  // LogitStats

namespace tandem::kernels::ref {

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);  // round to nearest even; NaN stays NaN (quiet, payload kept)
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);  // ggml_compute_fp32_to_bf16: RNE, NaN -> quiet NaN

// ggml's nearest_int (round half to even through the 1.5 * 2^23 trick).
int nearest_int(float f);

// gelu_tanh in f32, written as ggml_gelu_f32 is.
float gelu_tanh(float x);
// ggml_table_gelu_f16: entry h = f32_to_f16(gelu_tanh(f16_to_f32(h))). Built once, thread-safe.
const uint16_t* gelu_f16_table();
// ggml's table GELU for one value (x <= -10 -> 0, x >= 10 -> x, else table lookup).
float gelu_table(float x);

void dequantize_row(TensorType type, const void* src, float* dst, int64_t n);
void quantize_activation_row(TensorType act_type, const float* x, void* dst, int64_t n);
float vec_dot(TensorType weight_type, int64_t n, const void* w_row, const void* act_row);
void matmul_rows(TensorType weight_type, int64_t k, const void* w, int64_t row_begin,
                 int64_t row_end, const void* acts, size_t act_stride, int64_t n_act, float* y,
                 int64_t y_stride);

void rms_norm(const float* x, const float* w, float* out, int64_t n, float eps);
void swiglu(const float* gate, const float* up, float* out, int64_t n);
void geglu(const float* gate, const float* up, float* out, int64_t n);
void softmax(float* x, int64_t n);
LogitStats logit_stats(const float* x, int64_t n);
int64_t argmax(const float* x, int64_t n);
// Running sums over a logits row for logit_stats: z = sum exp(d), weighted = sum exp(d) * d with
// d = x - max (a -inf logit, a masked token, adds 0 to both).
struct ExpMoments {
  double z = 0, weighted = 0;
  void add(const float* x, int64_t n, float max);
  LogitStats stats(float max) const;  // entropy = log z - weighted / z
};
float dot_f32(const float* a, const float* b, int64_t n);
void axpy(float a, const float* x, float* y, int64_t n);
void attention_scores(const float* queries, int64_t n_q, const float* keys, size_t key_stride,
                      int64_t n_k, int64_t hd, float scale, float* scores, size_t score_stride);
void attention_values(const float* weights, size_t weight_stride, int64_t n_q, const float* values,
                      size_t value_stride, int64_t n_k, int64_t hdv, float* out, size_t out_stride);
void attention_rows(const float* const* q, float* const* out, int64_t n_q, const int32_t* lo,
                    const int32_t* hi, const float* keys, size_t key_stride, const float* values,
                    size_t value_stride, int64_t hd, int64_t hdv, float scale, float softcap);
void attention_rows(const float* const* q, float* const* out, int64_t n_q, const int32_t* lo,
                    const int32_t* hi, TensorType key_type, const void* keys, size_t key_stride,
                    TensorType value_type, const void* values, size_t value_stride, int64_t hd,
                    int64_t hdv, float scale, float softcap);

}  // namespace tandem::kernels::ref
