// Batch invariance of the kernels, on every SIMD target compiled in: an output row of matmul_rows
// and of attention_rows is bit for bit the same whatever the other rows computed with it (their
// number, the row's place among them, the weight rows' place in a prefill tile). The forward pass
// relies on this for tokens that are decoded alone, prefilled, or batched with other sequences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/aligned_vector.h"
#include "kernels/kernels.h"
#include "test_util.h"

namespace tandem::kernels {
namespace {

using testing::ForEachTarget;
using testing::RandomFloats;

// Weight rows of type t: random f32 values quantized (or converted) row by row.
std::vector<uint8_t> Weights(std::mt19937& rng, TensorType t, int64_t rows, int64_t k) {
  const size_t rb = row_bytes(t, k);
  std::vector<uint8_t> w(rb * static_cast<size_t>(rows));
  const auto f = RandomFloats(rng, static_cast<size_t>(rows * k), 0.05f);
  if (!traits(t).is_quantized) {
    // F32/F16/BF16: the activation conversion is the storage conversion.
    quantize_activation_row(t, f.data(), w.data(), rows * k);
    return w;
  }
  // Random bytes with sane f16 scales would do as well; quantizing through the activation path
  // is not available for weight types, so write random blocks and fix the scales.
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : w) b = static_cast<uint8_t>(byte(rng));
  const size_t bs = traits(t).type_size;
  // Offsets of the f16 d (and min) fields, as in test_kernels_simd.cpp.
  std::vector<int> fields;
  switch (t) {
    case TensorType::Q4_0:
    case TensorType::Q5_0:
    case TensorType::Q8_0:
      fields = {0};
      break;
    case TensorType::Q4_1:
    case TensorType::Q5_1:
    case TensorType::Q4_K:
    case TensorType::Q5_K:
      fields = {0, 2};
      break;
    case TensorType::Q2_K:
      fields = {80, 82};
      break;
    case TensorType::Q3_K:
      fields = {108};
      break;
    case TensorType::Q6_K:
      fields = {208};
      break;
    default:
      break;
  }
  std::uniform_real_distribution<float> mag(0.002f, 0.05f);
  for (size_t off = 0; off < w.size(); off += bs) {
    for (int o : fields) {
      const uint16_t h = f32_to_f16(mag(rng));
      std::memcpy(&w[off + o], &h, 2);
    }
  }
  return w;
}

class KernelsInvariance : public ::testing::TestWithParam<TensorType> {};

// Every activation row of a pool is multiplied alone (n_act = 1, the decode path) over all weight
// rows; then batches of 2..40 of the pool's rows in shuffled order, over weight ranges that start
// on and off a tile boundary, must give each row's outputs bit for bit.
TEST_P(KernelsInvariance, MatmulRowsIndependentOfBatch) {
  const TensorType wt = GetParam();
  const bool kquant = traits(wt).block_size == 256;
  const int64_t k = kquant ? 768 : 736;  // 23 blocks of 32: five groups of four and three more
  const int64_t rows = 53;               // three 16-row tiles and a remainder
  const int64_t pool = 40;
  std::mt19937 rng(1234 + static_cast<int>(wt));
  const auto w = Weights(rng, wt, rows, k);
  const TensorType at = activation_type(wt);
  const size_t stride = row_bytes(at, k) + 16;
  std::vector<uint8_t> acts(stride * pool, 0);
  for (int64_t r = 0; r < pool; ++r) {
    const auto x = RandomFloats(rng, static_cast<size_t>(k), 1.5f);
    quantize_activation_row(at, x.data(), acts.data() + r * stride, k);
  }
  ForEachTarget([&](const char* target) {
    // Each pool row alone: [pool][rows].
    std::vector<float> alone(static_cast<size_t>(pool * rows));
    for (int64_t r = 0; r < pool; ++r)
      matmul_rows(wt, k, w.data(), 0, rows, acts.data() + r * stride, stride, 1,
                  alone.data() + r * rows, rows);
    for (int64_t n_act : {2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 24, 33, 40}) {
      for (int64_t row_begin : {0, 5}) {
        std::vector<int64_t> order(pool);
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), rng);
        std::vector<uint8_t> batch(stride * n_act);
        for (int64_t j = 0; j < n_act; ++j)
          std::memcpy(batch.data() + j * stride, acts.data() + order[j] * stride, stride);
        std::vector<float> y(static_cast<size_t>(n_act * rows), -7.0f);
        matmul_rows(wt, k, w.data(), row_begin, rows, batch.data(), stride, n_act, y.data(), rows);
        for (int64_t j = 0; j < n_act; ++j) {
          const float* want = alone.data() + order[j] * rows + row_begin;
          const float* got = y.data() + j * rows + row_begin;
          ASSERT_EQ(std::memcmp(want, got, sizeof(float) * (rows - row_begin)), 0)
              << target << " " << traits(wt).name << ": n_act=" << n_act << " row " << j
              << " row_begin=" << row_begin;
        }
      }
    }
  });
}

