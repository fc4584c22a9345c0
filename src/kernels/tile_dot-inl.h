// Prefill matmul of the quantized types over tiles of weight rows interleaved four bytes at a
// time (Highway), included by kernels-inl.h once per target: the 32-element block types (Q4_0,
// Q4_1, Q5_0, Q5_1, Q8_0) first, the K-quants further down. Activation bytes are read in place
// from their Q8_0 / Q8_1 / Q8_K blocks.
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
// the 4- and 5-bit types; Q8_0 (u <= 255) would overflow there, so without VNNI (which sums in
// 32 bits) Q8_0 is staged as |w| with the signs of w applied to the activation bytes instead
// (Dot4Sign: pairs up to 2 * 128 * 127). Integer sums per block are exactly the reference's.
//
// Each thread stages its weight rows one tile at a time (about one byte per weight in a
// thread-local buffer: 13 KB for 16 rows of 640 Q5_0 weights, 110 KB for 16 rows of 4864 K-quant
// weights, so L1 or L2) and runs every activation row past it, kTileA rows at a time; each
// weight row is decoded once per call.

#if defined(TANDEM_TILE_DOT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TANDEM_TILE_DOT_INL_H_
#undef TANDEM_TILE_DOT_INL_H_
#else
#define TANDEM_TILE_DOT_INL_H_
#endif

#include <cstddef>
#include <cstring>
#include <type_traits>

#if defined(__aarch64__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

#include "common/tensor_type.h"
#include "hwy/highway.h"
#include "kernels/quant_blocks.h"
#include "kernels/quant_dot-inl.h"

