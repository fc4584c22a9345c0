// The native protocol's history hash written out on its own, apart from src/common/history_hash.h,
// so that tests pin the wire format (docs/protocol.md, a step's "expected_hash"): FNV-1a 64 over
// each id's 4 bytes, little-endian, as 16 lowercase hex digits.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace tandem::testing {

inline std::string protocol_hash_hex(const std::vector<int32_t>& ids) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const int32_t id : ids) {
    for (int b = 0; b < 4; ++b) {
      h = (h ^ ((static_cast<uint32_t>(id) >> (8 * b)) & 0xffu)) * 0x100000001b3ull;
    }
  }
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(h));
  return out;
}

}  // namespace tandem::testing
