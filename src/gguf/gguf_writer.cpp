#include "gguf/gguf_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "common/error.h"

namespace tandem {
namespace {

static_assert(std::endian::native == std::endian::little, "the GGUF writer assumes little-endian");

constexpr uint32_t kVersion = 3;
constexpr int kMaxArrayNesting = 8;           // as the reader
constexpr uint64_t kMaxNameLength = 1 << 16;  // as the reader

template <typename T>
void put_raw(std::vector<uint8_t>& out, T v) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

void put_string(std::vector<uint8_t>& out, std::string_view s) {
  put_raw<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

void check_name(std::string_view what, std::string_view name) {
  if (name.size() > kMaxNameLength) {
    throw Error("GgufWriter: " + std::string(what) + " of " + std::to_string(name.size()) +
                " bytes exceeds the limit of " + std::to_string(kMaxNameLength));
  }
}

// Encodes a value's payload (everything after its type tag).
void put_payload(std::vector<uint8_t>& out, std::string_view key, const GgufValue& v, int depth) {
  switch (v.type) {
    case GgufValueType::UINT8:
      put_raw<uint8_t>(out, static_cast<uint8_t>(v.u64));
      return;
    case GgufValueType::INT8:
      put_raw<int8_t>(out, static_cast<int8_t>(v.i64));
      return;
    case GgufValueType::UINT16:
      put_raw<uint16_t>(out, static_cast<uint16_t>(v.u64));
      return;
    case GgufValueType::INT16:
      put_raw<int16_t>(out, static_cast<int16_t>(v.i64));
      return;
    case GgufValueType::UINT32:
      put_raw<uint32_t>(out, static_cast<uint32_t>(v.u64));
      return;
    case GgufValueType::INT32:
      put_raw<int32_t>(out, static_cast<int32_t>(v.i64));
      return;
    case GgufValueType::UINT64:
      put_raw<uint64_t>(out, v.u64);
      return;
    case GgufValueType::INT64:
      put_raw<int64_t>(out, v.i64);
      return;
    case GgufValueType::FLOAT32:
      put_raw<float>(out, static_cast<float>(v.f64));
      return;
    case GgufValueType::FLOAT64:
      put_raw<double>(out, v.f64);
      return;
    case GgufValueType::BOOL:
      put_raw<uint8_t>(out, v.u64 != 0);
      return;
    case GgufValueType::STRING:
      put_string(out, v.str);
      return;
    case GgufValueType::ARRAY:
      break;
    default:
      throw Error("GgufWriter: key '" + std::string(key) + "': unknown value type " +
                  std::to_string(static_cast<uint32_t>(v.type)));
  }
  if (depth >= kMaxArrayNesting) {
    throw Error("GgufWriter: key '" + std::string(key) + "': arrays nested deeper than " +
                std::to_string(kMaxArrayNesting) + " levels");
  }
  put_raw<uint32_t>(out, static_cast<uint32_t>(v.elem_type));
  put_raw<uint64_t>(out, v.count);
  auto mismatch = [&](size_t have) {
    throw Error("GgufWriter: key '" + std::string(key) + "': array count " +
                std::to_string(v.count) + " but " + std::to_string(have) + " elements given");
  };
  if (v.elem_type == GgufValueType::STRING) {
    if (v.strings.size() != v.count) mismatch(v.strings.size());
    for (std::string_view s : v.strings) put_string(out, s);
  } else if (v.elem_type == GgufValueType::ARRAY) {
    if (v.items.size() != v.count) mismatch(v.items.size());
    for (const GgufValue& item : v.items) {
      if (item.type != GgufValueType::ARRAY) {
        throw Error("GgufWriter: key '" + std::string(key) +
                    "': an array of arrays holds a non-array item");
      }
      put_payload(out, key, item, depth + 1);
    }
  } else {
    const size_t es = gguf_scalar_size(v.elem_type);
    if (es == 0) {
      throw Error("GgufWriter: key '" + std::string(key) + "': unknown array element type " +
                  std::to_string(static_cast<uint32_t>(v.elem_type)));
    }
    if (v.count > 0 && v.elems == nullptr) mismatch(0);
    const uint8_t* p = v.elems;
    out.insert(out.end(), p, p + v.count * es);
  }
}

uint64_t align_up(uint64_t x, uint64_t a) {
  return (x + a - 1) / a * a;
}

struct VectorSink {
  std::vector<uint8_t>& out;
  void write(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + n);
  }
  void zeros(size_t n) { out.resize(out.size() + n, 0); }
};

struct FileSink {
  std::FILE* f;
  const std::string& path;
  void write(const void* p, size_t n) {
    if (n && std::fwrite(p, 1, n, f) != n) {
      throw Error(path + ": write failed: " + std::strerror(errno));
    }
  }
  void zeros(size_t n) {
    static const uint8_t kZeros[4096] = {};
    while (n) {
      const size_t k = std::min(n, sizeof(kZeros));
      write(kZeros, k);
      n -= k;
    }
  }
};

}  // namespace

// ---- metadata -----------------------------------------------------------------------------------

void GgufWriter::put(std::string_view key, std::vector<uint8_t> bytes) {
  if (key.empty()) throw Error("GgufWriter: empty metadata key");
  check_name("metadata key", key);
  for (Kv& kv : kv_) {
    if (kv.key == key) {
      kv.bytes = std::move(bytes);
      return;
    }
  }
  kv_.push_back({std::string(key), std::move(bytes)});
}

void GgufWriter::set_value(std::string_view key, const GgufValue& value) {
  std::vector<uint8_t> b;
  put_raw<uint32_t>(b, static_cast<uint32_t>(value.type));
  put_payload(b, key, value, 0);
  put(key, std::move(b));
}

namespace {
template <typename T>
std::vector<uint8_t> scalar_bytes(GgufValueType type, T v) {
  std::vector<uint8_t> b;
  put_raw<uint32_t>(b, static_cast<uint32_t>(type));
  put_raw<T>(b, v);
  return b;
}
}  // namespace

void GgufWriter::set_u8(std::string_view k, uint8_t v) {
  put(k, scalar_bytes(GgufValueType::UINT8, v));
}
void GgufWriter::set_i8(std::string_view k, int8_t v) {
  put(k, scalar_bytes(GgufValueType::INT8, v));
}
void GgufWriter::set_u16(std::string_view k, uint16_t v) {
  put(k, scalar_bytes(GgufValueType::UINT16, v));
}
void GgufWriter::set_i16(std::string_view k, int16_t v) {
  put(k, scalar_bytes(GgufValueType::INT16, v));
}
void GgufWriter::set_u32(std::string_view k, uint32_t v) {
  put(k, scalar_bytes(GgufValueType::UINT32, v));
}
void GgufWriter::set_i32(std::string_view k, int32_t v) {
  put(k, scalar_bytes(GgufValueType::INT32, v));
}
void GgufWriter::set_u64(std::string_view k, uint64_t v) {
  put(k, scalar_bytes(GgufValueType::UINT64, v));
}
void GgufWriter::set_i64(std::string_view k, int64_t v) {
  put(k, scalar_bytes(GgufValueType::INT64, v));
}
void GgufWriter::set_f32(std::string_view k, float v) {
  put(k, scalar_bytes(GgufValueType::FLOAT32, v));
}
void GgufWriter::set_f64(std::string_view k, double v) {
  put(k, scalar_bytes(GgufValueType::FLOAT64, v));
}
void GgufWriter::set_bool(std::string_view k, bool v) {
  put(k, scalar_bytes<uint8_t>(GgufValueType::BOOL, v ? 1 : 0));
}
void GgufWriter::set_string(std::string_view k, std::string_view v) {
  std::vector<uint8_t> b;
  put_raw<uint32_t>(b, static_cast<uint32_t>(GgufValueType::STRING));
  put_string(b, v);
  put(k, std::move(b));
}

void GgufWriter::set_numeric_array(std::string_view key, GgufValueType elem_type, uint64_t count,
                                   const void* elems, size_t elem_size) {
  const size_t es = gguf_scalar_size(elem_type);
  if (es == 0 || es != elem_size) {
    throw Error("GgufWriter: key '" + std::string(key) + "': element type " +
                std::string(gguf_value_type_name(elem_type)) + " with element size " +
                std::to_string(elem_size) + " is not a numeric array");
  }
  std::vector<uint8_t> b;
  b.reserve(16 + count * es);
  put_raw<uint32_t>(b, static_cast<uint32_t>(GgufValueType::ARRAY));
  put_raw<uint32_t>(b, static_cast<uint32_t>(elem_type));
  put_raw<uint64_t>(b, count);
  const auto* p = static_cast<const uint8_t*>(elems);
  if (count) b.insert(b.end(), p, p + count * es);
  put(key, std::move(b));
}

void GgufWriter::set_bool_array(std::string_view key, const std::vector<bool>& values) {
  std::vector<uint8_t> bytes(values.begin(), values.end());
  set_numeric_array(key, GgufValueType::BOOL, bytes.size(), bytes.data(), 1);
}

namespace {
template <typename S>
std::vector<uint8_t> string_array_bytes(std::span<const S> values) {
  std::vector<uint8_t> b;
  put_raw<uint32_t>(b, static_cast<uint32_t>(GgufValueType::ARRAY));
  put_raw<uint32_t>(b, static_cast<uint32_t>(GgufValueType::STRING));
  put_raw<uint64_t>(b, values.size());
  for (const auto& s : values) put_string(b, s);
  return b;
}
}  // namespace

void GgufWriter::set_string_array(std::string_view key, std::span<const std::string> values) {
  put(key, string_array_bytes(values));
}
void GgufWriter::set_string_array(std::string_view key, std::span<const std::string_view> values) {
  put(key, string_array_bytes(values));
}

void GgufWriter::copy_metadata(const GgufFile& src) {
  for (const auto& [key, value] : src.metadata()) {
    if (key == "general.alignment" && value.is_integer()) {
      set_alignment(value.u64);
    } else {
      set_value(key, value);
    }
  }
}

bool GgufWriter::has(std::string_view key) const {
  return std::any_of(kv_.begin(), kv_.end(), [&](const Kv& kv) { return kv.key == key; });
}

void GgufWriter::remove(std::string_view key) {
  std::erase_if(kv_, [&](const Kv& kv) { return kv.key == key; });
  if (key == "general.alignment") alignment_ = 32;
}

void GgufWriter::set_alignment(uint64_t alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > (1u << 20)) {
    throw Error("GgufWriter: alignment must be a power of two up to 1 MiB, got " +
                std::to_string(alignment));
  }
  alignment_ = alignment;
  set_u32("general.alignment", static_cast<uint32_t>(alignment));
}

