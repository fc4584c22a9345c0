// The sampler without a full sort (issue 21) draws exactly what the full-sort algorithm drew:
// that algorithm is kept here as the reference (src/runtime/sampler.cpp before the change), and
// both run on the same logits, seeds and histories for every combination of temperature, top-k
// (both the partial_sort path, k <= n/32, and the large-k path), top-p, min-p and repetition
// penalty. Logits come from a few shapes: many ties, +-0, a wide spread (so part of the vocabulary
// is below the normalizer's cut), -inf entries, and Gemma's 262,144-entry vocabulary.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/splitmix.h"
#include "tandem/engine.h"

namespace tandem {
namespace {

// The full-sort sampler, verbatim in its steps.
class ReferenceSampler {
 public:
  explicit ReferenceSampler(const SamplingParams& p) : params_(p), rng_state_(p.seed) {}
  void accept(TokenId t) {
    history_.push_back(t);
    const size_t keep = static_cast<size_t>(std::max(params_.repeat_last_n, 0));
    if (history_.size() > 4 * keep + 64)
      history_.erase(history_.begin(), history_.end() - static_cast<std::ptrdiff_t>(keep));
  }

  TokenId sample(const std::vector<float>& logits) {
    const int n = static_cast<int>(logits.size());
    std::vector<std::pair<float, TokenId>> cand(n);
    for (int i = 0; i < n; ++i) cand[i] = {logits[i], i};
    if (params_.repeat_penalty != 1.0f && params_.repeat_last_n > 0) {
      const size_t start = history_.size() > static_cast<size_t>(params_.repeat_last_n)
                               ? history_.size() - params_.repeat_last_n
                               : 0;
      std::vector<TokenId> seen(history_.begin() + start, history_.end());
      std::sort(seen.begin(), seen.end());
      seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
      for (TokenId t : seen) {
        if (t < 0 || t >= n) continue;
        float& l = cand[t].first;
        l = l > 0 ? l / params_.repeat_penalty : l * params_.repeat_penalty;
      }
    }
    auto by_logit = [](const auto& a, const auto& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    if (params_.temp <= 0) return std::min_element(cand.begin(), cand.end(), by_logit)->second;
    size_t keep = cand.size();
    if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < keep) {
      keep = params_.top_k;
      std::partial_sort(cand.begin(), cand.begin() + keep, cand.end(), by_logit);
      cand.resize(keep);
    } else {
      std::sort(cand.begin(), cand.end(), by_logit);
    }
    auto probs = [&](float temp) {
      std::vector<double> p(cand.size());
      const double mx = cand[0].first;
      double sum = 0;
      for (size_t i = 0; i < cand.size(); ++i) sum += p[i] = std::exp((cand[i].first - mx) / temp);
      for (double& x : p) x /= sum;
      return p;
    };
    if (params_.top_p < 1.0f) {
      const auto p = probs(1.0f);
      double cum = 0;
      size_t cut = cand.size();
      for (size_t i = 0; i < p.size(); ++i) {
        cum += p[i];
        if (cum >= params_.top_p) {
          cut = i + 1;
          break;
        }
      }
      cand.resize(std::max<size_t>(cut, 1));
    }
    if (params_.min_p > 0.0f) {
      const float threshold = cand[0].first + std::log(params_.min_p);
      size_t cut = 1;
      while (cut < cand.size() && cand[cut].first >= threshold) ++cut;
      cand.resize(cut);
    }
    const auto p = probs(params_.temp);
    const double r = unit_interval(splitmix64(rng_state_));
    double cum = 0;
    for (size_t i = 0; i < p.size(); ++i) {
      cum += p[i];
      if (r < cum) return cand[i].second;
    }
    return cand.back().second;
  }

