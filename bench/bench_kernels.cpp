// Kernel microbenchmarks at real model shapes. Bytes/s = weight bytes streamed (plus, for the
// baselines, the buffer read), so vec_dot/matmul throughput can be compared with the memory
// bandwidth baseline BM_ReadSum / BM_Memcpy on the same machine.
//
//   ./bench_kernels --benchmark_filter='Matvec/Q4_K'
//   TANDEM_SIMD_TARGET=AVX2 ./bench_kernels ...   (one of the compiled Highway targets that this
//                                                   CPU supports, instead of the best one)
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/kernels.h"

namespace {

using tandem::TensorType;
namespace k = tandem::kernels;

constexpr size_t kBaselineBytes = size_t{256} << 20;

void BM_ReadSum(benchmark::State& state) {
  std::vector<float> buf(kBaselineBytes / 4, 1.0f);
  for (auto _ : state) {
    float s = 0;
    // 8 independent accumulators so the loop is bandwidth-bound, not latency-bound.
    float acc[8] = {};
    for (size_t i = 0; i < buf.size(); i += 8)
      for (int j = 0; j < 8; ++j) acc[j] += buf[i + j];
    for (float a : acc) s += a;
    benchmark::DoNotOptimize(s);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * kBaselineBytes);
}
BENCHMARK(BM_ReadSum)->Unit(benchmark::kMillisecond);

void BM_Memcpy(benchmark::State& state) {
  std::vector<uint8_t> a(kBaselineBytes, 1), b(kBaselineBytes);
  for (auto _ : state) {
    std::memcpy(b.data(), a.data(), a.size());
    benchmark::DoNotOptimize(b.data());
    benchmark::ClobberMemory();
  }
  // Bytes read (the same amount is written).
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * kBaselineBytes);
}
BENCHMARK(BM_Memcpy)->Unit(benchmark::kMillisecond);

struct Problem {
  std::vector<uint8_t> w, acts;
  size_t w_row = 0, act_row = 0;
};

Problem MakeProblem(TensorType wt, int64_t rows, int64_t kdim, int64_t n_act) {
  Problem p;
  std::mt19937 rng(42);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  p.w_row = tandem::row_bytes(wt, kdim);
  p.w.resize(p.w_row * rows);
  std::uniform_int_distribution<int> byte(0, 255);
  if (tandem::traits(wt).is_quantized) {
    for (auto& b : p.w) b = static_cast<uint8_t>(byte(rng));
    // Keep the f16 scales finite: overwrite them with a small value (offsets per type).
    const uint16_t small = k::f32_to_f16(0.01f);
    const size_t bs = tandem::traits(wt).type_size;
    std::vector<size_t> offs;
    switch (wt) {
      case TensorType::Q2_K:
        offs = {80, 82};
        break;
      case TensorType::Q3_K:
        offs = {108};
        break;
      case TensorType::Q6_K:
        offs = {208};
        break;
      case TensorType::Q4_1:
      case TensorType::Q5_1:
      case TensorType::Q4_K:
      case TensorType::Q5_K:
        offs = {0, 2};
        break;
      default:
        offs = {0};
    }
    for (size_t o = 0; o < p.w.size(); o += bs)
      for (size_t f : offs) std::memcpy(&p.w[o + f], &small, 2);
  } else {
    std::vector<float> f(static_cast<size_t>(rows * kdim));
    for (auto& x : f) x = nd(rng);
    k::quantize_activation_row(wt, f.data(), p.w.data(), rows * kdim);
  }
  const TensorType at = k::activation_type(wt);
  p.act_row = tandem::row_bytes(at, kdim);
  p.acts.resize(p.act_row * n_act);
  std::vector<float> x(static_cast<size_t>(kdim));
  for (int64_t r = 0; r < n_act; ++r) {
    for (auto& v : x) v = nd(rng);
    k::quantize_activation_row(at, x.data(), p.acts.data() + r * p.act_row, kdim);
  }
  return p;
}

// One activation row against all weight rows (decode). Args: type, k, rows.
void BM_Matvec(benchmark::State& state) {
  const auto wt = static_cast<TensorType>(state.range(0));
  const int64_t kdim = state.range(1), rows = state.range(2);
  Problem p = MakeProblem(wt, rows, kdim, 1);
  std::vector<float> y(static_cast<size_t>(rows));
  for (auto _ : state) {
    k::matmul_rows(wt, kdim, p.w.data(), 0, rows, p.acts.data(), p.act_row, 1, y.data(), rows);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * p.w.size()));
  state.SetLabel(std::string(tandem::traits(wt).name) + " " + k::simd_target_name());
}

