// The error answer's body, {"error":{"code","message",...}}: one shape for the cloud server, the
// browser view and the HTTP server's own refusals (tandem/http_server.h).
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "tandem/http_server.h"

namespace tandem::net {

std::string error_json(std::string_view code, std::string_view message,
                       std::string_view extra_members) {
  using json = nlohmann::json;
  json e = {{"code", code}, {"message", message}};
  if (!extra_members.empty()) {
    const json extra = json::parse(extra_members, nullptr, false);
    if (extra.is_object()) e.update(extra);
  }
  const json body = {{"error", std::move(e)}};
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace tandem::net
