// UTF-8 helpers with llama.cpp's (permissive) semantics, and the GPT-2 byte <-> unicode map.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::unicode {

// Length of the UTF-8 sequence that starts with this byte, from its high nibble only
// (llama.cpp's unicode_len_utf8): continuation bytes count as 1.
inline size_t len_utf8(char c) {
  static constexpr uint8_t kLookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLookup[static_cast<uint8_t>(c) >> 4];
}

// Decodes like llama.cpp's unicode_cpts_from_utf8: lead/continuation structure is checked but
// overlong forms and surrogates are accepted; a byte that does not start a well-formed
// sequence becomes U+FFFD and decoding resumes at the next byte. Code points above U+10FFFF
// (which llama.cpp cannot re-encode) also become U+FFFD.
std::vector<uint32_t> cpts_from_utf8(std::string_view s);

// Appends the UTF-8 encoding of cpt (cpt <= 0x10FFFF; surrogates are encoded as 3 bytes).
void append_utf8(std::string& out, uint32_t cpt);

// GPT-2 bytes_to_unicode: the UTF-8 text of the code point that stands for byte b.
const std::string& byte_to_utf8(uint8_t b);
// Inverse: the byte for a code point, or -1 when the code point is not in the map.
int utf8_cpt_to_byte(uint32_t cpt);

}  // namespace tandem::unicode
