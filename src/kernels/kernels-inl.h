// SIMD kernels (Highway), compiled once per target through foreach_target.h from kernels.cpp.
//
// Quantized weights: the integer dot products of quant_dot-inl.h, driven by MatmulQuant below
// (activation panels kept in L2, four activation rows per weight-row pass). f32/f16/bf16 weights:
// f32 FMA dot products over rows widened to f32.

#if defined(TANDEM_KERNELS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TANDEM_KERNELS_INL_H_
#undef TANDEM_KERNELS_INL_H_
#else
#define TANDEM_KERNELS_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "common/tensor_type.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "kernels/kernels.h"
#include "kernels/kernels_ref.h"
#include "kernels/quant_blocks.h"
#include "kernels/quant_dot-inl.h"
#include "kernels/tile_dot-inl.h"

// 1 where this target converts f32 -> f16 in hardware, rounding to nearest even as the
// reference does (x86 F16C, AArch64); Highway's emulation elsewhere does not. Redefined per target.
#ifdef TANDEM_HW_F16
#undef TANDEM_HW_F16
#endif
#if (HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2) || (HWY_ARCH_ARM_A64 && HWY_TARGET != HWY_SCALAR)
#define TANDEM_HW_F16 1
#else
#define TANDEM_HW_F16 0
#endif

HWY_BEFORE_NAMESPACE();
namespace tandem::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

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
  std::vector<float> wf, af;  // f16/bf16 rows widened to f32
#if HWY_TARGET != HWY_SCALAR
  std::vector<float> act_scales;  // f32 scales of 32-element activation blocks
  std::vector<int32_t> act_sums;  // integer sums of Q8_0 activation blocks
  std::vector<qd::ActScales32> act_rows;
  std::vector<uint8_t> stage_u;  // one decoded K-quant weight row (qd::StagedRowK)
  std::vector<float> stage_f;
  std::vector<int16_t> stage_i16;
  std::vector<uint8_t> tile;      // one staged weight tile (tile_dot-inl.h)
  std::vector<int32_t> act_corr;  // per activation block: start of the tile accumulators
  std::vector<int8_t> act_panel;  // activation bytes repacked for the tiles (td::ActPanel32)
#endif
};
inline Scratch& GetScratch() {
  static thread_local Scratch s;
  return s;
}

constexpr int kRowTile = 4;                        // f32 path: weight rows per pass
constexpr size_t kActTileBytes = size_t{1} << 20;  // f32 path: widened activation bytes per tile
// Quantized activation rows per panel of the integer path: small enough to stay in L2 next to
// the weight rows streaming past.
constexpr size_t kActPanelBytes = size_t{256} << 10;
// Decode of at most this many weight bytes per thread interleaves four rows (MatmulQuant).
constexpr int64_t kInterleaveBytes = int64_t{8} << 20;

template <class T>
T* Grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

// Quantized weight types take the integer path (the rest is f32/f16/bf16).
inline bool IsIntType(TensorType t) {
  return is_supported_weight_type(t) && traits(t).is_quantized;
}

// Staged tiles of a whole matrix, made once by PackTilesT (kernels::PackedWeights): tile t holds
// weight rows [t * tile_w, (t + 1) * tile_w) in tile_dot-inl.h's layout. Empty where the matrix
// is staged per call.
struct PackedTiles {
  const uint8_t* data = nullptr;
  size_t tile_bytes = 0;
  int64_t tile_w = 0;

  // The packed tile holding rows [i0, i0 + tile_w), or null when i0 is not where one starts.
  uint8_t* at(int64_t i0) const {
    if (data == nullptr || i0 % tile_w != 0) return nullptr;
    return const_cast<uint8_t*>(data) + static_cast<size_t>(i0 / tile_w) * tile_bytes;
  }
};

#if HWY_TARGET != HWY_SCALAR
constexpr int kTileRows = 4;  // activation rows per weight-row pass of the integer path

// dot(std::integral_constant<int, RA>, a, r, out) sets out[v * RA + j] to the dot of weight row
// i + v with activation row r + j (a[j] points at it), v < RW, j < RA; the results go to
// y[(r + j) * y_stride + i + v].
template <int RA, int RW, class Dot>
HWY_INLINE void RunTile(const Dot& dot, const uint8_t* acts, size_t act_stride, int64_t r, float* y,
                        int64_t y_stride, int64_t i) {
  const uint8_t* a[RA];
  for (int j = 0; j < RA; ++j) a[j] = acts + (r + j) * act_stride;
  float out[RW * RA];
  dot(std::integral_constant<int, RA>(), a, r, out);
  for (int v = 0; v < RW; ++v)
    for (int j = 0; j < RA; ++j) y[(r + j) * y_stride + i + v] = out[v * RA + j];
}

// Activation rows [p0, p1) against weight rows [i, i + RW), kTileRows at a time and then the 1-3
// left.
template <int RW, class Dot>
HWY_INLINE void RunTiles(const Dot& dot, const uint8_t* acts, size_t act_stride, int64_t p0,
                         int64_t p1, float* y, int64_t y_stride, int64_t i) {
  int64_t r = p0;
  for (; r + kTileRows <= p1; r += kTileRows)
    RunTile<kTileRows, RW>(dot, acts, act_stride, r, y, y_stride, i);
  switch (p1 - r) {
    case 3:
      return RunTile<3, RW>(dot, acts, act_stride, r, y, y_stride, i);
    case 2:
      return RunTile<2, RW>(dot, acts, act_stride, r, y, y_stride, i);
    case 1:
      return RunTile<1, RW>(dot, acts, act_stride, r, y, y_stride, i);
    default:
      return;
  }
}

// Calls per_tile(sdot, t) for t < n_tiles, sdot = std::true_type where the CPU does the dot of
// four in one sdot (AArch64 dotprod) and kSdotOk, else std::false_type.
template <bool kSdotOk, class PerTile>
HWY_INLINE void ForEachTile(int64_t n_tiles, const PerTile& per_tile) {
  const auto run = [&](auto sdot) HWY_ATTR {
    for (int64_t t = 0; t < n_tiles; ++t) per_tile(sdot, t);
  };
  if constexpr (td::kSdotPath && kSdotOk) {
    if (td::HasSdot()) return run(std::true_type());
  }
  run(std::false_type());
}

// Outputs larger than this are written around the caches (MatmulTiled32).
constexpr size_t kStreamBytes = size_t{16} << 20;

