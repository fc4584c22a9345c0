// The trained router's forward pass (see include/tandem/router_mlp.h).
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "tandem/router_mlp.h"
#include "tandem/vector_ops.h"

namespace tandem {

std::string RouterFeatureSpec::describe() const {
  return "hidden[" + std::to_string(n_embd) + "],log_top_prob[" + std::to_string(top_k) +
         "],entropy,margin,log1p_position";
}

void router_features(const RouterFeatureSpec& spec, std::span<const float> hidden,
                     std::span<const float> log_top_probs, float entropy, float margin,
                     int position, float* out) {
  std::copy_n(hidden.begin(), spec.n_embd, out);
  out += spec.n_embd;
  // A probability of exactly 0 would give -inf; -30 nats is far below anything a model says.
  for (int i = 0; i < spec.top_k; ++i) out[i] = std::max(log_top_probs[i], -30.0f);
  out += spec.top_k;
  out[0] = entropy;
  out[1] = margin;
  out[2] = std::log1p(static_cast<float>(std::max(position, 0)));
}

void MlpRouterModel::validate() const {
  const int F = spec.n_features();
  auto fail = [](const std::string& m) { throw std::invalid_argument("router model: " + m); };
  if (spec.n_embd <= 0 || spec.top_k < 2) fail("bad feature spec " + spec.describe());
  if (static_cast<int>(mean.size()) != F || static_cast<int>(scale.size()) != F) {
    fail("standardisation has " + std::to_string(mean.size()) + "/" + std::to_string(scale.size()) +
         " entries, expected " + std::to_string(F));
  }
  for (int i = 0; i < F; ++i) {
    if (!std::isfinite(mean[i]) || !(scale[i] > 0) || !std::isfinite(scale[i])) {
      fail("feature " + std::to_string(i) + " has mean " + std::to_string(mean[i]) + " and scale " +
           std::to_string(scale[i]) + " (expected finite, scale > 0)");
    }
  }
  if (layers.empty()) fail("no layers");
  int n_in = F;
  for (size_t l = 0; l < layers.size(); ++l) {
    const MlpLayer& L = layers[l];
    if (L.n_in != n_in || L.n_out <= 0 ||
        L.weight.size() != static_cast<size_t>(L.n_in) * L.n_out ||
        L.bias.size() != static_cast<size_t>(L.n_out)) {
      fail("layer " + std::to_string(l) + " is " + std::to_string(L.n_out) + "x" +
           std::to_string(L.n_in) + " with " + std::to_string(L.weight.size()) + " weights, " +
           std::to_string(L.bias.size()) + " biases; expected " + std::to_string(n_in) + " inputs");
    }
    for (float w : L.weight)
      if (!std::isfinite(w)) fail("layer " + std::to_string(l) + " has a non-finite weight");
    for (float b : L.bias)
      if (!std::isfinite(b)) fail("layer " + std::to_string(l) + " has a non-finite bias");
    n_in = L.n_out;
  }
  if (n_in != 1) fail("the output layer has " + std::to_string(n_in) + " outputs, expected 1");
  if (calib_threshold.size() != calib_share.size()) {
    fail("calibration table has " + std::to_string(calib_threshold.size()) + " thresholds and " +
         std::to_string(calib_share.size()) + " shares");
  }
}

float MlpRouterModel::score_features(const float* x) const {
  // Two scratch rows, [max layer width] each; thread_local so score() stays const and
  // allocation-free after the first call.
  thread_local std::vector<float> a, b;
  const int F = spec.n_features();
  a.resize(F);
  for (int i = 0; i < F; ++i) a[i] = (x[i] - mean[i]) / scale[i];
  for (size_t l = 0; l < layers.size(); ++l) {
    const MlpLayer& L = layers[l];
    const bool last = l + 1 == layers.size();
    b.resize(L.n_out);
    for (int o = 0; o < L.n_out; ++o) {
      const float acc =
          vector_dot(L.weight.data() + static_cast<size_t>(o) * L.n_in, a.data(), L.n_in) +
          L.bias[o];
      b[o] = last ? acc : std::max(acc, 0.0f);
    }
    std::swap(a, b);
  }
  return a[0];
}

float MlpRouterModel::score(const RouterSignal& s) const {
  if (static_cast<int>(s.hidden.size()) != spec.n_embd) {
    throw std::invalid_argument("router model: the signal carries a hidden state of " +
                                std::to_string(s.hidden.size()) + " values, expected " +
                                std::to_string(spec.n_embd));
  }
  if (static_cast<int>(s.top_probs.size()) < spec.top_k) {
    throw std::invalid_argument("router model: the signal carries " +
                                std::to_string(s.top_probs.size()) + " top probabilities, " +
                                "expected " + std::to_string(spec.top_k));
  }
  thread_local std::vector<float> x, log_top;
  x.resize(spec.n_features());
  log_top.resize(spec.top_k);
  for (int i = 0; i < spec.top_k; ++i) log_top[i] = std::log(s.top_probs[i]);
  router_features(spec, s.hidden, log_top, s.entropy, s.margin, s.position, x.data());
  return score_features(x.data());
}

double MlpRouterModel::threshold_for_share(double share) const {
  if (calib_threshold.empty()) return 0;
  // calib_share descends as the threshold ascends: take the first threshold whose share is at
  // most the one asked for.
  for (size_t i = 0; i < calib_share.size(); ++i)
    if (calib_share[i] <= share) return calib_threshold[i];
  return calib_threshold.back();
}

std::vector<float> MlpRouterModel::prior_scores(int n) const {
  std::vector<float> out;
  if (calib_threshold.size() < 2 || n <= 0) return out;
  // The table's thresholds are score quantiles; interpolate n evenly spaced ones.
  for (int i = 0; i < n; ++i) {
    const double pos = (i + 0.5) / n * static_cast<double>(calib_threshold.size() - 1);
    const size_t lo = static_cast<size_t>(pos);
    const size_t hi = std::min(lo + 1, calib_threshold.size() - 1);
    const double f = pos - static_cast<double>(lo);
    out.push_back(static_cast<float>(calib_threshold[lo] * (1 - f) + calib_threshold[hi] * f));
  }
  return out;
}

}  // namespace tandem
