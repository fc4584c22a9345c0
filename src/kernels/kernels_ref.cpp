// Scalar reference kernels; see kernels_ref.h. Compiled with -ffp-contract=off so that no
// multiply-add is fused: dequantization must round exactly like ggml's to_float.
#include "kernels/kernels_ref.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/quant_blocks.h"

namespace tandem::kernels::ref {

namespace {

uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

[[noreturn]] void unsupported(const char* what, TensorType t) {
  throw std::invalid_argument(std::string("tandem::kernels: ") + what + " does not support type " +
                              std::string(traits(t).name));
}

// A K-quant super-block unpacked to integers: x[e] = d * sc[e / 16] * q[e] - dmin * mn[e / 16].
struct KBlock {
  int q[QK_K];
  int sc[QK_K / 16];
  int mn[QK_K / 16];
  float d;
  float dmin;
  bool has_min;
};

void unpack(const BlockQ2_K& b, KBlock& k) {
  for (int h = 0; h < 2; ++h)
    for (int j = 0; j < 4; ++j)
      for (int l = 0; l < 32; ++l) k.q[128 * h + 32 * j + l] = (b.qs[32 * h + l] >> (2 * j)) & 3;
  for (int g = 0; g < 16; ++g) {
    k.sc[g] = b.scales[g] & 0xF;
    k.mn[g] = b.scales[g] >> 4;
  }
  k.d = f16_to_f32(b.d);
  k.dmin = f16_to_f32(b.dmin);
  k.has_min = true;
}

void unpack(const BlockQ3_K& b, KBlock& k) {
  for (int h = 0; h < 2; ++h)
    for (int j = 0; j < 4; ++j)
      for (int l = 0; l < 32; ++l) {
        const int lo = (b.qs[32 * h + l] >> (2 * j)) & 3;
        const int hi = (b.hmask[l] >> (4 * h + j)) & 1;
        k.q[128 * h + 32 * j + l] = lo - (hi ? 0 : 4);
      }
  int8_t s[16];
  unpack_q3k_scales(b.scales, s);
  for (int g = 0; g < 16; ++g) {
    k.sc[g] = s[g] - 32;
    k.mn[g] = 0;
  }
  k.d = f16_to_f32(b.d);
  k.dmin = 0;
  k.has_min = false;
}

void unpack(const BlockQ4_K& b, KBlock& k) {
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) {
      k.q[64 * c + l] = b.qs[32 * c + l] & 0xF;
      k.q[64 * c + 32 + l] = b.qs[32 * c + l] >> 4;
    }
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    unpack_scale_min_k4(j, b.scales, &sc, &m);
    k.sc[2 * j] = k.sc[2 * j + 1] = sc;
    k.mn[2 * j] = k.mn[2 * j + 1] = m;
  }
  k.d = f16_to_f32(b.d);
  k.dmin = f16_to_f32(b.dmin);
  k.has_min = true;
}

void unpack(const BlockQ5_K& b, KBlock& k) {
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) {
      k.q[64 * c + l] = (b.qs[32 * c + l] & 0xF) + (((b.qh[l] >> (2 * c)) & 1) << 4);
      k.q[64 * c + 32 + l] = (b.qs[32 * c + l] >> 4) + (((b.qh[l] >> (2 * c + 1)) & 1) << 4);
    }
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    unpack_scale_min_k4(j, b.scales, &sc, &m);
    k.sc[2 * j] = k.sc[2 * j + 1] = sc;
    k.mn[2 * j] = k.mn[2 * j + 1] = m;
  }
  k.d = f16_to_f32(b.d);
  k.dmin = f16_to_f32(b.dmin);
  k.has_min = true;
}