// Prefill of the 32-element types (tile_dot-inl.h): the first whole tiles of rows
// [row_begin, row_end), each staged once (or taken from `packed`) and run against all n_act
// activation rows. Returns the first row left for MatmulQuant's own loop (fewer than td::kTileW).
template <TensorType T>
int64_t MatmulTiled32(int64_t k, const uint8_t* w, size_t w_stride, int64_t row_begin,
                      int64_t row_end, const uint8_t* acts, size_t act_stride, int64_t n_act,
                      float* y, int64_t y_stride, const PackedTiles& packed) {
  constexpr int64_t kW = static_cast<int64_t>(td::kTileW);
  constexpr bool kMin = td::HasMin(T);
  const int64_t n_tiles = (row_end - row_begin) / kW;
  if (n_tiles == 0) return row_begin;
  const int64_t nb = k / 32;
  Scratch& scratch = GetScratch();
  float* d = Grow(scratch.act_scales, static_cast<size_t>(2 * n_act * nb));
  const td::ActPanel32 panel{Grow(scratch.act_panel, static_cast<size_t>(32 * n_act * nb)), d,
                             d + n_act * nb,
                             Grow(scratch.act_corr, static_cast<size_t>(n_act * nb))};
  td::ForActGroups(n_act, [&](auto ra, int64_t r) HWY_ATTR {
    td::PackActGroup32<T, decltype(ra)::value>(acts, act_stride, r, nb, panel);
  });
  constexpr bool kSign = td::kSignedTile<T>;
  uint8_t* const own = packed.at(row_begin) ? nullptr : Grow(scratch.tile, td::TileBytes<T>(nb));
  // An output far larger than the caches (the LM head's logits, 1 MiB per row) is written with
  // streaming stores: a normal store would first read each line from memory and then push the
  // weights out of the cache. Smaller outputs are read again soon and stay cached.
  const bool stream = !own && static_cast<size_t>(n_act * y_stride) * sizeof(float) > kStreamBytes;
  // Q8_0's staged bytes do not fit sdot's signed operand.
  ForEachTile<T != TensorType::Q8_0>(n_tiles, [&](auto sdot, int64_t t) HWY_ATTR {
    const int64_t i0 = row_begin + t * kW;
    const td::Tile32 tile = td::TileIn<T>(own ? own : packed.at(i0), nb);
    if (own) td::StageTile32<T>(w + i0 * w_stride, w_stride, nb, tile);
    // A packed matrix larger than the caches (the LM head) streams from memory, and the hardware
    // prefetchers do not run far enough ahead of a tile's long compute: the next tile is asked
    // for, a line per step, into L2, during the first pass over this one (see td::PrefetchL2).
    const bool fetch = !own && t + 1 < n_tiles;
    const td::Tile32 next = fetch ? td::TileIn<T>(packed.at(i0 + kW), nb) : tile;
    td::ForActGroups(n_act, [&](auto ra, int64_t r) HWY_ATTR {
      td::TileDot32<kMin, kSign, decltype(sdot)::value, decltype(ra)::value>(
          tile, panel.group(r, nb), nb, y + r * y_stride + i0, y_stride,
          fetch && r == 0 ? &next : nullptr, stream);
    });
  });
  if (stream) hwy::FlushStream();
  return row_begin + n_tiles * kW;
}

// The same for the K-quants.
template <TensorType T>
int64_t MatmulTiledK(int64_t k, const uint8_t* w, size_t w_stride, int64_t row_begin,
                     int64_t row_end, const uint8_t* acts, size_t act_stride, int64_t n_act,
                     float* y, int64_t y_stride, const PackedTiles& packed) {
  constexpr int64_t kW = static_cast<int64_t>(td::kTileW);
  const int64_t n_tiles = (row_end - row_begin) / kW;
  if (n_tiles == 0) return row_begin;
  const int64_t nbk = k / QK_K;
  Scratch& scratch = GetScratch();
  qd::StagedRowK row;
  row.u = Grow(scratch.stage_u, static_cast<size_t>(k));
  row.scl = Grow(scratch.stage_i16, static_cast<size_t>(k / 2 + nbk * 16));
  row.mn = row.scl + k / 2;
  row.d = Grow(scratch.stage_f, static_cast<size_t>(2 * nbk));
  row.dmin = row.d + nbk;
  uint8_t* const own = packed.at(row_begin) ? nullptr : Grow(scratch.tile, td::TileBytesK(nbk));
  const bool stream = !own && static_cast<size_t>(n_act * y_stride) * sizeof(float) > kStreamBytes;
  float* d = Grow(scratch.act_scales, static_cast<size_t>(n_act * nbk));
  int32_t* bsums = Grow(scratch.act_corr, static_cast<size_t>(8 * n_act * nbk));
  const td::ActPanelK panel{Grow(scratch.act_panel, static_cast<size_t>(QK_K * n_act * nbk)), d,
                            bsums};
  td::ForActGroups(n_act, [&](auto ra, int64_t r) HWY_ATTR {
    td::PackActGroupK<decltype(ra)::value>(acts, act_stride, r, nbk, panel);
  });
  ForEachTile<true>(n_tiles, [&](auto sdot, int64_t t) HWY_ATTR {
    const int64_t i0 = row_begin + t * kW;
    const td::TileK tile = td::TileKIn(own ? own : packed.at(i0), nbk);
    if (own) td::StageTileK<T>(w + i0 * w_stride, w_stride, nbk, row, tile);
    td::ForActGroups(n_act, [&](auto ra, int64_t r) HWY_ATTR {
      td::TileDotK<td::GroupLenK(T), decltype(sdot)::value, decltype(ra)::value>(
          tile, panel.group(r, nbk), nbk, y + r * y_stride + i0, y_stride, stream);
    });
  });
  if (stream) hwy::FlushStream();
  return row_begin + n_tiles * kW;
}

// Fewest activation rows for which packed tiles beat the row kernel (TANDEM_PACKED_MIN_ACTS
// overrides it, for measuring): two. One row is bound by memory, and the row kernel reads the
// compact original blocks (Q4_K: 0.56 bytes per weight, its tile 1.1); from two rows on the
// tiles win (the real model, 4 sequences decoding together: 110 -> 240 tok/s).
inline int64_t PackedMinActs() {
  static const int64_t n = [] {
    const char* e = std::getenv("TANDEM_PACKED_MIN_ACTS");
    return e ? std::atoll(e) : int64_t{2};
  }();
  return n;
}