// A packed copy of the weights (PackedWeights: tiles staged once) gives every output bit for bit
// as without it, for batches on and off tile boundaries; a copy made on one target and used on
// another is ignored, not misread; a copy of other weights is refused.
TEST_P(KernelsInvariance, PackedWeightsGiveTheSameBits) {
  const TensorType wt = GetParam();
  const bool kquant = traits(wt).block_size == 256;
  const int64_t k = kquant ? 512 : 736;
  const int64_t rows = 71;  // four 16-row tiles (eight of 8) and a remainder
  std::mt19937 rng(4321 + static_cast<int>(wt));
  const auto w = Weights(rng, wt, rows, k);
  const TensorType at = activation_type(wt);
  const size_t stride = row_bytes(at, k);
  const int64_t pool = 33;
  std::vector<uint8_t> acts(stride * pool, 0);
  for (int64_t r = 0; r < pool; ++r) {
    const auto x = RandomFloats(rng, static_cast<size_t>(k), 1.5f);
    quantize_activation_row(at, x.data(), acts.data() + r * stride, k);
  }
  const std::string best = simd_target_name();
  const PackedWeights packed_best = PackedWeights::pack(wt, k, w.data(), rows);
  ForEachTarget([&](const char* target) {
    const PackedWeights packed = PackedWeights::pack(wt, k, w.data(), rows);
    if (!traits(wt).is_quantized || std::string(target) == "SCALAR") {
      EXPECT_TRUE(packed.empty()) << target << " " << traits(wt).name;
    } else {
      ASSERT_FALSE(packed.empty()) << target << " " << traits(wt).name;
      EXPECT_EQ(packed.rows() % 4, 0);
      EXPECT_GT(packed.rows(), rows - 17);
    }
    for (int64_t n_act : {1, 8, 9, 32, 33}) {
      for (int64_t row_begin : {0, 16, 5}) {
        for (int64_t row_end : {rows, int64_t{64}}) {
          std::vector<float> want(static_cast<size_t>(n_act * rows), -7.0f);
          std::vector<float> got = want, other = want;
          matmul_rows(wt, k, w.data(), row_begin, row_end, acts.data(), stride, n_act, want.data(),
                      rows);
          matmul_rows(wt, k, w.data(), row_begin, row_end, acts.data(), stride, n_act, got.data(),
                      rows, &packed);
          matmul_rows(wt, k, w.data(), row_begin, row_end, acts.data(), stride, n_act, other.data(),
                      rows, &packed_best);
          ASSERT_EQ(std::memcmp(want.data(), got.data(), sizeof(float) * want.size()), 0)
              << target << " " << traits(wt).name << ": n_act=" << n_act << " rows [" << row_begin
              << ", " << row_end << ")";
          ASSERT_EQ(std::memcmp(want.data(), other.data(), sizeof(float) * want.size()), 0)
              << target << " with a copy packed on " << best << " " << traits(wt).name
              << ": n_act=" << n_act << " rows [" << row_begin << ", " << row_end << ")";
        }
      }
    }
  });
  // An output over 16 MiB (an LM head's logits) is written with streaming stores: the same bits,
  // on and off a 64-byte boundary.
  {
    const int64_t n_act = 9, y_stride = 480000;
    AlignedVector<float> want(static_cast<size_t>(n_act * y_stride) + 16, -7.0f);
    for (int64_t shift : {0, 3}) {
      AlignedVector<float> got = want;
      float* y0 = got.data() + shift;
      matmul_rows(wt, k, w.data(), 0, rows, acts.data(), stride, n_act, want.data() + shift,
                  y_stride);
      matmul_rows(wt, k, w.data(), 0, rows, acts.data(), stride, n_act, y0, y_stride, &packed_best);
      for (int64_t j = 0; j < n_act; ++j)
        ASSERT_EQ(std::memcmp(want.data() + shift + j * y_stride, y0 + j * y_stride,
                              sizeof(float) * rows),
                  0)
            << traits(wt).name << " streamed output row " << j << " shift " << shift;
    }
  }
  if (!packed_best.empty()) {
    std::vector<float> y(static_cast<size_t>(rows) * 8);
    const TensorType other = wt == TensorType::Q8_0 ? TensorType::Q4_0 : TensorType::Q8_0;
    const int64_t k_other = 512;
    std::vector<uint8_t> w2(row_bytes(other, k_other) * rows);
    std::vector<uint8_t> a2(row_bytes(activation_type(other), k_other) * 8);
    EXPECT_THROW(
        matmul_rows(other, k_other, w2.data(), 0, rows, a2.data(),
                    row_bytes(activation_type(other), k_other), 8, y.data(), rows, &packed_best),
        std::invalid_argument);
    EXPECT_THROW(matmul_rows(wt, k, w.data(), 0, rows + 1, acts.data(), stride, 8, y.data(), rows,
                             &packed_best),
                 std::invalid_argument);
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, KernelsInvariance,
                         ::testing::Values(TensorType::F32, TensorType::F16, TensorType::BF16,
                                           TensorType::Q4_0, TensorType::Q4_1, TensorType::Q5_0,
                                           TensorType::Q5_1, TensorType::Q8_0, TensorType::Q2_K,
                                           TensorType::Q3_K, TensorType::Q4_K, TensorType::Q5_K,
                                           TensorType::Q6_K),
                         [](const ::testing::TestParamInfo<TensorType>& info) {
                           return std::string(traits(info.param).name);
                         });

// attention_rows: each query row alone (a decode token's single head) against the same row among
// the query heads of its token (decode of a GQA group) and among a run of tokens (prefill), with
// causal and sliding-window ranges, the softcap, and head sizes off the vector width.
TEST(KernelsInvariance, AttentionRowsIndependentOfRun) {
  std::mt19937 rng(77);
  for (int64_t hd : {64, 256, 20}) {
    for (int group : {1, 4, 7}) {
      for (int window : {0, 5}) {
        for (float softcap : {0.0f, 30.0f}) {
          const int tokens = 9, pos0 = 6;  // positions 6..14
          const int64_t n_q = tokens * group, n_k = pos0 + tokens;
          const int64_t hdv = hd + (hd == 20 ? 4 : 0);
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
          const std::string what = "hd=" + std::to_string(hd) + " group=" + std::to_string(group) +
                                   " window=" + std::to_string(window) +
                                   " softcap=" + std::to_string(softcap);
          ForEachTarget([&](const char* target) {
            std::vector<float> alone(static_cast<size_t>(n_q * hdv));
            for (int64_t a = 0; a < n_q; ++a) {
              float* o = alone.data() + a * hdv;
              attention_rows(&qr[a], &o, 1, &lo[a], &hi[a], keys.data(), kstride, vals.data(),
                             vstride, hd, hdv, 0.125f, softcap);
            }
            // Runs of `len` tokens starting at every token.
            for (int len : {1, 2, 3, 4, tokens}) {
              for (int t0 = 0; t0 + len <= tokens; ++t0) {
                const int64_t a0 = static_cast<int64_t>(t0) * group, na = int64_t{len} * group;
                std::vector<float> out(static_cast<size_t>(na * hdv), -7.0f);
                std::vector<float*> orows;
                for (int64_t a = 0; a < na; ++a) orows.push_back(out.data() + a * hdv);
                attention_rows(qr.data() + a0, orows.data(), na, lo.data() + a0, hi.data() + a0,
                               keys.data(), kstride, vals.data(), vstride, hd, hdv, 0.125f,
                               softcap);
                ASSERT_EQ(std::memcmp(out.data(), alone.data() + a0 * hdv,
                                      sizeof(float) * static_cast<size_t>(na * hdv)),
                          0)
                    << target << " " << what << " run of " << len << " at token " << t0;
              }
            }
          });
        }
      }
    }
  }
}

}  // namespace
}  // namespace tandem::kernels
