// SIMD kernels (Highway), compiled once per target through foreach_target.h from kernels.cpp.
//
// Integer dot products work on "staged" rows: a weight row is unpacked block by block into int16
// values (K-quants: already multiplied by their 4/6/8-bit sub-block scale, which always fits in
// int16) plus one f32 scale per block, and an activation row (q8_0/q8_1/q8_K) is widened to int16
// plus its block scales. The dot of two staged rows is one int16 x int16 -> int32 widening
// multiply-add per vector (ReorderWidenMulAccumulate: vpmaddwd on x86, smlal on NEON), reduced
// per block to f32 and scaled: the integer sums equal those of ggml's scalar code, only the f32
// summation order differs. Mins (Q2_K/Q4_K/Q5_K: dmin * min * bsums, Q4_1/Q5_1: m * s) are
// handled the same way on the short per-block arrays.
//
// matmul_rows stages a tile of activation rows once and then, for every group of 4 weight rows,
// unpacks those rows once and runs them against the staged activation rows two at a time (4x2
// register tile: 6 vector loads feed 8 multiply-adds), so weights are read from memory once per
// activation tile; the int16 activation tile is sized to stay in L2.

#if defined(TANDEM_KERNELS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TANDEM_KERNELS_INL_H_
#undef TANDEM_KERNELS_INL_H_
#else
#define TANDEM_KERNELS_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/tensor_type.h"
#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "kernels/kernels.h"
#include "kernels/kernels_ref.h"
#include "kernels/quant_blocks.h"

HWY_BEFORE_NAMESPACE();
namespace tandem::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Widest int16 vector used for the dot products (32 lanes: one Q8_0 block per AVX-512 vector).
using D16 = hn::CappedTag<int16_t, 32>;
using D32 = hn::Repartition<int32_t, D16>;
using DF = hn::Repartition<float, D16>;
// At most 16 lanes: unpacking (one vector never spans two 16-element scale groups) and mins.
using DU16s = hn::CappedTag<uint16_t, 16>;
using DI16s = hn::RebindToSigned<DU16s>;
using DU8s = hn::Rebind<uint8_t, DU16s>;
using DI32s = hn::Repartition<int32_t, DI16s>;
using DFs = hn::Repartition<float, DI16s>;

// ---------------------------------------------------------------- staged rows

struct StagedInt {
  int16_t* q = nullptr;   // [k]
  float* d = nullptr;     // [k / B] block scale
  int16_t* mn = nullptr;  // [k / 256 * 16] K-quant mins (weights) or bsums (activations)
  float* dmin = nullptr;  // [k / 256] K-quant dmin (weights only)
  float* m = nullptr;     // [k / 32] Q4_1/Q5_1 min (weights) or Q8_1 s (activations)
};

struct IntFormat {
  int block;  // 32 or 256 elements per scale
  bool kmin;  // K-quant mins (Q2_K, Q4_K, Q5_K)
  bool m;     // Q4_1/Q5_1 min
};

inline IntFormat FormatOf(TensorType t) {
  switch (t) {
    case TensorType::Q4_0:
    case TensorType::Q5_0:
    case TensorType::Q8_0:
      return {32, false, false};
    case TensorType::Q4_1:
    case TensorType::Q5_1:
      return {32, false, true};
    case TensorType::Q2_K:
    case TensorType::Q4_K:
    case TensorType::Q5_K:
      return {256, true, false};
    default:
      return {256, false, false};  // Q3_K, Q6_K
  }
}

HWY_INLINE const uint16_t* BitTable() {
  alignas(64) static const uint16_t kBits[16] = {1,   2,   4,    8,    16,   32,   64,    128,
                                                 256, 512, 1024, 2048, 4096, 8192, 16384, 32768};
  return kBits;
}


// Stores v (u16 lanes holding small non-negative values or two's complement) as int16.
HWY_INLINE void StoreI16(hn::Vec<DI16s> v, int16_t* p) {
  hn::StoreU(v, DI16s(), p);
}

// Unpacks `nb` 32-element blocks (Q4_0/Q4_1/Q5_0/Q5_1/Q8_0) into st.
template <TensorType T>
void Unpack32(const void* src, int64_t nb, const StagedInt& st) {
  const DU16s du;
  const DI16s di;
  const DU8s du8;
  const size_t N = hn::Lanes(du);
  const auto k0F = hn::Set(du, 0xF);
  const auto kBits = hn::LoadU(du, BitTable());
  const auto k16 = hn::Set(du, 16);
  for (int64_t i = 0; i < nb; ++i) {
    int16_t* q = st.q + i * 32;
    if constexpr (T == TensorType::Q8_0) {
      const auto* b = static_cast<const BlockQ8_0*>(src) + i;
      const hn::Rebind<int8_t, DI16s> di8;
      for (size_t j = 0; j < 32; j += N)
        StoreI16(hn::PromoteTo(di, hn::LoadU(di8, b->qs + j)), q + j);
      st.d[i] = fp16_to_fp32(b->d);
    } else if constexpr (T == TensorType::Q4_0 || T == TensorType::Q4_1) {
      using B = std::conditional_t<T == TensorType::Q4_0, BlockQ4_0, BlockQ4_1>;
      const B* b = static_cast<const B*>(src) + i;
      const auto off = hn::Set(di, T == TensorType::Q4_0 ? 8 : 0);
      for (size_t j = 0; j < 16; j += N) {
        const auto v = hn::PromoteTo(du, hn::LoadU(du8, b->qs + j));
        StoreI16(hn::Sub(hn::BitCast(di, hn::And(v, k0F)), off), q + j);
        StoreI16(hn::Sub(hn::BitCast(di, hn::ShiftRight<4>(v)), off), q + 16 + j);
      }
      st.d[i] = fp16_to_fp32(b->d);
      if constexpr (T == TensorType::Q4_1) st.m[i] = fp16_to_fp32(b->m);
    } else {  // Q5_0 / Q5_1
      using B = std::conditional_t<T == TensorType::Q5_0, BlockQ5_0, BlockQ5_1>;
      const B* b = static_cast<const B*>(src) + i;
      uint32_t qh;
      std::memcpy(&qh, b->qh, 4);
      const auto off = hn::Set(di, T == TensorType::Q5_0 ? 16 : 0);
      for (size_t j = 0; j < 16; j += N) {
        const auto v = hn::PromoteTo(du, hn::LoadU(du8, b->qs + j));
        const auto hlo = hn::Set(du, static_cast<uint16_t>(qh >> j));
        const auto hhi = hn::Set(du, static_cast<uint16_t>(qh >> (16 + j)));
        const auto lo = hn::Or(hn::And(v, k0F), hn::IfThenElseZero(hn::TestBit(hlo, kBits), k16));
        const auto hi =
            hn::Or(hn::ShiftRight<4>(v), hn::IfThenElseZero(hn::TestBit(hhi, kBits), k16));
        StoreI16(hn::Sub(hn::BitCast(di, lo), off), q + j);
        StoreI16(hn::Sub(hn::BitCast(di, hi), off), q + 16 + j);
      }
      st.d[i] = fp16_to_fp32(b->d);
      if constexpr (T == TensorType::Q5_1) st.m[i] = fp16_to_fp32(b->m);
    }
  }
}

