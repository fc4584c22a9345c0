// Integer dot products of quantized weight rows with quantized activation rows (Highway),
// included by kernels-inl.h once per SIMD target.
//
// Weights are read straight from their GGUF blocks (memory-mapped, never copied or repacked)
// and decoded in registers to 8-bit lanes, 32 elements per block step:
//   * K-quants (Q2_K..Q6_K) decode to unsigned values u and a per-16-element integer scale s and
//     "min" mn, so that w = d * s * u - dmin * mn for every element (Q6_K: u = q, mn = 32 * s,
//     dmin = d; Q3_K: u = q + 4, mn = 4 * s). sum(w * a) over a super-block is then
//     d * sum(s * u * a) - dmin * sum(mn * bsum), where bsum (per 16 activations) comes with the
//     Q8_K activation block.
//   * 32-element types decode to unsigned values u with w = d * u + c per block (Q4_0/Q5_0:
//     c = -8d / -16d; Q4_1/Q5_1: c = m), the c term taken against d_a * sum(a) of the activation
//     block (carried by Q8_1, computed once per call for Q8_0); Q8_0 weights stay signed.
//     Four blocks go together: their integer sums are folded into one vector with horizontal
//     pair adds (exact), then combined in f32 block by block in the prefill tiles' order.
// The multiply is the u8 x s8 -> s16 pairwise multiply-add (pmaddubsw on x86; an emulation from
// 16-bit ops elsewhere); signed weights go through it as |w| x (a * sign(w)). The s16 pair sums
// are then multiplied by the sub-block scale (or 1) and summed pairwise into s32 (pmaddwd).
// No step saturates: |w| <= 128 and |a| <= 127 (quantize_activation_row never writes -128), so a
// pair sum is at most 2 * 128 * 127 < 2^15, and a super-block's s32 sum stays below 2^31. The
// integer sums per block are therefore exactly ggml's; only the f32 accumulation order differs
// from ggml's. It is the same as the prefill tiles' (tile_dot-inl.h), so that a row's result does
// not depend on which kernel its batch took (batch invariance).
//
// One call of DotRow computes RW weight rows against RA activation rows (RA = 1 for decode, up
// to 4 for small batches): each weight block is decoded once and used RA times. Prefill takes the
// tiled kernels of tile_dot-inl.h instead, which stage K-quant rows through StageRowK.

#if defined(TANDEM_QUANT_DOT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TANDEM_QUANT_DOT_INL_H_
#undef TANDEM_QUANT_DOT_INL_H_
#else
#define TANDEM_QUANT_DOT_INL_H_
#endif

#include <cstddef>
#include <cstring>

#include "common/tensor_type.h"
#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "kernels/quant_blocks.h"

