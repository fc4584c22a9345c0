// Block layouts of the ggml/GGUF quantized tensor types, as stored in a GGUF file.
//
// Every struct is packed and its size is checked against the type table in
// common/tensor_type.h. Scales are IEEE half precision (stored as raw uint16_t bits) unless
// noted. Element j of a row lives in block j / block_size; the position inside the block is
// type specific and documented per struct. All values are little-endian.
#pragma once

#include <cstdint>
#include <cstring>

namespace tandem::kernels {

constexpr int QK4_0 = 32;
constexpr int QK4_1 = 32;
constexpr int QK5_0 = 32;
constexpr int QK5_1 = 32;
constexpr int QK8_0 = 32;
constexpr int QK8_1 = 32;
constexpr int QK_K = 256;         // super-block size of the K-quants
constexpr int K_SCALE_SIZE = 12;  // packed 6-bit scales + mins of Q4_K/Q5_K

using f16_bits = uint16_t;   // IEEE binary16
using bf16_bits = uint16_t;  // bfloat16 (top half of an f32)

// Exact IEEE binary16 -> binary32 (all 65536 patterns; NaN payloads kept), branch-free so it
// can be inlined into the kernels' block loops. Normal values are rebiased by one multiply by
// 2^-112; subnormals are built as (0.5 + m * 2^-24) - 0.5, both exact.
inline float fp16_to_fp32(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  uint32_t nb = (two_w >> 4) + (0xE0u << 23);
  float normalized;
  std::memcpy(&normalized, &nb, 4);
  normalized *= 0x1.0p-112f;
  uint32_t db = (two_w >> 17) | (126u << 23);
  float denormalized;
  std::memcpy(&denormalized, &db, 4);
  denormalized -= 0.5f;
  uint32_t r;
  if (two_w < (1u << 27)) {
    std::memcpy(&r, &denormalized, 4);
  } else {
    std::memcpy(&r, &normalized, 4);
  }
  r |= sign;
  float out;
  std::memcpy(&out, &r, 4);
  return out;
}

#pragma pack(push, 1)

// x = d * (q - 8), q in [0, 15]. qs[j] holds element j (low nibble) and j + 16 (high nibble).
struct BlockQ4_0 {
  f16_bits d;
  uint8_t qs[QK4_0 / 2];
};
static_assert(sizeof(BlockQ4_0) == 18);

// x = d * q + m, q in [0, 15]; nibble order as Q4_0.
struct BlockQ4_1 {
  f16_bits d;
  f16_bits m;
  uint8_t qs[QK4_1 / 2];
};
static_assert(sizeof(BlockQ4_1) == 20);

// x = d * (q - 16), q in [0, 31]: low 4 bits as Q4_0, bit 4 of element j is bit j of qh
// (qh read as a little-endian uint32).
struct BlockQ5_0 {
  f16_bits d;
  uint8_t qh[4];
  uint8_t qs[QK5_0 / 2];
};
static_assert(sizeof(BlockQ5_0) == 22);

// x = d * q + m, q in [0, 31]; bits as Q5_0.
struct BlockQ5_1 {
  f16_bits d;
  f16_bits m;
  uint8_t qh[4];
  uint8_t qs[QK5_1 / 2];
};
static_assert(sizeof(BlockQ5_1) == 24);

// x = d * q, q int8. Also the activation type of Q4_0/Q5_0/Q8_0 weights.
struct BlockQ8_0 {
  f16_bits d;
  int8_t qs[QK8_0];
};
static_assert(sizeof(BlockQ8_0) == 34);

// Activation type of Q4_1/Q5_1 weights: x = d * q, s = d * sum(q) (both f16).
struct BlockQ8_1 {
  f16_bits d;
  f16_bits s;
  int8_t qs[QK8_1];
};
static_assert(sizeof(BlockQ8_1) == 36);

// 2-bit K-quant. 16 sub-blocks of 16: scales[i] low nibble = scale, high nibble = min.
// x = d * scale * q - dmin * min, q in [0, 3]. Each 128-element half uses 32 bytes of qs:
// element 32 * j + l (j = 0..3 within the half) is bits 2j..2j+1 of qs[l] (l < 32).
struct BlockQ2_K {
  uint8_t scales[QK_K / 16];
  uint8_t qs[QK_K / 4];
  f16_bits d;
  f16_bits dmin;
};
static_assert(sizeof(BlockQ2_K) == 84);

// 3-bit K-quant. 16 sub-blocks of 16 with 6-bit scales (packed in 12 bytes, stored + 32).
// Low 2 bits as Q2_K; the high bit of element 32 * j + l (j = 0..7 over the block) is bit j of
// hmask[l]; when that bit is clear, 4 is subtracted: q in [-4, 3]. x = d * (scale - 32) * q.
struct BlockQ3_K {
  uint8_t hmask[QK_K / 8];
  uint8_t qs[QK_K / 4];
  uint8_t scales[12];
  f16_bits d;
};
static_assert(sizeof(BlockQ3_K) == 110);

// 4-bit K-quant. 8 sub-blocks of 32 with 6-bit scale and min packed in scales[12]
// (sub-block j < 4: scale = s[j] & 63, min = s[j + 4] & 63; j >= 4: scale = (s[j + 4] & 15) |
// (s[j - 4] >> 6) << 4, min = (s[j + 4] >> 4) | (s[j] >> 6) << 4).
// x = d * scale * q - dmin * min. Each 64-element chunk uses 32 bytes: low nibbles are its first
// 32 elements, high nibbles the next 32.
struct BlockQ4_K {
  f16_bits d;
  f16_bits dmin;
  uint8_t scales[K_SCALE_SIZE];
  uint8_t qs[QK_K / 2];
};
static_assert(sizeof(BlockQ4_K) == 144);

// 5-bit K-quant: Q4_K plus a fifth bit; for 64-element chunk c, bit 2c of qh[l] is the high bit
// of its element l and bit 2c + 1 that of element 32 + l.
struct BlockQ5_K {
  f16_bits d;
  f16_bits dmin;
  uint8_t scales[K_SCALE_SIZE];
  uint8_t qh[QK_K / 8];
  uint8_t qs[QK_K / 2];
};
static_assert(sizeof(BlockQ5_K) == 176);

// 6-bit K-quant. 16 sub-blocks of 16 with int8 scales. x = d * scale * (q - 32), q in [0, 63].
// Per 128-element half (ql += 64, qh += 32): for l < 32, element l = ql[l] low | qh[l] bits 0-1,
// l + 32 = ql[l + 32] low | bits 2-3, l + 64 = ql[l] high | bits 4-5, l + 96 = ql[l + 32] high |
// bits 6-7 (the qh bits are bits 4-5 of q).
struct BlockQ6_K {
  uint8_t ql[QK_K / 2];
  uint8_t qh[QK_K / 4];
  int8_t scales[QK_K / 16];
  f16_bits d;
};
static_assert(sizeof(BlockQ6_K) == 210);

// Activation type of the K-quants: x = d * q (d is f32), bsums = sums of q over groups of 16.
struct BlockQ8_K {
  float d;
  int8_t qs[QK_K];
  int16_t bsums[QK_K / 16];
};
static_assert(sizeof(BlockQ8_K) == 292);

#pragma pack(pop)

// Scale and min of sub-block j (0..7) from the 12 packed 6-bit scales of Q4_K/Q5_K (layout in
// BlockQ4_K's comment).
inline void unpack_scale_min_k4(int j, const uint8_t* s, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// The 16 6-bit sub-block scales of Q3_K (still biased by +32) from its 12 packed bytes.
inline void unpack_q3k_scales(const uint8_t* packed, int8_t out[16]) {
  uint32_t aux[4];
  std::memcpy(aux, packed, 12);
  const uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
  const uint32_t tmp = aux[2];
  aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
  aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
  aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
  aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
  std::memcpy(out, aux, 16);
}

}  // namespace tandem::kernels