HWY_BEFORE_NAMESPACE();
namespace tandem::kernels {
namespace HWY_NAMESPACE {
namespace td {
namespace hn = hwy::HWY_NAMESPACE;

// Asks for p's cache line in L2 (x86 prefetcht1, AArch64 prfm pldl2keep), for data streamed from
// memory well ahead of use. Not L1 (hwy::Prefetch): on Zen 4 a prefetch into L1 holds one of the
// core's few L1 miss buffers until its line arrives, and a stream of them stalled the loads they
// were meant to help (the LM head at 8 rows: 16.1 ms with prefetches into L1, 8.8 ms into L2).
HWY_INLINE void PrefetchL2(const void* p) {
  __builtin_prefetch(p, 0, 2);
}

#if HWY_TARGET != HWY_SCALAR

using DI = hn::ScalableTag<int32_t>;  // one lane per weight row of a tile
using DB = hn::Repartition<int8_t, DI>;
using DUB = hn::Repartition<uint8_t, DI>;
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

// AArch64 CPUs with the dot product extension (ARMv8.2 dotprod: Apple M1, Cortex-A76 and later)
// do the dot of four in one sdot, signed x signed: valid for every staged u below 128, i.e. all
// types but Q8_0 (u = w + 128, or |w| up to 128). Highway's NEON target assumes only ARMv8.0, so
// the instruction is written out and used only where the CPU reports it (HasSdot).
#if HWY_ARCH_ARM_A64 && HWY_TARGET == HWY_NEON
constexpr bool kSdotPath = true;
HWY_INLINE VI Dot4Sdot(VI acc, const int8_t* a, VB u) {
  const int8x16_t av = vreinterpretq_s8_s32(vdupq_n_s32(Load4(a)));
  // The assembler takes sdot only under a v8.2 .arch; the directive is undone right after so
  // that the rest of the file is assembled for the ARMv8.0 the compiler targets.
  asm(".arch armv8.2-a+dotprod\n\tsdot %0.4s, %1.16b, %2.16b\n\t.arch armv8-a"
      : "+w"(acc.raw)
      : "w"(u.raw), "w"(av));
  return acc;
}
inline bool HasSdot() {
  static const bool has = (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
  return has;
}
#else
constexpr bool kSdotPath = false;
HWY_INLINE VI Dot4Sdot(VI acc, const int8_t* a, VB u) {
  return Dot4(acc, a, u);
}
inline bool HasSdot() {
  return false;
}
#endif

// As Dot4 for Q8_0 without VNNI: u = |w|, and the activation bytes take the sign of w (sg), so
// that a pair stays within 2 * 128 * 127 < 2^15.
#if HWY_TARGET == HWY_AVX3
HWY_INLINE VI Dot4Sign(VI acc, const int8_t* a, VB u, VB sg) {
  const __m512i av = _mm512_set1_epi32(Load4(a));
  const __m512i s =
      _mm512_mask_sub_epi8(av, _mm512_movepi8_mask(sg.raw), _mm512_setzero_si512(), av);
  const __m512i pairs = _mm512_maddubs_epi16(u.raw, s);
  return VI{_mm512_add_epi32(acc.raw, _mm512_madd_epi16(pairs, _mm512_set1_epi16(1)))};
}
#elif HWY_TARGET != HWY_AVX3_DL
HWY_INLINE VI Dot4Sign(VI acc, const int8_t* a, VB u, VB sg) {
  const qd::DU8 du8;
  const qd::D8 d8;
  const qd::D16 d16;
  const auto av = qd::ApplySign(hn::BitCast(d8, hn::Set(DI(), Load4(a))), sg);
  return qd::MulAddPairs(qd::MulPairs(hn::BitCast(du8, u), av), hn::Set(d16, 1), acc);
}
#endif

// Q8_0 without VNNI: staged as |w| and sign (Dot4Sign), not as w + 128.
template <TensorType T>
constexpr bool kSignedTile = T == TensorType::Q8_0 && !kExact32;
constexpr bool HasMin(TensorType t) {
  return t == TensorType::Q4_1 || t == TensorType::Q5_1;
}

// u - w of the staged weights (see the top).
constexpr int TileOffset(TensorType t) {
  return t == TensorType::Q8_0 ? (kExact32 ? 128 : 0) : qd::OffsetOf(t);
}

// ---------------------------------------------------------------- staging

// One staged tile of nb blocks (see the layout at the top).
struct Tile32 {
  uint8_t* u;  // [nb * 8 * kTileW * 4]
  float* d;    // [nb * kTileW]  weight scale
  float* m;    // [nb * kTileW]  weight min (Q4_1/Q5_1 only)
  int8_t* sg;  // [nb * 8 * kTileW * 4]  w, for its sign (kSignedTile only)
};

// Bytes of one staged tile of nb blocks of type T: 32 per weight row and block, its scale, and
// the min and sign bytes where T has them. A multiple of 64 when nb * kTileW is a multiple of 16.
template <TensorType T>
constexpr size_t TileBytes(int64_t nb) {
  return static_cast<size_t>(nb) * kTileW *
         (32 + sizeof(float) * (HasMin(T) ? 2 : 1) + (kSignedTile<T> ? 32 : 0));
}

// A tile of type T in a buffer of TileBytes<T>(nb) bytes.
template <TensorType T>
inline Tile32 TileIn(uint8_t* buf, int64_t nb) {
  const size_t n = static_cast<size_t>(nb) * kTileW;
  float* d = reinterpret_cast<float*>(buf + 32 * n);
  float* m = HasMin(T) ? d + n : nullptr;
  int8_t* sg =
      kSignedTile<T> ? reinterpret_cast<int8_t*>(buf + (HasMin(T) ? 40 : 36) * n) : nullptr;
  return Tile32{buf, d, m, sg};
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
      alignas(32) int8_t signs[32];
      for (size_t j = 0; j < qd::kPer32; ++j) {
        auto uj = hn::BitCast(du8, v[j]);
        if constexpr (kSignedTile<T>) {
          hn::Store(v[j], qd::D8(), signs + j * qd::kN);
          uj = hn::BitCast(du8, hn::Abs(v[j]));  // |-128| wraps to 0x80 = 128 as u8
        } else if constexpr (T == TensorType::Q8_0) {
          uj = hn::Xor(uj, sign);  // w + 128
        }
        hn::Store(uj, du8, vals + j * qd::kN);
      }
      const size_t q0 = (static_cast<size_t>(b) * kGroups * kTileW + r) * 4;
      for (size_t g = 0; g < kGroups; ++g) {
        std::memcpy(tile.u + q0 + g * kTileW * 4, vals + 4 * g, 4);
        if constexpr (kSignedTile<T>) std::memcpy(tile.sg + q0 + g * kTileW * 4, signs + 4 * g, 4);
      }
      const size_t at = static_cast<size_t>(b) * kTileW + r;
      tile.d[at] = qd::HalfToFloat(wb[b].d);
      if constexpr (HasMin(T)) tile.m[at] = qd::HalfToFloat(wb[b].m);
    }
  }
}

// ---------------------------------------------------------------- activations

// The activation rows of one group of RA rows (ForActGroups: rows [r0, r0 + RA)), repacked once
// per call so that the kernel reaches every row's bytes and scales from one pointer each, at
// constant offsets: with a pointer per row the eight rows of a group ran the x86 general
// registers out, and the loop spilled and reloaded them every block.
//     q[((b * 8 + g) * RA + j) * 4 + e] = activation byte (row r0 + j, element 32 b + 4 g + e)
//     d[b * RA + j], s[b * RA + j], corr[b * RA + j]: that row's block b
// The groups of a call lie one after the other: group r0 starts at q + 32 * nb * r0 and at
// d/s/corr + nb * r0.
struct ActPanel32 {
  int8_t* q;      // [n_act * nb * 32]
  float* d;       // [n_act * nb]  block scale
  float* s;       // [n_act * nb]  Q8_1's d * sum(a)
  int32_t* corr;  // [n_act * nb]  -offset * sum(a), the accumulator's start