// Unpacks `nb` K-quant super-blocks into st (values pre-multiplied by their sub-block scale).
template <TensorType T>
void UnpackK(const void* src, int64_t nb, const StagedInt& st) {
  const DU16s du;
  const DI16s di;
  const DU8s du8;
  const size_t N = hn::Lanes(du);
  const auto k0F = hn::Set(du, 0xF);
  const auto k3 = hn::Set(du, 3);
  const auto k1 = hn::Set(du, 1);
  for (int64_t i = 0; i < nb; ++i) {
    int16_t* q = st.q + i * QK_K;
    int16_t* mn = st.mn ? st.mn + i * 16 : nullptr;
    if constexpr (T == TensorType::Q4_K || T == TensorType::Q5_K) {
      using B = std::conditional_t<T == TensorType::Q4_K, BlockQ4_K, BlockQ5_K>;
      const B* b = static_cast<const B*>(src) + i;
      int sc[8], m[8];
      for (int j = 0; j < 8; ++j) unpack_scale_min_k4(j, b->scales, &sc[j], &m[j]);
      for (int c = 0; c < 4; ++c) {
        const auto s_lo = hn::Set(du, static_cast<uint16_t>(sc[2 * c]));
        const auto s_hi = hn::Set(du, static_cast<uint16_t>(sc[2 * c + 1]));
        for (size_t j = 0; j < 32; j += N) {
          const auto v = hn::PromoteTo(du, hn::LoadU(du8, b->qs + 32 * c + j));
          auto lo = hn::And(v, k0F);
          auto hi = hn::ShiftRight<4>(v);
          if constexpr (T == TensorType::Q5_K) {
            const auto h = hn::PromoteTo(du, hn::LoadU(du8, b->qh + j));
            lo = hn::Or(lo, hn::ShiftLeft<4>(hn::And(hn::ShiftRightSame(h, 2 * c), k1)));
            hi = hn::Or(hi, hn::ShiftLeft<4>(hn::And(hn::ShiftRightSame(h, 2 * c + 1), k1)));
          }
          StoreI16(hn::BitCast(di, hn::Mul(lo, s_lo)), q + 64 * c + j);
          StoreI16(hn::BitCast(di, hn::Mul(hi, s_hi)), q + 64 * c + 32 + j);
        }
      }
      for (int g = 0; g < 16; ++g) mn[g] = static_cast<int16_t>(m[g / 2]);
      st.d[i] = fp16_to_fp32(b->d);
      st.dmin[i] = fp16_to_fp32(b->dmin);
    } else if constexpr (T == TensorType::Q6_K) {
      const auto* b = static_cast<const BlockQ6_K*>(src) + i;
      const auto k32 = hn::Set(di, 32);
      for (int h = 0; h < 2; ++h) {
        const uint8_t* ql = b->ql + 64 * h;
        const uint8_t* qh = b->qh + 32 * h;
        const int8_t* sc = b->scales + 8 * h;
        for (size_t l = 0; l < 32; l += N) {
          const auto a = hn::PromoteTo(du, hn::LoadU(du8, ql + l));
          const auto c = hn::PromoteTo(du, hn::LoadU(du8, ql + 32 + l));
          const auto hb = hn::PromoteTo(du, hn::LoadU(du8, qh + l));
          const auto q1 = hn::Or(hn::And(a, k0F), hn::ShiftLeft<4>(hn::And(hb, k3)));
          const auto q2 =
              hn::Or(hn::And(c, k0F), hn::ShiftLeft<4>(hn::And(hn::ShiftRight<2>(hb), k3)));
          const auto q3 =
              hn::Or(hn::ShiftRight<4>(a), hn::ShiftLeft<4>(hn::And(hn::ShiftRight<4>(hb), k3)));
          const auto q4 = hn::Or(hn::ShiftRight<4>(c), hn::ShiftLeft<4>(hn::ShiftRight<6>(hb)));
          const int is = static_cast<int>(l / 16);
          int16_t* o = q + 128 * h + l;
          StoreI16(hn::Mul(hn::Sub(hn::BitCast(di, q1), k32), hn::Set(di, sc[is + 0])), o);
          StoreI16(hn::Mul(hn::Sub(hn::BitCast(di, q2), k32), hn::Set(di, sc[is + 2])), o + 32);
          StoreI16(hn::Mul(hn::Sub(hn::BitCast(di, q3), k32), hn::Set(di, sc[is + 4])), o + 64);
          StoreI16(hn::Mul(hn::Sub(hn::BitCast(di, q4), k32), hn::Set(di, sc[is + 6])), o + 96);
        }
      }
      st.d[i] = fp16_to_fp32(b->d);
    } else if constexpr (T == TensorType::Q3_K) {
      const auto* b = static_cast<const BlockQ3_K*>(src) + i;
      int8_t sc[16];
      unpack_q3k_scales(b->scales, sc);
      const auto k4 = hn::Set(du, 4);
      for (int h = 0; h < 2; ++h)
        for (size_t l = 0; l < 32; l += N) {
          const auto qv = hn::PromoteTo(du, hn::LoadU(du8, b->qs + 32 * h + l));
          const auto hm = hn::PromoteTo(du, hn::LoadU(du8, b->hmask + l));
          for (int j = 0; j < 4; ++j) {
            const auto lo = hn::And(hn::ShiftRightSame(qv, 2 * j), k3);
            const auto bit = hn::Set(du, static_cast<uint16_t>(1u << (4 * h + j)));
            const auto sub = hn::IfThenZeroElse(hn::TestBit(hm, bit), k4);
            const int g = 8 * h + 2 * j + static_cast<int>(l / 16);
            const auto v = hn::Sub(hn::BitCast(di, lo), hn::BitCast(di, sub));
            StoreI16(hn::Mul(v, hn::Set(di, static_cast<int16_t>(sc[g] - 32))),
                     q + 128 * h + 32 * j + l);
          }
        }
      st.d[i] = fp16_to_fp32(b->d);
    } else {  // Q2_K
      const auto* b = static_cast<const BlockQ2_K*>(src) + i;
      for (int h = 0; h < 2; ++h)
        for (size_t l = 0; l < 32; l += N) {
          const auto qv = hn::PromoteTo(du, hn::LoadU(du8, b->qs + 32 * h + l));
          for (int j = 0; j < 4; ++j) {
            const int g = 8 * h + 2 * j + static_cast<int>(l / 16);
            const auto v = hn::And(hn::ShiftRightSame(qv, 2 * j), k3);
            StoreI16(hn::BitCast(di, hn::Mul(v, hn::Set(du, b->scales[g] & 0xF))),
                     q + 128 * h + 32 * j + l);
          }
        }
      for (int g = 0; g < 16; ++g) mn[g] = static_cast<int16_t>(b->scales[g] >> 4);
      st.d[i] = fp16_to_fp32(b->d);
      st.dmin[i] = fp16_to_fp32(b->dmin);
    }
  }
}