HWY_BEFORE_NAMESPACE();
namespace tandem::kernels {
namespace HWY_NAMESPACE {
namespace qd {
namespace hn = hwy::HWY_NAMESPACE;

// The scalar target has one lane per vector: it uses the reference kernels instead.
#if HWY_TARGET != HWY_SCALAR

// 32 int8 lanes where the target has 256-bit vectors, else 16: one step covers 32 elements.
using D8 = hn::CappedTag<int8_t, 32>;
using DU8 = hn::RebindToUnsigned<D8>;
using D16 = hn::Repartition<int16_t, D8>;
using D32 = hn::Repartition<int32_t, D8>;
using DF = hn::Repartition<float, D8>;
using V8 = hn::Vec<D8>;
using VU8 = hn::Vec<DU8>;
using V16 = hn::Vec<D16>;
using V32 = hn::Vec<D32>;
using VF = hn::Vec<DF>;
constexpr size_t kN = hn::MaxLanes(D8());
constexpr size_t kPer32 = 32 / kN;  // vectors per 32 elements (1 or 2)
static_assert(kN == 16 || kN == 32, "quant_dot expects 128- or 256-bit int8 vectors");

// ---------------------------------------------------------------- target primitives

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_SSSE3
HWY_INLINE hn::Vec128<int16_t> MulPairs(hn::Vec128<uint8_t> u, hn::Vec128<int8_t> s) {
  return hn::Vec128<int16_t>{_mm_maddubs_epi16(u.raw, s.raw)};
}
HWY_INLINE hn::Vec128<int8_t> ApplySign(hn::Vec128<int8_t> a, hn::Vec128<int8_t> w) {
  return hn::Vec128<int8_t>{_mm_sign_epi8(a.raw, w.raw)};
}
#if HWY_TARGET <= HWY_AVX2
HWY_INLINE hn::Vec256<int16_t> MulPairs(hn::Vec256<uint8_t> u, hn::Vec256<int8_t> s) {
  return hn::Vec256<int16_t>{_mm256_maddubs_epi16(u.raw, s.raw)};
}
HWY_INLINE hn::Vec256<int8_t> ApplySign(hn::Vec256<int8_t> a, hn::Vec256<int8_t> w) {
  return hn::Vec256<int8_t>{_mm256_sign_epi8(a.raw, w.raw)};
}
#endif
// acc + pairwise sums of p * s (pmaddwd and an add; vpdpwssd, one instruction, with AVX-512
// VNNI, written out for the reason DotQuads gives).
HWY_INLINE V32 MulAddPairs(V16 p, V16 s, V32 acc) {
#if HWY_TARGET == HWY_AVX3_DL
  asm("vpdpwssd %2, %1, %0" : "+v"(acc.raw) : "v"(p.raw), "v"(s.raw));
  return acc;
#else
  V32 unused = hn::Zero(D32());
  return hn::ReorderWidenMulAccumulate(D32(), p, s, acc, unused);
#endif
}
#else
// u8 x s8 -> s16: lane i = sat(u[2i] * s[2i] + u[2i+1] * s[2i+1]), from 16-bit operations.
HWY_INLINE V16 MulPairs(VU8 u, V8 s) {
  const D16 d16;
  const hn::RebindToUnsigned<D16> du16;
  const auto u_even = hn::BitCast(d16, hn::And(hn::BitCast(du16, u), hn::Set(du16, 0xFF)));
  const auto u_odd = hn::BitCast(d16, hn::ShiftRight<8>(hn::BitCast(du16, u)));
  const auto s16 = hn::BitCast(d16, s);
  const auto s_even = hn::ShiftRight<8>(hn::ShiftLeft<8>(s16));
  const auto s_odd = hn::ShiftRight<8>(s16);
  return hn::SaturatedAdd(hn::Mul(u_even, s_even), hn::Mul(u_odd, s_odd));
}
// a where w > 0, -a where w < 0 (lanes with w == 0 are multiplied by |w| = 0 anyway).
HWY_INLINE V8 ApplySign(V8 a, V8 w) {
  return hn::IfThenElse(hn::Lt(w, hn::Zero(D8())), hn::Neg(a), a);
}
HWY_INLINE V32 MulAddPairs(V16 p, V16 s, V32 acc) {
  V32 s1 = hn::Zero(D32());
  const V32 s0 = hn::ReorderWidenMulAccumulate(D32(), p, s, hn::Zero(D32()), s1);
  return hn::Add(acc, hn::RearrangeToOddPlusEven(s0, s1));
}
#endif

// acc + per 32-bit lane: the sum of the four u8 x s8 products of its bytes.
HWY_INLINE V32 DotQuads(V32 acc, VU8 u, V8 s) {
#if HWY_TARGET == HWY_AVX3_DL
  // vpdpbusd (AVX-512 VNNI, 256-bit form), written out: Highway 1.0 compiles this target without
  // GCC's avx512vnni flag. Same sums as below: those never saturate (see the top).
  asm("vpdpbusd %2, %1, %0" : "+v"(acc.raw) : "v"(u.raw), "v"(s.raw));
  return acc;
#else
  return MulAddPairs(MulPairs(u, s), hn::Set(D16(), 1), acc);
#endif
}

HWY_INLINE float HalfToFloat(uint16_t h) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  return _cvtsh_ss(h);  // F16C is part of Highway's AVX2 target
#elif HWY_ARCH_ARM_A64
  __fp16 v;
  std::memcpy(&v, &h, 2);
  return static_cast<float>(v);
#else
  return fp16_to_fp32(h);
#endif
}

HWY_INLINE uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
HWY_INLINE uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Fetches the `bytes` at p (never faults, even past the end of the weights).
HWY_INLINE void PrefetchAt(const uint8_t* p, size_t bytes) {
  for (size_t off = 0; off < bytes; off += 64) hwy::Prefetch(p + off);
}

// How far ahead of the loads decode fetches its weights (docs/benchmarks.md, "Decode prefetch
// distance"): against 1 KiB, 4 KiB decodes the Qwen files 10-11% faster; 8 KiB was slower.
inline constexpr size_t kPrefetchAheadBytes = 4096;

// Decode streams each weight byte once: fetch the `bytes` at p kPrefetchAheadBytes ahead of the
// loads.
HWY_INLINE void PrefetchAhead(const void* p, size_t bytes) {
  const auto* next = static_cast<const uint8_t*>(p) + kPrefetchAheadBytes;
  for (size_t off = 0; off < bytes; off += 64) hwy::Prefetch(next + off);
}

// Elements [0, 32) of a 16-byte nibble array (element j < 16: low nibble of qs[j]; j >= 16: high
// nibble of qs[j - 16]) as kPer32 vectors.
template <size_t N = kN>
HWY_INLINE void Nibbles32(const uint8_t* qs, VU8* out) {
  const DU8 du;
  if constexpr (N == 32) {
    const hn::Half<DU8> dh;
    const auto v = hn::LoadU(dh, qs);
    out[0] = hn::Combine(du, hn::ShiftRight<4>(v), hn::And(v, hn::Set(dh, 0x0F)));
  } else {
    const auto v = hn::LoadU(du, qs);
    out[0] = hn::And(v, hn::Set(du, 0x0F));
    out[kPer32 - 1] = hn::ShiftRight<4>(v);
  }
}

// Lane i: 0x10 when bit e0 + i of qh is set (the fifth bit of Q5_0/Q5_1), else 0.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// AVX-512: the bits are a byte mask as they stand (one masked broadcast).
HWY_INLINE VU8 FifthBits(uint32_t qh, size_t e0) {
  static_assert(kN == 32, "one 256-bit vector per 32-element block");
  return VU8{_mm256_maskz_set1_epi8(static_cast<__mmask32>(qh >> e0), 0x10)};
}
#else
HWY_INLINE VU8 FifthBits(uint32_t qh, size_t e0) {
  alignas(32) static constexpr uint8_t kByte[32] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                    2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};
  alignas(32) static constexpr uint8_t kBit[32] = {1,  2,   4,  8,  16,  32, 64, 128, 1,  2,  4,
                                                   8,  16,  32, 64, 128, 1,  2,  4,   8,  16, 32,
                                                   64, 128, 1,  2,  4,   8,  16, 32,  64, 128};
  const DU8 du;
  const hn::Repartition<uint32_t, DU8> du32;
  // Every 32-bit lane holds qh, so each 128-bit block has its four bytes at 0..3.
  const auto bytes =
      hn::TableLookupBytes(hn::BitCast(du, hn::Set(du32, qh)), hn::LoadU(du, kByte + e0));
  return hn::IfThenElseZero(hn::TestBit(bytes, hn::LoadU(du, kBit + e0)), hn::Set(du, 0x10));
}
#endif

// ---------------------------------------------------------------- 32-element block types

// Q4_0/Q5_0 are stored as u - offset with u unsigned; Q4_1/Q5_1 as d * u + m. Both go through
// the unsigned multiply: sum(w * a) = d * da * sum(u * a) + c * da * sum(a), with c = -offset * d
// or m. Q8_0 weights are signed and go through |w| x (a * sign(w)).
constexpr bool IsBlock32(TensorType t) {
  return t == TensorType::Q4_0 || t == TensorType::Q4_1 || t == TensorType::Q5_0 ||
         t == TensorType::Q5_1 || t == TensorType::Q8_0;
}

// Block struct of each quantized weight type.
template <TensorType T>
struct BlockType;
#define TANDEM_BLOCK_TYPE(TT)        \
  template <>                        \
  struct BlockType<TensorType::TT> { \
    using type = Block##TT;          \
  };
TANDEM_BLOCK_TYPE(Q4_0)
TANDEM_BLOCK_TYPE(Q4_1)
TANDEM_BLOCK_TYPE(Q5_0)
TANDEM_BLOCK_TYPE(Q5_1)
TANDEM_BLOCK_TYPE(Q8_0)
TANDEM_BLOCK_TYPE(Q2_K)
TANDEM_BLOCK_TYPE(Q3_K)
TANDEM_BLOCK_TYPE(Q4_K)
TANDEM_BLOCK_TYPE(Q5_K)
TANDEM_BLOCK_TYPE(Q6_K)
#undef TANDEM_BLOCK_TYPE
template <TensorType T>
using BlockOf = typename BlockType<T>::type;

// u - w of Q4_0 / Q5_0 (0 for the other 32-element types).
constexpr int OffsetOf(TensorType t) {
  return t == TensorType::Q4_0 ? 8 : t == TensorType::Q5_0 ? 16 : 0;
}

// The 32 integer weights of one block: signed values for Q8_0, the unsigned u (as u8 bits in a
// signed vector) for the others.
template <TensorType T>
HWY_INLINE void Decode32(const BlockOf<T>& b, V8* w) {
  const D8 d8;
  if constexpr (T == TensorType::Q8_0) {
    for (size_t j = 0; j < kPer32; ++j) w[j] = hn::LoadU(d8, b.qs + j * kN);
  } else {
    VU8 u[kPer32];
    Nibbles32(b.qs, u);
    if constexpr (T == TensorType::Q5_0 || T == TensorType::Q5_1) {
      uint32_t qh;
      std::memcpy(&qh, b.qh, 4);
      for (size_t j = 0; j < kPer32; ++j) u[j] = hn::Or(u[j], FifthBits(qh, j * kN));
    }
    for (size_t j = 0; j < kPer32; ++j) w[j] = hn::BitCast(d8, u[j]);
  }
}

// f32 scales of one activation row of 32-element blocks (Q8_0 or Q8_1), converted once per call:
// d[b], s[b] = Q8_1's s field (d * sum(q)) and sum[b] = sum(q) of a Q8_0 block.
struct ActScales32 {
  const float* d;
  const float* s;
  const int32_t* sum;
};

// Fills d[nb] and s[nb] (Q8_1) or sum[nb] (Q8_0) for one activation row.
HWY_INLINE void ComputeActScales32(TensorType act, const uint8_t* row, int64_t nb, float* d,
                                   float* s, int32_t* sum) {
  const D8 d8;
  const DU8 du8;
  const D16 d16;
  const D32 d32;
  const auto ones8 = hn::Set(du8, 1);
  const auto ones16 = hn::Set(d16, 1);
  for (int64_t b = 0; b < nb; ++b) {
    if (act == TensorType::Q8_1) {
      const auto* blk = reinterpret_cast<const BlockQ8_1*>(row) + b;
      d[b] = HalfToFloat(blk->d);
      s[b] = HalfToFloat(blk->s);
    } else {
      const auto* blk = reinterpret_cast<const BlockQ8_0*>(row) + b;
      V32 acc = hn::Zero(d32);
      for (size_t j = 0; j < kPer32; ++j)
        acc = MulAddPairs(MulPairs(ones8, hn::LoadU(d8, blk->qs + j * kN)), ones16, acc);
      d[b] = HalfToFloat(blk->d);
      sum[b] = hn::GetLane(hn::SumOfLanes(d32, acc));
    }
  }
}

// ---- four blocks at a time: the f32 work (convert, scale, accumulate) once per four blocks

using DF4 = hn::FixedTag<float, 4>;
using VF4 = hn::Vec<DF4>;

// f32 values of four f16 fields `stride` bytes apart (the d or m of four consecutive blocks).
HWY_INLINE VF4 HalvesToFloat4(const uint8_t* p, size_t stride) {
  uint64_t bits = 0;
  for (size_t q = 0; q < 4; ++q) bits |= uint64_t{LoadU16(p + q * stride)} << (16 * q);
  const hn::FixedTag<uint64_t, 1> d64;
  const hn::FixedTag<hwy::float16_t, 4> dh;
  return hn::PromoteTo(DF4(), hn::BitCast(dh, hn::Set(d64, bits)));
}

// Horizontal pair add per 128-bit block: [a0 + a1, a2 + a3, b0 + b1, b2 + b3].
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_SSSE3
HWY_INLINE hn::Vec128<int32_t> PairAdd(hn::Vec128<int32_t> a, hn::Vec128<int32_t> b) {
  return hn::Vec128<int32_t>{_mm_hadd_epi32(a.raw, b.raw)};
}
#if HWY_TARGET <= HWY_AVX2
HWY_INLINE hn::Vec256<int32_t> PairAdd(hn::Vec256<int32_t> a, hn::Vec256<int32_t> b) {
  return hn::Vec256<int32_t>{_mm256_hadd_epi32(a.raw, b.raw)};
}
#endif
#elif HWY_ARCH_ARM_A64 && HWY_TARGET == HWY_NEON
HWY_INLINE hn::Vec128<int32_t> PairAdd(hn::Vec128<int32_t> a, hn::Vec128<int32_t> b) {
  return hn::Vec128<int32_t>{vpaddq_s32(a.raw, b.raw)};
}
#else
HWY_INLINE V32 PairAdd(V32 a, V32 b) {
  const D32 d32;
  constexpr size_t kL = hn::MaxLanes(D32());
  alignas(64) int32_t x[kL], y[kL], z[kL];
  hn::Store(a, d32, x);
  hn::Store(b, d32, y);
  for (size_t blk = 0; blk < kL; blk += 4) {
    z[blk + 0] = x[blk + 0] + x[blk + 1];
    z[blk + 1] = x[blk + 2] + x[blk + 3];
    z[blk + 2] = y[blk + 0] + y[blk + 1];
    z[blk + 3] = y[blk + 2] + y[blk + 3];
  }
  return hn::Load(d32, z);
}
#endif

// Lane q of every 128-bit block: a share of block q's integer sum (the shares of all blocks of
// the vector add up to it), from the per-block sums m0..m3.
HWY_INLINE V32 SumBlocks4(V32 m0, V32 m1, V32 m2, V32 m3) {
  return PairAdd(PairAdd(m0, m1), PairAdd(m2, m3));
}

// The int8 values of block b of a Q8_1 (kMin) or Q8_0 activation row.
template <bool kMin>
HWY_INLINE const int8_t* ActQs(const uint8_t* row, int64_t b) {
  constexpr size_t kBlock = kMin ? sizeof(BlockQ8_1) : sizeof(BlockQ8_0);
  constexpr size_t kQs = kMin ? offsetof(BlockQ8_1, qs) : offsetof(BlockQ8_0, qs);
  return reinterpret_cast<const int8_t*>(row + b * static_cast<int64_t>(kBlock) + kQs);
}

using DI4 = hn::FixedTag<int32_t, 4>;
using VI4 = hn::Vec<DI4>;

// The four exact block sums of SumBlocks4's result (the two 128-bit halves added).
template <size_t N = kN>
HWY_INLINE VI4 Fold4(hn::Vec<hn::Repartition<int32_t, hn::CappedTag<int8_t, N>>> v) {
  if constexpr (N == 32) {
    const hn::Half<hn::Repartition<int32_t, hn::CappedTag<int8_t, N>>> dh;
    return hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v));
  } else {
    return v;
  }
}