  ActPanel32 group(int64_t r0, int64_t nb) const {
    return {q + 32 * nb * r0, d + nb * r0, s + nb * r0, corr + nb * r0};
  }
};

// Repacks activation rows [r0, r0 + RA) of the activation type of weight type T into `panel`'s
// group r0 (see ActPanel32).
template <TensorType T, int RA>
HWY_INLINE void PackActGroup32(const uint8_t* acts, size_t act_stride, int64_t r0, int64_t nb,
                               const ActPanel32& panel) {
  const qd::D8 d8;
  const qd::DU8 du8;
  const qd::D16 d16;
  const qd::D32 d32;
  const auto ones8 = hn::Set(du8, 1);
  const auto ones16 = hn::Set(d16, 1);
  const ActPanel32 p = panel.group(r0, nb);
  for (int j = 0; j < RA; ++j) {
    const uint8_t* row = acts + (r0 + j) * act_stride;
    using Block = std::conditional_t<HasMin(T), BlockQ8_1, BlockQ8_0>;
    for (int64_t b = 0; b < nb; ++b) {
      const size_t at = static_cast<size_t>(b * RA + j);
      const Block& blk = reinterpret_cast<const Block*>(row)[b];
      const int8_t* qs = blk.qs;
      p.d[at] = qd::HalfToFloat(blk.d);
      if constexpr (HasMin(T)) p.s[at] = qd::HalfToFloat(blk.s);
      p.corr[at] = 0;
      // Q4_1/Q5_1 are staged without offset, Q8_0 staged as |w| and signs has none.
      if constexpr (!HasMin(T) && TileOffset(T) != 0) {
        qd::V32 sum = hn::Zero(d32);
        for (size_t i = 0; i < qd::kPer32; ++i)
          sum = qd::MulAddPairs(qd::MulPairs(ones8, hn::LoadU(d8, qs + i * qd::kN)), ones16, sum);
        p.corr[at] = -TileOffset(T) * hn::GetLane(hn::SumOfLanes(d32, sum));
      }
      int8_t* dst = p.q + (static_cast<size_t>(b) * kGroups * RA + j) * 4;
      for (size_t g = 0; g < kGroups; ++g) std::memcpy(dst + g * RA * 4, qs + 4 * g, 4);
    }
  }
}

// ---------------------------------------------------------------- kernel

// Stores a tile's outputs for one activation row; `stream`: with a non-temporal store where the
// address is vector-aligned (the caller then ends with hwy::FlushStream()).
HWY_INLINE void StoreOut(VFT v, float* out, bool stream) {
  if (stream && reinterpret_cast<uintptr_t>(out) % (kTileW * sizeof(float)) == 0) {
    hn::Stream(v, DFT(), out);
  } else {
    hn::StoreU(v, DFT(), out);
  }
}

// One staged tile against the RA activation rows of panel group `acts` (ActPanel32::group):
// y0[j * y_stride + i] for the tile's rows i < kTileW. Its per-row f32 order (block after block,
// one FMA each, plus the min term) is the engine's reference order: qd::DotRow32 reproduces it
// bit for bit for decode (batch invariance), and so does TileDotK's for the K-quants
// (qd::DotRowK).
//
// next: a tile to fetch into the cache meanwhile (its bytes and scales, a line per step), or null.
// stream: see StoreOut.
template <bool kMin, bool kSign, bool kSdot, int RA>
HWY_INLINE void TileDot32(const Tile32& tile, const ActPanel32& acts, int64_t nb, float* y0,
                          int64_t y_stride, const Tile32* next, bool stream) {
  const DI di;
  const DFT df;
  VFT facc[RA];
  for (int j = 0; j < RA; ++j) facc[j] = hn::Zero(df);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* ub = tile.u + static_cast<size_t>(b) * kGroups * kTileW * 4;
    const int8_t* ab = acts.q + static_cast<size_t>(b) * kGroups * RA * 4;
    const size_t as = static_cast<size_t>(b) * RA;
    VI isum[RA];
    for (int j = 0; j < RA; ++j) isum[j] = hn::Set(di, acts.corr[as + j]);
    if (next != nullptr) PrefetchL2(next->d + static_cast<size_t>(b) * kTileW);
    for (size_t g = 0; g < kGroups; ++g) {
      const size_t off = g * kTileW * 4;
      if (next != nullptr) PrefetchL2(next->u + (ub - tile.u) + off);
      const VB uv = hn::BitCast(DB(), hn::LoadU(DUB(), ub + off));
      const int8_t* ag = ab + g * RA * 4;
      if constexpr (kSign) {
#if HWY_TARGET != HWY_AVX3_DL
        const VB sv = hn::LoadU(DB(), tile.sg + (ub - tile.u) + off);
        for (int j = 0; j < RA; ++j) isum[j] = Dot4Sign(isum[j], ag + 4 * j, uv, sv);
#endif
      } else if constexpr (kSdot) {
        for (int j = 0; j < RA; ++j) isum[j] = Dot4Sdot(isum[j], ag + 4 * j, uv);
      } else {
        for (int j = 0; j < RA; ++j) isum[j] = Dot4(isum[j], ag + 4 * j, uv);
      }
    }
    const size_t at = static_cast<size_t>(b) * kTileW;
    const VFT dw = hn::LoadU(df, tile.d + at);
    for (int j = 0; j < RA; ++j) {
      facc[j] =
          hn::MulAdd(hn::ConvertTo(df, isum[j]), hn::Mul(dw, hn::Set(df, acts.d[as + j])), facc[j]);
      if constexpr (kMin)
        facc[j] = hn::MulAdd(hn::LoadU(df, tile.m + at), hn::Set(df, acts.s[as + j]), facc[j]);
    }
  }
  for (int j = 0; j < RA; ++j) StoreOut(facc[j], y0 + j * y_stride, stream);
}

// ---------------------------------------------------------------- K-quants

// The same tiles for the K-quants (Q2_K..Q6_K), from quant_dot's decoding (see StageRowK): per
// super-block, unsigned u interleaved as above, and per 16-element group an integer scale s and
// min mn, so that the row's dot is d * sum_g s_g * (u . a)_g - dmin * sum_g mn_g * bsum_g.
// Each group's dot of fours is multiplied by its scale in 32 bits (groups of 32 where both halves
// share a scale: Q4_K, Q5_K); the mins go against the Q8_K block's bsums, two groups per 32-bit
// lane through the 16-bit pair multiply-add.
struct TileK {
  uint8_t* u;    // [nbk * 64 * kTileW * 4]
  int32_t* scl;  // [nbk * 16 * kTileW]  s of each 16-element group
  int32_t* mn;   // [nbk * 8 * kTileW]   (mn of group 2p, mn of group 2p + 1) as int16 pairs
  float* d;      // [nbk * kTileW]
  float* dmin;   // [nbk * kTileW]
};

inline size_t TileBytesK(int64_t nbk) {
  return static_cast<size_t>(nbk) * kTileW * (QK_K + 24 * sizeof(int32_t) + 2 * sizeof(float));
}

inline TileK TileKIn(uint8_t* buf, int64_t nbk) {
  const size_t n = static_cast<size_t>(nbk) * kTileW;
  uint8_t* p = buf + QK_K * n;
  TileK t;
  t.u = buf;
  t.scl = reinterpret_cast<int32_t*>(p);
  t.mn = t.scl + 16 * n;
  t.d = reinterpret_cast<float*>(t.mn + 8 * n);
  t.dmin = t.d + n;
  return t;
}

// Elements per scale group of the tiled kernel.
constexpr int GroupLenK(TensorType t) {
  return t == TensorType::Q4_K || t == TensorType::Q5_K ? 32 : 16;
}

// Decodes kTileW rows into `tile`, one row at a time through `row` (one row's staging buffers).
template <TensorType T>
HWY_INLINE void StageTileK(const uint8_t* w, size_t w_stride, int64_t nbk,
                           const qd::StagedRowK& row, const TileK& tile) {
  for (size_t r = 0; r < kTileW; ++r) {
    qd::StageRowK<T>(w + r * w_stride, nbk, row);
    for (int64_t b = 0; b < nbk; ++b) {
      const uint8_t* u = row.u + QK_K * b;
      uint8_t* dst = tile.u + (static_cast<size_t>(b) * 64 * kTileW + r) * 4;
      for (size_t g = 0; g < 64; ++g) std::memcpy(dst + g * kTileW * 4, u + 4 * g, 4);
      const int16_t* mn = row.mn + 16 * b;
      for (size_t grp = 0; grp < 16; ++grp) {
        // The pair lanes of group grp all hold its scale (8 pairs of 16 elements).
        tile.scl[(static_cast<size_t>(b) * 16 + grp) * kTileW + r] =
            row.scl[QK_K / 2 * b + 8 * grp];
      }
      for (size_t p = 0; p < 8; ++p) {
        const uint32_t pair = static_cast<uint16_t>(mn[2 * p]) |
                              (static_cast<uint32_t>(static_cast<uint16_t>(mn[2 * p + 1])) << 16);
        tile.mn[(static_cast<size_t>(b) * 8 + p) * kTileW + r] = static_cast<int32_t>(pair);
      }
      tile.d[static_cast<size_t>(b) * kTileW + r] = row.d[b];
      tile.dmin[static_cast<size_t>(b) * kTileW + r] = row.dmin[b];
    }
  }
}

// acc + per lane: a.lo * b.lo + a.hi * b.hi of the int16 halves.
HWY_INLINE VI PairDot(VI acc, VI a, VI b) {
  const hn::Repartition<int16_t, DI> d16;
#if HWY_ARCH_X86
  VI unused = hn::Zero(DI());
  return hn::ReorderWidenMulAccumulate(DI(), hn::BitCast(d16, a), hn::BitCast(d16, b), acc, unused);
#else
  return qd::MulAddPairs(hn::BitCast(d16, a), hn::BitCast(d16, b), acc);
#endif
}

// The Q8_K activation rows of one group of RA rows, repacked as ActPanel32's are:
//     q[((b * 64 + e / 4) * RA + j) * 4 + e % 4] = byte e of row r0 + j's super-block b
//     d[b * RA + j]: its scale; bsums[(b * 8 + p) * RA + j]: its bsums 2p and 2p + 1 as the two
//     int16 halves of one int32 (TileDotK's pair multiply against the mins)
// Group r0 starts at q + QK_K * nbk * r0 and at d + nbk * r0, bsums + 8 * nbk * r0.
struct ActPanelK {
  int8_t* q;       // [n_act * nbk * QK_K]
  float* d;        // [n_act * nbk]
  int32_t* bsums;  // [n_act * nbk * 8]