void UnpackWeights(TensorType t, const void* src, int64_t k, const StagedInt& st) {
  switch (t) {
    case TensorType::Q4_0:
      return Unpack32<TensorType::Q4_0>(src, k / 32, st);
    case TensorType::Q4_1:
      return Unpack32<TensorType::Q4_1>(src, k / 32, st);
    case TensorType::Q5_0:
      return Unpack32<TensorType::Q5_0>(src, k / 32, st);
    case TensorType::Q5_1:
      return Unpack32<TensorType::Q5_1>(src, k / 32, st);
    case TensorType::Q8_0:
      return Unpack32<TensorType::Q8_0>(src, k / 32, st);
    case TensorType::Q2_K:
      return UnpackK<TensorType::Q2_K>(src, k / QK_K, st);
    case TensorType::Q3_K:
      return UnpackK<TensorType::Q3_K>(src, k / QK_K, st);
    case TensorType::Q4_K:
      return UnpackK<TensorType::Q4_K>(src, k / QK_K, st);
    case TensorType::Q5_K:
      return UnpackK<TensorType::Q5_K>(src, k / QK_K, st);
    case TensorType::Q6_K:
      return UnpackK<TensorType::Q6_K>(src, k / QK_K, st);
    default:
      return;
  }
}

// Widens an activation row (q8_0 / q8_1 / q8_K) into st.
void StageActivation(TensorType act, const void* src, int64_t k, const StagedInt& st) {
  const D16 d16;
  const hn::Rebind<int8_t, D16> d8;
  const size_t N = hn::Lanes(d16);
  if (act == TensorType::Q8_K) {
    const auto* b = static_cast<const BlockQ8_K*>(src);
    for (int64_t i = 0; i < k / QK_K; ++i) {
      for (size_t j = 0; j < QK_K; j += N)
        hn::StoreU(hn::PromoteTo(d16, hn::LoadU(d8, b[i].qs + j)), d16, st.q + i * QK_K + j);
      std::memcpy(st.mn + i * 16, b[i].bsums, 32);
      st.d[i] = b[i].d;
    }
  } else if (act == TensorType::Q8_0) {
    const auto* b = static_cast<const BlockQ8_0*>(src);
    for (int64_t i = 0; i < k / 32; ++i) {
      for (size_t j = 0; j < 32; j += N)
        hn::StoreU(hn::PromoteTo(d16, hn::LoadU(d8, b[i].qs + j)), d16, st.q + i * 32 + j);
      st.d[i] = fp16_to_fp32(b[i].d);
    }
  } else {  // Q8_1
    const auto* b = static_cast<const BlockQ8_1*>(src);
    for (int64_t i = 0; i < k / 32; ++i) {
      for (size_t j = 0; j < 32; j += N)
        hn::StoreU(hn::PromoteTo(d16, hn::LoadU(d8, b[i].qs + j)), d16, st.q + i * 32 + j);
      st.d[i] = fp16_to_fp32(b[i].d);
      st.m[i] = fp16_to_fp32(b[i].s);
    }
  }
}

// out[r] = dot(w[r], a) for RW staged weight rows against one staged activation row.
template <int RW>
HWY_INLINE void DotStagedInt(const IntFormat& f, int64_t k, const StagedInt* w, const StagedInt& a,
                             float* out) {
  const D16 d16;
  const D32 d32;
  const DF df;
  const size_t N = hn::Lanes(d16);
  const int64_t nb = k / f.block;
  hn::Vec<DF> facc[RW];
  for (int r = 0; r < RW; ++r) facc[r] = hn::Zero(df);
  for (int64_t b = 0; b < nb; ++b) {
    hn::Vec<D32> s0[RW], s1[RW];
    for (int r = 0; r < RW; ++r) s0[r] = s1[r] = hn::Zero(d32);
    const int64_t e0 = b * f.block, e1 = e0 + f.block;
    for (int64_t e = e0; e < e1; e += static_cast<int64_t>(N)) {
      const auto av = hn::LoadU(d16, a.q + e);
      for (int r = 0; r < RW; ++r)
        s0[r] = hn::ReorderWidenMulAccumulate(d32, hn::LoadU(d16, w[r].q + e), av, s0[r], s1[r]);
    }
    for (int r = 0; r < RW; ++r) {
      const auto isum = hn::ConvertTo(df, hn::RearrangeToOddPlusEven(s0[r], s1[r]));
      facc[r] = hn::MulAdd(hn::Set(df, w[r].d[b] * a.d[b]), isum, facc[r]);
    }
  }
  float res[RW];
  for (int r = 0; r < RW; ++r) res[r] = hn::GetLane(hn::SumOfLanes(df, facc[r]));

  if (f.kmin) {
    const DI16s dm;
    const DI32s dm32;
    const DFs dfm;
    const size_t M = hn::Lanes(dm);
    hn::Vec<DFs> macc[RW];
    for (int r = 0; r < RW; ++r) macc[r] = hn::Zero(dfm);
    for (int64_t b = 0; b < nb; ++b) {
      hn::Vec<DI32s> s0[RW], s1[RW];
      for (int r = 0; r < RW; ++r) s0[r] = s1[r] = hn::Zero(dm32);
      for (size_t g = 0; g < 16; g += M) {
        const auto bs = hn::LoadU(dm, a.mn + b * 16 + g);
        for (int r = 0; r < RW; ++r)
          s0[r] = hn::ReorderWidenMulAccumulate(dm32, hn::LoadU(dm, w[r].mn + b * 16 + g), bs,
                                                s0[r], s1[r]);
      }
      for (int r = 0; r < RW; ++r) {
        const auto msum = hn::ConvertTo(dfm, hn::RearrangeToOddPlusEven(s0[r], s1[r]));
        macc[r] = hn::MulAdd(hn::Set(dfm, w[r].dmin[b] * a.d[b]), msum, macc[r]);
      }
    }
    for (int r = 0; r < RW; ++r) res[r] -= hn::GetLane(hn::SumOfLanes(dfm, macc[r]));
  }
  if (f.m) {
    for (int r = 0; r < RW; ++r) {
      float s = 0;
      for (int64_t b = 0; b < nb; ++b) s += w[r].m[b] * a.m[b];
      res[r] += s;
    }
  }
  for (int r = 0; r < RW; ++r) out[r] = res[r];
}

