// The router's signal from one logits row of the small model.
#include <algorithm>
#include <cmath>

#include "kernels/kernels.h"
#include "tandem/client.h"

namespace tandem {

RouterSignal router_signal_from_logits(std::span<const float> logits, int position, int top_k) {
  RouterSignal s;
  s.position = position;
  if (logits.empty()) return s;
  const kernels::LogitStats stats =
      kernels::logit_stats(logits.data(), static_cast<int64_t>(logits.size()));
  s.entropy = static_cast<float>(stats.entropy);
  const int k = std::min(std::max(top_k, 2), static_cast<int>(logits.size()));
  // Top-k logits by partial selection over (value, index) would cost a copy of the row; keep
  // a small sorted buffer instead (k is small).
  std::vector<float> top(k, -INFINITY);
  for (float l : logits) {
    if (l <= top.back()) continue;
    auto it = std::upper_bound(top.begin(), top.end(), l, std::greater<float>());
    top.insert(it, l);
    top.pop_back();
  }
  s.top_probs.resize(k);
  for (int i = 0; i < k; ++i) {
    s.top_probs[i] = static_cast<float>(std::exp(static_cast<double>(top[i]) - stats.log_z));
  }
  s.margin = s.top_probs.size() >= 2 ? s.top_probs[0] - s.top_probs[1] : s.top_probs[0];
  return s;
}

}  // namespace tandem
