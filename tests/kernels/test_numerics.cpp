// Half-precision conversions, activation quantization, GELU table and the f32 ops.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
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

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Independent f16 -> f32: value = (-1)^s * 2^(e-15) * (1 + m/1024), computed with ldexp.
double HalfValue(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return s ? -v : v;
}

TEST(KernelsHalf, F16ToF32AllPatterns) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    const int e = (h >> 10) & 31;
    if (e == 31) {
      if (h & 1023) {
        EXPECT_TRUE(std::isnan(f)) << h;
      } else {
        EXPECT_TRUE(std::isinf(f) && std::signbit(f) == bool(h & 0x8000)) << h;
      }
      continue;
    }
    EXPECT_EQ(static_cast<double>(f), HalfValue(static_cast<uint16_t>(h))) << h;
    EXPECT_EQ(std::signbit(f), bool(h & 0x8000)) << h;
  }
}

// Independent f32 -> f16 (round to nearest even) by searching the two neighbours in f64.
uint16_t RefF16(float f) {
  if (std::isnan(f)) return 0x7E00;
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 65520.0) return sign | 0x7C00;
  // Largest magnitude pattern <= a.
  uint16_t lo = 0;
  for (int bit = 14; bit >= 0; --bit) {
    const uint16_t c = lo | static_cast<uint16_t>(1u << bit);
    if (c <= 0x7BFF && HalfValue(c) <= a) lo = c;
  }
  const double vl = HalfValue(lo), vh = HalfValue(lo + 1);
  uint16_t r = lo;
  if (a - vl > vh - a || (a - vl == vh - a && (lo & 1))) r = lo + 1;
  return sign | r;
}

TEST(KernelsHalf, F32ToF16RoundTripAndMidpoints) {
  for (uint32_t h = 0; h < 65536; ++h) {
    if (((h >> 10) & 31) == 31) continue;
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    ASSERT_EQ(f32_to_f16(f), h) << h;
    // Midpoint to the next pattern up (in magnitude) and values just around it.
    if ((h & 0x7FFF) < 0x7BFF) {
      const double mid = (HalfValue(h) + HalfValue(h + 1)) / 2;  // exact in f32
      const float m = static_cast<float>(mid);
      ASSERT_EQ(static_cast<double>(m), mid);
      for (float x : {m, std::nextafter(m, 0.0f), std::nextafter(m, 1e30f * (mid < 0 ? -1 : 1))})
        ASSERT_EQ(f32_to_f16(x), RefF16(x)) << h << " x=" << x;
    }
  }
}

TEST(KernelsHalf, F32ToF16SpecialAndRandom) {
  EXPECT_EQ(f32_to_f16(INFINITY), 0x7C00);
  EXPECT_EQ(f32_to_f16(-INFINITY), 0xFC00);
  EXPECT_EQ(f32_to_f16(65519.99f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);
  EXPECT_EQ(f32_to_f16(1e10f), 0x7C00);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);  // tie -> even (zero)
  EXPECT_EQ(f32_to_f16(std::nextafter(0x1p-25f, 1.0f)), 0x0001);
  EXPECT_EQ(f32_to_f16(0x1p-24f * 1.5f), 0x0002);  // tie 1.5 -> 2
  const uint16_t qnan = f32_to_f16(std::nanf(""));
  EXPECT_EQ(qnan & 0x7C00, 0x7C00);
  EXPECT_NE(qnan & 0x3FF, 0);
  EXPECT_NE(f32_to_f16(FromBits(0x7F800001)) & 0x3FF, 0);  // signalling NaN stays NaN
  std::mt19937 rng(3);
  for (int i = 0; i < 2000000; ++i) {
    // Random bit patterns restricted to the f16 range and below.
    const uint32_t u = (rng() & 0x807FFFFF) | (((rng() % 50) + 90) << 23);
    const float f = FromBits(u);
    ASSERT_EQ(f32_to_f16(f), RefF16(f)) << std::hex << u;
  }
}

