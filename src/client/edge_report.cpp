// How an edge answer is reported: its stop reason's name and its stats as JSON, the same for
// `tandem run --json` and the browser view (include/tandem/client.h).
#include <nlohmann/json.hpp>

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

nlohmann::json edge_stats_json(const EdgeStats& s) {
  nlohmann::json j;
  j["tokens"] = s.tokens;
  j["cloud_tokens"] = s.cloud_tokens;
  j["cloud_share"] = s.cloud_share;
  j["route_events"] = s.route_events;
  j["bytes_up"] = s.bytes_up;
  j["bytes_down"] = s.bytes_down;
  j["cloud_ms"] = s.cloud_ms;
  j["wait_ms"] = s.wait_ms;
  j["local_ms"] = s.local_ms;
  j["ttft_ms"] = s.ttft_ms;
  j["tok_s"] = s.tok_s;
  j["fallbacks"] = s.fallbacks;
  j["replays"] = s.replays;
  j["accepted_drafts"] = s.accepted_drafts;
  j["drafted"] = s.drafted;
  j["prefilled_on_route"] = s.prefilled_on_route;
  j["sync_steps"] = s.sync_steps;
  j["sync_failures"] = s.sync_failures;
  j["cloud_failures"] = s.cloud_failures;
  j["route_confirmed"] = s.route_confirmed;
  j["route_changed"] = s.route_changed;
  j["wasted_tokens"] = s.wasted_tokens;
  j["chained_steps"] = s.chained_steps;
  j["cloud_lost"] = s.cloud_lost;
  j["total_ms"] = s.total_ms;
  if (!s.last_cloud_error.empty()) j["last_cloud_error"] = s.last_cloud_error;
  return j;
}

}  // namespace tandem