// The f32 combine of four blocks, in the order of the prefill tiles (tile_dot-inl.h, lane by
// lane): acc = fma(i[q], dd[q], acc), then with kMin acc = fma(m[q], s[q], acc), for q = 0..3.
// acc is a one-lane vector (MulAdd fuses exactly where the tiles' MulAdd does); the operands are
// stored and reloaded one lane at a time, which keeps the shuffle ports free for the block sums.
using DF1 = hn::CappedTag<float, 1>;
using VF1 = hn::Vec<DF1>;
template <bool kMin>
HWY_INLINE VF1 BlockTerms4(VF1 acc, VF4 fi, VF4 dd, VF4 m, VF4 s) {
  const DF1 df1;
  alignas(16) float f[4], d[4], mm[4], ss[4];
  hn::Store(fi, DF4(), f);
  hn::Store(dd, DF4(), d);
  if constexpr (kMin) {
    hn::Store(m, DF4(), mm);
    hn::Store(s, DF4(), ss);
  }
  for (int q = 0; q < 4; ++q) {
    acc = hn::MulAdd(hn::LoadU(df1, f + q), hn::LoadU(df1, d + q), acc);
    if constexpr (kMin) acc = hn::MulAdd(hn::LoadU(df1, mm + q), hn::LoadU(df1, ss + q), acc);
  }
  return acc;
}