// ---- tensors ------------------------------------------------------------------------------------

GgufWriter::Tensor& GgufWriter::new_tensor(std::string_view name, TensorType type,
                                           std::span<const int64_t> ne, size_t data_size) {
  const std::string where = "GgufWriter: tensor '" + std::string(name) + "': ";
  check_name("tensor name", name);
  for (const Tensor& t : tensors_) {
    if (t.name == name) throw Error(where + "duplicate tensor name");
  }
  if (ne.empty() || ne.size() > 4) {
    throw Error(where + "expected 1..4 dimensions, got " + std::to_string(ne.size()));
  }
  const auto& tt = traits(type);
  uint64_t n = 1;
  Tensor t{std::string(name), type, static_cast<uint32_t>(ne.size()), {1, 1, 1, 1}, {}, nullptr, 0};
  for (size_t d = 0; d < ne.size(); ++d) {
    if (ne[d] <= 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(ne[d]), &n) ||
        n > (uint64_t{1} << 48)) {
      throw Error(where + "dimension " + std::to_string(d) + " = " + std::to_string(ne[d]) +
                  " is not positive or makes the tensor too large");
    }
    t.ne[d] = ne[d];
  }
  if (t.ne[0] % tt.block_size != 0) {
    throw Error(where + "row length " + std::to_string(t.ne[0]) + " is not a multiple of the " +
                std::string(tt.name) + " block size " + std::to_string(tt.block_size));
  }
  t.nbytes = static_cast<size_t>(n / tt.block_size) * tt.type_size;
  if (data_size != t.nbytes) {
    throw Error(where + std::string(tt.name) + " " + std::to_string(n) + " elements need " +
                std::to_string(t.nbytes) + " bytes, got " + std::to_string(data_size));
  }
  tensors_.push_back(std::move(t));
  return tensors_.back();
}

