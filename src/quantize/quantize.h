// Quantizers: f32 rows -> every tensor type the engine reads, in ggml's block layouts.
//
// The algorithms are those of ggml's reference quantizers (what llama-quantize uses when no
// importance matrix is given), so a tensor quantized here is the tensor llama.cpp would write:
//   Q4_0/Q5_0   d = (signed max-abs value) / -8 (-16), q = round(x / d) + 8 (16)
//   Q4_1/Q5_1   d = (max - min) / 15 (31), m = min, q = round((x - m) / d)
//   Q8_0        d = max|x| / 127, q = round(x / d)
//   Q2_K/Q4_K/Q5_K  per sub-block scale and min from an iterative weighted least-squares search
//               (make_qkx2_quants: try nstep+1 inverse scales around nmax / (max - min), refit
//               scale and min by least squares on the rounded levels, keep the best weighted
//               error), then 4/6-bit super-block quantization of the scales and mins and a final
//               re-rounding of every value with the stored scales.
//   Q3_K        per 16 values make_q3_quants (signed levels, coordinate-descent refinement of
//               each level under the weighted error x^2), 6-bit scales.
//   Q6_K        per 16 values make_qx_quants with rmse_type 1 (19 candidate scales around the
//               max-abs one, weighted least squares), 8-bit scales.
// Weights of the K-quant errors: Q4_K/Q5_K sqrt(mean x^2) + |x|, Q2_K |x| (absolute error),
// Q3_K/Q6_K x^2 — as ggml's reference quantizers.
//
// Every function is thread-safe; quantize_rows splits the rows over a thread pool.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/tensor_type.h"

namespace tandem {
class ThreadPool;
}

namespace tandem::quant {

// True for the types quantize_row can produce: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
// Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.
bool can_quantize(TensorType type);

// Quantizes n values (n a multiple of the type's block size; throws tandem::Error otherwise)
// into dst, which holds row_bytes(type, n) bytes.
void quantize_row(TensorType type, const float* x, void* dst, int64_t n);

// Quantizes n_rows rows of n_per_row values (x: [n_rows][n_per_row]) into dst
// (n_rows * row_bytes(type, n_per_row) bytes). Runs on `pool` when given.
void quantize_rows(TensorType type, const float* x, void* dst, int64_t n_rows, int64_t n_per_row,
                   ThreadPool* pool = nullptr);

// Converts n values of any readable type (F32, F16, BF16, the quantized types) to f32.
void to_f32(TensorType type, const void* src, float* dst, int64_t n);

// ---- building blocks, exposed for tests ----

// ggml's nearest_int: round half to even for |f| < 2^22.
int nearest_int(float f);

// Weighted least-squares search for an asymmetric (scale, min) pair with levels 0..nmax.
// Returns the scale; *neg_min receives -min (>= 0). L receives the levels; Laux is scratch.
float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                       float* neg_min, uint8_t* Laux, float rmin, float rdelta, int nstep,
                       bool use_mad);
// Symmetric quantization with levels -nmax..nmax-1 (returned shifted by +nmax in L).
float make_q3_quants(int n, int nmax, const float* x, int8_t* L, bool do_rmse);
float make_qx_quants(int n, int nmax, const float* x, int8_t* L, int rmse_type, const float* qw);

}  // namespace tandem::quant