TEST(KernelsHalf, Bf16AllPatternsAndRounding) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_f32(static_cast<uint16_t>(h));
    ASSERT_EQ(Bits(f), h << 16);
    if (std::isnan(f)) {
      EXPECT_EQ(f32_to_bf16(f), h | 64) << h;  // quieted as ggml does
    } else {
      ASSERT_EQ(f32_to_bf16(f), h);
      // Midpoint to the next pattern: ties to even.
      const uint32_t mid = (h << 16) | 0x8000;
      if (((mid >> 23) & 0xFF) != 0xFF) {
        EXPECT_EQ(f32_to_bf16(FromBits(mid)), (h & 1) ? h + 1 : h) << h;
        EXPECT_EQ(f32_to_bf16(FromBits(mid + 1)), h + 1) << h;
        EXPECT_EQ(f32_to_bf16(FromBits(mid - 1)), h) << h;
      }
    }
  }
}

TEST(KernelsQuantize, NearestIntIsRoundHalfEven) {
  EXPECT_EQ(ref::nearest_int(0.5f), 0);
  EXPECT_EQ(ref::nearest_int(1.5f), 2);
  EXPECT_EQ(ref::nearest_int(2.5f), 2);
  EXPECT_EQ(ref::nearest_int(-2.5f), -2);
  EXPECT_EQ(ref::nearest_int(-127.4f), -127);
  for (float x = -200.0f; x < 200.0f; x += 0.173f)
    EXPECT_EQ(ref::nearest_int(x), static_cast<int>(std::nearbyint(x))) << x;
}

TEST(KernelsQuantize, Q8_0Invariants) {
  std::mt19937 rng(11);
  const int64_t n = 1024;
  auto x = testing::RandomFloats(rng, n, 3.0f);
  for (int j = 64; j < 96; ++j) x[j] = 0.0f;  // an all-zero block
  x[200] = 0.5f * 127 / 127;                  // keep things ordinary
  std::vector<BlockQ8_0> q(n / 32), q_ref(n / 32);
  quantize_activation_row(TensorType::Q8_0, x.data(), q.data(), n);
  ref::quantize_activation_row(TensorType::Q8_0, x.data(), q_ref.data(), n);
  ASSERT_EQ(std::memcmp(q.data(), q_ref.data(), sizeof(BlockQ8_0) * q.size()), 0);
  for (int64_t b = 0; b < n / 32; ++b) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    EXPECT_EQ(q[b].d, f32_to_f16(amax / 127));
    const float d = amax / 127, id = d ? 1.0f / d : 0.0f;
    for (int j = 0; j < 32; ++j) {
      EXPECT_EQ(q[b].qs[j], static_cast<int>(std::round(x[b * 32 + j] * id)));
      EXPECT_LE(std::abs(q[b].qs[j]), 127);
    }
  }
  EXPECT_EQ(q[2].d, 0);
}

TEST(KernelsQuantize, Q8_1Invariants) {
  std::mt19937 rng(12);
  const int64_t n = 512;
  const auto x = testing::RandomFloats(rng, n, 3.0f);
  std::vector<BlockQ8_1> q(n / 32);
  quantize_activation_row(TensorType::Q8_1, x.data(), q.data(), n);
  for (int64_t i = 0; i < n / 32; ++i) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[i * 32 + j]));
    const float d = amax / 127;
    int s = 0;
    for (int j = 0; j < 32; ++j) s += q[i].qs[j];
    EXPECT_EQ(q[i].d, f32_to_f16(d));
    EXPECT_EQ(q[i].s, f32_to_f16(static_cast<float>(s) * d));
  }
}

