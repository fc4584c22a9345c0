// libFuzzer target for `tandem ui`'s request parser (POST /api/generate bodies). Every input must
// end in a request or a RequestError naming a field; anything else (a crash, a sanitizer report,
// another exception) is a bug.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "ui/ui_server.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  try {
    const tandem::ui::GenerateRequest r =
        tandem::ui::parse_generate_request(body, tandem::ui::GenerateRequest{}, {});
    // What the parser lets through is within the limits the decoder relies on.
    if (r.prompt.empty() || r.n_predict < 1 || r.n_predict > tandem::ui::UiLimits{}.max_predict ||
        !(r.temp >= 0 && r.temp <= 2)) {
      __builtin_trap();
    }
  } catch (const tandem::ui::RequestError& e) {
    if (e.field().empty()) __builtin_trap();
  }
  return 0;
}