void unpack(const BlockQ6_K& b, KBlock& k) {
  for (int h = 0; h < 2; ++h) {
    const uint8_t* ql = b.ql + 64 * h;
    const uint8_t* qh = b.qh + 32 * h;
    int* q = k.q + 128 * h;
    for (int l = 0; l < 32; ++l) {
      q[l] = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      q[l + 32] = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      q[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      q[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
    }
  }
  for (int g = 0; g < 16; ++g) {
    k.sc[g] = b.scales[g];
    k.mn[g] = 0;
  }
  k.d = f16_to_f32(b.d);
  k.dmin = 0;
  k.has_min = false;
}

template <class Block>
void dequant_k(const void* src, float* y, int64_t n) {
  const Block* b = static_cast<const Block*>(src);
  KBlock k;
  for (int64_t i = 0; i < n / QK_K; ++i) {
    unpack(b[i], k);
    for (int e = 0; e < QK_K; ++e) {
      const int g = e / 16;
      // Same operations as ggml: (d * scale) * q - dmin * min.
      const float dl = k.d * static_cast<float>(k.sc[g]);
      float v = dl * static_cast<float>(k.q[e]);
      if (k.has_min) v = v - k.dmin * static_cast<float>(k.mn[g]);
      y[i * QK_K + e] = v;
    }
  }
}

template <class Block>
float dot_k(int64_t n, const void* w, const void* a) {
  const Block* b = static_cast<const Block*>(w);
  const BlockQ8_K* y = static_cast<const BlockQ8_K*>(a);
  KBlock k;
  float sumf = 0;
  for (int64_t i = 0; i < n / QK_K; ++i) {
    unpack(b[i], k);
    int isum = 0, msum = 0;
    for (int g = 0; g < 16; ++g) {
      int s = 0;
      for (int l = 0; l < 16; ++l) s += k.q[16 * g + l] * y[i].qs[16 * g + l];
      isum += k.sc[g] * s;
      msum += k.mn[g] * y[i].bsums[g];
    }
    sumf += (k.d * y[i].d) * static_cast<float>(isum);
    if (k.has_min) sumf -= (k.dmin * y[i].d) * static_cast<float>(msum);
  }
  return sumf;
}

// Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 blocks unpacked: x[j] = d * q[j] + m.
struct Block32 {
  int q[32];
  float d;
  float m;
};

void unpack(const BlockQ4_0& b, Block32& o) {
  for (int j = 0; j < 16; ++j) {
    o.q[j] = (b.qs[j] & 0xF) - 8;
    o.q[j + 16] = (b.qs[j] >> 4) - 8;
  }
  o.d = f16_to_f32(b.d);
  o.m = 0;
}
void unpack(const BlockQ4_1& b, Block32& o) {
  for (int j = 0; j < 16; ++j) {
    o.q[j] = b.qs[j] & 0xF;
    o.q[j + 16] = b.qs[j] >> 4;
  }
  o.d = f16_to_f32(b.d);
  o.m = f16_to_f32(b.m);
}
void unpack(const BlockQ5_0& b, Block32& o) {
  uint32_t qh;
  std::memcpy(&qh, b.qh, 4);
  for (int j = 0; j < 16; ++j) {
    const int h0 = ((qh >> j) << 4) & 0x10;
    const int h1 = (qh >> (j + 12)) & 0x10;
    o.q[j] = ((b.qs[j] & 0xF) | h0) - 16;
    o.q[j + 16] = ((b.qs[j] >> 4) | h1) - 16;
  }
  o.d = f16_to_f32(b.d);
  o.m = 0;
}
void unpack(const BlockQ5_1& b, Block32& o) {
  uint32_t qh;
  std::memcpy(&qh, b.qh, 4);
  for (int j = 0; j < 16; ++j) {
    const int h0 = ((qh >> j) << 4) & 0x10;
    const int h1 = (qh >> (j + 12)) & 0x10;
    o.q[j] = (b.qs[j] & 0xF) | h0;
    o.q[j + 16] = (b.qs[j] >> 4) | h1;
  }
  o.d = f16_to_f32(b.d);
  o.m = f16_to_f32(b.m);
}
void unpack(const BlockQ8_0& b, Block32& o) {
  for (int j = 0; j < 32; ++j) o.q[j] = b.qs[j];
  o.d = f16_to_f32(b.d);
  o.m = 0;
}

template <class Block, bool kHasMin>
void dequant_32(const void* src, float* y, int64_t n) {
  const Block* b = static_cast<const Block*>(src);
  Block32 u;
  for (int64_t i = 0; i < n / 32; ++i) {
    unpack(b[i], u);
    for (int j = 0; j < 32; ++j) {
      float v = static_cast<float>(u.q[j]) * u.d;
      if constexpr (kHasMin) v = v + u.m;
      y[i * 32 + j] = v;
    }
  }
}

// Weights without min against Q8_0 activations.
template <class Block>
float dot_32_q8_0(int64_t n, const void* w, const void* a) {
  const Block* b = static_cast<const Block*>(w);
  const BlockQ8_0* y = static_cast<const BlockQ8_0*>(a);
  Block32 u;
  float sumf = 0;
  for (int64_t i = 0; i < n / 32; ++i) {
    unpack(b[i], u);
    int s = 0;
    for (int j = 0; j < 32; ++j) s += u.q[j] * y[i].qs[j];
    sumf += static_cast<float>(s) * u.d * f16_to_f32(y[i].d);
  }
  return sumf;
}

// Weights with min against Q8_1 activations: d_w d_a sum(q a) + m_w s_a.
template <class Block>
float dot_32_q8_1(int64_t n, const void* w, const void* a) {
  const Block* b = static_cast<const Block*>(w);
  const BlockQ8_1* y = static_cast<const BlockQ8_1*>(a);
  Block32 u;
  float sumf = 0;
  for (int64_t i = 0; i < n / 32; ++i) {
    unpack(b[i], u);
    int s = 0;
    for (int j = 0; j < 32; ++j) s += u.q[j] * y[i].qs[j];
    sumf += (u.d * f16_to_f32(y[i].d)) * static_cast<float>(s) + u.m * f16_to_f32(y[i].s);
  }
  return sumf;
}

void quantize_q8_0(const float* x, BlockQ8_0* y, int64_t n) {
  for (int64_t i = 0; i < n / QK8_0; ++i) {
    float amax = 0;
    for (int j = 0; j < QK8_0; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    // As ggml's x86 SIMD path computes it (the path that produced the reference vectors):
    // scale by 127/amax and round half to even. ggml's portable _ref variant uses 1/d and rounds
    // half away from zero, which moves whole rounding steps.
    const float d = amax / 127;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    y[i].d = f32_to_f16(d);
    for (int j = 0; j < QK8_0; ++j) y[i].qs[j] = static_cast<int8_t>(std::nearbyint(x[j] * id));
    x += QK8_0;
  }
}

void quantize_q8_1(const float* x, BlockQ8_1* y, int64_t n) {
  for (int64_t i = 0; i < n / QK8_1; ++i) {
    float amax = 0;
    for (int j = 0; j < QK8_1; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    const float d = amax / 127;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;  // x86 semantics, as for Q8_0
    y[i].d = f32_to_f16(d);
    int sum = 0;
    for (int j = 0; j < QK8_1; ++j) {
      y[i].qs[j] = static_cast<int8_t>(std::nearbyint(x[j] * id));
      sum += y[i].qs[j];
    }
    y[i].s = f32_to_f16(static_cast<float>(sum) * d);
    x += QK8_1;
  }
}

void quantize_q8_k(const float* x, BlockQ8_K* y, int64_t n) {
  for (int64_t i = 0; i < n / QK_K; ++i) {
    float max = 0, amax = 0;
    for (int j = 0; j < QK_K; ++j) {
      const float ax = std::fabs(x[j]);
      if (ax > amax) {
        amax = ax;
        max = x[j];
      }
    }
    if (amax == 0.0f) {
      // ggml leaves bsums untouched here; we zero them so the block is fully defined.
      std::memset(&y[i], 0, sizeof(BlockQ8_K));
      x += QK_K;
      continue;
    }
    const float iscale = -127.f / max;
    for (int j = 0; j < QK_K; ++j) {
      const int v = nearest_int(iscale * x[j]);
      y[i].qs[j] = static_cast<int8_t>(v < 127 ? v : 127);
    }
    for (int g = 0; g < QK_K / 16; ++g) {
      int s = 0;
      for (int l = 0; l < 16; ++l) s += y[i].qs[16 * g + l];
      y[i].bsums[g] = static_cast<int16_t>(s);
    }
    y[i].d = 1 / iscale;
    x += QK_K;
  }
}

}  // namespace

float f16_to_f32(uint16_t h) {
  return fp16_to_fp32(h);
}

uint16_t f32_to_f16(float f) {
  uint32_t x = f32_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  x &= 0x7FFFFFFF;
  if (x >= 0x7F800000) {
    if (x == 0x7F800000) return sign | 0x7C00;
    return sign | 0x7E00 | ((x >> 13) & 0x3FF);  // quiet NaN, top payload bits kept
  }
  if (x >= 0x477FF000) return sign | 0x7C00;  // >= 65520 rounds to infinity
  if (x < 0x38800000) {                       // below 2^-14: f16 subnormal or zero
    if (x <= 0x33000000) return sign;         // <= 2^-25 rounds to zero (tie to even)
    const uint32_t e = x >> 23;
    const uint32_t m = (x & 0x7FFFFF) | 0x800000;
    const uint32_t shift = 126 - e;  // value / 2^-24 = m * 2^(e - 126)
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) ++r;
    return sign | static_cast<uint16_t>(r);
  }
  const uint32_t v = x - 0x38000000;  // rebias exponent 127 -> 15
  uint32_t h = v >> 13;
  const uint32_t rem = v & 0x1FFF;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;
  return sign | static_cast<uint16_t>(h);
}

float bf16_to_f32(uint16_t h) {
  return bits_f32(static_cast<uint32_t>(h) << 16);
}

uint16_t f32_to_bf16(float f) {
  const uint32_t u = f32_bits(f);
  if ((u & 0x7FFFFFFF) > 0x7F800000) return static_cast<uint16_t>((u >> 16) | 64);  // quiet NaN
  return static_cast<uint16_t>((u + (0x7FFF + ((u >> 16) & 1))) >> 16);
}

int nearest_int(float f) {
  const float val = f + 12582912.f;
  int32_t i;
  std::memcpy(&i, &val, 4);
  return (i & 0x007FFFFF) - 0x00400000;
}

float gelu_tanh(float x) {
  const float kGeluCoefA = 0.044715f;
  const float kSqrt2OverPi = 0.79788456080286535587989211986876f;
  return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * x * (1.0f + kGeluCoefA * x * x)));
}