void GgufWriter::add_tensor(std::string_view name, TensorType type, std::span<const int64_t> ne,
                            std::span<const uint8_t> data) {
  Tensor& t = new_tensor(name, type, ne, data.size());
  t.owned.assign(data.begin(), data.end());
  t.data = t.owned.data();
}

void GgufWriter::add_tensor_view(std::string_view name, TensorType type,
                                 std::span<const int64_t> ne, std::span<const uint8_t> data) {
  new_tensor(name, type, ne, data.size()).data = data.data();
}

void GgufWriter::add_tensor_view(const GgufTensorInfo& t) {
  add_tensor_view(t.name, t.type, std::span<const int64_t>(t.ne, t.n_dims),
                  std::span<const uint8_t>(t.data, t.nbytes));
}

// ---- output -------------------------------------------------------------------------------------

template <typename Sink>
void GgufWriter::emit(Sink& sink) const {
  std::vector<uint8_t> h;
  h.insert(h.end(), {'G', 'G', 'U', 'F'});
  put_raw<uint32_t>(h, kVersion);
  put_raw<uint64_t>(h, tensors_.size());
  put_raw<uint64_t>(h, kv_.size());
  for (const Kv& kv : kv_) {
    put_string(h, kv.key);
    h.insert(h.end(), kv.bytes.begin(), kv.bytes.end());
  }
  std::vector<uint64_t> offsets(tensors_.size());
  uint64_t off = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const Tensor& t = tensors_[i];
    offsets[i] = off;
    off = align_up(off + t.nbytes, alignment_);
    put_string(h, t.name);
    put_raw<uint32_t>(h, t.n_dims);
    for (uint32_t d = 0; d < t.n_dims; ++d) put_raw<uint64_t>(h, static_cast<uint64_t>(t.ne[d]));
    put_raw<uint32_t>(h, static_cast<uint32_t>(t.type));
    put_raw<uint64_t>(h, offsets[i]);
  }
  h.resize(align_up(h.size(), alignment_), 0);
  sink.write(h.data(), h.size());
  uint64_t pos = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const Tensor& t = tensors_[i];
    sink.zeros(offsets[i] - pos);
    sink.write(t.data, t.nbytes);
    pos = offsets[i] + t.nbytes;
  }
  sink.zeros(align_up(pos, alignment_) - pos);
}

