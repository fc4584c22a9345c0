// Prefill matmul of 32-element block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) over tiles of weight
// rows interleaved four bytes at a time (Highway), included by kernels-inl.h once per target.
//
// A tile holds kTileW weight rows, one per 32-bit lane of a full-width vector (16 on AVX-512,
// 8 on AVX2, 4 on SSE4/NEON). Its bytes are ordered so that one vector load gives four
// consecutive elements of every row:
//     q[((b * 8 + g) * kTileW + r) * 4 + e] = weight (row r, element 32 b + 4 g + e)
// Four activation bytes broadcast to every lane then make one "dot of four" per lane: the
// vpdpbusd of AVX-512 VNNI (with the broadcast folded into its memory operand), or pmaddubsw +
// pmaddwd elsewhere. No horizontal sums are needed: each lane ends a block holding the integer
// dot of its own row, which is scaled and accumulated in f32 block by block, in the reference's
// order.
//
// The multiply is u8 x s8: the weights are staged unsigned, u = w + o (Q4_0: o = 8, Q5_0: 16,
// Q8_0: 128; Q4_1/Q5_1: o = 0, w = q, with the min term m * s_a of the Q8_1 activation block),
// and the activations stay signed. sum(u * a) = sum(w * a) + o * sum(a), so each block's
// accumulator starts at -o * sum(a), computed once per activation block. Where the dot goes
// through pmaddubsw's saturating 16-bit pair sums, a pair is at most 2 * 31 * 127 < 2^15 for
// the 4- and 5-bit types; Q8_0 (u <= 255) would overflow there, so it takes this path only with
// VNNI, which sums in 32 bits. Integer sums per block are therefore exactly the reference's.
//
// Each thread stages its weight rows one tile at a time (a copy of about one byte per weight in
// a thread-local buffer that stays in L1) and runs every activation row past it, kTileA rows at
// a time; each weight row is decoded once per call.

#if defined(TANDEM_TILE_DOT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TANDEM_TILE_DOT_INL_H_
#undef TANDEM_TILE_DOT_INL_H_
#else
#define TANDEM_TILE_DOT_INL_H_
#endif

#include <cstddef>
#include <cstring>

#include "common/tensor_type.h"
#include "hwy/highway.h"
#include "kernels/quant_blocks.h"
#include "kernels/quant_dot-inl.h"

