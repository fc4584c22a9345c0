// Helpers shared by the GGUF tests: a little-endian byte builder for hand-made (often hostile)
// files, parsing with the error message captured, and locating the real default model.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "common/default_model.h"
#include "common/error.h"
#include "gguf/gguf.h"

namespace tandem::testing {

class Bytes {
 public:
  Bytes& u8(uint8_t v) { return raw(v); }
  Bytes& u32(uint32_t v) { return raw(v); }
  Bytes& i32(int32_t v) { return raw(v); }
  Bytes& u64(uint64_t v) { return raw(v); }
  Bytes& f32(float v) { return raw(v); }
  Bytes& str(std::string_view s) {
    u64(s.size());
    b_.insert(b_.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& magic(std::string_view m = "GGUF") {
    b_.insert(b_.end(), m.begin(), m.end());
    return *this;
  }
  // "GGUF", version, tensor count, metadata count.
  Bytes& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    return magic().u32(version).u64(n_tensors).u64(n_kv);
  }
  // A metadata key with a uint32 value.
  Bytes& kv_u32(std::string_view key, uint32_t v) { return str(key).u32(4).u32(v); }
  // A tensor info entry.
  Bytes& tensor(std::string_view name, std::vector<uint64_t> ne, uint32_t type, uint64_t off) {
    str(name).u32(static_cast<uint32_t>(ne.size()));
    for (uint64_t n : ne) u64(n);
    return u32(type).u64(off);
  }
  Bytes& pad_to(size_t alignment) {
    while (b_.size() % alignment) b_.push_back(0);
    return *this;
  }
  Bytes& zeros(size_t n) {
    b_.resize(b_.size() + n, 0);
    return *this;
  }
  size_t size() const { return b_.size(); }
  const std::vector<uint8_t>& bytes() const { return b_; }

 private:
  template <typename T>
  Bytes& raw(T v) {
    const size_t at = b_.size();
    b_.resize(at + sizeof(T));
    std::memcpy(b_.data() + at, &v, sizeof(T));
    return *this;
  }
  std::vector<uint8_t> b_;
};

inline std::unique_ptr<GgufFile> parse(const std::vector<uint8_t>& b) {
  return GgufFile::from_memory(b.data(), b.size(), "mem.gguf");
}

// Parses b, which must fail with tandem::Error; returns the message ("" and a test failure when it
// parsed, or threw anything else).
inline std::string parse_error(const std::vector<uint8_t>& b) {
  try {
    parse(b);
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected tandem::Error, got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected tandem::Error, but the " << b.size() << "-byte file parsed";
  return "";
}

// The real default model: TANDEM_MODEL, else the cache path of scripts/fetch_model.sh; "" when
// neither exists.
inline std::string real_model_path() {
  const std::string p = test_model_path();
  if (const char* m = std::getenv("TANDEM_MODEL"); m && *m) return p;
  return std::filesystem::exists(p) ? p : "";
}

}  // namespace tandem::testing
