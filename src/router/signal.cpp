// The router's signal from one logits row of the small model.
#include <algorithm>
#include <cmath>

#include "tandem/router.h"
#include "tandem/vector_ops.h"

namespace tandem {

RouterSignal router_signal_from_logits(std::span<const float> logits, int position, int top_k) {
  RouterSignal s;
  s.position = position;
  if (logits.empty()) return s;
  const LogitStats stats = logit_stats(logits);
  s.entropy = static_cast<float>(stats.entropy);
  const int k = std::min(std::max(top_k, 2), static_cast<int>(logits.size()));
  const std::vector<TokenLogProb> top = top_n(logits, k, stats.log_z);
  s.top_probs.resize(k);
  for (int i = 0; i < k; ++i) s.top_probs[i] = static_cast<float>(std::exp(top[i].log_prob));
  s.margin = s.top_probs.size() >= 2 ? s.top_probs[0] - s.top_probs[1] : s.top_probs[0];
  return s;
}

}  // namespace tandem