HWY_BEFORE_NAMESPACE();
namespace tandem::kernels {
namespace HWY_NAMESPACE {
namespace td {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET != HWY_SCALAR

using DI = hn::ScalableTag<int32_t>;  // one lane per weight row of a tile
using DB = hn::Repartition<int8_t, DI>;
using DFT = hn::Repartition<float, DI>;
using VI = hn::Vec<DI>;
using VB = hn::Vec<DB>;
using VFT = hn::Vec<DFT>;
constexpr size_t kTileW = hn::MaxLanes(DI());  // weight rows per tile
constexpr size_t kGroups = 8;                  // four-byte groups per 32-element block

// ---------------------------------------------------------------- dot of four

HWY_INLINE int32_t Load4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// acc + per lane: sum over e < 4 of u[4 * lane + e] * a[e] (u unsigned, a signed).
#if HWY_TARGET == HWY_AVX3_DL
constexpr bool kExact32 = true;  // vpdpbusd: no 16-bit intermediate
HWY_INLINE VI Dot4(VI acc, const int8_t* a, VB u) {
  // Highway 1.0 compiles AVX3_DL without GCC's avx512vnni flag (it checks the CPU for it), so
  // the instruction is written out; its signed operand is broadcast from memory.
  typedef uint32_t __attribute__((may_alias, aligned(1))) Bytes4;
  asm("vpdpbusd %2%{1to16%}, %1, %0"
      : "+v"(acc.raw)
      : "v"(u.raw), "m"(*reinterpret_cast<const Bytes4*>(a)));
  return acc;
}
#elif HWY_TARGET == HWY_AVX3
constexpr bool kExact32 = false;
HWY_INLINE VI Dot4(VI acc, const int8_t* a, VB u) {
  const __m512i pairs = _mm512_maddubs_epi16(u.raw, _mm512_set1_epi32(Load4(a)));
  return VI{_mm512_add_epi32(acc.raw, _mm512_madd_epi16(pairs, _mm512_set1_epi16(1)))};
}
#else
// Full-width vectors here are quant_dot's 8-bit vectors: reuse its pair multiply.
static_assert(hn::MaxLanes(DB()) == qd::kN, "tile_dot expects quant_dot's vector width");
constexpr bool kExact32 = false;
HWY_INLINE VI Dot4(VI acc, const int8_t* a, VB u) {
  const qd::DU8 du8;
  const qd::D8 d8;
  const qd::D16 d16;
  const auto av = hn::BitCast(d8, hn::Set(DI(), Load4(a)));
  return qd::MulAddPairs(qd::MulPairs(hn::BitCast(du8, u), av), hn::Set(d16, 1), acc);
}
#endif

// Types that take the tiled path on this target.
constexpr bool UsesTiles(TensorType t) {
  return qd::IsBlock32(t) && (t != TensorType::Q8_0 || kExact32);
}
constexpr bool HasMin(TensorType t) {
  return t == TensorType::Q4_1 || t == TensorType::Q5_1;
}

// u - w of the staged weights (see the top).
constexpr int TileOffset(TensorType t) {
  return t == TensorType::Q8_0 ? 128 : qd::OffsetOf(t);
}

// ---------------------------------------------------------------- staging

// One staged tile of nb blocks (see the layout at the top).
struct Tile32 {
  uint8_t* u;  // [nb * 8 * kTileW * 4]
  float* d;    // [nb * kTileW]  weight scale
  float* m;    // [nb * kTileW]  weight min (Q4_1/Q5_1)
};

inline size_t TileBytes(int64_t nb) {
  return static_cast<size_t>(nb) * kTileW * (32 + 2 * sizeof(float));
}

// A tile in a buffer of TileBytes(nb) bytes.
inline Tile32 TileIn(uint8_t* buf, int64_t nb) {
  const size_t n = static_cast<size_t>(nb) * kTileW;
  return Tile32{buf, reinterpret_cast<float*>(buf + 32 * n),
                reinterpret_cast<float*>(buf + 36 * n)};
}

// Decodes kTileW weight rows (w_stride bytes apart) into `tile`.
template <TensorType T>
HWY_INLINE void StageTile32(const uint8_t* w, size_t w_stride, int64_t nb, const Tile32& tile) {
  using B = qd::BlockOf<T>;
  const qd::DU8 du8;
  const auto sign = hn::Set(du8, 0x80);
  for (size_t r = 0; r < kTileW; ++r) {
    const B* wb = reinterpret_cast<const B*>(w + r * w_stride);
    for (int64_t b = 0; b < nb; ++b) {
      qd::V8 v[qd::kPer32];
      qd::Decode32<T>(wb[b], v);  // unsigned u, except Q8_0: signed w
      alignas(32) uint8_t vals[32];
      for (size_t j = 0; j < qd::kPer32; ++j) {
        auto uj = hn::BitCast(du8, v[j]);
        if constexpr (T == TensorType::Q8_0) uj = hn::Xor(uj, sign);  // w + 128
        hn::Store(uj, du8, vals + j * qd::kN);
      }
      uint8_t* dst = tile.u + (static_cast<size_t>(b) * kGroups * kTileW + r) * 4;
      for (size_t g = 0; g < kGroups; ++g) std::memcpy(dst + g * kTileW * 4, vals + 4 * g, 4);
      const size_t at = static_cast<size_t>(b) * kTileW + r;
      tile.d[at] = qd::HalfToFloat(wb[b].d);
      if constexpr (HasMin(T)) tile.m[at] = qd::HalfToFloat(wb[b].m);
    }
  }
}

// ---------------------------------------------------------------- activations

// What the kernel needs of the Q8_0 / Q8_1 activation rows besides their bytes, per block.
struct Acts32 {
  const uint8_t* rows;  // the activation rows, `stride` bytes apart
  size_t stride;
  const float* d;       // [n_act * nb]  block scale
  const float* s;       // [n_act * nb]  Q8_1's d * sum(a)
  const int32_t* corr;  // [n_act * nb]  -offset * sum(a), the accumulator's start
};

// Fills d, s and corr for n_act rows of the activation type of weight type T.
template <TensorType T>
HWY_INLINE void PrepareActs32(const uint8_t* acts, size_t act_stride, int64_t n_act, int64_t nb,
                              float* d, float* s, int32_t* corr) {
  const qd::D8 d8;
  const qd::DU8 du8;
  const qd::D16 d16;
  const qd::D32 d32;
  const auto ones8 = hn::Set(du8, 1);
  const auto ones16 = hn::Set(d16, 1);
  for (int64_t r = 0; r < n_act; ++r) {
    const uint8_t* row = acts + r * act_stride;
    for (int64_t b = 0; b < nb; ++b) {
      const size_t at = static_cast<size_t>(r * nb + b);
      if constexpr (HasMin(T)) {
        const auto* blk = reinterpret_cast<const BlockQ8_1*>(row) + b;
        d[at] = qd::HalfToFloat(blk->d);
        s[at] = qd::HalfToFloat(blk->s);
        corr[at] = 0;
      } else {
        const auto* blk = reinterpret_cast<const BlockQ8_0*>(row) + b;
        d[at] = qd::HalfToFloat(blk->d);
        qd::V32 sum = hn::Zero(d32);
        for (size_t j = 0; j < qd::kPer32; ++j)
          sum = qd::MulAddPairs(qd::MulPairs(ones8, hn::LoadU(d8, blk->qs + j * qd::kN)), ones16,
                                sum);
        corr[at] = -TileOffset(T) * hn::GetLane(hn::SumOfLanes(d32, sum));
      }
    }
  }
}

// Signed bytes of block b of activation row r.
template <bool kQ81>
HWY_INLINE const int8_t* ActBytes(const Acts32& a, int64_t r, int64_t b) {
  const uint8_t* row = a.rows + r * a.stride;
  if constexpr (kQ81) return reinterpret_cast<const BlockQ8_1*>(row)[b].qs;
  return reinterpret_cast<const BlockQ8_0*>(row)[b].qs;
}

// ---------------------------------------------------------------- kernel

// One staged tile against RA activation rows from row r0: y0[(r0 + j) * y_stride + i] for the
// tile's rows i < kTileW.
template <bool kMin, int RA>
HWY_INLINE void TileDot32(const Tile32& tile, const Acts32& acts, int64_t r0, int64_t nb, float* y0,
                          int64_t y_stride) {
  const DI di;
  const DFT df;
  VFT facc[RA];
  for (int j = 0; j < RA; ++j) facc[j] = hn::Zero(df);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* ub = tile.u + static_cast<size_t>(b) * kGroups * kTileW * 4;
    const int8_t* a[RA];
    VI isum[RA];
    for (int j = 0; j < RA; ++j) {
      a[j] = ActBytes<kMin>(acts, r0 + j, b);
      isum[j] = hn::Set(di, acts.corr[(r0 + j) * nb + b]);
    }
    for (size_t g = 0; g < kGroups; ++g) {
      const VB uv =
          hn::BitCast(DB(), hn::LoadU(hn::Repartition<uint8_t, DI>(), ub + g * kTileW * 4));
      for (int j = 0; j < RA; ++j) isum[j] = Dot4(isum[j], a[j] + 4 * g, uv);
    }
    const size_t at = static_cast<size_t>(b) * kTileW;
    const VFT dw = hn::LoadU(df, tile.d + at);
    for (int j = 0; j < RA; ++j) {
      const size_t ab = static_cast<size_t>((r0 + j) * nb + b);
      facc[j] =
          hn::MulAdd(hn::ConvertTo(df, isum[j]), hn::Mul(dw, hn::Set(df, acts.d[ab])), facc[j]);
      if constexpr (kMin)
        facc[j] = hn::MulAdd(hn::LoadU(df, tile.m + at), hn::Set(df, acts.s[ab]), facc[j]);
    }
  }
  for (int j = 0; j < RA; ++j) hn::StoreU(facc[j], df, y0 + (r0 + j) * y_stride);
}

// Activation rows per pass: as many accumulator pairs as the register file holds.
constexpr int kTileA = HWY_TARGET <= HWY_AVX3 ? 8 : 4;

// All activation rows against one staged tile, kTileA at a time and then the rest.
template <bool kMin>
HWY_INLINE void TileDotAll(const Tile32& tile, const Acts32& acts, int64_t n_act, int64_t nb,
                           float* y0, int64_t y_stride) {
  int64_t r = 0;
  for (; r + kTileA <= n_act; r += kTileA) TileDot32<kMin, kTileA>(tile, acts, r, nb, y0, y_stride);
  const auto tail = [&](auto ra) HWY_ATTR {
    TileDot32<kMin, decltype(ra)::value>(tile, acts, r, nb, y0, y_stride);
  };
  switch (n_act - r) {
    case 7:
      return tail(std::integral_constant<int, 7>());
    case 6:
      return tail(std::integral_constant<int, 6>());
    case 5:
      return tail(std::integral_constant<int, 5>());
    case 4:
      return tail(std::integral_constant<int, 4>());
    case 3:
      return tail(std::integral_constant<int, 3>());
    case 2:
      return tail(std::integral_constant<int, 2>());
    case 1:
      return tail(std::integral_constant<int, 1>());
    default:
      return;
  }
}

#endif  // HWY_TARGET != HWY_SCALAR

}  // namespace td
}  // namespace HWY_NAMESPACE
}  // namespace tandem::kernels
HWY_AFTER_NAMESPACE();

#endif  // TANDEM_TILE_DOT_INL_H_