// Mins (K-quants) and Q4_1/Q5_1 m terms of one staged weight row against one staged activation
// row (integer min sums as in ggml; scalar: a few products per block).
HWY_INLINE float StagedExtras(const IntFormat& f, int64_t nb, const StagedInt& w,
                              const StagedInt& a) {
  float res = 0.0f;
  if (f.kmin) {
    const DI16s dm;
    const DI32s dm32;
    const DFs dfm;
    const size_t M = hn::Lanes(dm);
    auto macc = hn::Zero(dfm);
    for (int64_t b = 0; b < nb; ++b) {
      auto s0 = hn::Zero(dm32), s1 = hn::Zero(dm32);
      for (size_t g = 0; g < 16; g += M)
        s0 = hn::ReorderWidenMulAccumulate(dm32, hn::LoadU(dm, w.mn + b * 16 + g),
                                           hn::LoadU(dm, a.mn + b * 16 + g), s0, s1);
      macc = hn::MulAdd(hn::Set(dfm, w.dmin[b] * a.d[b]),
                        hn::ConvertTo(dfm, hn::RearrangeToOddPlusEven(s0, s1)), macc);
    }
    res -= hn::GetLane(hn::SumOfLanes(dfm, macc));
  }
  if (f.m) {
    float s = 0;
    for (int64_t b = 0; b < nb; ++b) s += w.m[b] * a.m[b];
    res += s;
  }
  return res;
}