// out[v * RA + r] = dot(weight row w[v], activation row a[r]) for RW weight rows and RA
// activation rows.
//
// Batch invariance: the result must be bit for bit what the prefill tiles compute for the same
// row (TileDot32), so the f32 combine is theirs, one block after the other: the exact integer dot
// i_b of block b (offsets included: sum(u * a) - o * sum(a)) is converted and accumulated by
// acc = fma(i_b, d_w * d_a, acc) (+ fma(m, s_a, acc) for Q4_1/Q5_1). Only the integer work is
// vectorized across a block's elements; four blocks' sums are folded into one vector (exact
// integer adds) and the four f32 steps then run as a chain of broadcast FMAs. That chain is one
// FMA latency per block, so decode (RA = 1) takes several weight rows per call (RW) whose chains
// overlap.
//
// Kept as one function (about 80 lines) on purpose: it is the innermost loop of every decode
// matmul on Q4_0..Q8_0 weights. The decoded blocks (wq, wu) and the RW x RA accumulators live in
// registers across the loop; the main loop (four blocks) and the tail (one block) are the same
// combine at two widths, and both must match TileDot32 bit for bit, which is checked most
// easily with the two on one page. Helpers that took those register arrays by pointer would
// leave it to the inliner whether they stay in registers.
template <TensorType T, int RA, int RW>
HWY_INLINE void DotRow32(const uint8_t* const* w, const uint8_t* const* a, const ActScales32* as,
                         int64_t nb, float* out) {
  using B = BlockOf<T>;
  constexpr bool kSigned = T == TensorType::Q8_0;
  constexpr bool kMin = T == TensorType::Q4_1 || T == TensorType::Q5_1;
  constexpr int kOffset = OffsetOf(T);
  const D8 d8;
  const DU8 du8;
  const D32 d32;
  const DF4 df4;
  const DI4 di4;
  const DF1 df1;
  VF1 acc[RW * RA];
  for (int r = 0; r < RW * RA; ++r) acc[r] = hn::Zero(df1);
  // Integer sum of weight block wq (decoded) with activation block b of row r.
  const auto block_sum = [&](const V8* wq, const VU8* wu, int r, int64_t b) HWY_ATTR {
    const int8_t* aq = ActQs<kMin>(a[r], b);
    V32 isum = hn::Zero(d32);
    for (size_t j = 0; j < kPer32; ++j) {
      V8 av = hn::LoadU(d8, aq + j * kN);
      if constexpr (kSigned) av = ApplySign(av, wq[j]);
      isum = DotQuads(isum, wu[j], av);
    }
    return isum;
  };
  const auto unsigned_of = [&](const V8* wq, VU8* wu) HWY_ATTR {
    for (size_t j = 0; j < kPer32; ++j)
      wu[j] = kSigned ? hn::BitCast(du8, hn::Abs(wq[j])) : hn::BitCast(du8, wq[j]);
  };
  int64_t b = 0;
  for (; b + 4 <= nb; b += 4) {
    for (int v = 0; v < RW; ++v) {
      const B* wb = reinterpret_cast<const B*>(w[v]);
      // The rows are consecutive (MatmulQuant): fetch the blocks the next RW rows will take.
      if constexpr (RA == 1 && RW == 1) PrefetchAhead(wb + b, 4 * sizeof(B));
      // Consecutive rows (MatmulQuant): fetch the blocks the next RW rows will take.
      if constexpr (RA == 1 && RW > 1) PrefetchAt(w[v] + (RW * nb + b) * sizeof(B), 4 * sizeof(B));
      V8 wq[4][kPer32];
      VU8 wu[4][kPer32];
      for (int q = 0; q < 4; ++q) {
        Decode32<T>(wb[b + q], wq[q]);
        unsigned_of(wq[q], wu[q]);
      }
      const auto* base = reinterpret_cast<const uint8_t*>(wb + b);
      const VF4 dw = HalvesToFloat4(base + offsetof(B, d), sizeof(B));
      VF4 m = hn::Zero(df4);
      if constexpr (kMin) m = HalvesToFloat4(base + offsetof(B, m), sizeof(B));
      for (int r = 0; r < RA; ++r) {
        VI4 isum =
            Fold4(SumBlocks4(block_sum(wq[0], wu[0], r, b), block_sum(wq[1], wu[1], r, b + 1),
                             block_sum(wq[2], wu[2], r, b + 2), block_sum(wq[3], wu[3], r, b + 3)));
        if constexpr (kOffset != 0)
          isum = hn::Sub(isum, hn::Mul(hn::LoadU(di4, as[r].sum + b), hn::Set(di4, kOffset)));
        const VF4 fi = hn::ConvertTo(df4, isum);
        const VF4 dd = hn::Mul(dw, hn::LoadU(df4, as[r].d + b));
        const VF4 s = kMin ? hn::LoadU(df4, as[r].s + b) : hn::Zero(df4);
        acc[v * RA + r] = BlockTerms4<kMin>(acc[v * RA + r], fi, dd, m, s);
      }
    }
  }
  for (; b < nb; ++b) {
    for (int v = 0; v < RW; ++v) {
      const B* wb = reinterpret_cast<const B*>(w[v]);
      V8 wq[kPer32];
      VU8 wu[kPer32];
      Decode32<T>(wb[b], wq);
      unsigned_of(wq, wu);
      const float dw = HalfToFloat(wb[b].d);
      for (int r = 0; r < RA; ++r) {
        int32_t isum = hn::GetLane(hn::SumOfLanes(d32, block_sum(wq, wu, r, b)));
        if constexpr (kOffset != 0) isum -= kOffset * as[r].sum[b];
        VF1& x = acc[v * RA + r];
        x = hn::MulAdd(hn::Set(df1, static_cast<float>(isum)), hn::Set(df1, dw * as[r].d[b]), x);
        if constexpr (kMin)
          x = hn::MulAdd(hn::Set(df1, HalfToFloat(wb[b].m)), hn::Set(df1, as[r].s[b]), x);
      }
    }
  }
  for (int r = 0; r < RW * RA; ++r) out[r] = hn::GetLane(acc[r]);
}