const uint16_t* gelu_f16_table() {
  static uint16_t table[65536];
  static std::once_flag once;
  std::call_once(once, [] {
    for (uint32_t h = 0; h < 65536; ++h)
      table[h] = f32_to_f16(gelu_tanh(f16_to_f32(static_cast<uint16_t>(h))));
  });
  return table;
}

float gelu_table(float x) {
  if (x <= -10.0f) return 0.0f;
  if (x >= 10.0f) return x;
  return f16_to_f32(gelu_f16_table()[f32_to_f16(x)]);
}

void dequantize_row(TensorType type, const void* src, float* dst, int64_t n) {
  switch (type) {
    case TensorType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case TensorType::F16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case TensorType::BF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case TensorType::Q4_0:
      return dequant_32<BlockQ4_0, false>(src, dst, n);
    case TensorType::Q4_1:
      return dequant_32<BlockQ4_1, true>(src, dst, n);
    case TensorType::Q5_0:
      return dequant_32<BlockQ5_0, false>(src, dst, n);
    case TensorType::Q5_1:
      return dequant_32<BlockQ5_1, true>(src, dst, n);
    case TensorType::Q8_0:
      return dequant_32<BlockQ8_0, false>(src, dst, n);
    case TensorType::Q2_K:
      return dequant_k<BlockQ2_K>(src, dst, n);
    case TensorType::Q3_K:
      return dequant_k<BlockQ3_K>(src, dst, n);
    case TensorType::Q4_K:
      return dequant_k<BlockQ4_K>(src, dst, n);
    case TensorType::Q5_K:
      return dequant_k<BlockQ5_K>(src, dst, n);
    case TensorType::Q6_K:
      return dequant_k<BlockQ6_K>(src, dst, n);
    case TensorType::Q8_K: {
      const BlockQ8_K* b = static_cast<const BlockQ8_K*>(src);
      for (int64_t i = 0; i < n / QK_K; ++i)
        for (int j = 0; j < QK_K; ++j) dst[i * QK_K + j] = b[i].d * b[i].qs[j];
      return;
    }
    case TensorType::Q8_1: {
      const BlockQ8_1* b = static_cast<const BlockQ8_1*>(src);
      for (int64_t i = 0; i < n / QK8_1; ++i)
        for (int j = 0; j < QK8_1; ++j)
          dst[i * QK8_1 + j] = static_cast<float>(b[i].qs[j]) * f16_to_f32(b[i].d);
      return;
    }
    default:
      unsupported("dequantize_row", type);
  }
}