// Register tile: 4 staged weight rows x 2 staged activation rows (separate variables, no arrays
// of vectors, so it builds for SVE). out0[r] / out1[r] = dot(w[r], a0 / a1).
template <int kBlock>
HWY_INLINE void DotStagedTile42(const IntFormat& f, int64_t k, const StagedInt* w,
                                const StagedInt& a0, const StagedInt& a1, float* out0,
                                float* out1) {
  const D16 d16;
  const D32 d32;
  const DF df;
  const size_t N = hn::Lanes(d16);
  const int64_t nb = k / kBlock;
  const int16_t* w0 = w[0].q;
  const int16_t* w1 = w[1].q;
  const int16_t* w2 = w[2].q;
  const int16_t* w3 = w[3].q;
  const int16_t* x0 = a0.q;
  const int16_t* x1 = a1.q;
#define TANDEM_T42(X) X(0, 0) X(0, 1) X(1, 0) X(1, 1) X(2, 0) X(2, 1) X(3, 0) X(3, 1)
#define TANDEM_FZ(r, c) auto f##r##c = hn::Zero(df);
  TANDEM_T42(TANDEM_FZ)
#undef TANDEM_FZ
  for (int64_t b = 0; b < nb; ++b) {
#define TANDEM_IZ(r, c) \
  auto i##r##c = hn::Zero(d32); \
  auto j##r##c = hn::Zero(d32);
    TANDEM_T42(TANDEM_IZ)
#undef TANDEM_IZ
    const int64_t e0 = b * kBlock;
    for (int64_t e = e0; e < e0 + kBlock; e += static_cast<int64_t>(N)) {
      const auto v0 = hn::LoadU(d16, x0 + e);
      const auto v1 = hn::LoadU(d16, x1 + e);
#define TANDEM_ROW(r)                                                 \
  {                                                                   \
    const auto wv = hn::LoadU(d16, w##r + e);                         \
    i##r##0 = hn::ReorderWidenMulAccumulate(d32, wv, v0, i##r##0, j##r##0); \
    i##r##1 = hn::ReorderWidenMulAccumulate(d32, wv, v1, i##r##1, j##r##1); \
  }
      TANDEM_ROW(0)
      TANDEM_ROW(1)
      TANDEM_ROW(2)
      TANDEM_ROW(3)
#undef TANDEM_ROW
    }
    const float ad0 = a0.d[b], ad1 = a1.d[b];
#define TANDEM_FA(r, c)                                                                    \
  f##r##c = hn::MulAdd(hn::Set(df, w[r].d[b] * ad##c),                                     \
                       hn::ConvertTo(df, hn::RearrangeToOddPlusEven(i##r##c, j##r##c)), f##r##c);
    TANDEM_T42(TANDEM_FA)
#undef TANDEM_FA
  }
#define TANDEM_OUT(r, c) out##c[r] = hn::GetLane(hn::SumOfLanes(df, f##r##c));
  TANDEM_T42(TANDEM_OUT)
#undef TANDEM_OUT
#undef TANDEM_T42
  if (f.kmin || f.m) {
    for (int r = 0; r < 4; ++r) {
      out0[r] += StagedExtras(f, nb, w[r], a0);
      out1[r] += StagedExtras(f, nb, w[r], a1);
    }
  }
}

// ---------------------------------------------------------------- fused decode kernels
//
// For one or two activation rows (decode) staging the weights costs more than the dot itself:
// the fused kernels unpack each weight block in registers and feed it straight to the int16
// multiply-add against the staged activation row. Integer sums per block are the same as the
// staged path's (and ggml's); only the f32 accumulation order differs.

template <TensorType T>
constexpr bool HasFused() {
  return T == TensorType::Q4_0 || T == TensorType::Q4_1 || T == TensorType::Q5_0 ||
         T == TensorType::Q5_1 || T == TensorType::Q8_0 || T == TensorType::Q4_K ||
         T == TensorType::Q5_K || T == TensorType::Q6_K;
}

template <TensorType T>
constexpr size_t BlockBytes32() {
  if constexpr (T == TensorType::Q4_0) return sizeof(BlockQ4_0);
  if constexpr (T == TensorType::Q4_1) return sizeof(BlockQ4_1);
  if constexpr (T == TensorType::Q5_0) return sizeof(BlockQ5_0);
  if constexpr (T == TensorType::Q5_1) return sizeof(BlockQ5_1);
  return sizeof(BlockQ8_0);
}

// out[r] = dot(weight row wr[r], staged activation a), r < RW.
template <TensorType T, int RW>
HWY_INLINE void FusedDot(const uint8_t* const* wr, const StagedInt& a, int64_t k, float* out) {
  const DI16s di;
  const DU16s du;
  const DU8s du8;
  const DI32s d32;
  const DFs df;
  const size_t N = hn::Lanes(di);
  const auto k0F = hn::Set(du, 0xF);
  hn::Vec<DFs> facc[RW];
  float extra[RW];
  for (int r = 0; r < RW; ++r) {
    facc[r] = hn::Zero(df);
    extra[r] = 0.0f;
  }
  if constexpr (T == TensorType::Q4_K || T == TensorType::Q5_K || T == TensorType::Q6_K) {
    const int64_t nb = k / QK_K;
    for (int64_t b = 0; b < nb; ++b) {
      const int16_t* aq = a.q + b * QK_K;
      const float ad = a.d[b];
      for (int r = 0; r < RW; ++r) {
        auto s0 = hn::Zero(d32), s1 = hn::Zero(d32);
        if constexpr (T == TensorType::Q6_K) {
          const auto* blk = reinterpret_cast<const BlockQ6_K*>(wr[r]) + b;
          const auto k3 = hn::Set(du, 3);
          const auto k32 = hn::Set(di, 32);
          for (int h = 0; h < 2; ++h) {
            const uint8_t* ql = blk->ql + 64 * h;
            const uint8_t* qh = blk->qh + 32 * h;
            const int8_t* sc = blk->scales + 8 * h;
            const int16_t* ah = aq + 128 * h;
            for (size_t l = 0; l < 32; l += N) {
              const auto av = hn::PromoteTo(du, hn::LoadU(du8, ql + l));
              const auto cv = hn::PromoteTo(du, hn::LoadU(du8, ql + 32 + l));
              const auto hb = hn::PromoteTo(du, hn::LoadU(du8, qh + l));
              const auto q1 = hn::Or(hn::And(av, k0F), hn::ShiftLeft<4>(hn::And(hb, k3)));
              const auto q2 =
                  hn::Or(hn::And(cv, k0F), hn::ShiftLeft<4>(hn::And(hn::ShiftRight<2>(hb), k3)));
              const auto q3 = hn::Or(hn::ShiftRight<4>(av),
                                     hn::ShiftLeft<4>(hn::And(hn::ShiftRight<4>(hb), k3)));
              const auto q4 =
                  hn::Or(hn::ShiftRight<4>(cv), hn::ShiftLeft<4>(hn::ShiftRight<6>(hb)));
              const int is = static_cast<int>(l / 16);
              const auto v1 = hn::Mul(hn::Sub(hn::BitCast(di, q1), k32), hn::Set(di, sc[is + 0]));
              const auto v2 = hn::Mul(hn::Sub(hn::BitCast(di, q2), k32), hn::Set(di, sc[is + 2]));
              const auto v3 = hn::Mul(hn::Sub(hn::BitCast(di, q3), k32), hn::Set(di, sc[is + 4]));
              const auto v4 = hn::Mul(hn::Sub(hn::BitCast(di, q4), k32), hn::Set(di, sc[is + 6]));
              s0 = hn::ReorderWidenMulAccumulate(d32, v1, hn::LoadU(di, ah + l), s0, s1);
              s0 = hn::ReorderWidenMulAccumulate(d32, v2, hn::LoadU(di, ah + 32 + l), s0, s1);
              s0 = hn::ReorderWidenMulAccumulate(d32, v3, hn::LoadU(di, ah + 64 + l), s0, s1);
              s0 = hn::ReorderWidenMulAccumulate(d32, v4, hn::LoadU(di, ah + 96 + l), s0, s1);
            }
          }
          const float dw = fp16_to_fp32(blk->d);
          facc[r] = hn::MulAdd(hn::Set(df, dw * ad),
                               hn::ConvertTo(df, hn::RearrangeToOddPlusEven(s0, s1)), facc[r]);
        } else {  // Q4_K / Q5_K
          using B = std::conditional_t<T == TensorType::Q4_K, BlockQ4_K, BlockQ5_K>;
          const auto* blk = reinterpret_cast<const B*>(wr[r]) + b;
          int sc[8], m[8];
          for (int j = 0; j < 8; ++j) unpack_scale_min_k4(j, blk->scales, &sc[j], &m[j]);
          for (int c = 0; c < 4; ++c) {
            const auto s_lo = hn::Set(di, static_cast<int16_t>(sc[2 * c]));
            const auto s_hi = hn::Set(di, static_cast<int16_t>(sc[2 * c + 1]));
            for (size_t j = 0; j < 32; j += N) {
              const auto v = hn::PromoteTo(du, hn::LoadU(du8, blk->qs + 32 * c + j));
              auto lo = hn::And(v, k0F);
              auto hi = hn::ShiftRight<4>(v);
              if constexpr (T == TensorType::Q5_K) {
                const auto k1 = hn::Set(du, 1);
                const auto h = hn::PromoteTo(du, hn::LoadU(du8, blk->qh + j));
                lo = hn::Or(lo, hn::ShiftLeft<4>(hn::And(hn::ShiftRightSame(h, 2 * c), k1)));
                hi = hn::Or(hi, hn::ShiftLeft<4>(hn::And(hn::ShiftRightSame(h, 2 * c + 1), k1)));
              }
              s0 = hn::ReorderWidenMulAccumulate(d32, hn::Mul(hn::BitCast(di, lo), s_lo),
                                                 hn::LoadU(di, aq + 64 * c + j), s0, s1);
              s0 = hn::ReorderWidenMulAccumulate(d32, hn::Mul(hn::BitCast(di, hi), s_hi),
                                                 hn::LoadU(di, aq + 64 * c + 32 + j), s0, s1);
            }
          }
          const int16_t* bs = a.mn + b * 16;
          int32_t msum = 0;
          for (int j = 0; j < 8; ++j) msum += m[j] * (bs[2 * j] + bs[2 * j + 1]);
          const float dw = fp16_to_fp32(blk->d);
          facc[r] = hn::MulAdd(hn::Set(df, dw * ad),
                               hn::ConvertTo(df, hn::RearrangeToOddPlusEven(s0, s1)), facc[r]);
          extra[r] -= fp16_to_fp32(blk->dmin) * ad * static_cast<float>(msum);
        }
      }
    }
  } else {
    const int64_t nb = k / 32;
    const hn::CappedTag<float, 4> df4;
    const hn::Rebind<hwy::float16_t, decltype(df4)> dh4;
    constexpr size_t kBlockBytes = BlockBytes32<T>();
    for (int64_t b = 0; b < nb; ++b) {
      const int16_t* aq = a.q + b * 32;
      const float ad = a.d[b];
      // Block scales of the RW rows (d is the first field of every 32-element block), converted
      // with one vector f16 -> f32 conversion (exact) and multiplied by the activation scale.
      alignas(16) uint16_t dbits[4] = {0, 0, 0, 0};
      for (int r = 0; r < RW; ++r) std::memcpy(&dbits[r], wr[r] + b * kBlockBytes, 2);
      // Fetch the same position one row group ahead (the next group is contiguous), one line
      // every other block per row (measured ~15-30% faster on the 178 MB Gemma LM head than
      // no prefetch or a bulk prefetch of the next group).
      if (RW == 4 && (b & 1) == 0)
        for (int r = 0; r < RW; ++r)
          hwy::Prefetch(wr[r] + (RW * nb + b) * static_cast<int64_t>(kBlockBytes));
      alignas(16) float scl[4];
      for (size_t i = 0; i < static_cast<size_t>(RW); i += hn::Lanes(df4)) {
        const auto h = hn::LoadU(dh4, reinterpret_cast<const hwy::float16_t*>(dbits + i));
        hn::StoreU(hn::Mul(hn::PromoteTo(df4, h), hn::Set(df4, ad)), df4, scl + i);
      }
      for (int r = 0; r < RW; ++r) {
        auto s0 = hn::Zero(d32), s1 = hn::Zero(d32);
        if constexpr (T == TensorType::Q8_0) {
          const auto* blk = reinterpret_cast<const BlockQ8_0*>(wr[r]) + b;
          const hn::Rebind<int8_t, DI16s> di8;
          for (size_t j = 0; j < 32; j += N)
            s0 = hn::ReorderWidenMulAccumulate(d32, hn::PromoteTo(di, hn::LoadU(di8, blk->qs + j)),
                                               hn::LoadU(di, aq + j), s0, s1);
        } else if constexpr (T == TensorType::Q4_0 || T == TensorType::Q4_1) {
          using B = std::conditional_t<T == TensorType::Q4_0, BlockQ4_0, BlockQ4_1>;
          const auto* blk = reinterpret_cast<const B*>(wr[r]) + b;
          const auto off = hn::Set(di, T == TensorType::Q4_0 ? 8 : 0);
          for (size_t j = 0; j < 16; j += N) {
            const auto v = hn::PromoteTo(du, hn::LoadU(du8, blk->qs + j));
            const auto lo = hn::Sub(hn::BitCast(di, hn::And(v, k0F)), off);
            const auto hi = hn::Sub(hn::BitCast(di, hn::ShiftRight<4>(v)), off);
            s0 = hn::ReorderWidenMulAccumulate(d32, lo, hn::LoadU(di, aq + j), s0, s1);
            s0 = hn::ReorderWidenMulAccumulate(d32, hi, hn::LoadU(di, aq + 16 + j), s0, s1);
          }
          if constexpr (T == TensorType::Q4_1) extra[r] += fp16_to_fp32(blk->m) * a.m[b];
        } else {  // Q5_0 / Q5_1
          using B = std::conditional_t<T == TensorType::Q5_0, BlockQ5_0, BlockQ5_1>;
          const auto* blk = reinterpret_cast<const B*>(wr[r]) + b;
          const auto kBits = hn::LoadU(du, BitTable());
          const auto k16 = hn::Set(du, 16);
          uint32_t qh;
          std::memcpy(&qh, blk->qh, 4);
          const auto off = hn::Set(di, T == TensorType::Q5_0 ? 16 : 0);
          for (size_t j = 0; j < 16; j += N) {
            const auto v = hn::PromoteTo(du, hn::LoadU(du8, blk->qs + j));
            const auto hlo = hn::Set(du, static_cast<uint16_t>(qh >> j));
            const auto hhi = hn::Set(du, static_cast<uint16_t>(qh >> (16 + j)));
            const auto lo =
                hn::Or(hn::And(v, k0F), hn::IfThenElseZero(hn::TestBit(hlo, kBits), k16));
            const auto hi =
                hn::Or(hn::ShiftRight<4>(v), hn::IfThenElseZero(hn::TestBit(hhi, kBits), k16));
            s0 = hn::ReorderWidenMulAccumulate(d32, hn::Sub(hn::BitCast(di, lo), off),
                                               hn::LoadU(di, aq + j), s0, s1);
            s0 = hn::ReorderWidenMulAccumulate(d32, hn::Sub(hn::BitCast(di, hi), off),
                                               hn::LoadU(di, aq + 16 + j), s0, s1);
          }
          if constexpr (T == TensorType::Q5_1) extra[r] += fp16_to_fp32(blk->m) * a.m[b];
        }
        facc[r] = hn::MulAdd(hn::Set(df, scl[r]),
                             hn::ConvertTo(df, hn::RearrangeToOddPlusEven(s0, s1)), facc[r]);
      }
    }
  }
  for (int r = 0; r < RW; ++r) out[r] = hn::GetLane(hn::SumOfLanes(df, facc[r])) + extra[r];
}

// Rows [row_begin, row_end) of w against `ra` staged activation rows; y row r at y + r*y_stride.
template <TensorType T>
void MatvecFused(int64_t k, const uint8_t* w, size_t w_stride, int64_t row_begin, int64_t row_end,
                 const StagedInt* ast, int64_t ra, float* y, int64_t y_stride) {
  constexpr int kRW = 4;
  int64_t i0 = row_begin;
  for (; i0 + kRW <= row_end; i0 += kRW) {
    const uint8_t* wr[kRW];
    for (int r = 0; r < kRW; ++r) wr[r] = w + (i0 + r) * w_stride;
    for (int64_t r = 0; r < ra; ++r) {
      float out[kRW];
      FusedDot<T, kRW>(wr, ast[r], k, out);
      for (int j = 0; j < kRW; ++j) y[r * y_stride + i0 + j] = out[j];
    }
  }
  for (; i0 < row_end; ++i0) {
    const uint8_t* wr[1] = {w + i0 * w_stride};
    for (int64_t r = 0; r < ra; ++r) FusedDot<T, 1>(wr, ast[r], k, y + r * y_stride + i0);
  }
}

// Returns false when the type has no fused kernel.
bool TryMatvecFused(TensorType t, int64_t k, const uint8_t* w, size_t w_stride, int64_t row_begin,
                    int64_t row_end, const StagedInt* ast, int64_t ra, float* y, int64_t y_stride) {
#define TANDEM_FUSED_CASE(TT)                                                              \
  case TensorType::TT:                                                                     \
    MatvecFused<TensorType::TT>(k, w, w_stride, row_begin, row_end, ast, ra, y, y_stride); \
    return true;
  switch (t) {
    TANDEM_FUSED_CASE(Q4_0)
    TANDEM_FUSED_CASE(Q4_1)
    TANDEM_FUSED_CASE(Q5_0)
    TANDEM_FUSED_CASE(Q5_1)
    TANDEM_FUSED_CASE(Q8_0)
    TANDEM_FUSED_CASE(Q4_K)
    TANDEM_FUSED_CASE(Q5_K)
    TANDEM_FUSED_CASE(Q6_K)
    default:
      return false;
  }
#undef TANDEM_FUSED_CASE
}

// ---------------------------------------------------------------- f32 / f16 / bf16

void StageFloat(TensorType t, const void* src, int64_t n, float* dst) {
  const hn::ScalableTag<float> df;
  const size_t N = hn::Lanes(df);
  int64_t i = 0;
  if (t == TensorType::F16) {
    const hn::Rebind<hwy::float16_t, decltype(df)> dh;
    const auto* s = static_cast<const hwy::float16_t*>(src);
    for (; i + static_cast<int64_t>(N) <= n; i += N)
      hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, s + i)), df, dst + i);
    const auto* h = static_cast<const uint16_t*>(src);
    for (; i < n; ++i) dst[i] = fp16_to_fp32(h[i]);
  } else if (t == TensorType::BF16) {
    const hn::Rebind<hwy::bfloat16_t, decltype(df)> dh;
    const auto* s = static_cast<const hwy::bfloat16_t*>(src);
    for (; i + static_cast<int64_t>(N) <= n; i += N)
      hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, s + i)), df, dst + i);
    const auto* h = static_cast<const uint16_t*>(src);
    for (; i < n; ++i) dst[i] = ref::bf16_to_f32(h[i]);
  } else {
    std::memcpy(dst, src, static_cast<size_t>(n) * 4);
  }
}