// ---------------------------------------------------------------- K-quants

// Per super-block: integer scale and min of each 16-element group (groups 0..7 in [0], 8..15 in
// [1], one int16 lane each), and the two f32 factors. Kept in registers: the scale of a step is
// picked out with one byte shuffle.
using D16x8 = hn::FixedTag<int16_t, 8>;
using V16x8 = hn::Vec<D16x8>;
struct KScales {
  // User-provided so that it carries the target attributes (the implicit one does not on NEON).
  HWY_ATTR KScales() {}
  V16x8 sc[2];
  V16x8 mn[2];
  float d;
  float dmin;
};

// Byte-shuffle indices that broadcast int16 lanes of a 128-bit scale vector: pair[p] puts lane
// 2p in the low 128 bits and lane 2p + 1 in the high 128 bits (256-bit steps cover two groups),
// single[q] puts lane q everywhere (128-bit steps cover one group).
struct ScaleShuffles {
  uint8_t pair[4][32];
  uint8_t single[8][16];
};
constexpr ScaleShuffles MakeScaleShuffles() {
  ScaleShuffles t{};
  for (int p = 0; p < 4; ++p)
    for (int b = 0; b < 32; ++b)
      t.pair[p][b] = static_cast<uint8_t>(4 * p + (b < 16 ? 0 : 2) + (b & 1));
  for (int q = 0; q < 8; ++q)
    for (int b = 0; b < 16; ++b) t.single[q][b] = static_cast<uint8_t>(2 * q + (b & 1));
  return t;
}
alignas(32) constexpr ScaleShuffles kScaleShuffles = MakeScaleShuffles();

// Two 128-bit int16 vectors (groups 0..7, 8..15) from 16 group values given as bytes.
template <class VB>
HWY_INLINE void WidenGroups(VB bytes, V16x8* out) {
  const D16x8 d16;
  const hn::Half<hn::DFromV<VB>> dh;
  out[0] = hn::PromoteTo(d16, hn::LowerHalf(dh, bytes));
  out[1] = hn::PromoteTo(d16, hn::UpperHalf(dh, bytes));
}

