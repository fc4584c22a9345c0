// libFuzzer target for the server's request parsers: the native protocol's step and the
// completion requests. Every input must end in a parsed request or a tandem::Error that names
// the problem; anything else (a crash, a sanitizer report, another exception) is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/error.h"
#include "server/api.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  try {
    tandem::server::parse_step_for_fuzzing(body, 1000);
  } catch (const tandem::Error&) {
  }
  try {
    tandem::server::parse_completion_for_fuzzing(body, 1000);
  } catch (const tandem::Error&) {
  }
  return 0;
}