TEST(KernelsQuantize, Q8_KInvariants) {
  std::mt19937 rng(13);
  const int64_t n = 1024;
  auto x = testing::RandomFloats(rng, n, 3.0f);
  for (int j = 256; j < 512; ++j) x[j] = 0.0f;
  std::vector<BlockQ8_K> q(n / QK_K), q_ref(n / QK_K);
  quantize_activation_row(TensorType::Q8_K, x.data(), q.data(), n);
  ref::quantize_activation_row(TensorType::Q8_K, x.data(), q_ref.data(), n);
  ASSERT_EQ(std::memcmp(q.data(), q_ref.data(), sizeof(BlockQ8_K) * q.size()), 0);
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const float* xb = x.data() + b * QK_K;
    float max = 0, amax = 0;
    for (int j = 0; j < QK_K; ++j)
      if (std::fabs(xb[j]) > amax) amax = std::fabs(xb[j]), max = xb[j];
    if (amax == 0) {
      EXPECT_EQ(q[b].d, 0.0f);
      continue;
    }
    const float iscale = -127.f / max;
    EXPECT_EQ(q[b].d, 1 / iscale);
    for (int j = 0; j < QK_K; ++j) {
      EXPECT_EQ(q[b].qs[j], std::min(127, static_cast<int>(std::nearbyint(iscale * xb[j]))));
      EXPECT_GE(q[b].qs[j], -127);
    }
    for (int g = 0; g < 16; ++g) {
      int s = 0;
      for (int l = 0; l < 16; ++l) s += q[b].qs[16 * g + l];
      EXPECT_EQ(q[b].bsums[g], s);
    }
    // The element of largest magnitude maps to -127 (iscale has the opposite sign).
    for (int j = 0; j < QK_K; ++j) {
      if (xb[j] == max) {
        EXPECT_EQ(q[b].qs[j], -127);
      }
    }
  }
}

TEST(KernelsQuantize, F16AndBf16Activations) {
  std::mt19937 rng(14);
  const auto x = testing::RandomFloats(rng, 300, 100.0f);
  std::vector<uint16_t> h(300), b(300);
  quantize_activation_row(TensorType::F16, x.data(), h.data(), 300);
  quantize_activation_row(TensorType::BF16, x.data(), b.data(), 300);
  for (int i = 0; i < 300; ++i) {
    EXPECT_EQ(h[i], f32_to_f16(x[i]));
    EXPECT_EQ(b[i], f32_to_bf16(x[i]));
  }
}

TEST(KernelsGelu, TableSemantics) {
  const uint16_t* table = ref::gelu_f16_table();
  int off_by_one = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const float x = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(x)) continue;
    ASSERT_EQ(table[h], f32_to_f16(ref::gelu_tanh(x))) << h;
    if (x > -3.0f && x < 10.0f) {
      // Independent f64 GELU: the f32 formula may differ by one f16 step at most (below -3,
      // 1 + tanh cancels in f32 and only the f32 formula itself is the reference).
      const double xd = x;
      const double g =
          0.5 * xd * (1 + std::tanh(std::sqrt(2 / M_PI) * (xd + 0.044715 * xd * xd * xd)));
      const int diff =
          std::abs(static_cast<int>(table[h]) - static_cast<int>(RefF16(static_cast<float>(g))));
      if (diff != 0) ++off_by_one;
      EXPECT_LE(diff, 1) << h << " x=" << x;
    }
  }
  EXPECT_LT(off_by_one, 200);
  const float up[8] = {2, 2, 2, 2, 2, 2, 2, 2};
  const float gate[8] = {-10.0f, -10.5f, 10.0f, 12.0f, 9.99f, 0.1f, -3.3f, 1.0001f};
  float out[8];
  geglu(gate, up, out, 8);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], 0.0f);
  EXPECT_EQ(out[2], 20.0f);
  EXPECT_EQ(out[3], 24.0f);
  for (int i = 4; i < 8; ++i) {
    // The input is rounded to f16 before the lookup.
    const float g = f16_to_f32(f32_to_f16(ref::gelu_tanh(f16_to_f32(f32_to_f16(gate[i])))));
    EXPECT_EQ(out[i], g * 2.0f) << i;
    EXPECT_EQ(ref::gelu_table(gate[i]), g);
  }
}

TEST(KernelsOps, RmsNormMatchesDouble) {
  std::mt19937 rng(21);
  const int64_t n = 640;
  const auto x = testing::RandomFloats(rng, n, 5.0f);
  const auto w = testing::RandomFloats(rng, n);
  double ss = 0;
  for (float v : x) ss += double(v) * v;
  const double scale = 1.0 / std::sqrt(ss / n + 1e-6);
  testing::ForEachTarget([&](const char*) {
    std::vector<float> out(n);
    rms_norm(x.data(), w.data(), out.data(), n, 1e-6f);
    for (int64_t i = 0; i < n; ++i)
      EXPECT_NEAR(out[i], x[i] * scale * w[i], 1e-6 * std::fabs(x[i] * scale * w[i]) + 1e-7);
  });
}