 private:
  SamplingParams params_;
  uint64_t rng_state_;
  std::vector<TokenId> history_;
};

enum class Shape { Ties, Zeros, Wide, NegInf, Smooth };

std::vector<float> make_logits(Shape shape, int n, uint64_t& rng) {
  std::vector<float> l(n);
  auto gauss = [&] {  // Box-Muller on splitmix, platform-independent
    const double u1 = unit_interval(splitmix64(rng)) + 1e-12, u2 = unit_interval(splitmix64(rng));
    return std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  };
  for (int i = 0; i < n; ++i) {
    switch (shape) {
      case Shape::Ties:  // eight values only: ties everywhere, including for the best
        l[i] = static_cast<float>(splitmix64(rng) % 8) * 0.5f;
        break;
      case Shape::Zeros:  // -0 and +0 among the best, which compare equal
        l[i] = splitmix64(rng) % 3 == 0 ? (splitmix64(rng) % 2 ? 0.0f : -0.0f)
                                        : -static_cast<float>(1 + splitmix64(rng) % 5);
        break;
      case Shape::Wide:  // a spread of ~80: much of it below exp(-37.5) of the best
        l[i] = static_cast<float>(gauss() * 20);
        break;
      case Shape::NegInf:  // masked tokens
        l[i] = splitmix64(rng) % 4 == 0 ? -std::numeric_limits<float>::infinity()
                                        : static_cast<float>(gauss() * 3);
        break;
      case Shape::Smooth:
        l[i] = static_cast<float>(gauss() * 3);
        break;
    }
  }
  if (shape == Shape::Smooth || shape == Shape::Wide)
    for (int k = 0; k < 8; ++k) l[splitmix64(rng) % n] = 12.0f + k;  // a few clear favourites
  return l;
}

// Runs both samplers over `draws` draws (accepting each drawn token, so the penalty history
// grows the same way) and counts the draws compared.
int compare(const SamplingParams& p, const std::vector<float>& logits, int draws) {
  Sampler fast(p);
  ReferenceSampler ref(p);
  for (int i = 0; i < 20; ++i) {  // a history, some of it repeated, for the penalty
    const TokenId t = (i * 7919) % static_cast<int>(logits.size());
    fast.accept(t);
    ref.accept(t);
  }
  for (int d = 0; d < draws; ++d) {
    const TokenId want = ref.sample(logits);
    const TokenId got = fast.sample(logits);
    EXPECT_EQ(got, want) << "draw " << d << " seed " << p.seed << " temp " << p.temp << " top_k "
                         << p.top_k << " top_p " << p.top_p << " min_p " << p.min_p << " penalty "
                         << p.repeat_penalty << " n " << logits.size();
    if (got != want) return d + 1;
    fast.accept(got);
    ref.accept(want);
  }
  return draws;
}

TEST(SamplerEquivalence, SameTokenAsTheFullSortForEverySetting) {
  uint64_t rng = 2021;
  int compared = 0;
  const int n = 3000;  // top-k 40 and 2000 take the two paths; above the radix sort's 256
  for (Shape shape : {Shape::Ties, Shape::Zeros, Shape::Wide, Shape::NegInf, Shape::Smooth}) {
    const std::vector<float> logits = make_logits(shape, n, rng);
    for (float temp : {0.0f, 0.25f, 0.8f, 1.0f, 1.7f})
      for (int top_k : {0, 1, 7, 40, 2000, n, n + 5})
        for (float top_p : {1.0f, 0.999f, 0.9f, 0.3f, 0.0f})
          for (float min_p : {0.0f, 1e-30f, 0.05f, 0.6f})
            for (float penalty : {1.0f, 1.3f}) {
              SamplingParams p;
              p.temp = temp;
              p.top_k = top_k;
              p.top_p = top_p;
              p.min_p = min_p;
              p.repeat_penalty = penalty;
              p.seed = splitmix64(rng) & 0xFFFFFFF;
              compared += compare(p, logits, 3);
              if (HasFailure()) return;
            }
  }
  EXPECT_EQ(compared, 5 * 5 * 7 * 5 * 4 * 2 * 3);
}

TEST(SamplerEquivalence, ManySeedsOnRandomLogits) {
  uint64_t rng = 7;
  for (int round = 0; round < 300; ++round) {
    const auto shape = static_cast<Shape>(round % 5);
    const int n = 1 + static_cast<int>(splitmix64(rng) % 5000);
    const std::vector<float> logits = make_logits(shape, n, rng);
    SamplingParams p;
    p.temp = 0.05f + static_cast<float>(unit_interval(splitmix64(rng)) * 2);
    p.top_k = static_cast<int>(splitmix64(rng) % 3 == 0 ? 0 : splitmix64(rng) % (n + 2));
    p.top_p = splitmix64(rng) % 2 ? 1.0f : static_cast<float>(unit_interval(splitmix64(rng)));
    p.min_p = splitmix64(rng) % 2 ? 0.0f : static_cast<float>(unit_interval(splitmix64(rng)));
    p.repeat_penalty = splitmix64(rng) % 2 ? 1.0f : 1.5f;
    p.seed = splitmix64(rng) & 0xFFFFFFF;
    compare(p, logits, 20);
    if (HasFailure()) return;
  }
}

TEST(SamplerEquivalence, GemmaSizedVocabulary) {
  uint64_t rng = 262144;
  const std::vector<float> logits = make_logits(Shape::Smooth, 262144, rng);
  for (float temp : {0.3f, 1.0f})
    for (int top_k : {0, 40, 5000, 100000})
      for (float top_p : {1.0f, 0.95f})
        for (float min_p : {0.0f, 0.05f}) {
          SamplingParams p;
          p.temp = temp;
          p.top_k = top_k;
          p.top_p = top_p;
          p.min_p = min_p;
          p.seed = splitmix64(rng) & 0xFFFFFFF;
          compare(p, logits, 4);
          if (HasFailure()) return;
        }
}

}  // namespace
}  // namespace tandem
