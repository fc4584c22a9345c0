// A trained router: a small multilayer perceptron over the edge model's router signal.
//
//   features  x = [hidden[n_embd], log top-k probabilities[k], entropy, margin, log1p(position)]
//   layers    z = (x - mean) / scale;  h1 = relu(W1 z + b1);  ...;  score = w_out · h_L + b_out
//
// The score is "more reason to ask the cloud" (a logit for a classification label, the expected
// log-likelihood gain of the cloud for the `gain` label). Each layer's dot products run through
// tandem's f32 SIMD kernels by their public entry (tandem/vector_ops.h): the router layer
// includes no engine or kernel headers (src/layers.txt). A 659×64 layer is ~40k multiply-adds, a
// few microseconds against a ~20 ms decode step. Loading from and saving to GGUF is in
// src/router/router_file.h.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tandem/router.h"

namespace tandem {

// What the feature vector is made of. The order is fixed (see above); n_features() long.
struct RouterFeatureSpec {
  int n_embd = 0;  // hidden-state width of the edge model
  int top_k = 8;   // log-probabilities of the k most likely tokens
  int n_features() const { return n_embd + top_k + 3; }
  std::string describe() const;  // e.g. "hidden[640],log_top_prob[8],entropy,margin,log1p_position"
};

// Writes the raw (unstandardised) features of one position into out[n_features()].
// `log_top_probs` holds at least top_k values, most likely first; `hidden` n_embd values.
void router_features(const RouterFeatureSpec& spec, std::span<const float> hidden,
                     std::span<const float> log_top_probs, float entropy, float margin,
                     int position, float* out);

struct MlpLayer {
  int n_in = 0, n_out = 0;
  std::vector<float> weight;  // [n_out][n_in], row-major
  std::vector<float> bias;    // [n_out]
};

class MlpRouterModel {
 public:
  RouterFeatureSpec spec;
  std::vector<float> mean, scale;  // feature standardisation, [n_features] each (scale > 0)
  std::vector<MlpLayer> layers;    // hidden layers (ReLU) then the output layer (n_out = 1)
  // Calibration from validation scores: threshold[i] leaves share[i] of tokens above it
  // (share descending as threshold ascends).
  std::vector<float> calib_threshold, calib_share;

  // Checks shapes and finiteness; throws std::invalid_argument naming what is wrong.
  void validate() const;
  // Score of raw features x[n_features()].
  float score_features(const float* x) const;
  // Score of a signal; throws std::invalid_argument when it lacks the hidden state or has
  // fewer than top_k probabilities.
  float score(const RouterSignal& signal) const;
  // The calibration threshold that leaves about `share` of tokens above it.
  double threshold_for_share(double share) const;
  // Calibration scores spread over the quantiles (n of them), to seed a target-rate controller.
  std::vector<float> prior_scores(int n) const;
};

}  // namespace tandem