TEST(KernelsOps, SwigluSoftmax) {
  const float gate[4] = {-3.0f, 0.0f, 0.5f, 20.0f};
  const float up[4] = {1.0f, 2.0f, -1.0f, 0.5f};
  float out[4];
  swiglu(gate, up, out, 4);
  for (int i = 0; i < 4; ++i) {
    const double g = gate[i];
    EXPECT_NEAR(out[i], g / (1 + std::exp(-g)) * up[i], 1e-6 * (1 + std::fabs(out[i])));
  }
  float s[5] = {1.0f, 2.0f, 3.0f, -100.0f, 3.0f};
  softmax(s, 5);
  double den = std::exp(-2.0) + std::exp(-1.0) + 2 + std::exp(-103.0);
  EXPECT_NEAR(s[0], std::exp(-2.0) / den, 1e-7);
  EXPECT_NEAR(s[2], 1.0 / den, 1e-7);
  EXPECT_EQ(s[2], s[4]);
  EXPECT_NEAR(s[0] + s[1] + s[2] + s[3] + s[4], 1.0, 1e-6);
}

TEST(KernelsTypes, TargetsUnderTest) {
  const auto targets = hwy::SupportedAndGeneratedTargets();
  std::string names;
  for (int64_t t : targets) names += std::string(" ") + hwy::TargetName(t);
  std::printf("SIMD targets tested on this CPU:%s (dispatch default: %s)\n", names.c_str(),
              simd_target_name());
  EXPECT_GE(targets.size(), 2u) << "expected several targets (e.g. AVX2 and SSE4)";
}

TEST(KernelsTypes, PinsTheSimdTarget) {
  const std::vector<std::string> names = simd_targets();
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names.front(), simd_target_name());
  for (const std::string& name : names) {
    set_simd_target(name);
    EXPECT_EQ(name, simd_target_name());
  }
  set_simd_target("");
  EXPECT_EQ(names.front(), simd_target_name());
  try {
    set_simd_target("NOT_A_TARGET");
    ADD_FAILURE() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(names.front()), std::string::npos) << e.what();
  }
  EXPECT_EQ(names.front(), simd_target_name());
}

TEST(KernelsTypes, ActivationTypes) {
  EXPECT_EQ(activation_type(TensorType::Q4_K), TensorType::Q8_K);
  EXPECT_EQ(activation_type(TensorType::Q6_K), TensorType::Q8_K);
  EXPECT_EQ(activation_type(TensorType::Q5_0), TensorType::Q8_0);
  EXPECT_EQ(activation_type(TensorType::Q8_0), TensorType::Q8_0);
  EXPECT_EQ(activation_type(TensorType::Q4_1), TensorType::Q8_1);
  EXPECT_EQ(activation_type(TensorType::F16), TensorType::F16);
  EXPECT_EQ(activation_type(TensorType::BF16), TensorType::BF16);
  EXPECT_EQ(activation_type(TensorType::F32), TensorType::F32);
  EXPECT_TRUE(is_supported_weight_type(TensorType::Q2_K));
  EXPECT_FALSE(is_supported_weight_type(TensorType::I32));
  EXPECT_FALSE(is_supported_weight_type(TensorType::Q8_K));
  EXPECT_NE(std::string(simd_target_name()), "");
}

TEST(KernelsTypes, RejectsPartialBlocks) {
  std::vector<uint8_t> w(4096), a(4096);
  float y = 0;
  EXPECT_THROW(vec_dot(TensorType::Q4_K, 640, w.data(), a.data()), std::invalid_argument);
  EXPECT_THROW(matmul_rows(TensorType::Q8_0, 40, w.data(), 0, 1, a.data(), 0, 1, &y, 1),
               std::invalid_argument);
  EXPECT_THROW(dequantize_row(TensorType::Q6_K, w.data(), &y, 16), std::invalid_argument);
  EXPECT_NO_THROW(vec_dot(TensorType::F16, 3, w.data(), a.data()));
}

}  // namespace
}  // namespace tandem::kernels