// Rows [row_begin, row_end) of a quantized weight matrix against n_act quantized activation
// rows. With at least kTiledMinActs activation rows (prefill), whole tiles of weight rows take
// the tiled kernels of tile_dot-inl.h. The rest (decode, small batches, the last rows short of a
// tile) goes through qd::DotRow, which decodes each weight block in registers once per kTileRows
// activation rows; the activation rows are then taken in panels that stay in L2 while every
// weight row of the range streams past once per panel. Both paths combine the exact integer
// block sums in the same f32 order, so an output element does not depend on n_act, on the
// activation row's place among them or on the weight row's place in a tile (batch invariance).
template <TensorType T>
void MatmulQuant(int64_t k, const uint8_t* w, size_t w_stride, int64_t row_begin, int64_t row_end,
                 const uint8_t* acts, size_t act_stride, int64_t n_act, float* y, int64_t y_stride,
                 const PackedTiles& packed) {
  constexpr bool kBlock32 = qd::IsBlock32(T);
  constexpr int64_t kTiledMinActs = 8;
  const int64_t min_acts = packed.data != nullptr ? PackedMinActs() : kTiledMinActs;
  if (n_act >= min_acts) {
    if constexpr (kBlock32) {
      row_begin = MatmulTiled32<T>(k, w, w_stride, row_begin, row_end, acts, act_stride, n_act, y,
                                   y_stride, packed);
    } else {
      row_begin = MatmulTiledK<T>(k, w, w_stride, row_begin, row_end, acts, act_stride, n_act, y,
                                  y_stride, packed);
    }
    if (row_begin == row_end) return;
  }
  const int64_t panel = std::max<int64_t>(
      kTileRows, static_cast<int64_t>(kActPanelBytes / std::max<size_t>(act_stride, 1)) /
                     kTileRows * kTileRows);
  // 32-element types: the activation rows' f32 block scales, once per call.
  qd::ActScales32* scales = nullptr;
  if constexpr (kBlock32) {
    Scratch& scratch = GetScratch();
    const int64_t nb = k / 32;
    float* buf = Grow(scratch.act_scales, static_cast<size_t>(2 * n_act * nb));
    int32_t* sums = Grow(scratch.act_sums, static_cast<size_t>(n_act * nb));
    scales = Grow(scratch.act_rows, static_cast<size_t>(n_act));
    for (int64_t r = 0; r < n_act; ++r) {
      float* d = buf + 2 * r * nb;
      qd::ComputeActScales32(activation_type(T), acts + r * act_stride, nb, d, d + nb,
                             sums + r * nb);
      scales[r] = {d, d + nb, sums + r * nb};
    }
  }
  for (int64_t p0 = 0; p0 < n_act; p0 += panel) {
    const int64_t p1 = std::min(n_act, p0 + panel);
    // Four weight rows at a time (qd::RowsPerDot of them per DotRow call: more independent f32
    // chains), then single rows. Weights streamed from memory (the LM head) go one row at a
    // time, which keeps a single stream for the prefetchers. The results are the same either way.
    const bool interleave =
        (row_end - row_begin) * static_cast<int64_t>(w_stride) <= kInterleaveBytes;
    int64_t i = row_begin;
    for (; interleave && i + 4 <= row_end; i += 4) {
      const uint8_t* wr[4];
      for (int v = 0; v < 4; ++v) wr[v] = w + (i + v) * w_stride;
      const auto dot = [&](auto ra, const uint8_t* const* a, int64_t r, float* out) HWY_ATTR {
        constexpr int RA = decltype(ra)::value;
        constexpr int RW = qd::RowsPerDot(RA);
        for (int v = 0; v < 4; v += RW)
          qd::DotRow<T, RA, RW>(wr + v, a, kBlock32 ? scales + r : nullptr, k, out + v * RA);
      };
      RunTiles<4>(dot, acts, act_stride, p0, p1, y, y_stride, i);
    }
    for (; i < row_end; ++i) {
      const uint8_t* wr = w + i * w_stride;
      const auto dot = [&](auto ra, const uint8_t* const* a, int64_t r, float* out) HWY_ATTR {
        qd::DotRow<T, decltype(ra)::value, 1>(&wr, a, kBlock32 ? scales + r : nullptr, k, out);
      };
      RunTiles<1>(dot, acts, act_stride, p0, p1, y, y_stride, i);
    }
  }
}

// Calls fn(std::integral_constant<TensorType, T>()) for the quantized weight type wt; returns
// false (without calling) for the others.
template <class Fn>
HWY_INLINE bool VisitQuantType(TensorType wt, const Fn& fn) {
#define TANDEM_QUANT_CASE(TT)                                 \
  case TensorType::TT:                                        \
    fn(std::integral_constant<TensorType, TensorType::TT>()); \
    return true;
  switch (wt) {
    TANDEM_QUANT_CASE(Q4_0)
    TANDEM_QUANT_CASE(Q4_1)
    TANDEM_QUANT_CASE(Q5_0)
    TANDEM_QUANT_CASE(Q5_1)
    TANDEM_QUANT_CASE(Q8_0)
    TANDEM_QUANT_CASE(Q2_K)
    TANDEM_QUANT_CASE(Q3_K)
    TANDEM_QUANT_CASE(Q4_K)
    TANDEM_QUANT_CASE(Q5_K)
    TANDEM_QUANT_CASE(Q6_K)
    default:
      return false;
  }
#undef TANDEM_QUANT_CASE
}

// Returns false for types without an integer kernel.
bool MatmulInt(TensorType wt, int64_t k, const uint8_t* w, size_t w_stride, int64_t row_begin,
               int64_t row_end, const uint8_t* acts, size_t act_stride, int64_t n_act, float* y,
               int64_t y_stride, const PackedTiles& packed) {
  return VisitQuantType(wt, [&](auto type) HWY_ATTR {
    MatmulQuant<decltype(type)::value>(k, w, w_stride, row_begin, row_end, acts, act_stride, n_act,
                                       y, y_stride, packed);
  });
}
#else
bool MatmulInt(TensorType, int64_t, const uint8_t*, size_t, int64_t, int64_t, const uint8_t*,
               size_t, int64_t, float*, int64_t, const PackedTiles&) {
  return false;  // one-lane target: the scalar reference is the kernel
}
#endif

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
// packed_data / packed_tile_bytes: the matrix's tiles made by PackTilesT on this target, or null.
bool MatmulRowsT(TensorType wt, int64_t k, const void* w, int64_t row_begin, int64_t row_end,
                 const void* acts, size_t act_stride, int64_t n_act, float* y, int64_t y_stride,
                 const uint8_t* packed_data, size_t packed_tile_bytes) {
  const size_t w_stride = row_bytes(wt, k);
  const auto* wb = static_cast<const uint8_t*>(w);
  const auto* ab = static_cast<const uint8_t*>(acts);
  if (IsIntType(wt)) {
    PackedTiles packed;
#if HWY_TARGET != HWY_SCALAR
    packed = PackedTiles{packed_data, packed_tile_bytes, static_cast<int64_t>(td::kTileW)};
#endif
    return MatmulInt(wt, k, wb, w_stride, row_begin, row_end, ab, act_stride, n_act, y, y_stride,
                     packed);
  }
  if (wt == TensorType::F32 || wt == TensorType::F16 || wt == TensorType::BF16) {
    MatmulFloat(wt, k, wb, w_stride, row_begin, row_end, ab, act_stride, n_act, y, y_stride);
    return true;
  }
  return false;
}

// ---------------------------------------------------------------- packing

// The SIMD target this code was compiled for (a packed matrix is only valid on its own target).
int64_t TargetIdT() {
  return HWY_TARGET;
}

