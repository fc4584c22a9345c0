// SIMD kernels against the scalar reference, on every SIMD target compiled in.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/kernels_ref.h"
#include "kernels/quant_blocks.h"
#include "test_util.h"

namespace tandem::kernels {
namespace {

using testing::ForEachTarget;
using testing::RandomFloats;

const std::vector<TensorType>& WeightTypes() {
  static const std::vector<TensorType> types = {
      TensorType::F32,  TensorType::F16,  TensorType::BF16, TensorType::Q4_0, TensorType::Q4_1,
      TensorType::Q5_0, TensorType::Q5_1, TensorType::Q8_0, TensorType::Q2_K, TensorType::Q3_K,
      TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K};
  return types;
}

bool IsQuant(TensorType t) {
  return traits(t).is_quantized;
}

// Byte offsets of the f16 scale fields in one block: {d..., mins...}.
struct ScaleFields {
  std::vector<int> d;     // may be negative
  std::vector<int> mins;  // non-negative
};
ScaleFields ScaleFieldsOf(TensorType t) {
  switch (t) {
    case TensorType::Q4_0:
    case TensorType::Q5_0:
    case TensorType::Q8_0:
      return {{0}, {}};
    case TensorType::Q4_1:
    case TensorType::Q5_1:
      return {{0}, {2}};
    case TensorType::Q2_K:
      return {{80}, {82}};
    case TensorType::Q3_K:
      return {{108}, {}};
    case TensorType::Q4_K:
    case TensorType::Q5_K:
      return {{0}, {2}};
    case TensorType::Q6_K:
      return {{208}, {}};
    default:
      return {{}, {}};
  }
}

void PutF16(uint8_t* p, float v) {
  const uint16_t h = f32_to_f16(v);
  std::memcpy(p, &h, 2);
}

// Random weight rows: random bytes for quant blocks with sane scales (every bit pattern of the
// quants is exercised), or random floats for F32/F16/BF16. `unit_scales` sets every scale to 1.
std::vector<uint8_t> RandomWeights(std::mt19937& rng, TensorType t, int64_t rows, int64_t k,
                                   bool unit_scales = false) {
  const size_t rb = row_bytes(t, k);
  std::vector<uint8_t> w(rb * static_cast<size_t>(rows));
  if (!IsQuant(t)) {
    const auto f = RandomFloats(rng, static_cast<size_t>(rows * k));
    ref::quantize_activation_row(t, f.data(), w.data(), rows * k);  // F32/F16/BF16 conversion
    return w;
  }
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : w) b = static_cast<uint8_t>(byte(rng));
  std::uniform_real_distribution<float> mag(0.002f, 0.05f);
  const ScaleFields sf = ScaleFieldsOf(t);
  const size_t bs = traits(t).type_size;
  for (size_t off = 0; off < w.size(); off += bs) {
    for (int o : sf.d)
      PutF16(&w[off + o], unit_scales ? 1.0f : (byte(rng) & 1 ? 1 : -1) * mag(rng));
    for (int o : sf.mins) PutF16(&w[off + o], unit_scales ? 1.0f : mag(rng));
  }
  return w;
}

// Prepared activation rows with stride `stride` bytes.
std::vector<uint8_t> RandomActs(std::mt19937& rng, TensorType wt, int64_t n_act, int64_t k,
                                size_t stride) {
  const TensorType at = activation_type(wt);
  std::vector<uint8_t> a(stride * static_cast<size_t>(n_act), 0xCD);
  for (int64_t r = 0; r < n_act; ++r) {
    const auto x = RandomFloats(rng, static_cast<size_t>(k), 2.0f);
    quantize_activation_row(at, x.data(), a.data() + r * stride, k);
  }
  return a;
}

// Activation rows with all scales 1 and small integer values, so every dot product is an
// integer that f32 represents exactly, whatever the summation order.
std::vector<uint8_t> UnitActs(std::mt19937& rng, TensorType wt, int64_t n_act, int64_t k) {
  const TensorType at = activation_type(wt);
  const size_t rb = row_bytes(at, k);
  std::vector<uint8_t> a(rb * static_cast<size_t>(n_act));
  std::uniform_int_distribution<int> q(-15, 15);
  for (int64_t r = 0; r < n_act; ++r) {
    uint8_t* row = a.data() + r * rb;
    if (at == TensorType::Q8_K) {
      auto* b = reinterpret_cast<BlockQ8_K*>(row);
      for (int64_t i = 0; i < k / QK_K; ++i) {
        b[i].d = 1.0f;
        for (int j = 0; j < QK_K; ++j) b[i].qs[j] = static_cast<int8_t>(q(rng));
        for (int g = 0; g < 16; ++g) {
          int s = 0;
          for (int l = 0; l < 16; ++l) s += b[i].qs[16 * g + l];
          b[i].bsums[g] = static_cast<int16_t>(s);
        }
      }
    } else if (at == TensorType::Q8_0) {
      auto* b = reinterpret_cast<BlockQ8_0*>(row);
      for (int64_t i = 0; i < k / 32; ++i) {
        b[i].d = f32_to_f16(1.0f);
        for (int j = 0; j < 32; ++j) b[i].qs[j] = static_cast<int8_t>(q(rng));
      }
    } else {
      auto* b = reinterpret_cast<BlockQ8_1*>(row);
      for (int64_t i = 0; i < k / 32; ++i) {
        b[i].d = f32_to_f16(1.0f);
        int s = 0;
        for (int j = 0; j < 32; ++j) s += b[i].qs[j] = static_cast<int8_t>(q(rng));
        b[i].s = f32_to_f16(static_cast<float>(s));
      }
    }
  }
  return a;
}

// sum_i |w_i * a_i| over the dequantized rows: the scale of the rounding error.
double AbsDot(TensorType wt, int64_t k, const void* w, const void* a) {
  std::vector<float> wf(static_cast<size_t>(k)), af(static_cast<size_t>(k));
  ref::dequantize_row(wt, w, wf.data(), k);
  ref::dequantize_row(activation_type(wt), a, af.data(), k);
  double s = 0;
  for (int64_t i = 0; i < k; ++i) s += std::fabs(static_cast<double>(wf[i]) * af[i]);
  return s;
}

std::string TypeName(const ::testing::TestParamInfo<TensorType>& info) {
  return std::string(traits(info.param).name);
}

class KernelsSimdVsRef : public ::testing::TestWithParam<TensorType> {};

TEST_P(KernelsSimdVsRef, MatmulRowsAndVecDot) {
  const TensorType wt = GetParam();
  std::mt19937 rng(1234 + static_cast<int>(wt));
  for (int64_t k : {256, 512, 1536}) {
    SCOPED_TRACE("k=" + std::to_string(k));
    const int64_t rows = 11, n_act = 6;
    const auto w = RandomWeights(rng, wt, rows, k);
    const size_t wrb = row_bytes(wt, k);
    const size_t act_stride = row_bytes(activation_type(wt), k) + 40;
    const auto a = RandomActs(rng, wt, n_act, k, act_stride);
    const int64_t y_stride = rows + 3;
    // Reference over all rows; SIMD over rows [1, rows) so that row_begin matters.
    std::vector<float> y_ref(static_cast<size_t>(n_act * y_stride), -7.0f);
    ref::matmul_rows(wt, k, w.data(), 0, rows, a.data(), act_stride, n_act, y_ref.data(), y_stride);
    std::vector<double> tol(static_cast<size_t>(n_act * rows));
    for (int64_t r = 0; r < n_act; ++r)
      for (int64_t i = 0; i < rows; ++i)
        tol[r * rows + i] = 1e-6 * std::sqrt(static_cast<double>(k)) *
                                AbsDot(wt, k, w.data() + i * wrb, a.data() + r * act_stride) +
                            1e-30;
    ForEachTarget([&](const char*) {
      std::vector<float> y(static_cast<size_t>(n_act * y_stride), -7.0f);
      matmul_rows(wt, k, w.data(), 1, rows, a.data(), act_stride, n_act, y.data(), y_stride);
      for (int64_t r = 0; r < n_act; ++r) {
        EXPECT_EQ(y[r * y_stride + 0], -7.0f) << "wrote outside [row_begin, row_end)";
        for (int64_t i = 1; i < rows; ++i)
          EXPECT_NEAR(y[r * y_stride + i], y_ref[r * y_stride + i], tol[r * rows + i])
              << "act " << r << " row " << i;
        for (int64_t i = rows; i < y_stride; ++i) EXPECT_EQ(y[r * y_stride + i], -7.0f);
      }
      for (int64_t i = 0; i < rows; i += 5) {
        const float d = vec_dot(wt, k, w.data() + i * wrb, a.data() + act_stride);
        EXPECT_NEAR(d, y_ref[1 * y_stride + i], tol[1 * rows + i]) << "vec_dot row " << i;
        EXPECT_NEAR(ref::vec_dot(wt, k, w.data() + i * wrb, a.data() + act_stride),
                    y_ref[1 * y_stride + i], 0.0);
      }
    });
  }
}

// Reference vec_dot equals the f64 dot of the dequantized rows (checks the reference itself).
TEST_P(KernelsSimdVsRef, ReferenceDotMatchesDequantized) {
  const TensorType wt = GetParam();
  std::mt19937 rng(99 + static_cast<int>(wt));
  const int64_t k = 512;
  const auto w = RandomWeights(rng, wt, 1, k);
  const auto a = RandomActs(rng, wt, 1, k, row_bytes(activation_type(wt), k));
  std::vector<float> wf(k), af(k);
  ref::dequantize_row(wt, w.data(), wf.data(), k);
  ref::dequantize_row(activation_type(wt), a.data(), af.data(), k);
  double exact = 0, abs = 0;
  for (int64_t i = 0; i < k; ++i) {
    exact += static_cast<double>(wf[i]) * af[i];
    abs += std::fabs(static_cast<double>(wf[i]) * af[i]);
  }
  // Q4_1/Q5_1 use the f16-rounded s = d * sum(q) of q8_1, which dequantization does not see.
  const double tol = (wt == TensorType::Q4_1 || wt == TensorType::Q5_1) ? 2e-3 * abs : 1e-5 * abs;
  EXPECT_NEAR(ref::vec_dot(wt, k, w.data(), a.data()), exact, tol);
}

TEST_P(KernelsSimdVsRef, ExactWithUnitScales) {
  const TensorType wt = GetParam();
  if (!IsQuant(wt)) GTEST_SKIP() << "integer path only";
  std::mt19937 rng(7 + static_cast<int>(wt));
  const int64_t k = 1024, rows = 9, n_act = 5;
  const auto w = RandomWeights(rng, wt, rows, k, /*unit_scales=*/true);
  const auto a = UnitActs(rng, wt, n_act, k);
  const size_t act_stride = row_bytes(activation_type(wt), k);
  std::vector<float> y_ref(static_cast<size_t>(n_act * rows));
  ref::matmul_rows(wt, k, w.data(), 0, rows, a.data(), act_stride, n_act, y_ref.data(), rows);
  for (float v : y_ref) ASSERT_EQ(v, std::nearbyint(v));
  ForEachTarget([&](const char*) {
    std::vector<float> y(static_cast<size_t>(n_act * rows));
    matmul_rows(wt, k, w.data(), 0, rows, a.data(), act_stride, n_act, y.data(), rows);
    for (size_t i = 0; i < y.size(); ++i) EXPECT_EQ(y[i], y_ref[i]) << i;
  });
}

// Many activation rows (more than one activation tile for large k) and a row count that is not
// a multiple of the 4-row weight tile.
TEST_P(KernelsSimdVsRef, LargeTiles) {
  const TensorType wt = GetParam();
  std::mt19937 rng(31 + static_cast<int>(wt));
  const int64_t k = 4096, rows = 7, n_act = 70;
  const auto w = RandomWeights(rng, wt, rows, k);
  const size_t act_stride = row_bytes(activation_type(wt), k);
  const auto a = RandomActs(rng, wt, n_act, k, act_stride);
  std::vector<float> y_ref(static_cast<size_t>(n_act * rows));
  ref::matmul_rows(wt, k, w.data(), 0, rows, a.data(), act_stride, n_act, y_ref.data(), rows);
  std::vector<float> y(y_ref.size());
  matmul_rows(wt, k, w.data(), 0, rows, a.data(), act_stride, n_act, y.data(), rows);
  const size_t wrb = row_bytes(wt, k);
  for (int64_t r = 0; r < n_act; ++r)
    for (int64_t i = 0; i < rows; ++i)
      EXPECT_NEAR(y[r * rows + i], y_ref[r * rows + i],
                  1e-6 * 64 * AbsDot(wt, k, w.data() + i * wrb, a.data() + r * act_stride))
          << r << " " << i;
}

// Every batch shape of the integer path: 1-3 activation rows (tiles of 1-3 rows, weights decoded
// per tile), 4-7 (one 4-row tile plus a remainder), 8 and more (the tiled prefill kernels where
// the 10 rows make a weight-row tile, i.e. below AVX-512); a row_begin > 0 and rows that end
// mid-way.
TEST_P(KernelsSimdVsRef, BatchShapes) {
  const TensorType wt = GetParam();
  std::mt19937 rng(4321 + static_cast<int>(wt));
  for (int64_t k : {256, 1536}) {
    for (int64_t n_act : {1, 2, 3, 4, 5, 7, 8, 13}) {
      SCOPED_TRACE("k=" + std::to_string(k) + " n_act=" + std::to_string(n_act));
      const int64_t rows = 11;
      const auto w = RandomWeights(rng, wt, rows, k);
      const size_t wrb = row_bytes(wt, k);
      const size_t act_stride = row_bytes(activation_type(wt), k) + 8;
      const auto a = RandomActs(rng, wt, n_act, k, act_stride);
      const int64_t y_stride = rows + 1;
      std::vector<float> y_ref(static_cast<size_t>(n_act * y_stride), -7.0f);
      ref::matmul_rows(wt, k, w.data(), 0, rows, a.data(), act_stride, n_act, y_ref.data(),
                       y_stride);
      ForEachTarget([&](const char*) {
        std::vector<float> y(static_cast<size_t>(n_act * y_stride), -7.0f);
        matmul_rows(wt, k, w.data(), 1, rows, a.data(), act_stride, n_act, y.data(), y_stride);
        for (int64_t r = 0; r < n_act; ++r) {
          EXPECT_EQ(y[r * y_stride], -7.0f);
          EXPECT_EQ(y[r * y_stride + rows], -7.0f);
          for (int64_t i = 1; i < rows; ++i) {
            const double tol = 1e-6 * std::sqrt(static_cast<double>(k)) *
                                   AbsDot(wt, k, w.data() + i * wrb, a.data() + r * act_stride) +
                               1e-30;
            EXPECT_NEAR(y[r * y_stride + i], y_ref[r * y_stride + i], tol)
                << "act " << r << " row " << i;
          }
        }
      });
      if (!IsQuant(wt)) continue;
      // Unit scales: the integer sums must match exactly.
      const auto wu = RandomWeights(rng, wt, rows, k, /*unit_scales=*/true);
      const auto au = UnitActs(rng, wt, n_act, k);
      const size_t us = row_bytes(activation_type(wt), k);
      std::vector<float> u_ref(static_cast<size_t>(n_act * rows));
      ref::matmul_rows(wt, k, wu.data(), 0, rows, au.data(), us, n_act, u_ref.data(), rows);
      ForEachTarget([&](const char*) {
        std::vector<float> u(u_ref.size());
        matmul_rows(wt, k, wu.data(), 0, rows, au.data(), us, n_act, u.data(), rows);
        for (size_t i = 0; i < u.size(); ++i) EXPECT_EQ(u[i], u_ref[i]) << i;
      });
    }
  }
}

// 32-element block types run four blocks at a time plus single blocks: row lengths of 1 to 7
// blocks cover every remainder, with exact integer sums under unit scales.
TEST_P(KernelsSimdVsRef, ShortRowsBlockRemainders) {
  const TensorType wt = GetParam();
  if (!IsQuant(wt) || traits(wt).block_size != 32) GTEST_SKIP() << "32-element block types";
  std::mt19937 rng(555 + static_cast<int>(wt));
  for (int64_t k = 32; k <= 224; k += 32) {
    for (int64_t n_act : {1, 3, 4, 6, 11}) {
      SCOPED_TRACE("k=" + std::to_string(k) + " n_act=" + std::to_string(n_act));
      const int64_t rows = 5;
      const auto w = RandomWeights(rng, wt, rows, k, /*unit_scales=*/true);
      const auto a = UnitActs(rng, wt, n_act, k);
      const size_t as = row_bytes(activation_type(wt), k);
      std::vector<float> y_ref(static_cast<size_t>(n_act * rows));
      ref::matmul_rows(wt, k, w.data(), 0, rows, a.data(), as, n_act, y_ref.data(), rows);
      const auto wr = RandomWeights(rng, wt, rows, k);
      const auto ar = RandomActs(rng, wt, n_act, k, as);
      std::vector<float> z_ref(static_cast<size_t>(n_act * rows));
      ref::matmul_rows(wt, k, wr.data(), 0, rows, ar.data(), as, n_act, z_ref.data(), rows);
      const size_t wrb = row_bytes(wt, k);
      ForEachTarget([&](const char*) {
        std::vector<float> y(y_ref.size());
        matmul_rows(wt, k, w.data(), 0, rows, a.data(), as, n_act, y.data(), rows);
        for (size_t i = 0; i < y.size(); ++i) EXPECT_EQ(y[i], y_ref[i]) << i;
        std::vector<float> z(z_ref.size());
        matmul_rows(wt, k, wr.data(), 0, rows, ar.data(), as, n_act, z.data(), rows);
        for (int64_t r = 0; r < n_act; ++r)
          for (int64_t i = 0; i < rows; ++i)
            EXPECT_NEAR(z[r * rows + i], z_ref[r * rows + i],
                        1e-5 * AbsDot(wt, k, wr.data() + i * wrb, ar.data() + r * as) + 1e-30);
      });
    }
  }
}

// Prefill shapes across several weight-row tiles of the tiled path (tile_dot-inl.h: 4, 8 or 16
// rows a tile) with a partial tile left over, a row_begin off the tile grid, activation row
// counts around its groups of 4 or 8, and a y stride wider than the rows.
TEST_P(KernelsSimdVsRef, PrefillAcrossRowTiles) {
  const TensorType wt = GetParam();
  if (!IsQuant(wt)) GTEST_SKIP() << "quantized types";
  std::mt19937 rng(777 + static_cast<int>(wt));
  const int64_t bs = traits(wt).block_size;
  const int64_t rows = 40, row_begin = 3, y_stride = rows + 5;
  for (int64_t k : {bs, 3 * bs, bs == 32 ? int64_t{640} : 2 * bs}) {
    for (int64_t n_act : {8, 9, 12, 17, 23}) {
      SCOPED_TRACE("k=" + std::to_string(k) + " n_act=" + std::to_string(n_act));
      const size_t as = row_bytes(activation_type(wt), k);
      const size_t wrb = row_bytes(wt, k);
      const auto wu = RandomWeights(rng, wt, rows, k, /*unit_scales=*/true);
      const auto au = UnitActs(rng, wt, n_act, k);
      const auto wr = RandomWeights(rng, wt, rows, k);
      const auto ar = RandomActs(rng, wt, n_act, k, as);
      std::vector<float> u_ref(static_cast<size_t>(n_act * y_stride), -7.0f), z_ref(u_ref);
      ref::matmul_rows(wt, k, wu.data(), row_begin, rows, au.data(), as, n_act, u_ref.data(),
                       y_stride);
      ref::matmul_rows(wt, k, wr.data(), row_begin, rows, ar.data(), as, n_act, z_ref.data(),
                       y_stride);
      ForEachTarget([&](const char*) {
        std::vector<float> u(u_ref.size(), -7.0f), z(z_ref.size(), -7.0f);
        matmul_rows(wt, k, wu.data(), row_begin, rows, au.data(), as, n_act, u.data(), y_stride);
        matmul_rows(wt, k, wr.data(), row_begin, rows, ar.data(), as, n_act, z.data(), y_stride);
        for (int64_t r = 0; r < n_act; ++r) {
          for (int64_t i = 0; i < y_stride; ++i) {
            const size_t at = static_cast<size_t>(r * y_stride + i);
            EXPECT_EQ(u[at], u_ref[at]) << "unit scales: act " << r << " row " << i;
            if (i < row_begin || i >= rows) {
              EXPECT_EQ(z[at], -7.0f) << "written outside the rows: act " << r << " row " << i;
              continue;
            }
            EXPECT_NEAR(z[at], z_ref[at],
                        1e-5 * AbsDot(wt, k, wr.data() + i * wrb, ar.data() + r * as) + 1e-30)
                << "act " << r << " row " << i;
          }
        }
      });
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, KernelsSimdVsRef, ::testing::ValuesIn(WeightTypes()), TypeName);

TEST(KernelsSimdF32, DotAxpyRmsNorm) {
  std::mt19937 rng(5);
  for (int64_t n : {1, 7, 64, 257, 1000, 4096}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const auto a = RandomFloats(rng, n), b = RandomFloats(rng, n), w = RandomFloats(rng, n);
    double abs = 0;
    for (int64_t i = 0; i < n; ++i) abs += std::fabs(static_cast<double>(a[i]) * b[i]);
    const float d_ref = ref::dot_f32(a.data(), b.data(), n);
    std::vector<float> y_ref = b;
    ref::axpy(0.37f, a.data(), y_ref.data(), n);
    std::vector<float> rn_ref(n);
    ref::rms_norm(a.data(), w.data(), rn_ref.data(), n, 1e-6f);
    ForEachTarget([&](const char*) {
      EXPECT_NEAR(dot_f32(a.data(), b.data(), n), d_ref, 1e-6 * std::sqrt(double(n)) * abs);
      std::vector<float> y = b;
      axpy(0.37f, a.data(), y.data(), n);
      for (int64_t i = 0; i < n; ++i)
        EXPECT_NEAR(y[i], y_ref[i], 1e-6f * (1 + std::fabs(y_ref[i])));
      std::vector<float> rn(n);
      rms_norm(a.data(), w.data(), rn.data(), n, 1e-6f);
      // The f64 sum of f32 squares only changes order: the scale is (almost always) identical.
      for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(rn[i], rn_ref[i], 1e-6f * std::fabs(rn_ref[i]));
    });
  }
}

// The SIMD activation quantizers reproduce the reference byte for byte on every target: random
// rows at several magnitudes, an all-zero block, a block whose largest magnitude appears twice
// with opposite signs (Q8_K takes the first), and values that land exactly on .5 steps.
TEST(KernelsSimdQuantize, ActivationRowsMatchReference) {
  std::mt19937 rng(77);
  const int64_t n = 1024;
  for (TensorType at : {TensorType::Q8_0, TensorType::Q8_1, TensorType::Q8_K}) {
    SCOPED_TRACE(traits(at).name);
    for (float scale : {1e-3f, 1.0f, 37.0f}) {
      auto x = RandomFloats(rng, static_cast<size_t>(n), scale);
      for (int j = 256; j < 512; ++j) x[j] = 0.0f;
      x[600] = -2 * scale;
      x[700] = 2 * scale;
      for (int j = 768; j < 800; ++j) x[j] = 0.5f * static_cast<float>(j - 784);  // amax 8
      const size_t rb = row_bytes(at, n);
      std::vector<uint8_t> ref_out(rb);
      ref::quantize_activation_row(at, x.data(), ref_out.data(), n);
      ForEachTarget([&](const char* target) {
        std::vector<uint8_t> out(rb, 0xAB);
        quantize_activation_row(at, x.data(), out.data(), n);
        EXPECT_EQ(std::memcmp(out.data(), ref_out.data(), rb), 0) << target;
      });
    }
  }
}

// f32 -> f16 rows (f16 weights' activations, an f16 KV cache) byte for byte as the reference on
// every target: ties to even, overflow to infinity, subnormals, signed zero, NaN, and a tail
// shorter than a vector.
TEST(KernelsSimdQuantize, F16RowsMatchReference) {
  std::mt19937 rng(78);
  const int64_t n = 1027;
  auto x = RandomFloats(rng, static_cast<size_t>(n), 3.0f);
  const float specials[] = {1.0f + 1.0f / 2048,
                            1.0f + 3.0f / 2048,
                            65504.0f,
                            65520.0f,
                            70000.0f,
                            -1e9f,
                            1e-6f,
                            -3e-8f,
                            -0.0f,
                            std::nanf(""),
                            5.96e-8f,
                            2.98e-8f};
  for (size_t i = 0; i < std::size(specials); ++i) {
    x[3 + i] = specials[i];
    x[static_cast<size_t>(n) - 1 - i] = specials[i];
  }
  std::vector<uint16_t> want(static_cast<size_t>(n));
  ref::quantize_activation_row(TensorType::F16, x.data(), want.data(), n);
  ForEachTarget([&](const char* target) {
    std::vector<uint16_t> got(static_cast<size_t>(n), 0xABCD);
    quantize_activation_row(TensorType::F16, x.data(), got.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      if (std::isnan(x[static_cast<size_t>(i)])) {
        EXPECT_TRUE(std::isnan(f16_to_f32(got[static_cast<size_t>(i)]))) << target << " " << i;
      } else {
        EXPECT_EQ(got[static_cast<size_t>(i)], want[static_cast<size_t>(i)])
            << target << " " << i << " " << x[static_cast<size_t>(i)];
      }
    }
  });
}

// Attention kernels against the reference, with query/key counts and head sizes that leave
// remainders in every tile dimension and strides wider than the rows.
TEST(KernelsSimdAttention, ScoresAndValuesMatchReference) {
  std::mt19937 rng(91);
  for (int64_t hd : {64, 256, 37}) {
    for (int64_t n_q : {1, 4, 7}) {
      for (int64_t n_k : {1, 5, 130}) {
        SCOPED_TRACE("hd=" + std::to_string(hd) + " n_q=" + std::to_string(n_q) +
                     " n_k=" + std::to_string(n_k));
        const size_t kstride = static_cast<size_t>(hd) + 3, sstride = static_cast<size_t>(n_k) + 2;
        const auto q = RandomFloats(rng, static_cast<size_t>(n_q * hd));
        const auto keys = RandomFloats(rng, static_cast<size_t>(n_k) * kstride);
        std::vector<float> s_ref(static_cast<size_t>(n_q) * sstride, -9.0f);
        ref::attention_scores(q.data(), n_q, keys.data(), kstride, n_k, hd, 0.125f, s_ref.data(),
                              sstride);
        const auto w = RandomFloats(rng, static_cast<size_t>(n_q) * sstride);
        const size_t ostride = static_cast<size_t>(hd) + 1;
        std::vector<float> o_ref(static_cast<size_t>(n_q) * ostride, -9.0f);
        ref::attention_values(w.data(), sstride, n_q, keys.data(), kstride, n_k, hd, o_ref.data(),
                              ostride);
        ForEachTarget([&](const char* target) {
          std::vector<float> sc(s_ref.size(), -9.0f);
          attention_scores(q.data(), n_q, keys.data(), kstride, n_k, hd, 0.125f, sc.data(),
                           sstride);
          for (size_t i = 0; i < sc.size(); ++i)
            EXPECT_NEAR(sc[i], s_ref[i], 1e-5 * std::sqrt(static_cast<double>(hd)))
                << target << " " << i;
          std::vector<float> o(o_ref.size(), -9.0f);
          attention_values(w.data(), sstride, n_q, keys.data(), kstride, n_k, hd, o.data(),
                           ostride);
          for (size_t i = 0; i < o.size(); ++i)
            EXPECT_NEAR(o[i], o_ref[i], 1e-5 * std::sqrt(static_cast<double>(n_k)))
                << target << " " << i;
        });
      }
    }
  }
}

// Prefill attention over many query rows: causal and sliding-window key ranges (rows of one
// token share a range, as the query heads of one KV head do), lane groups cut mid-token, a last
// group shorter than the vector, head sizes that are not a multiple of it, and the softcap.
TEST(KernelsSimdAttention, RowsMatchReference) {
  std::mt19937 rng(93);
  for (int64_t hd : {64, 256, 20}) {
    for (int group : {1, 4, 7}) {
      for (int window : {0, 5}) {
        for (float softcap : {0.0f, 20.0f}) {
          const int tokens = 5, pos0 = 9;  // tokens at positions 9..13
          const int64_t n_q = tokens * group, n_k = pos0 + tokens;
          const int64_t hdv = hd + (hd == 20 ? 4 : 0);
          SCOPED_TRACE("hd=" + std::to_string(hd) + " group=" + std::to_string(group) +
                       " window=" + std::to_string(window) + " softcap=" + std::to_string(softcap));
          const size_t kstride = static_cast<size_t>(hd) + 3,
                       vstride = static_cast<size_t>(hdv) + 1;
          const auto q = RandomFloats(rng, static_cast<size_t>(n_q * hd), 2.0f);
          const auto keys = RandomFloats(rng, static_cast<size_t>(n_k) * kstride);
          const auto vals = RandomFloats(rng, static_cast<size_t>(n_k) * vstride);
          std::vector<const float*> qr;
          std::vector<int32_t> lo, hi;
          for (int t = 0; t < tokens; ++t)
            for (int g = 0; g < group; ++g) {
              const int pos = pos0 + t;
              qr.push_back(q.data() + (t * group + g) * hd);
              lo.push_back(window > 0 ? std::max(0, pos - window + 1) : 0);
              hi.push_back(pos + 1);
            }
          const size_t ostride = static_cast<size_t>(hdv) + 2;
          std::vector<float> o_ref(static_cast<size_t>(n_q) * ostride, -9.0f);
          std::vector<float*> orr;
          for (int64_t a = 0; a < n_q; ++a) orr.push_back(o_ref.data() + a * ostride);
          ref::attention_rows(qr.data(), orr.data(), n_q, lo.data(), hi.data(), keys.data(),
                              kstride, vals.data(), vstride, hd, hdv, 0.1f, softcap);
          ForEachTarget([&](const char* target) {
            std::vector<float> o(o_ref.size(), -9.0f);
            std::vector<float*> orows;
            for (int64_t a = 0; a < n_q; ++a) orows.push_back(o.data() + a * ostride);
            attention_rows(qr.data(), orows.data(), n_q, lo.data(), hi.data(), keys.data(), kstride,
                           vals.data(), vstride, hd, hdv, 0.1f, softcap);
            for (size_t i = 0; i < o.size(); ++i)
              EXPECT_NEAR(o[i], o_ref[i], 2e-5) << target << " " << i;
          });
        }
      }
    }
  }
  const float x = 0;
  const float* qp = &x;
  float y = 0;
  float* op = &y;
  const int32_t lo = 3, hi = 3;
  EXPECT_THROW(attention_rows(&qp, &op, 1, &lo, &hi, &x, 1, &x, 1, 1, 1, 1.0f, 0.0f),
               std::invalid_argument);
  // Only f32 and f16 caches exist.
  const int32_t lo0 = 0, hi1 = 1;
  EXPECT_THROW(attention_rows(&qp, &op, 1, &lo0, &hi1, TensorType::BF16, &x, 1, TensorType::F32, &x,
                              1, 1, 1, 1.0f, 0.0f),
               std::invalid_argument);
}

// attention_rows over an f16 cache (keys, values or both): on every target, bit for bit the f32
// kernel over the same rows widened to f32, and within rounding of the reference.
TEST(KernelsSimdAttention, F16CacheRowsEqualF32KernelOnWidenedRows) {
  std::mt19937 rng(94);
  const std::pair<TensorType, TensorType> types[] = {{TensorType::F16, TensorType::F16},
                                                     {TensorType::F16, TensorType::F32},
                                                     {TensorType::F32, TensorType::F16}};
  for (const auto& [kt, vt] : types) {
    for (int64_t hd : {64, 256, 20}) {
      for (int group : {1, 4}) {
        for (int window : {0, 5}) {
          const int tokens = 5, pos0 = 9;
          const int64_t n_q = tokens * group, n_k = pos0 + tokens, hdv = hd;
          SCOPED_TRACE(std::string(traits(kt).name) + "/" + std::string(traits(vt).name) +
                       " hd=" + std::to_string(hd) + " group=" + std::to_string(group) +
                       " window=" + std::to_string(window));
          const size_t kstride = static_cast<size_t>(hd) + 3, vstride = static_cast<size_t>(hdv);
          const auto q = RandomFloats(rng, static_cast<size_t>(n_q * hd), 2.0f);
          const auto keys = testing::ToCacheRows(RandomFloats(rng, n_k * kstride), kt);
          const auto vals = testing::ToCacheRows(RandomFloats(rng, n_k * vstride), vt);
          std::vector<const float*> qr;
          std::vector<int32_t> lo, hi;
          for (int t = 0; t < tokens; ++t)
            for (int g = 0; g < group; ++g) {
              qr.push_back(q.data() + (t * group + g) * hd);
              lo.push_back(window > 0 ? std::max(0, pos0 + t - window + 1) : 0);
              hi.push_back(pos0 + t + 1);
            }
          const auto rows = [&](std::vector<float>& o) {
            o.assign(static_cast<size_t>(n_q * hdv), -9.0f);
            std::vector<float*> r;
            for (int64_t a = 0; a < n_q; ++a) r.push_back(o.data() + a * hdv);
            return r;
          };
          std::vector<float> o_ref;
          auto orr = rows(o_ref);
          ref::attention_rows(qr.data(), orr.data(), n_q, lo.data(), hi.data(), kt, keys.data(),
                              kstride, vt, vals.data(), vstride, hd, hdv, 0.1f, 0.0f);
          ForEachTarget([&](const char* target) {
            std::vector<float> o, o_wide;
            auto orows = rows(o), owide = rows(o_wide);
            attention_rows(qr.data(), orows.data(), n_q, lo.data(), hi.data(), kt, keys.data(),
                           kstride, vt, vals.data(), vstride, hd, hdv, 0.1f, 0.0f);
            attention_rows(qr.data(), owide.data(), n_q, lo.data(), hi.data(), keys.f32.data(),
                           kstride, vals.f32.data(), vstride, hd, hdv, 0.1f, 0.0f);
            ASSERT_EQ(std::memcmp(o.data(), o_wide.data(), o.size() * sizeof(float)), 0) << target;
            for (size_t i = 0; i < o.size(); ++i)
              EXPECT_NEAR(o[i], o_ref[i], 2e-5) << target << " " << i;
          });
        }
      }
    }
  }
}

// The SIMD GELU-table gate matches the reference bit for bit on every target, over the whole
// range (both clamps, values on f16 rounding midpoints, a tail shorter than a vector).
TEST(KernelsSimdGeglu, MatchesReferenceExactly) {
  std::mt19937 rng(17);
  const int64_t n = 4099;
  auto gate = RandomFloats(rng, static_cast<size_t>(n), 14.0f);
  const auto up = RandomFloats(rng, static_cast<size_t>(n), 3.0f);
  gate[0] = -10.0f;
  gate[1] = 10.0f;
  gate[2] = 1.0f + 1.0f / 2048;  // halfway between two f16 values: ties to even
  gate[3] = 1.0f + 3.0f / 2048;
  std::vector<float> ref_out(static_cast<size_t>(n));
  ref::geglu(gate.data(), up.data(), ref_out.data(), n);
  ForEachTarget([&](const char* target) {
    std::vector<float> out(static_cast<size_t>(n), -1.0f);
    geglu(gate.data(), up.data(), out.data(), n);
    EXPECT_EQ(std::memcmp(out.data(), ref_out.data(), out.size() * 4), 0) << target;
  });
}

// Max, log-normaliser and entropy of a logits row against the reference on every target:
// vocabulary-sized rows (the lane sums are folded into doubles), tails, and a masked (-inf) logit.
TEST(KernelsSimdF32, LogitStatsMatchReference) {
  std::mt19937 rng(29);
  for (int64_t n : {1, 7, 257, 4864, 262144}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    auto x = RandomFloats(rng, static_cast<size_t>(n), 16.0f);
    if (n > 1) x[static_cast<size_t>(n / 2)] = -INFINITY;
    const LogitStats want = ref::logit_stats(x.data(), n);
    ASSERT_TRUE(std::isfinite(want.log_z));
    ASSERT_TRUE(std::isfinite(want.entropy));
    ForEachTarget([&](const char* target) {
      const LogitStats got = logit_stats(x.data(), n);
      EXPECT_EQ(got.max, want.max) << target;
      EXPECT_EQ(got.argmax, want.argmax) << target;
      EXPECT_EQ(got.argmax, argmax(x.data(), n)) << target;
      EXPECT_NEAR(got.log_z, want.log_z, 1e-5 * std::fabs(want.log_z) + 1e-6) << target;
      EXPECT_NEAR(got.entropy, want.entropy, 1e-5 * want.entropy + 1e-6) << target;
    });
  }
  // One dominant logit: entropy ~0 and log Z = the max.
  std::vector<float> peaked(1000, -50.0f);
  peaked[3] = 50.0f;
  const LogitStats p = logit_stats(peaked.data(), 1000);
  EXPECT_NEAR(p.log_z, 50.0, 1e-6);
  EXPECT_NEAR(p.entropy, 0.0, 1e-6);
  // Uniform: entropy = log n.
  std::vector<float> flat(4096, 0.25f);
  EXPECT_NEAR(logit_stats(flat.data(), 4096).entropy, std::log(4096.0), 1e-5);
}

// argmax (and logit_stats' argmax): the first largest, as the scalar reference, with ties (the
// first wins), the largest in the tail, -inf and all-equal rows.
TEST(KernelsSimdF32, ArgmaxMatchesReference) {
  std::mt19937 rng(31);
  for (int64_t n : {1, 2, 15, 17, 257, 4864, 262144}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    auto x = RandomFloats(rng, static_cast<size_t>(n), 8.0f);
    std::vector<std::vector<float>> rows = {x};
    auto tie = x;  // the max twice: at n/3 and 2n/3
    tie[static_cast<size_t>(n / 3)] = tie[static_cast<size_t>(2 * n / 3)] = 100.0f;
    rows.push_back(tie);
    auto tail = x;
    tail.back() = 100.0f;
    rows.push_back(tail);
    rows.push_back(std::vector<float>(static_cast<size_t>(n), -INFINITY));
    rows.push_back(std::vector<float>(static_cast<size_t>(n), 0.5f));
    for (const auto& row : rows) {
      const int64_t want = ref::argmax(row.data(), n);
      ForEachTarget([&](const char* target) {
        EXPECT_EQ(argmax(row.data(), n), want) << target;
        EXPECT_EQ(logit_stats(row.data(), n).argmax, want) << target << " (logit_stats)";
      });
    }
  }
  EXPECT_EQ(argmax(nullptr, 0), 0);
}

// SIMD SiLU gate and softmax against the reference (exp within a few ulp), lengths with tails.
TEST(KernelsSimdF32, SwigluSoftmaxMatchReference) {
  std::mt19937 rng(23);
  for (int64_t n : {1, 7, 64, 257, 4864}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const auto gate = RandomFloats(rng, static_cast<size_t>(n), 12.0f);
    const auto up = RandomFloats(rng, static_cast<size_t>(n), 2.0f);
    std::vector<float> sw_ref(static_cast<size_t>(n));
    ref::swiglu(gate.data(), up.data(), sw_ref.data(), n);
    std::vector<float> sm_ref = gate;
    ref::softmax(sm_ref.data(), n);
    ForEachTarget([&](const char* target) {
      std::vector<float> sw(static_cast<size_t>(n));
      swiglu(gate.data(), up.data(), sw.data(), n);
      std::vector<float> sm = gate;
      softmax(sm.data(), n);
      double total = 0;
      for (int64_t i = 0; i < n; ++i) {
        EXPECT_NEAR(sw[i], sw_ref[i], 1e-6f * std::fabs(sw_ref[i]) + 1e-30f) << target << " " << i;
        EXPECT_NEAR(sm[i], sm_ref[i], 1e-6f * sm_ref[i] + 1e-30f) << target << " " << i;
        total += sm[i];
      }
      EXPECT_NEAR(total, 1.0, 1e-5);
    });
  }
}

}  // namespace
}  // namespace tandem::kernels