// The eight 6-bit scales and the eight mins of a Q4_K/Q5_K super-block (layout in BlockQ4_K's
// comment), sub-block j's in byte j.
struct Q4KScaleBytes {
  uint64_t scales;
  uint64_t mins;
};
HWY_INLINE Q4KScaleBytes UnpackQ4KScales(const uint8_t* packed) {
  const uint32_t w0 = LoadU32(packed), w1 = LoadU32(packed + 4), w2 = LoadU32(packed + 8);
  const uint32_t sc_lo = w0 & 0x3f3f3f3fu;
  const uint32_t sc_hi = (w2 & 0x0f0f0f0fu) | ((w0 >> 2) & 0x30303030u);
  const uint32_t mn_lo = w1 & 0x3f3f3f3fu;
  const uint32_t mn_hi = ((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 2) & 0x30303030u);
  return {sc_lo | uint64_t{sc_hi} << 32, mn_lo | uint64_t{mn_hi} << 32};
}

template <TensorType T>
HWY_INLINE void DecodeScales(const BlockOf<T>& b, KScales& s) {
  const hn::FixedTag<uint8_t, 16> du16b;
  if constexpr (T == TensorType::Q4_K || T == TensorType::Q5_K) {
    const Q4KScaleBytes sm = UnpackQ4KScales(b.scales);
    const hn::FixedTag<uint64_t, 2> d64;
    const auto sc8 = hn::BitCast(du16b, hn::Set(d64, sm.scales));
    const auto mn8 = hn::BitCast(du16b, hn::Set(d64, sm.mins));
    // Each 32-element sub-block is two 16-element groups.
    WidenGroups(hn::InterleaveLower(du16b, sc8, sc8), s.sc);
    WidenGroups(hn::InterleaveLower(du16b, mn8, mn8), s.mn);
    s.d = HalfToFloat(b.d);
    s.dmin = HalfToFloat(b.dmin);
  } else if constexpr (T == TensorType::Q6_K) {
    const hn::FixedTag<int8_t, 16> di16b;
    WidenGroups(hn::LoadU(di16b, b.scales), s.sc);
    for (int h = 0; h < 2; ++h) s.mn[h] = hn::ShiftLeft<5>(s.sc[h]);  // 32 * scale
    s.d = s.dmin = HalfToFloat(b.d);
  } else if constexpr (T == TensorType::Q3_K) {
    const hn::FixedTag<int8_t, 16> di16b;
    alignas(16) int8_t sc[16];
    unpack_q3k_scales(b.scales, sc);
    WidenGroups(hn::LoadU(di16b, sc), s.sc);
    for (int h = 0; h < 2; ++h) {
      s.sc[h] = hn::Sub(s.sc[h], hn::Set(D16x8(), 32));
      s.mn[h] = hn::ShiftLeft<2>(s.sc[h]);  // 4 * scale
    }
    s.d = s.dmin = HalfToFloat(b.d);
  } else {  // Q2_K: low nibble scale, high nibble min
    const auto v = hn::LoadU(du16b, b.scales);
    WidenGroups(hn::And(v, hn::Set(du16b, 0x0F)), s.sc);
    WidenGroups(hn::ShiftRight<4>(v), s.mn);
    s.d = HalfToFloat(b.d);
    s.dmin = HalfToFloat(b.dmin);
  }
}

// The 16 group mins as kPer32 vectors of pair lanes (matching bsums[16]).
template <size_t N = kN>
HWY_INLINE void MinsOf(const KScales& s, hn::Vec<hn::CappedTag<int16_t, N / 2>>* mins) {
  if constexpr (N == 32) {
    mins[0] = hn::Combine(hn::CappedTag<int16_t, N / 2>(), s.mn[1], s.mn[0]);
  } else {
    mins[0] = s.mn[0];
    mins[kPer32 - 1] = s.mn[1];
  }
}

// Scales of the s16 pair lanes of the kN elements starting at e0 (pair lane i covers elements
// e0 + 2i and e0 + 2i + 1, i.e. group (e0 + 2i) / 16).
template <size_t N = kN>
HWY_INLINE hn::Vec<hn::CappedTag<int16_t, N / 2>> ScalesAt(const KScales& s, size_t e0) {
  const size_t g = e0 / 16;
  const V16x8 src = s.sc[g / 8];
  if constexpr (N == 32) {
    const hn::CappedTag<int16_t, N / 2> d16;
    const hn::Repartition<uint8_t, D16> du8;
    return hn::TableLookupBytes(hn::Combine(d16, src, src),
                                hn::BitCast(d16, hn::Load(du8, kScaleShuffles.pair[(g % 8) / 2])));
  } else {
    const hn::Repartition<uint8_t, D16x8> du8;
    return hn::TableLookupBytes(src,
                                hn::BitCast(D16x8(), hn::Load(du8, kScaleShuffles.single[g % 8])));
  }
}