// Bytes of one packed tile of weight rows of length k, or 0 where this target has no tiled
// kernel for the type (nothing to pack). Its width: TileWidthT() rows.
size_t PackTileBytesT(TensorType wt, int64_t k) {
  size_t bytes = 0;
#if HWY_TARGET != HWY_SCALAR
  VisitQuantType(wt, [&](auto type) HWY_ATTR {
    constexpr TensorType T = decltype(type)::value;
    bytes = qd::IsBlock32(T) ? td::TileBytes<T>(k / 32) : td::TileBytesK(k / QK_K);
  });
#else
  (void)wt;
  (void)k;
#endif
  return bytes;
}

int64_t TileWidthT() {
#if HWY_TARGET != HWY_SCALAR
  return static_cast<int64_t>(td::kTileW);
#else
  return 0;
#endif
}

#if HWY_TARGET != HWY_SCALAR
template <TensorType T>
void PackTiles(int64_t k, const uint8_t* w, size_t w_stride, int64_t tile_begin, int64_t tile_end,
               uint8_t* out) {
  constexpr int64_t kW = static_cast<int64_t>(td::kTileW);
  if constexpr (qd::IsBlock32(T)) {
    const int64_t nb = k / 32;
    for (int64_t t = tile_begin; t < tile_end; ++t) {
      const td::Tile32 tile =
          td::TileIn<T>(out + static_cast<size_t>(t) * td::TileBytes<T>(nb), nb);
      td::StageTile32<T>(w + t * kW * w_stride, w_stride, nb, tile);
    }
  } else {
    const int64_t nbk = k / QK_K;
    std::vector<uint8_t> u(static_cast<size_t>(k));
    std::vector<int16_t> i16(static_cast<size_t>(k / 2 + nbk * 16));
    std::vector<float> f(static_cast<size_t>(2 * nbk));
    const qd::StagedRowK row{u.data(), i16.data(), i16.data() + k / 2, f.data(), f.data() + nbk};
    for (int64_t t = tile_begin; t < tile_end; ++t) {
      const td::TileK tile = td::TileKIn(out + static_cast<size_t>(t) * td::TileBytesK(nbk), nbk);
      td::StageTileK<T>(w + t * kW * w_stride, w_stride, nbk, row, tile);
    }
  }
}
#endif

// Stages tiles [tile_begin, tile_end) of W (rows of length k) into out, tile t at
// t * PackTileBytesT(wt, k). Only for types with PackTileBytesT(wt, k) > 0.
void PackTilesT(TensorType wt, int64_t k, const void* w, int64_t tile_begin, int64_t tile_end,
                uint8_t* out) {
#if HWY_TARGET != HWY_SCALAR
  VisitQuantType(wt, [&](auto type) HWY_ATTR {
    PackTiles<decltype(type)::value>(k, static_cast<const uint8_t*>(w), row_bytes(wt, k),
                                     tile_begin, tile_end, out);
  });
#else
  (void)wt, (void)k, (void)w, (void)tile_begin, (void)tile_end, (void)out;
#endif
}

// ---------------------------------------------------------------- activation quantization
//
// Same results as ref::quantize_activation_row bit for bit (tests/kernels check it on every
// target): the scale and rounding (round half to even) are computed identically, only the max
// search and the rounding run on vectors. Inputs are expected finite (a NaN would make the SIMD
// max differ from the reference's fmax).

HWY_INLINE uint16_t FloatToHalf(float f) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));  // F16C, round to even
#else
  return ref::f32_to_f16(f);
#endif
}

// Largest |x[j]| of n (a multiple of the lane count) elements.
template <class D>
HWY_INLINE float AbsMax(D d, const float* x, size_t n) {
  auto m = hn::Zero(d);
  for (size_t j = 0; j < n; j += hn::Lanes(d)) m = hn::Max(m, hn::Abs(hn::LoadU(d, x + j)));
  return hn::GetLane(hn::MaxOfLanes(d, m));
}

// Rounds x[j] * scale (round half to even) to int8 into q[n]; returns sum(q) when kSum.
template <bool kSum, bool kClampHigh, class D>
HWY_INLINE int RoundToInt8(D d, const float* x, size_t n, float scale, int8_t* q) {
  const hn::RebindToSigned<D> di;
  const hn::Rebind<int8_t, decltype(di)> d8;
  const auto vs = hn::Set(d, scale);
  auto sum = hn::Zero(di);
  for (size_t j = 0; j < n; j += hn::Lanes(d)) {
    auto v = hn::NearestInt(hn::Mul(hn::LoadU(d, x + j), vs));
    if constexpr (kClampHigh) v = hn::Min(v, hn::Set(di, 127));
    if constexpr (kSum) sum = hn::Add(sum, v);
    hn::StoreU(hn::DemoteTo(d8, v), d8, q + j);
  }
  return kSum ? hn::GetLane(hn::SumOfLanes(di, sum)) : 0;
}

// Returns false for activation types without a SIMD quantizer.
bool QuantizeActivationRowT(TensorType act, const float* x, void* dst, int64_t n) {
#if HWY_TARGET == HWY_SCALAR
  return false;
#else
  const hn::CappedTag<float, 16> d;
#if TANDEM_HW_F16
  // f16: activations of f16 weights, an f16 KV cache's rows.
  if (act == TensorType::F16) {
    const hn::Rebind<hwy::float16_t, decltype(d)> dh;
    const int64_t N = static_cast<int64_t>(hn::Lanes(d));
    auto* h = static_cast<hwy::float16_t*>(dst);
    int64_t i = 0;
    for (; i + N <= n; i += N) hn::StoreU(hn::DemoteTo(dh, hn::LoadU(d, x + i)), dh, h + i);
    for (; i < n; ++i) static_cast<uint16_t*>(dst)[i] = ref::f32_to_f16(x[i]);
    return true;
  }
#endif
  if (act == TensorType::Q8_0 || act == TensorType::Q8_1) {
    for (int64_t i = 0; i < n / 32; ++i, x += 32) {
      const float amax = AbsMax(d, x, 32);
      const float dq = amax / 127;
      const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
      if (act == TensorType::Q8_0) {
        auto* y = static_cast<BlockQ8_0*>(dst) + i;
        y->d = FloatToHalf(dq);
        RoundToInt8<false, false>(d, x, 32, id, y->qs);
      } else {
        auto* y = static_cast<BlockQ8_1*>(dst) + i;
        y->d = FloatToHalf(dq);
        const int sum = RoundToInt8<true, false>(d, x, 32, id, y->qs);
        y->s = FloatToHalf(static_cast<float>(sum) * dq);
      }
    }
    return true;
  }
  if (act == TensorType::Q8_K) {
    for (int64_t i = 0; i < n / QK_K; ++i, x += QK_K) {
      auto* y = static_cast<BlockQ8_K*>(dst) + i;
      const float amax = AbsMax(d, x, QK_K);
      if (amax == 0.0f) {
        std::memset(y, 0, sizeof(BlockQ8_K));
        continue;
      }
      // The signed value of the first element with the largest magnitude (as the reference).
      float max = 0.0f;
      for (int j = 0; j < QK_K; ++j)
        if (std::fabs(x[j]) == amax) {
          max = x[j];
          break;
        }
      const float iscale = -127.f / max;
      for (int g = 0; g < QK_K / 16; ++g)
        y->bsums[g] = static_cast<int16_t>(
            RoundToInt8<true, true>(d, x + 16 * g, 16, iscale, y->qs + 16 * g));
      y->d = 1 / iscale;
    }
    return true;
  }
  return false;
#endif
}

