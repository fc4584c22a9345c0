// libFuzzer target for the router trace reader (src/router/trace.h): parse the input strictly
// and as a resumable file; whatever the reader accepts must encode back to the same bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "common/error.h"
#include "router/trace.h"

namespace {

#define FUZZ_CHECK(cond)                                                             \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      __builtin_printf("fuzz_trace: check failed: %s (line %d)\n", #cond, __LINE__); \
      std::abort();                                                                  \
    }                                                                                \
  } while (0)

// The accepted prefix re-encodes to exactly the bytes it was read from.
void check_round_trip(const tandem::router::TraceFile& tf, const uint8_t* data, size_t valid) {
  std::vector<uint8_t> out = tandem::router::encode_trace_header(tf.header);
  for (const auto& s : tf.sequences) {
    const auto b = tandem::router::encode_trace_sequence(tf.header, s);
    out.insert(out.end(), b.begin(), b.end());
  }
  FUZZ_CHECK(out.size() == valid);
  FUZZ_CHECK(std::memcmp(out.data(), data, valid) == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem::router;
  try {
    size_t valid = 0;
    const TraceFile tf = parse_trace(data, size, "<fuzz>", {}, &valid);
    FUZZ_CHECK(valid == size);
    check_round_trip(tf, data, valid);
  } catch (const tandem::Error&) {
  }
  try {
    TraceReadOptions ro;
    ro.allow_truncated_tail = true;
    size_t valid = 0;
    const TraceFile tf = parse_trace(data, size, "<fuzz>", ro, &valid);
    FUZZ_CHECK(valid <= size);
    check_round_trip(tf, data, valid);
  } catch (const tandem::Error&) {
  }
  return 0;
}
