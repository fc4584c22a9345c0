// How an edge answer is reported: its stop reason's name and its stats as JSON, the same for
// `tandem run --json` and the browser view (include/tandem/client.h).
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <type_traits>

#include "tandem/client.h"

namespace tandem {

std::string stop_reason_name(StopReason stop) {
  switch (stop) {
    case StopReason::EndOfGeneration:
      return "eog";
    case StopReason::ContextFull:
      return "context_full";
    case StopReason::Callback:
      return "stopped";
    case StopReason::Length:
      break;
  }
  return "length";
}

std::string edge_stats_json(const EdgeStats& s) {
  nlohmann::json j;
  visit_edge_stats(
      [&j](const char* name, const auto& field) {
        if constexpr (std::is_same_v<std::decay_t<decltype(field)>, std::string>) {
          if (field.empty()) return;  // only when there was an error
        }
        j[name] = field;
      },
      s);
  return j.dump();
}

void add_edge_stats(EdgeStats& total, const EdgeStats& one) {
  const bool first = total.tokens == 0 && total.total_ms == 0;
  visit_edge_stats(
      [first](std::string_view name, auto& t, const auto& x) {
        using T = std::decay_t<decltype(t)>;
        if constexpr (std::is_same_v<T, std::string>) {
          if (!x.empty()) t = x;
        } else if constexpr (std::is_same_v<T, bool>) {
          t = t || x;
        } else if (name == "ttft_ms") {
          if (first) t = x;
        } else if (name != "cloud_share" && name != "tok_s") {  // recomputed below
          t += x;
        }
      },
      total, one);
  total.cloud_share = total.tokens ? static_cast<double>(total.cloud_tokens) / total.tokens : 0;
  total.tok_s = total.total_ms > 0 ? 1000.0 * total.tokens / total.total_ms : 0;
}

}  // namespace tandem
