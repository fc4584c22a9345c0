// libFuzzer target for the GGUF reader: parse the input as a GGUF image, then touch every
// metadata value and every tensor byte range the reader hands out, and check that whatever the
// reader accepts, GgufWriter writes back into a file that reads the same.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "common/error.h"
#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"

namespace {

volatile uint64_t g_sink;

#define FUZZ_CHECK(cond)                                                            \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      __builtin_printf("fuzz_gguf: check failed: %s (line %d)\n", #cond, __LINE__); \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)

// Reads every byte a value points at, so ASan sees any view that escapes the input.
uint64_t touch(const tandem::GgufValue& v) {
  uint64_t h = v.u64 ^ static_cast<uint64_t>(v.i64) ^ static_cast<uint64_t>(v.f64 == v.f64);
  for (char c : v.str) h = h * 31 + static_cast<unsigned char>(c);
  if (v.type != tandem::GgufValueType::ARRAY) return h;
  if (v.elem_type == tandem::GgufValueType::STRING) {
    FUZZ_CHECK(v.strings.size() == v.count);
    for (auto s : v.strings) {
      for (char c : s) h = h * 31 + static_cast<unsigned char>(c);
    }
  } else if (v.elem_type == tandem::GgufValueType::ARRAY) {
    FUZZ_CHECK(v.items.size() == v.count);
    for (const auto& item : v.items) h ^= touch(item);
  } else {
    const size_t n = v.count * tandem::gguf_scalar_size(v.elem_type);
    for (size_t i = 0; i < n; ++i) h = h * 31 + v.elems[i];
  }
  return h;
}

void exercise(const tandem::GgufFile& f) {
  uint64_t h = f.version() + f.alignment() + f.data_offset();
  for (const auto& [key, v] : f.metadata()) {
    FUZZ_CHECK(f.find(key) == &v);
    h ^= touch(v);
    // Typed getters either answer or throw tandem::Error.
    try {
      h += f.get_u64(key);
    } catch (const tandem::Error&) {
    }
    try {
      h += f.get_i64_or(key, 0);
    } catch (const tandem::Error&) {
    }
    try {
      try {
        const double d = f.get_f64(key);
        uint64_t bits;
        std::memcpy(&bits, &d, sizeof bits);
        h += bits;
      } catch (const tandem::Error&) {
      }
    } catch (const tandem::Error&) {
    }
    try {
      h += f.get_string(key).size();
    } catch (const tandem::Error&) {
    }
    try {
      h += f.get_bool_or(key, false);
    } catch (const tandem::Error&) {
    }
    try {
      h += f.get_string_array(key).size();
    } catch (const tandem::Error&) {
    }
    try {
      h += f.get_f32_array(key).size();
    } catch (const tandem::Error&) {
    }
    try {
      h += f.get_int_array(key).size();
    } catch (const tandem::Error&) {
    }
  }
  for (const auto& t : f.tensors()) {
    FUZZ_CHECK(f.find_tensor(t.name) == &t);
    FUZZ_CHECK(t.data >= f.base() && t.data + t.nbytes <= f.base() + f.file_size());
    h += t.shape_string().size() + static_cast<uint64_t>(t.n_elements());
    if (t.nbytes) h += t.data[0] + t.data[t.nbytes - 1];
  }
  g_sink = h;
}

// What the reader accepts, the writer reproduces.
void round_trip(const tandem::GgufFile& f) {
  std::vector<uint8_t> bytes;
  try {
    tandem::GgufWriter w;
    w.copy_metadata(f);
    for (const auto& t : f.tensors()) w.add_tensor_view(t);
    bytes = w.to_bytes();
  } catch (const tandem::Error&) {
    return;  // the writer is stricter than the reader in places (e.g. empty keys)
  }
  const auto g = tandem::GgufFile::from_memory(bytes.data(), bytes.size(), "<round trip>");
  FUZZ_CHECK(g->metadata().size() == f.metadata().size());
  FUZZ_CHECK(g->tensors().size() == f.tensors().size());
  for (size_t i = 0; i < f.metadata().size(); ++i) {
    FUZZ_CHECK(g->metadata()[i].first == f.metadata()[i].first);
    FUZZ_CHECK(g->metadata()[i].second.type == f.metadata()[i].second.type ||
               f.metadata()[i].first == "general.alignment");
  }
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const auto& a = f.tensors()[i];
    const auto& b = g->tensors()[i];
    FUZZ_CHECK(a.name == b.name && a.type == b.type && a.nbytes == b.nbytes);
    FUZZ_CHECK(a.nbytes == 0 || std::memcmp(a.data, b.data, a.nbytes) == 0);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::unique_ptr<tandem::GgufFile> f;
  try {
    f = tandem::GgufFile::from_memory(data, size, "<fuzz>");
  } catch (const tandem::Error& e) {
    FUZZ_CHECK(std::strstr(e.what(), "<fuzz>") != nullptr);  // errors name the input
    return 0;
  }
  exercise(*f);
  round_trip(*f);
  return 0;
}
