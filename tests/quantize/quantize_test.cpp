// Quantize -> dequantize round trips for every type, and the K-quant scale searches against a
// plain max-abs scale.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "common/error.h"
#include "common/thread_pool.h"
#include "kernels/kernels.h"
#include "quantize/quantize.h"

namespace tandem::quant {
namespace {

std::vector<float> random_normal(size_t n, uint32_t seed, float std = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, std);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<float> round_trip(TensorType t, const std::vector<float>& x) {
  std::vector<uint8_t> q(row_bytes(t, static_cast<int64_t>(x.size())));
  quantize_row(t, x.data(), q.data(), static_cast<int64_t>(x.size()));
  std::vector<float> y(x.size());
  kernels::dequantize_row(t, q.data(), y.data(), static_cast<int64_t>(x.size()));
  return y;
}

double rel_rmse(const std::vector<float>& x, const std::vector<float>& y) {
  double e = 0, s = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    e += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
    s += double(x[i]) * x[i];
  }
  return std::sqrt(e / s);
}

struct Bound {
  TensorType type;
  double max_rel_rmse;
};

class RoundTrip : public ::testing::TestWithParam<Bound> {};

// Bounds: about 1.1-1.25x the relative RMS error measured on N(0, 1) data (the error of a b-bit
// uniform quantizer is ~ 2^-b times the range; K-quants and 5/6/8-bit types much lower).
TEST_P(RoundTrip, ErrorWithinBound) {
  const Bound b = GetParam();
  const auto x = random_normal(256 * 64, 42);
  const auto y = round_trip(b.type, x);
  const double e = rel_rmse(x, y);
  RecordProperty("rel_rmse", std::to_string(e));
  std::printf("%-5s relative RMS error %.5f (bound %.5f)\n",
              std::string(traits(b.type).name).c_str(), e, b.max_rel_rmse);
  EXPECT_LT(e, b.max_rel_rmse) << traits(b.type).name;
  EXPECT_GT(e, 0.0) << traits(b.type).name;
  // Zeros and constant rows survive exactly (no NaN from a zero scale).
  const std::vector<float> z(256, 0.0f);
  for (float v : round_trip(b.type, z)) EXPECT_EQ(v, 0.0f) << traits(b.type).name;
}

INSTANTIATE_TEST_SUITE_P(
    AllTypes, RoundTrip,
    ::testing::Values(Bound{TensorType::F16, 4e-4}, Bound{TensorType::BF16, 3e-3},
                      Bound{TensorType::Q8_0, 0.0075}, Bound{TensorType::Q6_K, 0.021},
                      Bound{TensorType::Q5_1, 0.044}, Bound{TensorType::Q5_0, 0.049},
                      Bound{TensorType::Q5_K, 0.042}, Bound{TensorType::Q4_1, 0.09},
                      Bound{TensorType::Q4_0, 0.1}, Bound{TensorType::Q4_K, 0.082},
                      Bound{TensorType::Q3_K, 0.17}, Bound{TensorType::Q2_K, 0.33}),
    [](const auto& info) { return std::string(traits(info.param.type).name); });

TEST(Quantize, RejectsRowNotMultipleOfBlock) {
  std::vector<float> x(300, 1.0f);
  std::vector<uint8_t> q(4096);
  EXPECT_THROW(quantize_row(TensorType::Q4_K, x.data(), q.data(), 300), Error);
  EXPECT_THROW(quantize_row(TensorType::Q8_0, x.data(), q.data(), 300), Error);
  EXPECT_NO_THROW(quantize_row(TensorType::F16, x.data(), q.data(), 300));
}

TEST(Quantize, ThreadedRowsEqualSerial) {
  const int64_t rows = 37, n = 512;
  const auto x = random_normal(rows * n, 7);
  for (TensorType t : {TensorType::Q4_K, TensorType::Q8_0, TensorType::Q3_K}) {
    std::vector<uint8_t> a(row_bytes(t, n) * rows), b(a.size());
    quantize_rows(t, x.data(), a.data(), rows, n, nullptr);
    ThreadPool pool(2);
    quantize_rows(t, x.data(), b.data(), rows, n, &pool);
    EXPECT_EQ(a, b) << traits(t).name;
  }
}

// ---- the K-quant searches beat a plain max-abs scale on their weighted error ----

// Weighted squared error with the importance weights ggml's reference quantizer uses for the
// type: Q4_K/Q5_K sqrt(mean x^2 of the 32-group) + |x|, Q2_K |x|, Q3_K/Q6_K x^2.
double weighted_error(TensorType t, const std::vector<float>& x, const std::vector<float>& y) {
  double e = 0;
  for (size_t g = 0; g < x.size(); g += 32) {
    double s2 = 0;
    for (size_t i = g; i < g + 32; ++i) s2 += double(x[i]) * x[i];
    const double av = std::sqrt(s2 / 32);
    for (size_t i = g; i < g + 32; ++i) {
      double w = 1;
      if (t == TensorType::Q4_K || t == TensorType::Q5_K) w = av + std::fabs(x[i]);
      if (t == TensorType::Q2_K) w = std::fabs(x[i]);
      if (t == TensorType::Q3_K || t == TensorType::Q6_K) w = double(x[i]) * x[i];
      e += w * (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
    }
  }
  return e;
}

// The same sub-block structure with a plain scale (asymmetric types: (max - min) / nmax and
// min; symmetric: max|x| / nmax), scales kept in f32 (no 4/6/8-bit scale rounding, which only
// favours the plain version).
std::vector<float> plain_scale(TensorType t, const std::vector<float>& x) {
  int group = 16, nmax = 0;
  bool asym = false;
  switch (t) {
    case TensorType::Q2_K:
      group = 16, nmax = 3, asym = true;
      break;
    case TensorType::Q4_K:
      group = 32, nmax = 15, asym = true;
      break;
    case TensorType::Q5_K:
      group = 32, nmax = 31, asym = true;
      break;
    case TensorType::Q3_K:
      group = 16, nmax = 4;
      break;
    case TensorType::Q6_K:
      group = 16, nmax = 32;
      break;
    default:
      break;
  }
  std::vector<float> y(x.size());
  for (size_t g = 0; g < x.size(); g += group) {
    float mn = x[g], mx = x[g], amax = 0;
    for (int i = 0; i < group; ++i) {
      mn = std::min(mn, x[g + i]);
      mx = std::max(mx, x[g + i]);
      amax = std::max(amax, std::fabs(x[g + i]));
    }
    for (int i = 0; i < group; ++i) {
      if (asym) {
        mn = std::min(mn, 0.0f);
        const float d = (mx - mn) / nmax;
        const float q = std::clamp(std::round((x[g + i] - mn) / d), 0.0f, float(nmax));
        y[g + i] = d * q + mn;
      } else {
        const float d = amax / nmax;
        const float q = std::clamp(std::round(x[g + i] / d), float(-nmax), float(nmax - 1));
        y[g + i] = d * q;
      }
    }
  }
  return y;
}

TEST(Quantize, KQuantSearchBeatsPlainMaxAbsScale) {
  const auto x = random_normal(256 * 256, 3, 0.02f);
  for (TensorType t :
       {TensorType::Q2_K, TensorType::Q3_K, TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K}) {
    const double ours = weighted_error(t, x, round_trip(t, x));
    const double plain = weighted_error(t, x, plain_scale(t, x));
    std::printf("%-5s weighted error: search %.4g, plain max-abs %.4g (ratio %.3f)\n",
                std::string(traits(t).name).c_str(), ours, plain, ours / plain);
    EXPECT_LT(ours, plain) << traits(t).name;
  }
}

TEST(Quantize, MakeQkx2QuantsImprovesOnFirstGuess) {
  // Skewed data: the least-squares refit must find a better scale than (max - min) / nmax.
  std::vector<float> x(32), w(32, 1.0f);
  for (int i = 0; i < 32; ++i) x[i] = (i == 0 ? 5.0f : 0.1f * (i % 7)) - 0.2f;
  uint8_t L[32], Laux[32];
  float neg_min = 0;
  const float scale =
      make_qkx2_quants(32, 15, x.data(), w.data(), L, &neg_min, Laux, -1.f, 0.1f, 20, false);
  double e_search = 0, e_plain = 0;
  float mn = 0, mx = x[0];
  for (float v : x) mn = std::min(mn, v), mx = std::max(mx, v);
  const float d = (mx - mn) / 15;
  for (int i = 0; i < 32; ++i) {
    e_search += std::pow(scale * L[i] - neg_min - x[i], 2);
    e_plain += std::pow(d * std::round((x[i] - mn) / d) + mn - x[i], 2);
  }
  EXPECT_LE(e_search, e_plain);
}

TEST(Quantize, NearestIntRoundsHalfToEven) {
  EXPECT_EQ(nearest_int(0.5f), 0);
  EXPECT_EQ(nearest_int(1.5f), 2);
  EXPECT_EQ(nearest_int(-2.5f), -2);
  EXPECT_EQ(nearest_int(-2.6f), -3);
  EXPECT_EQ(nearest_int(7.49f), 7);
}

}  // namespace
}  // namespace tandem::quant