void quantize_activation_row(TensorType act_type, const float* x, void* dst, int64_t n) {
  switch (act_type) {
    case TensorType::F32:
      std::memcpy(dst, x, static_cast<size_t>(n) * 4);
      return;
    case TensorType::F16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(x[i]);
      return;
    }
    case TensorType::BF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(x[i]);
      return;
    }
    case TensorType::Q8_0:
      return quantize_q8_0(x, static_cast<BlockQ8_0*>(dst), n);
    case TensorType::Q8_1:
      return quantize_q8_1(x, static_cast<BlockQ8_1*>(dst), n);
    case TensorType::Q8_K:
      return quantize_q8_k(x, static_cast<BlockQ8_K*>(dst), n);
    default:
      unsupported("quantize_activation_row", act_type);
  }
}

float vec_dot(TensorType weight_type, int64_t n, const void* w_row, const void* act_row) {
  switch (weight_type) {
    case TensorType::F32: {
      const float* a = static_cast<const float*>(w_row);
      const float* b = static_cast<const float*>(act_row);
      double s = 0;
      for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i] * b[i]);
      return static_cast<float>(s);
    }
    case TensorType::F16:
    case TensorType::BF16: {
      const bool bf = weight_type == TensorType::BF16;
      const uint16_t* a = static_cast<const uint16_t*>(w_row);
      const uint16_t* b = static_cast<const uint16_t*>(act_row);
      double s = 0;
      for (int64_t i = 0; i < n; ++i) {
        const float x = bf ? bf16_to_f32(a[i]) : f16_to_f32(a[i]);
        const float y = bf ? bf16_to_f32(b[i]) : f16_to_f32(b[i]);
        s += static_cast<double>(x * y);
      }
      return static_cast<float>(s);
    }
    case TensorType::Q4_0:
      return dot_32_q8_0<BlockQ4_0>(n, w_row, act_row);
    case TensorType::Q5_0:
      return dot_32_q8_0<BlockQ5_0>(n, w_row, act_row);
    case TensorType::Q8_0:
      return dot_32_q8_0<BlockQ8_0>(n, w_row, act_row);
    case TensorType::Q4_1:
      return dot_32_q8_1<BlockQ4_1>(n, w_row, act_row);
    case TensorType::Q5_1:
      return dot_32_q8_1<BlockQ5_1>(n, w_row, act_row);
    case TensorType::Q2_K:
      return dot_k<BlockQ2_K>(n, w_row, act_row);
    case TensorType::Q3_K:
      return dot_k<BlockQ3_K>(n, w_row, act_row);
    case TensorType::Q4_K:
      return dot_k<BlockQ4_K>(n, w_row, act_row);
    case TensorType::Q5_K:
      return dot_k<BlockQ5_K>(n, w_row, act_row);
    case TensorType::Q6_K:
      return dot_k<BlockQ6_K>(n, w_row, act_row);
    default:
      unsupported("vec_dot", weight_type);
  }
}

