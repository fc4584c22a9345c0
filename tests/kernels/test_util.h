// Helpers shared by the kernel tests.
#pragma once

#include <hwy/targets.h>

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernels.h"

namespace tandem::kernels::testing {

// Runs fn once per SIMD target compiled into the library and supported by this CPU, with
// dispatch forced to that target; restores normal dispatch afterwards.
inline void ForEachTarget(const std::function<void(const char* target)>& fn) {
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  ASSERT_FALSE(targets.empty());
  for (int64_t t : targets) {
    hwy::SetSupportedTargetsForTest(t);
    SCOPED_TRACE(std::string("target ") + hwy::TargetName(t));
    // Dispatch really switched to this target.
    EXPECT_STREQ(simd_target_name(), hwy::TargetName(t));
    fn(hwy::TargetName(t));
  }
  hwy::SetSupportedTargetsForTest(0);
}

inline std::vector<float> RandomFloats(std::mt19937& rng, size_t n, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// A KV cache's rows in one of its element types: f32 as given, or rounded to f16 (the bits).
struct CacheRows {
  TensorType type;
  std::vector<float> f32;      // the values as the kernel sees them (f16 rows widened back)
  std::vector<uint16_t> bits;  // f16 only
  const void* data() const {
    return type == TensorType::F16 ? static_cast<const void*>(bits.data()) : f32.data();
  }
};
inline CacheRows ToCacheRows(const std::vector<float>& x, TensorType type) {
  CacheRows r{type, x, {}};
  if (type == TensorType::F16) {
    for (float& v : r.f32) {
      r.bits.push_back(f32_to_f16(v));
      v = f16_to_f32(r.bits.back());
    }
  }
  return r;
}

}  // namespace tandem::kernels::testing