template <int RW>
HWY_INLINE void DotF32Multi(int64_t n, const float* const* w, const float* a, float* out) {
  const hn::ScalableTag<float> df;
  const size_t N = hn::Lanes(df);
  hn::Vec<decltype(df)> acc0[RW], acc1[RW];
  for (int r = 0; r < RW; ++r) acc0[r] = acc1[r] = hn::Zero(df);
  int64_t i = 0;
  for (; i + 2 * static_cast<int64_t>(N) <= n; i += 2 * N) {
    const auto a0 = hn::LoadU(df, a + i);
    const auto a1 = hn::LoadU(df, a + i + N);
    for (int r = 0; r < RW; ++r) {
      acc0[r] = hn::MulAdd(hn::LoadU(df, w[r] + i), a0, acc0[r]);
      acc1[r] = hn::MulAdd(hn::LoadU(df, w[r] + i + N), a1, acc1[r]);
    }
  }
  for (; i + static_cast<int64_t>(N) <= n; i += N) {
    const auto a0 = hn::LoadU(df, a + i);
    for (int r = 0; r < RW; ++r) acc0[r] = hn::MulAdd(hn::LoadU(df, w[r] + i), a0, acc0[r]);
  }
  for (int r = 0; r < RW; ++r) {
    float s = hn::GetLane(hn::SumOfLanes(df, hn::Add(acc0[r], acc1[r])));
    for (int64_t j = i; j < n; ++j) s += w[r][j] * a[j];
    out[r] = s;
  }
}

