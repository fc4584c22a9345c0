// libFuzzer target for `tandem ui`'s request checks: the POST /api/generate body parser (the
// depth check, then the fields) and the Host/Origin allowlist every route applies. Every input
// must end in a request or a RequestError naming a field, and a refusal that is empty only for
// an allowed Host; anything else (a crash, a sanitizer report, another exception) is a bug.
#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "ui/ui_server.h"

namespace {

// The input's first two lines as Host and Origin of a POST (the same bytes the parser sees).
void check_refusal(std::string_view data) {
  static const std::vector<std::string> hosts = tandem::ui::allowed_hosts(8090);
  tandem::net::HttpRequest request;
  request.method = "POST";
  const size_t first = std::min(data.find('\n'), data.size());
  const std::string_view rest = data.substr(std::min(first + 1, data.size()));
  std::string host(data.substr(0, first));
  request.headers["host"] = host;
  request.headers["origin"] = std::string(rest.substr(0, rest.find('\n')));
  request.headers["content-type"] = "application/json";
  const std::string refused = tandem::ui::request_refusal(request, hosts);
  for (char& c : host) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (refused.empty() && std::find(hosts.begin(), hosts.end(), host) == hosts.end()) {
    __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  check_refusal(body);
  try {
    const tandem::ui::GenerateRequest r =
        tandem::ui::parse_generate_request(body, tandem::ui::GenerateRequest{}, {});
    // What the parser lets through is within the limits the decoder relies on.
    if (r.prompt.empty() || r.prompt.size() > tandem::ui::UiLimits{}.max_prompt_bytes ||
        r.n_predict < 1 || r.n_predict > tandem::ui::UiLimits{}.max_predict ||
        !(r.temp >= 0 && r.temp <= 2)) {
      __builtin_trap();
    }
  } catch (const tandem::ui::RequestError& e) {
    if (e.field().empty()) __builtin_trap();
  }
  return 0;
}