// vec_dot called row by row (what a naive caller does).
void BM_VecDot(benchmark::State& state) {
  const auto wt = static_cast<TensorType>(state.range(0));
  const int64_t kdim = state.range(1), rows = state.range(2);
  Problem p = MakeProblem(wt, rows, kdim, 1);
  std::vector<float> y(static_cast<size_t>(rows));
  for (auto _ : state) {
    for (int64_t i = 0; i < rows; ++i)
      y[i] = k::vec_dot(wt, kdim, p.w.data() + i * p.w_row, p.acts.data());
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * p.w.size()));
  state.SetLabel(std::string(tandem::traits(wt).name));
}

// Prefill: n_act activation rows. Args: type, k, rows, n_act. Reports weight bytes/s and
// GFLOP/s-equivalent (2 * k * rows * n_act per iteration) as a counter.
void BM_Matmul(benchmark::State& state) {
  const auto wt = static_cast<TensorType>(state.range(0));
  const int64_t kdim = state.range(1), rows = state.range(2), n_act = state.range(3);
  Problem p = MakeProblem(wt, rows, kdim, n_act);
  std::vector<float> y(static_cast<size_t>(rows * n_act));
  for (auto _ : state) {
    k::matmul_rows(wt, kdim, p.w.data(), 0, rows, p.acts.data(), p.act_row, n_act, y.data(), rows);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * p.w.size()));
  state.counters["GMAC/s"] =
      benchmark::Counter(static_cast<double>(kdim * rows * n_act) * state.iterations() / 1e9,
                         benchmark::Counter::kIsRate);
  state.SetLabel(std::string(tandem::traits(wt).name));
}

// BM_Matmul with the weights packed once beforehand (kernels::PackedWeights, as tandem serve
// loads them): the per-call staging of every weight tile is gone.
void BM_MatmulPacked(benchmark::State& state) {
  const auto wt = static_cast<TensorType>(state.range(0));
  const int64_t kdim = state.range(1), rows = state.range(2), n_act = state.range(3);
  Problem p = MakeProblem(wt, rows, kdim, n_act);
  const k::PackedWeights packed = k::PackedWeights::pack(wt, kdim, p.w.data(), rows);
  // 64-byte aligned, as the engine's logits (streaming stores need it).
  std::vector<float> y_buf(static_cast<size_t>(rows * n_act) + 16);
  float* y = y_buf.data() + (16 - reinterpret_cast<uintptr_t>(y_buf.data()) % 64 / 4) % 16;
  for (auto _ : state) {
    k::matmul_rows(wt, kdim, p.w.data(), 0, rows, p.acts.data(), p.act_row, n_act, y, rows,
                   &packed);
    benchmark::DoNotOptimize(y);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * packed.bytes()));
  state.counters["GMAC/s"] =
      benchmark::Counter(static_cast<double>(kdim * rows * n_act) * state.iterations() / 1e9,
                         benchmark::Counter::kIsRate);
  state.SetLabel(std::string(tandem::traits(wt).name));
}

void QuantizeActivation(benchmark::State& state) {
  const auto at = static_cast<TensorType>(state.range(0));
  const int64_t n = state.range(1);
  std::vector<float> x(static_cast<size_t>(n), 0.5f);
  std::vector<uint8_t> out(tandem::row_bytes(at, n));
  for (auto _ : state) {
    k::quantize_activation_row(at, x.data(), out.data(), n);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n * 4));
}