// Calls f(u, e0) with the unsigned values of elements [e0, e0 + kN) for every e0 of the block.
template <TensorType T, class F>
HWY_INLINE void ForEachChunk(const BlockOf<T>& b, F&& f) {
  const DU8 du;
  const auto k0F = hn::Set(du, 0x0F);
  const auto k3 = hn::Set(du, 3);
  if constexpr (T == TensorType::Q4_K || T == TensorType::Q5_K) {
    for (size_t c = 0; c < 4; ++c) {
      for (size_t j = 0; j < 32; j += kN) {
        const auto v = hn::LoadU(du, b.qs + 32 * c + j);
        auto lo = hn::And(v, k0F);
        auto hi = hn::ShiftRight<4>(v);
        if constexpr (T == TensorType::Q5_K) {
          const auto h = hn::LoadU(du, b.qh + j);
          const auto k16 = hn::Set(du, 16);
          const auto bit_lo = hn::Set(du, static_cast<uint8_t>(1u << (2 * c)));
          const auto bit_hi = hn::Set(du, static_cast<uint8_t>(2u << (2 * c)));
          lo = hn::Or(lo, hn::IfThenElseZero(hn::TestBit(h, bit_lo), k16));
          hi = hn::Or(hi, hn::IfThenElseZero(hn::TestBit(h, bit_hi), k16));
        }
        f(lo, 64 * c + j);
        f(hi, 64 * c + 32 + j);
      }
    }
  } else if constexpr (T == TensorType::Q6_K) {
    for (size_t h = 0; h < 2; ++h) {
      const uint8_t* ql = b.ql + 64 * h;
      const uint8_t* qh = b.qh + 32 * h;
      for (size_t l = 0; l < 32; l += kN) {
        const auto va = hn::LoadU(du, ql + l);
        const auto vc = hn::LoadU(du, ql + 32 + l);
        const auto hb = hn::LoadU(du, qh + l);
        f(hn::Or(hn::And(va, k0F), hn::ShiftLeft<4>(hn::And(hb, k3))), 128 * h + l);
        f(hn::Or(hn::And(vc, k0F), hn::ShiftLeft<4>(hn::And(hn::ShiftRight<2>(hb), k3))),
          128 * h + 32 + l);
        f(hn::Or(hn::ShiftRight<4>(va), hn::ShiftLeft<4>(hn::And(hn::ShiftRight<4>(hb), k3))),
          128 * h + 64 + l);
        f(hn::Or(hn::ShiftRight<4>(vc), hn::ShiftLeft<4>(hn::ShiftRight<6>(hb))), 128 * h + 96 + l);
      }
    }
  } else {  // Q2_K / Q3_K: 2-bit fields, Q3_K plus a third bit from hmask
    for (size_t h = 0; h < 2; ++h) {
      for (size_t l = 0; l < 32; l += kN) {
        const auto qv = hn::LoadU(du, b.qs + 32 * h + l);
        for (int j = 0; j < 4; ++j) {
          auto u = hn::And(hn::ShiftRightSame(qv, 2 * j), k3);
          if constexpr (T == TensorType::Q3_K) {
            const auto hm = hn::LoadU(du, b.hmask + l);
            const auto bit = hn::Set(du, static_cast<uint8_t>(1u << (4 * h + j)));
            u = hn::Or(u, hn::IfThenElseZero(hn::TestBit(hm, bit), hn::Set(du, 4)));
          }
          f(u, 128 * h + 32 * j + l);
        }
      }
    }
  }
}

// acc (every lane the same) after one super-block against activation block ab, in the order of
// the prefill tiles (TileDotK): the exact integer sums i = sum(s * u * a) and
// m = sum(mins * bsums) are reduced across lanes (integer adds, exact), then
// acc = fma(i, d * d_a, acc) and acc = fma(m, dmin * -d_a, acc). mins: kPer32 vectors of pair
// lanes.
HWY_INLINE VF1 AddSuperBlock(VF1 acc, V32 isum, const V16* mins, const BlockQ8_K& ab, float d,
                             float dmin) {
  const DF4 df4;
  const DF1 df1;
  V32 msum = hn::Zero(D32());
  for (size_t h = 0; h < kPer32; ++h)
    msum = MulAddPairs(mins[h], hn::LoadU(D16(), ab.bsums + h * (kN / 2)), msum);
  // [i, i, m, m] after pair adds: (i0 + i1, i2 + i3, m0 + m1, m2 + m3) per 128-bit block, the
  // blocks added, then neighbours.
  const VI4 y = Fold4(PairAdd(isum, msum));
  const VF4 f = hn::ConvertTo(df4, hn::Add(y, hn::Shuffle2301(y)));
  // One-lane vectors: the scalar factors need no broadcast.
  acc = hn::MulAdd(hn::LowerHalf(df1, hn::LowerHalf(f)), hn::Set(df1, d * ab.d), acc);
  return hn::MulAdd(hn::LowerHalf(df1, hn::LowerHalf(hn::ConcatUpperUpper(df4, f, f))),
                    hn::Set(df1, dmin * -ab.d), acc);
}

// Q4_K, Q5_K and Q6_K on AVX-512: decode is bound by the vector shuffle port, and KScales'
// general layout (two 128-bit halves, combined again for each step, then a scale shuffle per
// step) spends much of it on scales. Here the 16 group scales and mins are widened once into one
// vector each, and each 32-element step takes its two groups' scales with one cross-lane word
// permute: Q4_K decodes 12-20% faster on one core. (The helpers are templates on the vector type
// so that other targets, which do not use them, need not compile them.)
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
template <TensorType T>
inline constexpr bool kPermuteScalesK =
    T == TensorType::Q4_K || T == TensorType::Q5_K || T == TensorType::Q6_K;
#else
template <TensorType T>
inline constexpr bool kPermuteScalesK = false;
#endif

// Lane g (of 16 int16 lanes): group g's integer scale, and its min (see KScales).
template <class V>
struct GroupScalesK {
  V scales;
  V mins;
  float d;
  float dmin;
};
template <TensorType T, class V = V16>
HWY_INLINE GroupScalesK<V> DecodeGroupScales(const BlockOf<T>& b) {
  const hn::DFromV<V> d16;
  const hn::FixedTag<uint8_t, 16> db;
  if constexpr (T == TensorType::Q6_K) {
    const V sc = hn::PromoteTo(d16, hn::LoadU(hn::FixedTag<int8_t, 16>(), b.scales));
    const float d = HalfToFloat(b.d);
    return {sc, hn::ShiftLeft<5>(sc), d, d};  // 32 * scale
  } else {
    // Each 32-element sub-block is two 16-element groups.
    const hn::RebindToUnsigned<decltype(d16)> du16;
    const hn::FixedTag<uint64_t, 2> d64;
    const Q4KScaleBytes sm = UnpackQ4KScales(b.scales);
    const auto sc8 = hn::BitCast(db, hn::Set(d64, sm.scales));
    const auto mn8 = hn::BitCast(db, hn::Set(d64, sm.mins));
    return {hn::BitCast(d16, hn::PromoteTo(du16, hn::InterleaveLower(db, sc8, sc8))),
            hn::BitCast(d16, hn::PromoteTo(du16, hn::InterleaveLower(db, mn8, mn8))),
            HalfToFloat(b.d), HalfToFloat(b.dmin)};
  }
}

