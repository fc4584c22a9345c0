// The native protocol's history hash (docs/protocol.md, a step's "expected_hash"): FNV-1a, 64
// bits, over the history's token ids, each as its 4 bytes little-endian; written as 16 lowercase
// hex digits. A step that names it runs only on a session whose history before expected_pos
// hashes to it, so a step that reached the server out of turn is refused instead of running on
// a history that merely has the right length.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace tandem {

class HistoryHash {
 public:
  static constexpr uint64_t kOffset = 0xcbf29ce484222325ull;
  static constexpr uint64_t kPrime = 0x100000001b3ull;

  HistoryHash() = default;
  // Goes on from the hash of a prefix (the value() of a HistoryHash that saw it).
  explicit HistoryHash(uint64_t value) : value_(value) {}

  void add(int32_t token) {
    const auto bits = static_cast<uint32_t>(token);
    for (int byte = 0; byte < 4; ++byte) {
      value_ = (value_ ^ ((bits >> (8 * byte)) & 0xffu)) * kPrime;
    }
  }
  void add(std::span<const int32_t> tokens) {
    for (const int32_t t : tokens) add(t);
  }
  uint64_t value() const { return value_; }

  static uint64_t of(std::span<const int32_t> tokens) {
    HistoryHash h;
    h.add(tokens);
    return h.value();
  }
  static std::string hex(uint64_t v) {
    static constexpr char kDigits[] = "0123456789abcdef";
    std::string s(16, '0');
    for (int i = 15; i >= 0; --i, v >>= 4) s[static_cast<size_t>(i)] = kDigits[v & 0xf];
    return s;
  }
  // The value of 16 lowercase hex digits; nullopt for anything else.
  static std::optional<uint64_t> parse_hex(std::string_view s) {
    if (s.size() != 16) return std::nullopt;
    uint64_t v = 0;
    for (const char c : s) {
      const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (d < 0) return std::nullopt;
      v = (v << 4) | static_cast<uint64_t>(d);
    }
    return v;
  }

 private:
  uint64_t value_ = kOffset;
};

}  // namespace tandem