void matmul_rows(TensorType weight_type, int64_t k, const void* w, int64_t row_begin,
                 int64_t row_end, const void* acts, size_t act_stride, int64_t n_act, float* y,
                 int64_t y_stride) {
  const size_t w_stride = row_bytes(weight_type, k);
  const uint8_t* wb = static_cast<const uint8_t*>(w);
  const uint8_t* ab = static_cast<const uint8_t*>(acts);
  for (int64_t r = 0; r < n_act; ++r)
    for (int64_t i = row_begin; i < row_end; ++i)
      y[r * y_stride + i] = vec_dot(weight_type, k, wb + i * w_stride, ab + r * act_stride);
}

void rms_norm(const float* x, const float* w, float* out, int64_t n, float eps) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
  const float mean = static_cast<float>(sum / static_cast<double>(n));
  const float scale = 1.0f / std::sqrt(mean + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = (x[i] * scale) * w[i];
}

void swiglu(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = (g / (1.0f + std::exp(-g))) * up[i];
  }
}

void geglu(const float* gate, const float* up, float* out, int64_t n) {
  const uint16_t* table = gelu_f16_table();
  for (int64_t i = 0; i < n; ++i) {
    const float x = gate[i];
    if (x <= -10.0f)
      out[i] = 0.0f;
    else if (x >= 10.0f)
      out[i] = x * up[i];
    else
      out[i] = f16_to_f32(table[f32_to_f16(x)]) * up[i];
  }
}

void ExpMoments::add(const float* x, int64_t n, float max) {
  for (int64_t i = 0; i < n; ++i) {
    const double d =
        std::max(static_cast<double>(x[i]) - max, double{std::numeric_limits<float>::lowest()});
    const double e = std::exp(d);
    z += e;
    weighted += e * d;
  }
}