// ---------------------------------------------------------------- matmul driver

struct Scratch {
  std::vector<int16_t> wq, aq, wmn, amn;
  std::vector<float> wd, ad, wdmin, wm, am, wf, af;
  std::vector<StagedInt> ast;
};
inline Scratch& GetScratch() {
  static thread_local Scratch s;
  return s;
}

constexpr int kRowTile = 4;          // weight rows unpacked together
constexpr int64_t kFusedMaxAct = 3;  // up to this many activation rows: fused (no staging)
constexpr size_t kActTileBytes = size_t{1} << 20;  // staged activation bytes per tile
// Staged int16 activation tile of the integer path: sized to stay in L2 next to the streamed
// weights, so every group of weight rows re-reads it from L2 rather than L3.
constexpr size_t kIntActTileBytes = size_t{256} << 10;

template <class T>
T* Grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

// Quantized weight types take the integer path (the rest is f32/f16/bf16).
inline bool IsIntType(TensorType t) {
  return is_supported_weight_type(t) && traits(t).is_quantized;
}

void MatmulInt(TensorType wt, int64_t k, const uint8_t* w, size_t w_stride, int64_t row_begin,
               int64_t row_end, const uint8_t* acts, size_t act_stride, int64_t n_act, float* y,
               int64_t y_stride) {
  const IntFormat f = FormatOf(wt);
  const int64_t nb = k / f.block;
  const int64_t nbk = k / QK_K;
  const int64_t nb32 = k / 32;
  const TensorType at = activation_type(wt);
  Scratch& s = GetScratch();

  const size_t act_row_bytes = static_cast<size_t>(k) * 2 + 64;
  const int64_t ra_max =
      std::max<int64_t>(1, std::min<int64_t>(n_act, kIntActTileBytes / act_row_bytes));
  int16_t* aq = Grow(s.aq, static_cast<size_t>(ra_max * k));
  float* ad = Grow(s.ad, static_cast<size_t>(ra_max * nb + 1));
  int16_t* amn = Grow(s.amn, static_cast<size_t>(ra_max * nbk * 16 + 16));
  float* am = Grow(s.am, static_cast<size_t>(ra_max * nb32 + 1));
  int16_t* wq = Grow(s.wq, static_cast<size_t>(kRowTile * k));
  float* wd = Grow(s.wd, static_cast<size_t>(kRowTile * nb + 1));
  int16_t* wmn = Grow(s.wmn, static_cast<size_t>(kRowTile * nbk * 16 + 16));
  float* wdmin = Grow(s.wdmin, static_cast<size_t>(kRowTile * nbk + 1));
  float* wm = Grow(s.wm, static_cast<size_t>(kRowTile * nb32 + 1));

  StagedInt* ast = Grow(s.ast, static_cast<size_t>(ra_max));
  for (int64_t r0 = 0; r0 < n_act; r0 += ra_max) {
    const int64_t ra = std::min(ra_max, n_act - r0);
    for (int64_t r = 0; r < ra; ++r) {
      StagedInt& st = ast[static_cast<size_t>(r)];
      st.q = aq + r * k;
      st.d = ad + r * nb;
      st.mn = amn + r * nbk * 16;
      st.m = am + r * nb32;
      StageActivation(at, acts + (r0 + r) * act_stride, k, st);
    }
    if (ra <= kFusedMaxAct && TryMatvecFused(wt, k, w, w_stride, row_begin, row_end, ast, ra,
                                             y + r0 * y_stride, y_stride))
      continue;
    for (int64_t i0 = row_begin; i0 < row_end; i0 += kRowTile) {
      const int rw = static_cast<int>(std::min<int64_t>(kRowTile, row_end - i0));
      StagedInt wst[kRowTile];
      for (int r = 0; r < rw; ++r) {
        wst[r].q = wq + r * k;
        wst[r].d = wd + r * nb;
        wst[r].mn = wmn + r * nbk * 16;
        wst[r].dmin = wdmin + r * nbk;
        wst[r].m = wm + r * nb32;
        UnpackWeights(wt, w + (i0 + r) * w_stride, k, wst[r]);
        // Start fetching the same row of the next tile (hardware prefetchers track a handful
        // of streams; this keeps decode closer to memory bandwidth).
        if (i0 + kRowTile + r < row_end) {
          const uint8_t* next = w + (i0 + kRowTile + r) * w_stride;
          for (size_t off = 0; off < w_stride; off += 64) hwy::Prefetch(next + off);
        }
      }
      float out[kRowTile];
      int64_t r = 0;
      if (rw == 4) {
        float out1[kRowTile];
        for (; r + 2 <= ra; r += 2) {
          const StagedInt& a0 = ast[static_cast<size_t>(r)];
          const StagedInt& a1 = ast[static_cast<size_t>(r + 1)];
          if (f.block == 32)
            DotStagedTile42<32>(f, k, wst, a0, a1, out, out1);
          else
            DotStagedTile42<QK_K>(f, k, wst, a0, a1, out, out1);
          float* yr = y + (r0 + r) * y_stride + i0;
          for (int j = 0; j < 4; ++j) {
            yr[j] = out[j];
            yr[y_stride + j] = out1[j];
          }
        }
      }
      for (; r < ra; ++r) {
        const StagedInt& a = ast[static_cast<size_t>(r)];
        float* yr = y + (r0 + r) * y_stride + i0;
        if (rw == 4) {
          DotStagedInt<4>(f, k, wst, a, out);
        } else {
          for (int j = 0; j < rw; ++j) DotStagedInt<1>(f, k, wst + j, a, out + j);
        }
        for (int j = 0; j < rw; ++j) yr[j] = out[j];
      }
    }
  }
}

