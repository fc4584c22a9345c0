// The trained router's decision cost per token: features from the signal, the MLP's forward
// pass, and the target-rate controller, at the default pair's shape (Gemma 3 270M: n_embd 640,
// top-8) with random weights (the cost does not depend on their values). Compare with the edge
// model's decode step (`tandem bench -m EDGE -t 1`, tg); the goal is under 2% of it. The counter
// "decision" is the time per decision.
//
//   ./bench_router --benchmark_repetitions=5
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "tandem/router.h"
#include "tandem/router_mlp.h"
#include "tandem/vector_ops.h"

namespace {

using namespace tandem;

std::shared_ptr<MlpRouterModel> random_model(int n_embd, const std::vector<int>& hidden) {
  auto m = std::make_shared<MlpRouterModel>();
  m->spec.n_embd = n_embd;
  m->spec.top_k = 8;
  const int F = m->spec.n_features();
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0, 0.05f);
  m->mean.assign(F, 0.1f);
  m->scale.assign(F, 1.5f);
  int n_in = F;
  std::vector<int> widths = hidden;
  widths.push_back(1);
  for (int w : widths) {
    MlpLayer L;
    L.n_in = n_in;
    L.n_out = w;
    for (int i = 0; i < n_in * w; ++i) L.weight.push_back(nd(rng));
    L.bias.assign(w, 0.01f);
    m->layers.push_back(std::move(L));
    n_in = w;
  }
  for (int i = 0; i <= 128; ++i) {
    m->calib_threshold.push_back(-1 + i / 64.0f);
    m->calib_share.push_back(1 - i / 128.0f);
  }
  m->validate();
  return m;
}

// Decisions per iteration: one offline replay (replay_decisions, as eval and `tandem router
// bench` run it) over a stream this long, so the router's construction is a small share.
constexpr int kStream = 1024;

// The time per decision of replaying `signals` under `config`, as the counter "decision".
void replay_stream(benchmark::State& state, const RouterConfig& config,
                   const std::vector<RouterSignal>& signals) {
  for (auto _ : state) {
    const std::vector<RouteDecision> d = replay_decisions(config, signals);
    benchmark::DoNotOptimize(d.data());
  }
  state.counters["decision"] = benchmark::Counter(
      static_cast<double>(signals.size()),
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

void BM_MlpRouterDecide(benchmark::State& state) {
  const int n_embd = static_cast<int>(state.range(0));
  const std::vector<int> hidden =
      state.range(2)
          ? std::vector<int>{static_cast<int>(state.range(1)), static_cast<int>(state.range(2))}
          : std::vector<int>{static_cast<int>(state.range(1))};
  auto model = random_model(n_embd, hidden);
  std::vector<float> h(n_embd);
  for (int i = 0; i < n_embd; ++i) h[i] = std::sin(0.37f * i) * 3;
  RouterSignal s;
  s.hidden = h;
  s.top_probs = {0.4f, 0.2f, 0.1f, 0.05f, 0.03f, 0.02f, 0.01f, 0.01f};
  s.entropy = 2.1f;
  s.margin = 0.2f;
  std::vector<RouterSignal> signals(kStream, s);
  for (int i = 0; i < kStream; ++i) signals[i].position = i;
  RouterConfig c;
  c.policy = RouterPolicy::Mlp;
  c.mlp = model;
  c.target_rate = 0.07;
  c.prior_scores = model->prior_scores(c.window);
  replay_stream(state, c, signals);
}
// n_embd, hidden widths: the default pair's 640 with 64 / 64+32; Qwen2.5-0.5B's 896.
BENCHMARK(BM_MlpRouterDecide)->Args({640, 64, 0})->Args({640, 64, 32})->Args({896, 64, 0});

// The heuristic policy with the same controller, for comparison.
void BM_ConfidenceRouterDecide(benchmark::State& state) {
  RouterSignal s;
  s.top_probs = {0.4f, 0.2f, 0.1f, 0.05f, 0.03f, 0.02f, 0.01f, 0.01f};
  RouterConfig c = parse_router_policy("confidence");
  c.target_rate = 0.07;
  replay_stream(state, c, std::vector<RouterSignal>(kStream, s));
}
BENCHMARK(BM_ConfidenceRouterDecide);

// The signal itself, from one logits row of the vocabulary's size (Gemma 3: 262,144): what route
// mode pays at every position before any policy runs (local mode does not). Arg: n_vocab.
void BM_SignalFromLogits(benchmark::State& state) {
  std::vector<float> logits(static_cast<size_t>(state.range(0)));
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0, 3);
  for (float& x : logits) x = nd(rng);
  int position = 0;
  for (auto _ : state) {
    const RouterSignal s = router_signal_from_logits(logits, ++position, 8);
    benchmark::DoNotOptimize(s.entropy);
  }
}
BENCHMARK(BM_SignalFromLogits)->Arg(32000)->Arg(151936)->Arg(262144)->Unit(benchmark::kMicrosecond);

// top_n's scan before its block prefilter (2026-12-07): every logit compared with the heap's
// worst, one at a time. Kept here only to measure the ratio in one run.
std::vector<int> top_n_every_logit(const std::vector<float>& logits, int n) {
  const auto better = [&](int a, int b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::vector<int> best;
  for (int i = 0; i < static_cast<int>(logits.size()); ++i) {
    if (static_cast<int>(best.size()) < n) {
      best.push_back(i);
      std::push_heap(best.begin(), best.end(), better);
    } else if (better(i, best.front())) {
      std::pop_heap(best.begin(), best.end(), better);
      best.back() = i;
      std::push_heap(best.begin(), best.end(), better);
    }
  }
  std::sort(best.begin(), best.end(), better);
  return best;
}

// The top 8 of a row of the Qwen (151,936) and Gemma (262,144) vocabularies: Arg(1) the scan
// top_n does, Arg(0) the one it did. Logits as in BM_SignalFromLogits.
void BM_TopEight(benchmark::State& state) {
  std::vector<float> logits(static_cast<size_t>(state.range(0)));
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0, 3);
  for (float& x : logits) x = nd(rng);
  const bool blocked = state.range(1) == 1;
  for (auto _ : state) {
    if (blocked) {
      benchmark::DoNotOptimize(top_n(logits, 8, 0.0).front().id);
    } else {
      benchmark::DoNotOptimize(top_n_every_logit(logits, 8).front());
    }
  }
}
BENCHMARK(BM_TopEight)->ArgsProduct({{151936, 262144}, {0, 1}})->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