  ActPanelK group(int64_t r0, int64_t nbk) const {
    return {q + QK_K * nbk * r0, d + nbk * r0, bsums + 8 * nbk * r0};
  }
};

// Repacks Q8_K activation rows [r0, r0 + RA) into `panel`'s group r0.
template <int RA>
HWY_INLINE void PackActGroupK(const uint8_t* acts, size_t act_stride, int64_t r0, int64_t nbk,
                              const ActPanelK& panel) {
  const ActPanelK p = panel.group(r0, nbk);
  for (int j = 0; j < RA; ++j) {
    const auto* blocks = reinterpret_cast<const BlockQ8_K*>(acts + (r0 + j) * act_stride);
    for (int64_t b = 0; b < nbk; ++b) {
      const BlockQ8_K& blk = blocks[b];
      int8_t* dst = p.q + (static_cast<size_t>(b) * 64 * RA + j) * 4;
      for (size_t g = 0; g < 64; ++g) std::memcpy(dst + g * RA * 4, blk.qs + 4 * g, 4);
      p.d[b * RA + j] = blk.d;
      for (int q = 0; q < 8; ++q) std::memcpy(p.bsums + (b * 8 + q) * RA + j, blk.bsums + 2 * q, 4);
    }
  }
}

// One staged K tile against the RA activation rows of panel group `acts` (ActPanelK::group),
// as TileDot32.
template <int kGroup, bool kSdot, int RA>
HWY_INLINE void TileDotK(const TileK& tile, const ActPanelK& acts, int64_t nbk, float* y0,
                         int64_t y_stride, bool stream) {
  const DI di;
  const DFT df;
  VFT facc[RA];
  for (int j = 0; j < RA; ++j) facc[j] = hn::Zero(df);
  for (int64_t b = 0; b < nbk; ++b) {
    const int8_t* ab = acts.q + static_cast<size_t>(b) * 64 * RA * 4;
    VI iacc[RA];
    for (int j = 0; j < RA; ++j) iacc[j] = hn::Zero(di);
    const uint8_t* ub = tile.u + static_cast<size_t>(b) * 64 * kTileW * 4;
    for (int e0 = 0; e0 < QK_K; e0 += kGroup) {
      VI isum[RA];
      for (int j = 0; j < RA; ++j) isum[j] = hn::Zero(di);
      for (int e = e0; e < e0 + kGroup; e += 4) {
        const VB uv = hn::BitCast(DB(), hn::LoadU(DUB(), ub + e * kTileW));
        const int8_t* ag = ab + e * RA;
        for (int j = 0; j < RA; ++j) {
          if constexpr (kSdot) {
            isum[j] = Dot4Sdot(isum[j], ag + 4 * j, uv);
          } else {
            isum[j] = Dot4(isum[j], ag + 4 * j, uv);
          }
        }
      }
      const VI sv = hn::LoadU(di, tile.scl + (static_cast<size_t>(b) * 16 + e0 / 16) * kTileW);
      for (int j = 0; j < RA; ++j) iacc[j] = hn::Add(iacc[j], hn::Mul(isum[j], sv));
    }
    VI imin[RA];
    for (int j = 0; j < RA; ++j) imin[j] = hn::Zero(di);
    const int32_t* bs = acts.bsums + static_cast<size_t>(b) * 8 * RA;
    for (int p = 0; p < 8; ++p) {
      const VI mv = hn::LoadU(di, tile.mn + (static_cast<size_t>(b) * 8 + p) * kTileW);
      for (int j = 0; j < RA; ++j) imin[j] = PairDot(imin[j], mv, hn::Set(di, bs[p * RA + j]));
    }
    const VFT dw = hn::LoadU(df, tile.d + static_cast<size_t>(b) * kTileW);
    const VFT dm = hn::LoadU(df, tile.dmin + static_cast<size_t>(b) * kTileW);
    const float* da = acts.d + static_cast<size_t>(b) * RA;
    for (int j = 0; j < RA; ++j) {
      facc[j] = hn::MulAdd(hn::ConvertTo(df, iacc[j]), hn::Mul(dw, hn::Set(df, da[j])), facc[j]);
      facc[j] = hn::MulAdd(hn::ConvertTo(df, imin[j]), hn::Mul(dm, hn::Set(df, -da[j])), facc[j]);
    }
  }
  for (int j = 0; j < RA; ++j) StoreOut(facc[j], y0 + j * y_stride, stream);
}

// ---------------------------------------------------------------- activation groups

// Activation rows per pass: as many accumulators as the register file holds.
constexpr int kTileA = HWY_TARGET <= HWY_AVX3 ? 8 : 4;

// Calls tile(std::integral_constant<int, RA>(), r) for the groups of rows [r, r + RA) that
// cover [0, n_act): kTileA rows at a time, then the rest as groups of 4, 2 and 1 (fewer kernel
// instances to compile than one per remainder, for at most two extra passes over the tile).
template <class Tile>
HWY_INLINE void ForActGroups(int64_t n_act, const Tile& tile) {
  int64_t r = 0;
  for (; r + kTileA <= n_act; r += kTileA) tile(std::integral_constant<int, kTileA>(), r);
  if constexpr (kTileA > 4) {
    if (r + 4 <= n_act) {
      tile(std::integral_constant<int, 4>(), r);
      r += 4;
    }
  }
  if (r + 2 <= n_act) {
    tile(std::integral_constant<int, 2>(), r);
    r += 2;
  }
  if (r < n_act) tile(std::integral_constant<int, 1>(), r);
}

#endif  // HWY_TARGET != HWY_SCALAR

}  // namespace td
}  // namespace HWY_NAMESPACE
}  // namespace tandem::kernels
HWY_AFTER_NAMESPACE();

#endif  // TANDEM_TILE_DOT_INL_H_