void MatmulFloat(TensorType wt, int64_t k, const uint8_t* w, size_t w_stride, int64_t row_begin,
                 int64_t row_end, const uint8_t* acts, size_t act_stride, int64_t n_act, float* y,
                 int64_t y_stride) {
  Scratch& s = GetScratch();
  const bool is_f32 = wt == TensorType::F32;
  const size_t row_b = static_cast<size_t>(k) * 4;
  const int64_t ra_max = std::max<int64_t>(1, std::min<int64_t>(n_act, kActTileBytes / row_b));
  float* af = is_f32 ? nullptr : Grow(s.af, static_cast<size_t>(ra_max * k));
  float* wf = is_f32 ? nullptr : Grow(s.wf, static_cast<size_t>(kRowTile * k));
  for (int64_t r0 = 0; r0 < n_act; r0 += ra_max) {
    const int64_t ra = std::min(ra_max, n_act - r0);
    if (!is_f32)
      for (int64_t r = 0; r < ra; ++r) StageFloat(wt, acts + (r0 + r) * act_stride, k, af + r * k);
    for (int64_t i0 = row_begin; i0 < row_end; i0 += kRowTile) {
      const int rw = static_cast<int>(std::min<int64_t>(kRowTile, row_end - i0));
      const float* wr[kRowTile];
      for (int r = 0; r < rw; ++r) {
        if (is_f32) {
          wr[r] = reinterpret_cast<const float*>(w + (i0 + r) * w_stride);
        } else {
          StageFloat(wt, w + (i0 + r) * w_stride, k, wf + r * k);
          wr[r] = wf + r * k;
        }
      }
      float out[kRowTile];
      for (int64_t r = 0; r < ra; ++r) {
        const float* a =
            is_f32 ? reinterpret_cast<const float*>(acts + (r0 + r) * act_stride) : af + r * k;
        if (rw == 4) {
          DotF32Multi<4>(k, wr, a, out);
        } else {
          for (int j = 0; j < rw; ++j) DotF32Multi<1>(k, wr + j, a, out + j);
        }
        float* yr = y + (r0 + r) * y_stride + i0;
        for (int j = 0; j < rw; ++j) yr[j] = out[j];
      }
    }
  }
}

// ---------------------------------------------------------------- exported entry points

// Returns false when the type has no SIMD path here (the caller then uses the reference).
bool MatmulRowsT(TensorType wt, int64_t k, const void* w, int64_t row_begin, int64_t row_end,
                 const void* acts, size_t act_stride, int64_t n_act, float* y, int64_t y_stride) {
  const size_t w_stride = row_bytes(wt, k);
  const auto* wb = static_cast<const uint8_t*>(w);
  const auto* ab = static_cast<const uint8_t*>(acts);
  if (IsIntType(wt)) {
    MatmulInt(wt, k, wb, w_stride, row_begin, row_end, ab, act_stride, n_act, y, y_stride);
    return true;
  }
  if (wt == TensorType::F32 || wt == TensorType::F16 || wt == TensorType::BF16) {
    MatmulFloat(wt, k, wb, w_stride, row_begin, row_end, ab, act_stride, n_act, y, y_stride);
    return true;
  }
  return false;
}

float DotF32T(const float* a, const float* b, int64_t n) {
  const float* w[1] = {a};
  float out;
  DotF32Multi<1>(n, w, b, &out);
  return out;
}

void AxpyT(float alpha, const float* x, float* y, int64_t n) {
  const hn::ScalableTag<float> df;
  const size_t N = hn::Lanes(df);
  const auto va = hn::Set(df, alpha);
  int64_t i = 0;
  for (; i + static_cast<int64_t>(N) <= n; i += N)
    hn::StoreU(hn::MulAdd(va, hn::LoadU(df, x + i), hn::LoadU(df, y + i)), df, y + i);
  for (; i < n; ++i) y[i] += alpha * x[i];
}

void RmsNormT(const float* x, const float* w, float* out, int64_t n, float eps) {
  double sum = 0;
#if HWY_HAVE_FLOAT64
  {
    const hn::ScalableTag<double> dd;
    const hn::Rebind<float, decltype(dd)> dfh;
    const size_t N = hn::Lanes(dd);
    auto acc = hn::Zero(dd);
    int64_t i = 0;
    for (; i + static_cast<int64_t>(N) <= n; i += N) {
      const auto v = hn::LoadU(dfh, x + i);
      acc = hn::Add(acc, hn::PromoteTo(dd, hn::Mul(v, v)));  // f32 square, f64 sum (as ggml)
    }
    sum = hn::GetLane(hn::SumOfLanes(dd, acc));
    for (; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
  }
#else
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
#endif
  const float mean = static_cast<float>(sum / static_cast<double>(n));
  const float scale = 1.0f / std::sqrt(mean + eps);
  const hn::ScalableTag<float> df;
  const size_t N = hn::Lanes(df);
  const auto vs = hn::Set(df, scale);
  int64_t i = 0;
  for (; i + static_cast<int64_t>(N) <= n; i += N)
    hn::StoreU(hn::Mul(hn::Mul(hn::LoadU(df, x + i), vs), hn::LoadU(df, w + i)), df, out + i);
  for (; i < n; ++i) out[i] = (x[i] * scale) * w[i];
}

const char* TargetNameT() {
  return hwy::TargetName(HWY_TARGET);
}

}  // namespace HWY_NAMESPACE
}  // namespace tandem::kernels
HWY_AFTER_NAMESPACE();

#endif  // include guard