// The scales of the pair lanes of step e0 (lanes 0-7: group e0 / 16, lanes 8-15: the next).
template <class V>
HWY_INLINE V GroupScalesAt(V scales, size_t e0) {
  struct Lanes {
    int16_t step[8][16];
  };
  alignas(32) static constexpr Lanes kLanes = [] {
    Lanes t{};
    for (int step = 0; step < 8; ++step)
      for (int i = 0; i < 16; ++i) t.step[step][i] = static_cast<int16_t>(2 * step + i / 8);
    return t;
  }();
  const V idx = hn::Load(hn::DFromV<V>(), kLanes.step[e0 / 32]);
  return V{_mm256_permutexvar_epi16(idx.raw, scales.raw)};
}

// out[r] = dot(weight row w, activation row a[r]) for RA Q8_K activation rows; bit for bit the
// prefill tiles' result (see AddSuperBlock).
template <TensorType T, int RA>
HWY_INLINE void DotRowK(const uint8_t* w, const uint8_t* const* a, int64_t nb, float* out) {
  using B = BlockOf<T>;
  const D8 d8;
  const D32 d32;
  const DF1 df1;
  VF1 acc[RA];
  for (int r = 0; r < RA; ++r) acc[r] = hn::Zero(df1);
  const B* wb = reinterpret_cast<const B*>(w);
  for (int64_t b = 0; b < nb; ++b) {
    if constexpr (RA == 1) PrefetchAhead(wb + b, sizeof(B));
    const BlockQ8_K* ab[RA];
    V32 iacc[RA];
    for (int r = 0; r < RA; ++r) {
      ab[r] = reinterpret_cast<const BlockQ8_K*>(a[r]) + b;
      iacc[r] = hn::Zero(d32);
    }
    const auto add_step = [&](VU8 u, size_t e0, V16 scl) HWY_ATTR {
      for (int r = 0; r < RA; ++r)
        iacc[r] = MulAddPairs(MulPairs(u, hn::LoadU(d8, ab[r]->qs + e0)), scl, iacc[r]);
    };
    V16 mins[kPer32];
    float d, dmin;
    if constexpr (kPermuteScalesK<T>) {
      const GroupScalesK<V16> s = DecodeGroupScales<T, V16>(wb[b]);
      ForEachChunk<T>(
          wb[b], [&](VU8 u, size_t e0) HWY_ATTR { add_step(u, e0, GroupScalesAt(s.scales, e0)); });
      mins[0] = s.mins;
      d = s.d;
      dmin = s.dmin;
    } else {
      KScales s;
      DecodeScales<T>(wb[b], s);
      ForEachChunk<T>(wb[b], [&](VU8 u, size_t e0) HWY_ATTR { add_step(u, e0, ScalesAt(s, e0)); });
      MinsOf(s, mins);
      d = s.d;
      dmin = s.dmin;
    }
    for (int r = 0; r < RA; ++r) acc[r] = AddSuperBlock(acc[r], iacc[r], mins, *ab[r], d, dmin);
  }
  for (int r = 0; r < RA; ++r) out[r] = hn::GetLane(acc[r]);
}

// ---- K-quant rows decoded once for the prefill tiles (tile_dot-inl.h)

// One K-quant weight row decoded: unsigned values, the scale of every s16 pair lane, the 16 group
// mins and the two f32 factors per super-block (see KScales).
struct StagedRowK {
  uint8_t* u;    // [nbk * 256]
  int16_t* scl;  // [nbk * 128] scale per pair lane
  int16_t* mn;   // [nbk * 16]
  float* d;      // [nbk]
  float* dmin;   // [nbk]
};

template <TensorType T>
HWY_INLINE void StageRowK(const uint8_t* w, int64_t nbk, const StagedRowK& st) {
  using B = BlockOf<T>;
  const DU8 du8;
  const D16 d16;
  const B* wb = reinterpret_cast<const B*>(w);
  for (int64_t b = 0; b < nbk; ++b) {
    KScales s;
    DecodeScales<T>(wb[b], s);
    uint8_t* u = st.u + QK_K * b;
    int16_t* scl = st.scl + (QK_K / 2) * b;
    ForEachChunk<T>(wb[b], [&](VU8 v, size_t e0) HWY_ATTR {
      hn::StoreU(v, du8, u + e0);
      hn::StoreU(ScalesAt(s, e0), d16, scl + e0 / 2);
    });
    V16 mins[kPer32];
    MinsOf(s, mins);
    for (size_t h = 0; h < kPer32; ++h) hn::StoreU(mins[h], d16, st.mn + 16 * b + h * (kN / 2));
    st.d[b] = s.d;
    st.dmin[b] = s.dmin;
  }
}

// ---------------------------------------------------------------- dispatch on the weight type

// Weight rows per DotRow call for RA activation rows: enough independent f32 chains (RW * RA) to
// hide DotRow32's FMA latency.
constexpr int RowsPerDot(int ra) {
  return ra == 1 ? 4 : ra == 2 ? 2 : 1;
}

// out[v * RA + r] = dot(weight row w[v], activation row a[r]), v < RW, r < RA; k elements.
// as: the activation rows' f32 block scales (32-element types only).
template <TensorType T, int RA, int RW>
HWY_INLINE void DotRow(const uint8_t* const* w, const uint8_t* const* a, const ActScales32* as,
                       int64_t k, float* out) {
  if constexpr (T == TensorType::Q2_K || T == TensorType::Q3_K || T == TensorType::Q4_K ||
                T == TensorType::Q5_K || T == TensorType::Q6_K) {
    // Two FMAs per 256 elements: one row at a time keeps up.
    for (int v = 0; v < RW; ++v) DotRowK<T, RA>(w[v], a, k / QK_K, out + v * RA);
  } else {
    DotRow32<T, RA, RW>(w, a, as, k / 32, out);
  }
}

#endif  // HWY_TARGET != HWY_SCALAR

}  // namespace qd
}  // namespace HWY_NAMESPACE
}  // namespace tandem::kernels
HWY_AFTER_NAMESPACE();

#endif  // include guard
