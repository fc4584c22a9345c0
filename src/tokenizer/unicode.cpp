#include "tokenizer/unicode.h"

#include <array>

namespace tandem::unicode {

std::vector<uint32_t> cpts_from_utf8(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  const size_t n = s.size();
  auto cont = [&](size_t i) { return i < n && (static_cast<uint8_t>(s[i]) & 0xC0) == 0x80; };
  size_t i = 0;
  while (i < n) {
    const uint8_t c = static_cast<uint8_t>(s[i]);
    if (!(c & 0x80)) {
      out.push_back(c);
      i += 1;
    } else if (!(c & 0x40)) {
      out.push_back(0xFFFD);
      i += 1;
    } else if (!(c & 0x20)) {
      if (!cont(i + 1)) {
        out.push_back(0xFFFD);
        i += 1;
        continue;
      }
      out.push_back(((c & 0x1Fu) << 6) | (static_cast<uint8_t>(s[i + 1]) & 0x3Fu));
      i += 2;
    } else if (!(c & 0x10)) {
      if (!cont(i + 1) || !cont(i + 2)) {
        out.push_back(0xFFFD);
        i += 1;
        continue;
      }
      out.push_back(((c & 0x0Fu) << 12) | ((static_cast<uint8_t>(s[i + 1]) & 0x3Fu) << 6) |
                    (static_cast<uint8_t>(s[i + 2]) & 0x3Fu));
      i += 3;
    } else if (!(c & 0x08)) {
      if (!cont(i + 1) || !cont(i + 2) || !cont(i + 3)) {
        out.push_back(0xFFFD);
        i += 1;
        continue;
      }
      uint32_t cpt = ((c & 0x07u) << 18) | ((static_cast<uint8_t>(s[i + 1]) & 0x3Fu) << 12) |
                     ((static_cast<uint8_t>(s[i + 2]) & 0x3Fu) << 6) |
                     (static_cast<uint8_t>(s[i + 3]) & 0x3Fu);
      out.push_back(cpt <= 0x10FFFF ? cpt : 0xFFFD);
      i += 4;
    } else {
      out.push_back(0xFFFD);
      i += 1;
    }
  }
  return out;
}

void append_utf8(std::string& out, uint32_t cpt) {
  if (cpt <= 0x7F) {
    out.push_back(static_cast<char>(cpt));
  } else if (cpt <= 0x7FF) {
    out.push_back(static_cast<char>(0xC0 | (cpt >> 6)));
    out.push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else if (cpt <= 0xFFFF) {
    out.push_back(static_cast<char>(0xE0 | (cpt >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cpt >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cpt >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  }
}

namespace {

struct ByteMap {
  std::array<std::string, 256> utf8;
  std::array<uint16_t, 256> cpt{};
  ByteMap() {
    // Printable bytes map to themselves; the rest to 256, 257, ... in byte order.
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool keep = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      cpt[b] = static_cast<uint16_t>(keep ? b : next++);
      append_utf8(utf8[b], cpt[b]);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

}  // namespace

const std::string& byte_to_utf8(uint8_t b) {
  return byte_map().utf8[b];
}

int utf8_cpt_to_byte(uint32_t cpt) {
  // Inverse of the map above: identity on the kept ranges, 256.. for the others.
  static const std::array<int16_t, 324> inv = [] {
    std::array<int16_t, 324> a{};
    a.fill(-1);
    for (int b = 0; b < 256; ++b) a[byte_map().cpt[b]] = static_cast<int16_t>(b);
    return a;
  }();
  return cpt < inv.size() ? inv[cpt] : -1;
}

}  // namespace tandem::unicode