std::vector<uint8_t> GgufWriter::to_bytes() const {
  std::vector<uint8_t> out;
  VectorSink sink{out};
  emit(sink);
  return out;
}

void GgufWriter::write(const std::string& path) const {
  std::string tmp = path + ".tmp.XXXXXX";
  const int fd = mkstemp(tmp.data());
  if (fd < 0) throw Error(tmp + ": cannot create: " + std::strerror(errno));
  std::FILE* f = fdopen(fd, "wb");
  if (!f) {
    const int e = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    throw Error(tmp + ": fdopen failed: " + std::strerror(e));
  }
  try {
    std::setvbuf(f, nullptr, _IOFBF, 1 << 20);
    FileSink sink{f, tmp};
    emit(sink);
    if (std::fflush(f) != 0 || ::fsync(fd) != 0) {
      throw Error(tmp + ": flush failed: " + std::strerror(errno));
    }
    ::fchmod(fd, 0644);  // mkstemp creates 0600
  } catch (...) {
    std::fclose(f);
    ::unlink(tmp.c_str());
    throw;
  }
  if (std::fclose(f) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw Error(tmp + ": close failed: " + std::strerror(e));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw Error(path + ": cannot rename " + tmp + " over it: " + std::strerror(e));
  }
}

}  // namespace tandem