// Prefill attention of one run of 4 tokens x `group` query heads of one KV head over n_k cached
// keys (attention_rows), as Gemma 3 270M (group 4, head 256) and Qwen2.5 0.5B (group 7, head 64)
// run it at the end of a 512-token prompt. Counts the multiply-adds of scores plus values.
void BM_AttentionRows(benchmark::State& state) {
  const int group = static_cast<int>(state.range(0));
  const int64_t hd = state.range(1), n_k = state.range(2);
  const int tokens = 4, n_q = tokens * group;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(n_q * hd)), kv(static_cast<size_t>(n_k * hd));
  for (auto& x : q) x = nd(rng);
  for (auto& x : kv) x = nd(rng);
  std::vector<float> out(q.size());
  std::vector<const float*> qr;
  std::vector<float*> outr;
  std::vector<int32_t> lo, hi;
  for (int a = 0; a < n_q; ++a) {
    qr.push_back(q.data() + a * hd);
    outr.push_back(out.data() + a * hd);
    lo.push_back(0);
    hi.push_back(static_cast<int32_t>(n_k - tokens + 1 + a / group));
  }
  for (auto _ : state) {
    k::attention_rows(qr.data(), outr.data(), n_q, lo.data(), hi.data(), kv.data(),
                      static_cast<size_t>(hd), kv.data(), static_cast<size_t>(hd), hd, hd, 0.0625f,
                      0.0f);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["GMAC/s"] =
      benchmark::Counter(2.0 * n_q * hd * static_cast<double>(n_k) * state.iterations() / 1e9,
                         benchmark::Counter::kIsRate);
}
BENCHMARK(BM_AttentionRows)->Args({4, 256, 512})->Args({7, 64, 512})->Unit(benchmark::kMicrosecond);

// Decode attention as a server's batch runs it: n_seq sequences, each one token of `group` query
// heads over its own n_k cached keys and values (Gemma 3 270M: group 4, head 256), so that the
// caches (2 KiB per key of every sequence) stream from memory as they do at depth. Counts the
// multiply-adds of scores plus values over all sequences.
// Args: query heads per KV head, head size, keys, sequences, cache element bytes (4: f32, 2: f16).
void BM_AttentionDecode(benchmark::State& state) {
  const int group = static_cast<int>(state.range(0));
  const int64_t hd = state.range(1), n_k = state.range(2), n_seq = state.range(3);
  const TensorType kv = state.range(4) == 2 ? TensorType::F16 : TensorType::F32;
  const size_t elem = state.range(4) == 2 ? 2 : 4;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(group * hd)), out(q.size()),
      row(static_cast<size_t>(hd));
  // Each sequence's cache rows, [n_k][hd] of the cache type.
  std::vector<tandem::HugePageVector<uint8_t>> keys(n_seq), vals(n_seq);
  for (int64_t s = 0; s < n_seq; ++s) {
    for (auto* rows : {&keys[s], &vals[s]}) {
      rows->resize(static_cast<size_t>(n_k * hd) * elem);
      for (int64_t j = 0; j < n_k; ++j) {
        for (auto& x : row) x = nd(rng);
        k::quantize_activation_row(kv, row.data(), rows->data() + j * hd * elem, hd);
      }
    }
  }
  for (auto& x : q) x = nd(rng);
  std::vector<const float*> qr;
  std::vector<float*> outr;
  std::vector<int32_t> lo(group, 0), hi(group, static_cast<int32_t>(n_k));
  for (int a = 0; a < group; ++a) {
    qr.push_back(q.data() + a * hd);
    outr.push_back(out.data() + a * hd);
  }
  for (auto _ : state) {
    for (int64_t s = 0; s < n_seq; ++s) {
      k::attention_rows(qr.data(), outr.data(), group, lo.data(), hi.data(), kv, keys[s].data(),
                        static_cast<size_t>(hd), kv, vals[s].data(), static_cast<size_t>(hd), hd,
                        hd, 0.0625f, 0.0f);
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["GMAC/s"] = benchmark::Counter(
      2.0 * group * hd * static_cast<double>(n_k) * n_seq * state.iterations() / 1e9,
      benchmark::Counter::kIsRate);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n_seq * n_k * hd * 2 * elem));
}
BENCHMARK(BM_AttentionDecode)
    ->Args({4, 256, 512, 1, 4})
    ->Args({4, 256, 512, 32, 4})
    ->Args({4, 256, 1024, 32, 4})
    ->Args({4, 256, 128, 32, 4})
    ->Args({4, 256, 512, 1, 2})
    ->Args({4, 256, 512, 32, 2})
    ->Args({4, 256, 1024, 32, 2})
    ->Args({4, 256, 128, 32, 2})
    ->Unit(benchmark::kMicrosecond);

constexpr int64_t T(TensorType t) {
  return static_cast<int64_t>(t);
}

