#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>

#include "common/error.h"
#include "common/splitmix.h"
#include "kernels/kernels.h"
#include "tandem/engine.h"

namespace tandem {

Sampler::Sampler(const SamplingParams& params) : params_(params) {
  if (params.top_p < 0 || params.min_p < 0 || params.repeat_penalty <= 0 ||
      params.repeat_last_n < 0) {
    throw Error(
        "sampling parameters out of range: top_p and min_p must be >= 0, "
        "repeat_penalty > 0, repeat_last_n >= 0");
  }
  reset();
}

void Sampler::reset() {
  history_.clear();
  rng_state_ = params_.seed == kRandomSeed
                   ? static_cast<uint64_t>(
                         std::chrono::high_resolution_clock::now().time_since_epoch().count())
                   : params_.seed;
}

void Sampler::accept(TokenId token) {
  history_.push_back(token);
  const size_t keep = static_cast<size_t>(std::max(params_.repeat_last_n, 0));
  if (history_.size() > 4 * keep + 64) {
    history_.erase(history_.begin(), history_.end() - static_cast<std::ptrdiff_t>(keep));
  }
}

bool Sampler::greedy() const {
  return params_.temp <= 0 && (params_.repeat_penalty == 1.0f || params_.repeat_last_n <= 0);
}

TokenId Sampler::sample(std::span<const float> logits) {
  const int n = static_cast<int>(logits.size());
  if (n == 0) throw Error("sample: empty logits");
  // Greedy without penalties: the first largest logit, without building the candidate list (a
  // server samples hundreds of rows of 262k logits per batch on one thread).
  if (greedy()) return static_cast<TokenId>(kernels::argmax(logits.data(), n));
  cand_.resize(n);
  for (int i = 0; i < n; ++i) cand_[i] = {logits[i], i};

  // Repetition penalty over the last repeat_last_n accepted tokens (llama.cpp semantics:
  // positive logits are divided, negative ones multiplied).
  if (params_.repeat_penalty != 1.0f && params_.repeat_last_n > 0) {
    const size_t start = history_.size() > static_cast<size_t>(params_.repeat_last_n)
                             ? history_.size() - params_.repeat_last_n
                             : 0;
    std::vector<TokenId> seen(history_.begin() + start, history_.end());
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (TokenId t : seen) {
      if (t < 0 || t >= n) continue;
      float& l = cand_[t].first;
      l = l > 0 ? l / params_.repeat_penalty : l * params_.repeat_penalty;
    }
  }

  auto by_logit = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  if (params_.temp <= 0) {
    return std::min_element(cand_.begin(), cand_.end(), by_logit)->second;
  }

  // top-k: keep the k best (sorted).
  size_t keep = cand_.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < keep) {
    keep = params_.top_k;
    std::partial_sort(cand_.begin(), cand_.begin() + keep, cand_.end(), by_logit);
    cand_.resize(keep);
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }

  // Probabilities of the survivors (at temperature 1, as llama.cpp's top-p/min-p see them).
  auto probs = [&](float temp) {
    std::vector<double> p(cand_.size());
    const double mx = cand_[0].first;
    double sum = 0;
    for (size_t i = 0; i < cand_.size(); ++i) sum += p[i] = std::exp((cand_[i].first - mx) / temp);
    for (double& x : p) x /= sum;
    return p;
  };

  if (params_.top_p < 1.0f) {
    const auto p = probs(1.0f);
    double cum = 0;
    size_t cut = cand_.size();
    for (size_t i = 0; i < p.size(); ++i) {
      cum += p[i];
      if (cum >= params_.top_p) {
        cut = i + 1;
        break;
      }
    }
    cand_.resize(std::max<size_t>(cut, 1));
  }
  if (params_.min_p > 0.0f) {
    const float threshold = cand_[0].first + std::log(params_.min_p);
    size_t cut = 1;
    while (cut < cand_.size() && cand_[cut].first >= threshold) ++cut;
    cand_.resize(cut);
  }

  const auto p = probs(params_.temp);
  const double r = unit_interval(splitmix64(rng_state_));
  double cum = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    cum += p[i];
    if (r < cum) return cand_[i].second;
  }
  return cand_.back().second;
}

}  // namespace tandem