LogitStats ExpMoments::stats(float max) const {
  LogitStats st;
  st.max = max;
  st.log_z = max + std::log(z);
  st.entropy = std::log(z) - weighted / z;
  return st;
}

LogitStats logit_stats(const float* x, int64_t n) {
  if (n <= 0) return {};
  float max = -INFINITY;
  for (int64_t i = 0; i < n; ++i) max = std::fmax(max, x[i]);
  ExpMoments sums;
  sums.add(x, n, max);
  LogitStats st = sums.stats(max);
  st.argmax = argmax(x, n);
  return st;
}

int64_t argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

void softmax(float* x, int64_t n) {
  if (n <= 0) return;
  float max = -INFINITY;
  for (int64_t i = 0; i < n; ++i) max = std::fmax(max, x[i]);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

float dot_f32(const float* a, const float* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i] * b[i]);
  return static_cast<float>(s);
}

void axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

void attention_scores(const float* queries, int64_t n_q, const float* keys, size_t key_stride,
                      int64_t n_k, int64_t hd, float scale, float* scores, size_t score_stride) {
  for (int64_t q = 0; q < n_q; ++q)
    for (int64_t j = 0; j < n_k; ++j)
      scores[q * score_stride + j] = scale * dot_f32(queries + q * hd, keys + j * key_stride, hd);
}

void attention_values(const float* weights, size_t weight_stride, int64_t n_q, const float* values,
                      size_t value_stride, int64_t n_k, int64_t hdv, float* out,
                      size_t out_stride) {
  for (int64_t q = 0; q < n_q; ++q) {
    float* o = out + q * out_stride;
    std::fill(o, o + hdv, 0.0f);
    for (int64_t j = 0; j < n_k; ++j)
      axpy(weights[q * weight_stride + j], values + j * value_stride, o, hdv);
  }
}

void attention_rows(const float* const* q, float* const* out, int64_t n_q, const int32_t* lo,
                    const int32_t* hi, const float* keys, size_t key_stride, const float* values,
                    size_t value_stride, int64_t hd, int64_t hdv, float scale, float softcap) {
  std::vector<float> p;
  for (int64_t a = 0; a < n_q; ++a) {
    const int64_t n = hi[a] - lo[a];
    p.resize(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) {
      float s = scale * dot_f32(q[a], keys + (lo[a] + j) * key_stride, hd);
      if (softcap > 0) s = softcap * std::tanh(s / softcap);
      p[static_cast<size_t>(j)] = s;
    }
    softmax(p.data(), n);
    std::fill(out[a], out[a] + hdv, 0.0f);
    for (int64_t j = 0; j < n; ++j)
      axpy(p[static_cast<size_t>(j)], values + (lo[a] + j) * value_stride, out[a], hdv);
  }
}

void attention_rows(const float* const* q, float* const* out, int64_t n_q, const int32_t* lo,
                    const int32_t* hi, TensorType key_type, const void* keys, size_t key_stride,
                    TensorType value_type, const void* values, size_t value_stride, int64_t hd,
                    int64_t hdv, float scale, float softcap) {
  // Widens the rows the queries see into f32 copies and runs the f32 reference on them.
  int32_t n_k = 0;
  for (int64_t a = 0; a < n_q; ++a) n_k = std::max(n_k, hi[a]);
  const auto widen = [n_k](TensorType t, const void* src, size_t stride, int64_t width) {
    std::vector<float> rows(static_cast<size_t>(n_k) * stride);
    for (int64_t j = 0; j < n_k; ++j) {
      float* dst = rows.data() + j * stride;
      if (t == TensorType::F16) {
        const uint16_t* h = static_cast<const uint16_t*>(src) + j * stride;
        for (int64_t d = 0; d < width; ++d) dst[d] = f16_to_f32(h[d]);
      } else {
        std::memcpy(dst, static_cast<const float*>(src) + j * stride, sizeof(float) * width);
      }
    }
    return rows;
  };
  const std::vector<float> k = widen(key_type, keys, key_stride, hd);
  const std::vector<float> v = widen(value_type, values, value_stride, hdv);
  attention_rows(q, out, n_q, lo, hi, k.data(), key_stride, v.data(), value_stride, hd, hdv, scale,
                 softcap);
}

}  // namespace tandem::kernels::ref