void MatvecShapes(benchmark::internal::Benchmark* b) {
  // k x rows. 32-element block types: Gemma 3 270M attn/ffn 640x2048 and 2048x640, Qwen2.5 0.5B
  // 896x4864. K-quants need k % 256 == 0 (llama.cpp falls back to Q5_0/Q8_0 for k = 640/896):
  // 2048x640 (ffn_down), 1024x4096, 4864x896.
  for (TensorType t : {TensorType::Q5_0, TensorType::Q8_0, TensorType::Q4_0, TensorType::Q4_1,
                       TensorType::Q5_1, TensorType::F16, TensorType::BF16, TensorType::F32}) {
    b->Args({T(t), 640, 2048});
    b->Args({T(t), 2048, 640});
    b->Args({T(t), 896, 4864});
  }
  for (TensorType t :
       {TensorType::Q4_K, TensorType::Q6_K, TensorType::Q5_K, TensorType::Q3_K, TensorType::Q2_K}) {
    b->Args({T(t), 2048, 640});
    b->Args({T(t), 1024, 4096});
    b->Args({T(t), 4864, 896});
  }
  // Qwen2.5 1.5B ffn_up (Q4_K) and ffn_down (Q6_K), and a 100 MB-class row count that no cache
  // holds: decode streams its weights from memory.
  for (TensorType t : {TensorType::Q4_K, TensorType::Q6_K}) {
    b->Args({T(t), 1536, 8960});
    b->Args({T(t), 8960, 1536});
    b->Args({T(t), 1536, 65536});
  }
  // Gemma 3 output projection (tied Q8_0 embedding): 640 x 262144.
  b->Args({T(TensorType::Q8_0), 640, 262144});
}

// A server's batches of decode rows (8, 32, 64 sessions) through the Gemma 3 270M layer matrices
// and its LM head. Args: type, k, rows, n_act.
void ServerBatchShapes(benchmark::internal::Benchmark* b) {
  b->Args({T(TensorType::Q5_0), 640, 2048, 32});
  b->Args({T(TensorType::Q8_0), 640, 2048, 32});
  b->Args({T(TensorType::Q6_K), 2048, 640, 32});
  b->Args({T(TensorType::Q4_K), 2048, 640, 32});
  for (int64_t n_act : {8, 32, 64}) b->Args({T(TensorType::Q8_0), 640, 262144, n_act});
}

BENCHMARK(BM_Matvec)->Apply(MatvecShapes)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_VecDot)
    ->Args({T(TensorType::Q4_K), 2048, 640})
    ->Args({T(TensorType::Q8_0), 640, 2048})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Matmul)
    ->Args({T(TensorType::Q4_K), 2048, 640, 512})
    ->Args({T(TensorType::Q6_K), 2048, 640, 512})
    ->Args({T(TensorType::Q5_0), 2048, 640, 512})
    ->Args({T(TensorType::Q5_0), 640, 2048, 512})
    ->Args({T(TensorType::Q8_0), 640, 2048, 512})
    ->Args({T(TensorType::F16), 640, 2048, 64})
    ->Apply(ServerBatchShapes)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MatmulPacked)
    ->Args({T(TensorType::Q8_0), 640, 2048, 512})
    ->Args({T(TensorType::Q5_0), 640, 2048, 1})
    ->Args({T(TensorType::Q5_0), 640, 2048, 2})
    ->Args({T(TensorType::Q5_0), 640, 2048, 4})
    ->Args({T(TensorType::Q4_K), 2048, 640, 4})
    ->Args({T(TensorType::Q8_0), 640, 262144, 1})
    ->Args({T(TensorType::Q8_0), 640, 262144, 2})
    ->Args({T(TensorType::Q8_0), 640, 262144, 4})
    ->Apply(ServerBatchShapes)
    // The LM head's shape cut to sizes that fit the L3 cache and that do not.
    ->Args({T(TensorType::Q8_0), 640, 8192, 32})
    ->Args({T(TensorType::Q8_0), 640, 32768, 32})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(QuantizeActivation)
    ->Args({T(TensorType::Q8_0), 2048})
    ->Args({T(TensorType::Q8_K), 2048})
    ->Args({T(TensorType::F16), 2048});

}  // namespace

int main(int argc, char** argv) {
  if (const char* want = std::getenv("TANDEM_SIMD_TARGET")) {
    try {
      k::set_simd_target(want);
    } catch (const std::invalid_argument& e) {
      std::fprintf(stderr, "TANDEM_SIMD_TARGET: %s\n", e.what());
      return 2;
    }
  }
  benchmark::AddCustomContext("simd_target", k::simd_target_name());
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