float DotF32T(const float* a, const float* b, int64_t n) {
  const float* w[1] = {a};
  float out;
  DotF32Multi<1>(n, w, b, &out);
  return out;
}

// ---------------------------------------------------------------- attention

// Cached key and value rows are f32, or IEEE f16 (a KV cache at half the bytes, llama.cpp's
// -ctk/-ctv f16): an f16 row is widened to f32 as it loads, and all arithmetic stays in f32.
template <class D>
HWY_INLINE hn::Vec<D> LoadKv(D d, const float* p) {
  return hn::LoadU(d, p);
}
template <class D>
HWY_INLINE hn::Vec<D> LoadKv(D d, const uint16_t* p) {
  const hn::Rebind<hwy::float16_t, D> dh;
  return hn::PromoteTo(d, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p)));
}
HWY_INLINE float KvToF32(float x) {
  return x;
}
HWY_INLINE float KvToF32(uint16_t h) {
  return fp16_to_fp32(h);
}

#if HWY_TARGET <= HWY_AVX3
// The 16 lane sums of acc[0..15] (512-bit f32 vectors), as one vector: lane 4 q + k holds the sum
// of acc[4 k + q]. Each sum takes exactly _mm512_reduce_add_ps's tree (Highway's SumOfLanes on
// this target: lanes i and i + 8, then i and i + 4, i and i + 2, i and i + 1), so the results
// are bit for bit those of 16 SumOfLanes, at 45 shuffles and adds instead of ~130.
HWY_INLINE __m512 TransposedSums16(const __m512* acc) {
  __m512 c[8], e[4];
  for (int m = 0; m < 8; ++m)  // 256-bit halves: acc[2m] in lanes 0-7, acc[2m + 1] in 8-15
    c[m] = _mm512_add_ps(_mm512_shuffle_f32x4(acc[2 * m], acc[2 * m + 1], 0x44),
                         _mm512_shuffle_f32x4(acc[2 * m], acc[2 * m + 1], 0xEE));
  for (int p = 0; p < 4; ++p)  // 128-bit quarters: quarter q holds acc[4p + q]'s four partials
    e[p] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * p], c[2 * p + 1], 0x88),
                         _mm512_shuffle_f32x4(c[2 * p], c[2 * p + 1], 0xDD));
  // Within each quarter: lanes i and i + 2, then i and i + 1.
  const __m512 g0 = _mm512_add_ps(_mm512_shuffle_ps(e[0], e[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_ps(e[0], e[1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 g1 = _mm512_add_ps(_mm512_shuffle_ps(e[2], e[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_ps(e[2], e[3], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm512_add_ps(_mm512_shuffle_ps(g0, g1, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_ps(g0, g1, _MM_SHUFFLE(3, 1, 3, 1)));
}
#endif

// RQ query rows x RK key rows: the 2x4 tile loads 6 vectors per 8 FMAs, so it runs at FMA
// throughput instead of load throughput. scores[a * sq + b * sk] = scale * dot(q[a], key b).
//
// This is the one order in which attention scores are summed (batch invariance: a query row
// gets the same scores alone or among others, decode or prefill): lane-wise FMAs over whole
// vectors of the head dimension, SumOfLanes, then the elements past the last whole vector in
// order. The result of a (query, key) pair does not depend on RQ, RK or the strides.
template <int RQ, int RK, class KT>
HWY_INLINE void ScoreTile(const float* const* q, int64_t hd, const KT* k, size_t key_stride,
                          float scale, float* scores, size_t sq, size_t sk,
                          const KT* fetch = nullptr) {
  const hn::CappedTag<float, 16> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  hn::Vec<decltype(df)> acc[RQ][RK];
  for (int a = 0; a < RQ; ++a)
    for (int b = 0; b < RK; ++b) acc[a][b] = hn::Zero(df);
  int64_t d = 0;
  for (; d + N <= hd; d += N) {
    hn::Vec<decltype(df)> qv[RQ];
    for (int a = 0; a < RQ; ++a) qv[a] = hn::LoadU(df, q[a] + d);
    for (int b = 0; b < RK; ++b) {
      // One prefetch per 64-byte line (f16 rows: every other step).
      if (fetch != nullptr && (d * sizeof(KT)) % 64 == 0)
        td::PrefetchL2(fetch + b * key_stride + d);
      const auto kv = LoadKv(df, k + b * key_stride + d);
      for (int a = 0; a < RQ; ++a) acc[a][b] = hn::MulAdd(qv[a], kv, acc[a][b]);
    }
  }
#if HWY_TARGET <= HWY_AVX3
  if constexpr (RQ == 4 && RK == 4) {
    if (d == hd) {  // no tail elements to add after the lane sums
      __m512 raw[16];
      for (int a = 0; a < 4; ++a)
        for (int b = 0; b < 4; ++b) raw[4 * a + b] = acc[a][b].raw;
      alignas(64) float sums[16];  // [key b][row a]
      _mm512_store_ps(sums, _mm512_mul_ps(_mm512_set1_ps(scale), TransposedSums16(raw)));
      for (int a = 0; a < 4; ++a)
        for (int b = 0; b < 4; ++b) scores[a * sq + b * sk] = sums[4 * b + a];
      return;
    }
  }
#endif
  for (int a = 0; a < RQ; ++a)
    for (int b = 0; b < RK; ++b) {
      float sum = hn::GetLane(hn::SumOfLanes(df, acc[a][b]));
      for (int64_t e = d; e < hd; ++e) sum += q[a][e] * KvToF32(k[b * key_stride + e]);
      scores[a * sq + b * sk] = scale * sum;
    }
}

// Keys ahead of the score tile whose rows it prefetches (into L2, td::PrefetchL2): the hardware
// prefetchers do not follow a tile's four interleaved key rows, and a decode batch's caches
// (2 KiB per key and layer at Gemma 3's head of 256) stream from memory: 7.1 -> 2.9 ms for 32
// sequences of 1,024 keys (bench_kernels BM_AttentionDecode).
constexpr int64_t kScoreFetchKeys = 8;

// RQ query rows against all n_k keys: 4-key tiles, then single keys.
template <int RQ, class KT>
HWY_INLINE void ScoreRows(const float* const* q, int64_t hd, const KT* keys, size_t key_stride,
                          int64_t n_k, float scale, float* scores, size_t sq, size_t sk) {
  int64_t j = 0;
  for (; j + 4 <= n_k; j += 4) {
    const KT* fetch =
        j + kScoreFetchKeys + 4 <= n_k ? keys + (j + kScoreFetchKeys) * key_stride : nullptr;
    ScoreTile<RQ, 4>(q, hd, keys + j * key_stride, key_stride, scale, scores + j * sk, sq, sk,
                     fetch);
  }
  for (; j < n_k; ++j)
    ScoreTile<RQ, 1>(q, hd, keys + j * key_stride, key_stride, scale, scores + j * sk, sq, sk);
}

void AttentionScoresT(const float* queries, int64_t n_q, const float* keys, size_t key_stride,
                      int64_t n_k, int64_t hd, float scale, float* scores, size_t score_stride) {
  int64_t q = 0;
  for (; q + 2 <= n_q; q += 2) {
    const float* qr[2] = {queries + q * hd, queries + (q + 1) * hd};
    ScoreRows<2>(qr, hd, keys, key_stride, n_k, scale, scores + q * score_stride, score_stride, 1);
  }
  if (q < n_q) {
    const float* qr[1] = {queries + q * hd};
    ScoreRows<1>(qr, hd, keys, key_stride, n_k, scale, scores + q * score_stride, score_stride, 1);
  }
}

// RG output rows, columns [d, d + kCols * N): the accumulators stay in registers over all keys
// (each key's value vectors are loaded once for RG rows), and every element is summed in key
// order with one FMA per key, exactly as axpy would.
template <int RG, int kCols>
HWY_INLINE void ValueTile(const float* w, size_t weight_stride, const float* values,
                          size_t value_stride, int64_t n_k, int64_t d, float* out,
                          size_t out_stride) {
  const hn::CappedTag<float, 16> df;
  const size_t N = hn::Lanes(df);
  hn::Vec<decltype(df)> acc[RG][kCols];
  for (int g = 0; g < RG; ++g)
    for (int c = 0; c < kCols; ++c) acc[g][c] = hn::Zero(df);
  for (int64_t j = 0; j < n_k; ++j) {
    const float* v = values + j * value_stride + d;
    hn::Vec<decltype(df)> vv[kCols];
    for (int c = 0; c < kCols; ++c) vv[c] = hn::LoadU(df, v + c * N);
    for (int g = 0; g < RG; ++g) {
      const auto wg = hn::Set(df, w[g * weight_stride + j]);
      for (int c = 0; c < kCols; ++c) acc[g][c] = hn::MulAdd(wg, vv[c], acc[g][c]);
    }
  }
  for (int g = 0; g < RG; ++g)
    for (int c = 0; c < kCols; ++c) hn::StoreU(acc[g][c], df, out + g * out_stride + d + c * N);
}

template <int RG>
HWY_INLINE void ValueRows(const float* w, size_t weight_stride, const float* values,
                          size_t value_stride, int64_t n_k, int64_t hdv, float* out,
                          size_t out_stride) {
  const hn::CappedTag<float, 16> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  int64_t d = 0;
  for (; d + 2 * N <= hdv; d += 2 * N)
    ValueTile<RG, 2>(w, weight_stride, values, value_stride, n_k, d, out, out_stride);
  for (; d + N <= hdv; d += N)
    ValueTile<RG, 1>(w, weight_stride, values, value_stride, n_k, d, out, out_stride);
  for (; d < hdv; ++d)
    for (int g = 0; g < RG; ++g) {
      float acc = 0.0f;
      for (int64_t j = 0; j < n_k; ++j)
        acc += w[g * weight_stride + j] * values[j * value_stride + d];
      out[g * out_stride + d] = acc;
    }
}

void AttentionValuesT(const float* weights, size_t weight_stride, int64_t n_q, const float* values,
                      size_t value_stride, int64_t n_k, int64_t hdv, float* out,
                      size_t out_stride) {
  int64_t q = 0;
  for (; q + 4 <= n_q; q += 4)
    ValueRows<4>(weights + q * weight_stride, weight_stride, values, value_stride, n_k, hdv,
                 out + q * out_stride, out_stride);
  const float* w = weights + q * weight_stride;
  float* o = out + q * out_stride;
  switch (n_q - q) {
    case 3:
      return ValueRows<3>(w, weight_stride, values, value_stride, n_k, hdv, o, out_stride);
    case 2:
      return ValueRows<2>(w, weight_stride, values, value_stride, n_k, hdv, o, out_stride);
    case 1:
      return ValueRows<1>(w, weight_stride, values, value_stride, n_k, hdv, o, out_stride);
    default:
      return;
  }
}

// ---- attention of many query rows at once (prefill): query rows along the lanes

// Scratch of AttentionRowsT, per thread: queries transposed, then scores/probabilities.
struct AttentionScratch {
  std::vector<float> st;  // [keys][L]
};

// out rows [g0, g0 + RG) of the lane group, columns [d, d + kCols * L), over keys [j0, j1):
// weights st[j * L + g]. `first`: the sums start at 0, else from what out holds (the keys before
// j0), so that every element is still summed in key order, one FMA per key.
//
// fetch_end: the next block's keys [j1, fetch_end) have their lines of these columns prefetched,
// a row per key of this block.
template <int RG, int kCols, class DF, class VT>
HWY_INLINE void ValueLanes(DF df, const float* st, int64_t g0, const VT* v, size_t value_stride,
                           int64_t j0, int64_t j1, int64_t fetch_end, bool first, int64_t d,
                           float* const* out) {
  const size_t L = hn::Lanes(df);
  hn::Vec<DF> acc[RG][kCols];
  for (int g = 0; g < RG; ++g)
    for (int c = 0; c < kCols; ++c)
      acc[g][c] = first ? hn::Zero(df) : hn::LoadU(df, out[g0 + g] + d + c * L);
  for (int64_t j = j0; j < j1; ++j) {
    const int64_t jf = j - j0 + j1;
    if (jf < fetch_end) {
      for (int c = 0; c < kCols; ++c) {
        // One prefetch per 64-byte line (f16 rows: the two columns share one).
        if (((d + c * L) * sizeof(VT)) % 64 == 0) td::PrefetchL2(v + jf * value_stride + d + c * L);
      }
    }
    hn::Vec<DF> vv[kCols];
    for (int c = 0; c < kCols; ++c) vv[c] = LoadKv(df, v + j * value_stride + d + c * L);
    for (int g = 0; g < RG; ++g) {
      const auto w = hn::Set(df, st[j * L + g0 + g]);
      for (int c = 0; c < kCols; ++c) acc[g][c] = hn::MulAdd(w, vv[c], acc[g][c]);
    }
  }
  for (int g = 0; g < RG; ++g)
    for (int c = 0; c < kCols; ++c) hn::StoreU(acc[g][c], df, out[g0 + g] + d + c * L);
}

// Keys per block of the value pass: a block's value rows (16 KiB at a head of 256 floats) stay
// in L1 while every column of the output rows goes past them, so that each value row comes from
// memory once, in order, instead of once per column chunk with a stride of a whole row.
constexpr int64_t kValueBlockKeys = 16;

// Output rows [g0, g0 + RG) of a lane group: every column, key block by key block.
template <int RG, class DF, class VT>
HWY_INLINE void ValueLaneRows(DF df, const float* st, int64_t g0, const VT* v, size_t value_stride,
                              int64_t n_j, int64_t hdv, float* const* out) {
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  if (n_j == 0) {
    for (int g = 0; g < RG; ++g) std::fill(out[g0 + g], out[g0 + g] + hdv, 0.0f);
    return;
  }
  for (int64_t j0 = 0; j0 < n_j; j0 += kValueBlockKeys) {
    const int64_t j1 = std::min(n_j, j0 + kValueBlockKeys);
    const int64_t fetch_end = std::min(n_j, j1 + kValueBlockKeys);
    const bool first = j0 == 0;
    int64_t d = 0;
    for (; d + 2 * L <= hdv; d += 2 * L)
      ValueLanes<RG, 2>(df, st, g0, v, value_stride, j0, j1, fetch_end, first, d, out);
    for (; d + L <= hdv; d += L)
      ValueLanes<RG, 1>(df, st, g0, v, value_stride, j0, j1, fetch_end, first, d, out);
    for (; d < hdv; ++d)
      for (int g = 0; g < RG; ++g) {
        float acc = first ? 0.0f : out[g0 + g][d];
        for (int64_t j = j0; j < j1; ++j)
          acc += st[j * L + g0 + g] * KvToF32(v[j * value_stride + d]);
        out[g0 + g][d] = acc;
      }
  }
}

// Query rows per score tile in AttentionRowsT: four (16 accumulators against four keys) where
// the register file has 32 vectors, else two.
#if HWY_TARGET <= HWY_AVX3 || HWY_ARCH_ARM_A64
constexpr int kScoreTileRows = 4;
#else
constexpr int kScoreTileRows = 2;
#endif

template <class KT, class VT>
void AttentionRowsKv(const float* const* q, float* const* out, int64_t n_q, const int32_t* lo,
                     const int32_t* hi, const KT* keys, size_t key_stride, const VT* values,
                     size_t value_stride, int64_t hd, int64_t hdv, float scale, float softcap) {
  const hn::CappedTag<float, 16> df;
  const hn::RebindToSigned<decltype(df)> di;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  static thread_local AttentionScratch scratch;
  for (int64_t a0 = 0; a0 < n_q; a0 += L) {
    const int64_t na = std::min(L, n_q - a0);
    // The lane group's keys: the union of its rows' ranges. Lanes past the last row repeat it.
    alignas(64) int32_t lo_l[16], hi_l[16];
    for (int64_t a = 0; a < L; ++a) {
      lo_l[a] = lo[a0 + std::min(a, na - 1)];
      hi_l[a] = hi[a0 + std::min(a, na - 1)];
    }
    const int32_t j0 = *std::min_element(lo_l, lo_l + L);
    const int32_t j1 = *std::max_element(hi_l, hi_l + L);
    const int64_t n_j = j1 - j0;
    // Scores of the lane group's rows, transposed: st[jj * L + a] for key j0 + jj. They are
    // summed as the per-token kernel sums them (ScoreTile), whatever rows share the group;
    // lanes past the last row are 0.
    float* st = Grow(scratch.st, static_cast<size_t>(n_j * L));
    const KT* k0 = keys + static_cast<size_t>(j0) * key_stride;
    int64_t a = 0;
    if constexpr (kScoreTileRows == 4) {
      for (; a + 4 <= na; a += 4)
        ScoreRows<4>(q + a0 + a, hd, k0, key_stride, n_j, scale, st + a, 1, L);
    }
    for (; a + 2 <= na; a += 2)
      ScoreRows<2>(q + a0 + a, hd, k0, key_stride, n_j, scale, st + a, 1, L);
    if (a < na) ScoreRows<1>(q + a0 + a, hd, k0, key_stride, n_j, scale, st + a, 1, L);
    if (na < L) {
      for (int64_t jj = 0; jj < n_j; ++jj) std::fill(st + jj * L + na, st + (jj + 1) * L, 0.0f);
    }
    if (softcap > 0) {
      for (int64_t e = 0; e < n_j * L; ++e) st[e] = softcap * std::tanh(st[e] / softcap);
    }
    // Softmax of every lane over its own keys; keys outside them get probability 0.
    // lo <= j < hi as lo - 1 < j < hi (Highway 1.0 has no signed >=).
    const auto vlo1 = hn::Sub(hn::Load(di, lo_l), hn::Set(di, 1)), vhi = hn::Load(di, hi_l);
    const auto visible = [&](int64_t jj) HWY_ATTR {
      const auto vj = hn::Set(di, static_cast<int32_t>(j0 + jj));
      return hn::RebindMask(df, hn::And(hn::Lt(vlo1, vj), hn::Lt(vj, vhi)));
    };
    auto vmax = hn::Set(df, -INFINITY);
    for (int64_t jj = 0; jj < n_j; ++jj)
      vmax = hn::Max(vmax, hn::IfThenElse(visible(jj), hn::LoadU(df, st + jj * L), vmax));
    auto vsum = hn::Zero(df);
    for (int64_t jj = 0; jj < n_j; ++jj) {
      const auto e =
          hn::IfThenElseZero(visible(jj), hn::Exp(df, hn::Sub(hn::LoadU(df, st + jj * L), vmax)));
      hn::StoreU(e, df, st + jj * L);
      vsum = hn::Add(vsum, e);
    }
    const auto inv = hn::Div(hn::Set(df, 1.0f), vsum);
    for (int64_t jj = 0; jj < n_j; ++jj)
      hn::StoreU(hn::Mul(hn::LoadU(df, st + jj * L), inv), df, st + jj * L);
    // Weighted values, four output rows at a time.
    const VT* v0 = values + static_cast<size_t>(j0) * value_stride;
    float* const* o = out + a0;
    int64_t g = 0;
    for (; g + 4 <= na; g += 4) ValueLaneRows<4>(df, st, g, v0, value_stride, n_j, hdv, o);
    for (; g < na; ++g) ValueLaneRows<1>(df, st, g, v0, value_stride, n_j, hdv, o);
  }
}

// The entry points per cache type (f32 or f16 keys, f32 or f16 values); the f16 rows are
// passed as their uint16_t bits.
#define TANDEM_ATTENTION_ROWS(NAME, KT, VT)                                                 \
  void NAME(const float* const* q, float* const* out, int64_t n_q, const int32_t* lo,       \
            const int32_t* hi, const void* keys, size_t key_stride, const void* values,     \
            size_t value_stride, int64_t hd, int64_t hdv, float scale, float softcap) {     \
    AttentionRowsKv(q, out, n_q, lo, hi, static_cast<const KT*>(keys), key_stride,          \
                    static_cast<const VT*>(values), value_stride, hd, hdv, scale, softcap); \
  }
TANDEM_ATTENTION_ROWS(AttentionRowsT, float, float)
TANDEM_ATTENTION_ROWS(AttentionRowsK16T, uint16_t, float)
TANDEM_ATTENTION_ROWS(AttentionRowsV16T, float, uint16_t)
TANDEM_ATTENTION_ROWS(AttentionRowsK16V16T, uint16_t, uint16_t)
#undef TANDEM_ATTENTION_ROWS

// out = gelu(gate) * up with ggml's f16 table GELU, as ref::geglu: the f32 -> f16 index and
// the f16 -> f32 result are vector conversions (exact / round to nearest even, as the
// reference's), only the table lookups are scalar. Only where f32 -> f16 is a hardware
// conversion (x86 F16C, AArch64): Highway's emulation elsewhere does not round to nearest even.
void GegluT(const float* gate, const float* up, float* out, int64_t n) {
#if TANDEM_HW_F16
  const hn::CappedTag<float, 8> df;
  const hn::Rebind<hwy::float16_t, decltype(df)> dh;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const uint16_t* table = ref::gelu_f16_table();
  const auto lo = hn::Set(df, -10.0f), hi = hn::Set(df, 10.0f);
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    alignas(32) uint16_t idx[8];
    alignas(32) uint16_t val[8];
    const auto g = hn::LoadU(df, gate + i);
    hn::StoreU(hn::DemoteTo(dh, g), dh, reinterpret_cast<hwy::float16_t*>(idx));
    for (int64_t j = 0; j < N; ++j) val[j] = table[idx[j]];
    const auto t = hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(val)));
    const auto prod = hn::Mul(hn::IfThenElse(hn::Ge(g, hi), g, t), hn::LoadU(df, up + i));
    hn::StoreU(hn::IfThenZeroElse(hn::Le(g, lo), prod), df, out + i);
  }
  if (i < n) ref::geglu(gate + i, up + i, out + i, n - i);
#else
  ref::geglu(gate, up, out, n);
#endif
}

// out = silu(gate) * up. Highway's Exp is within a few ulp of expf; the tests hold the result to
// the reference within a relative 1e-6.
void SwigluT(const float* gate, const float* up, float* out, int64_t n) {
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const auto one = hn::Set(df, 1.0f);
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    const auto g = hn::LoadU(df, gate + i);
    const auto silu = hn::Div(g, hn::Add(one, hn::Exp(df, hn::Neg(g))));
    hn::StoreU(hn::Mul(silu, hn::LoadU(df, up + i)), df, out + i);
  }
  if (i < n) ref::swiglu(gate + i, up + i, out + i, n - i);
}

// max_i x[i] (n >= 1).
float RowMax(const float* x, int64_t n) {
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  auto vmax = hn::Set(df, -INFINITY);
  int64_t i = 0;
  for (; i + N <= n; i += N) vmax = hn::Max(vmax, hn::LoadU(df, x + i));
  float max = hn::GetLane(hn::MaxOfLanes(df, vmax));
  for (; i < n; ++i) max = std::fmax(max, x[i]);
  return max;
}

// The first index holding the row's largest value: the vector max, then the first lane equal to
// it (two streaming reads instead of a compare chain through every element).
int64_t ArgmaxT(const float* x, int64_t n) {
  if (n <= 0) return 0;
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const auto vmax = hn::Set(df, RowMax(x, n));
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    const auto eq = hn::Eq(hn::LoadU(df, x + i), vmax);
    if (!hn::AllFalse(df, eq)) return i + static_cast<int64_t>(hn::FindKnownFirstTrue(df, eq));
  }
  for (; i < n; ++i)
    if (x[i] == hn::GetLane(vmax)) return i;
  return ref::argmax(x, n);  // NaNs: no element equals the max the vector pass found
}

// In-place softmax: vector max, exp and sum (f32 lanes; the reference sums in f64).
void SoftmaxT(float* x, int64_t n) {
  if (n <= 0) return;
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const float max = RowMax(x, n);
  const auto vm = hn::Set(df, max);
  auto vsum = hn::Zero(df);
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    const auto e = hn::Exp(df, hn::Sub(hn::LoadU(df, x + i), vm));
    hn::StoreU(e, df, x + i);
    vsum = hn::Add(vsum, e);
  }
  double sum = hn::GetLane(hn::SumOfLanes(df, vsum));
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  const auto inv = hn::Set(df, static_cast<float>(1.0 / sum));
  i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Mul(hn::LoadU(df, x + i), inv), df, x + i);
  for (; i < n; ++i) x[i] *= hn::GetLane(inv);
}

// Max, log Z and entropy of softmax(x): two reads, exp in f32 lanes; each lane's sums are
// folded into doubles every 4096 elements so a 262k-entry row keeps ~1e-7 relative error.
LogitStats LogitStatsT(const float* x, int64_t n) {
  if (n <= 0) return {};
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const float max = RowMax(x, n);
  const auto vm = hn::Set(df, max);
  const auto vlowest = hn::Set(df, std::numeric_limits<float>::lowest());
  ref::ExpMoments sums;
  int64_t i = 0, first_max = -1;
  constexpr int64_t kFold = 4096;
  while (i + N <= n) {
    auto vz = hn::Zero(df), vw = hn::Zero(df);
    const int64_t end = std::min(n - N + 1, i + kFold);
    for (; i < end; i += N) {
      const auto v = hn::LoadU(df, x + i);
      // The first element equal to the max is argmax's answer (ArgmaxT).
      if (first_max < 0) {
        const auto eq = hn::Eq(v, vm);
        if (!hn::AllFalse(df, eq))
          first_max = i + static_cast<int64_t>(hn::FindKnownFirstTrue(df, eq));
      }
      // -inf logits (masked tokens) become the lowest finite value: exp 0, and 0 * d stays 0.
      const auto d = hn::Max(hn::Sub(v, vm), vlowest);
      const auto e = hn::Exp(df, d);
      vz = hn::Add(vz, e);
      vw = hn::MulAdd(e, d, vw);
    }
    sums.z += hn::GetLane(hn::SumOfLanes(df, vz));
    sums.weighted += hn::GetLane(hn::SumOfLanes(df, vw));
  }
  for (int64_t j = i; j < n && first_max < 0; ++j)
    if (x[j] == max) first_max = j;
  sums.add(x + i, n - i, max);
  LogitStats st = sums.stats(max);
  st.argmax = first_max >= 0 ? first_max : ref::argmax(x, n);  // NaNs: as ArgmaxT
  return st;
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
