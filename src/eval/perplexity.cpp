// Perplexity and KL statistics; see tandem/perplexity.h.
#include "tandem/perplexity.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"

namespace tandem::eval {

double token_logprob(std::span<const float> logits, int token) {
  if (token < 0 || static_cast<size_t>(token) >= logits.size()) {
    throw Error("perplexity: token id " + std::to_string(token) + " outside the vocabulary of " +
                std::to_string(logits.size()));
  }
  float max = logits[0];
  for (float v : logits) max = std::max(max, v);
  double sum = 0;
  for (float v : logits) sum += std::exp(static_cast<double>(v) - max);
  return static_cast<double>(logits[token]) - max - std::log(sum);
}

void log_softmax(std::span<const float> logits, std::vector<double>& out) {
  out.resize(logits.size());
  float max = logits[0];
  for (float v : logits) max = std::max(max, v);
  double sum = 0;
  for (float v : logits) sum += std::exp(static_cast<double>(v) - max);
  const double lse = max + std::log(sum);
  for (size_t i = 0; i < logits.size(); ++i) out[i] = logits[i] - lse;
}

double PplStats::ppl() const {
  return std::exp(mean_nll());
}

double PplStats::ppl_error() const {
  if (count < 2) return 0;
  const double m = sum_nll / count;
  const double var = sum_nll2 / count - m * m;
  if (var <= 0) return 0;
  return std::sqrt(var / (count - 1)) * ppl();
}

void KlStats::add(std::span<const float> base, std::span<const float> model) {
  if (base.size() != model.size() || base.empty()) {
    throw Error("kl-divergence: base vocabulary has " + std::to_string(base.size()) +
                " entries, model " + std::to_string(model.size()));
  }
  log_softmax(base, lb_);
  log_softmax(model, lm_);
  double kl = 0;
  for (size_t i = 0; i < lb_.size(); ++i) kl += std::exp(lb_[i]) * (lb_[i] - lm_[i]);
  if (kl < 0) kl = 0;  // rounding
  sum_kl += kl;
  sum_kl2 += kl * kl;
  const auto ab = std::max_element(base.begin(), base.end()) - base.begin();
  const auto am = std::max_element(model.begin(), model.end()) - model.begin();
  if (ab == am) ++n_same_top;
  ++count;
}

double KlStats::kl_error() const {
  if (count < 2) return 0;
  const double m = sum_kl / count;
  const double var = sum_kl2 / count - m * m;
  return var > 0 ? std::sqrt(var / (count - 1)) : 0;
}

double KlStats::top1_error() const {
  if (count < 2) return 0;
  const double p = top1();
  return std::sqrt(p * (1 - p) / (count - 1));
}

int n_chunks(int64_t n_tokens, int n_ctx, int max_chunks) {
  if (n_ctx <= 0) return 0;
  int64_t n = n_tokens / n_ctx;
  if (max_chunks > 0) n = std::min<int64_t>(n, max_chunks);
  return static_cast<int>(n);
}

}  // namespace tandem::eval
