// The cost per sampled token at Gemma 3's vocabulary (262,144 logits), for the sampler settings
// a server sees: tandem's defaults (top-k 40), an OpenAI-style request (no top-k: temperature
// alone, or with top-p), min-p without top-k, and a repetition penalty. Issue 21: a sampled
// token must not fully sort the vocabulary.
//
//   ./bench_sampler --benchmark_repetitions=9 --benchmark_report_aggregates_only=true
//
// The logits are synthetic but shaped like a language model's: N(0, 3) for most of the
// vocabulary, a few dozen plausible tokens 8-14 above, and one at 18.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "tandem/engine.h"

namespace {

using namespace tandem;

constexpr int kVocab = 262144;

const std::vector<float>& logits() {
  static const std::vector<float> l = [] {
    std::vector<float> v(kVocab);
    std::mt19937 rng(21);
    std::normal_distribution<float> nd(0.0f, 3.0f);
    for (float& x : v) x = nd(rng);
    std::uniform_int_distribution<int> id(0, kVocab - 1);
    std::uniform_real_distribution<float> high(8.0f, 14.0f);
    for (int i = 0; i < 40; ++i) v[id(rng)] = high(rng);
    v[id(rng)] = 18.0f;
    return v;
  }();
  return l;
}

struct Setting {
  const char* name;
  SamplingParams params;
};

SamplingParams make(float temp, int top_k, float top_p, float min_p, float penalty = 1.0f) {
  SamplingParams p;
  p.temp = temp;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.repeat_penalty = penalty;
  p.seed = 42;
  return p;
}

const Setting kSettings[] = {
    {"defaults_k40_p0.95_m0.05_t0.8", make(0.8f, 40, 0.95f, 0.05f)},
    {"openai_t1", make(1.0f, 0, 1.0f, 0.0f)},
    {"openai_t1_p0.9", make(1.0f, 0, 0.9f, 0.0f)},
    {"minp0.05_t0.8", make(0.8f, 0, 1.0f, 0.05f)},
    {"p0.95_m0.05_t0.7_penalty1.1", make(0.7f, 0, 0.95f, 0.05f, 1.1f)},
    {"k5000_t1", make(1.0f, 5000, 1.0f, 0.0f)},
};

void BM_SampleToken(benchmark::State& state) {
  const Setting& s = kSettings[state.range(0)];
  state.SetLabel(s.name);
  Sampler sampler(s.params);
  for (int i = 0; i < 64; ++i) sampler.accept(i * 977 % kVocab);  // a history for the penalty
  const auto& l = logits();
  for (auto _ : state) benchmark::DoNotOptimize(sampler.sample(l));
}
BENCHMARK(BM_SampleToken)->DenseRange(0, 5)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
