#include "gguf/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "common/byte_reader.h"
#include "common/error.h"

namespace tandem {
namespace {

constexpr uint32_t kMaxDims = 4;
constexpr int kMaxArrayNesting = 8;
constexpr uint64_t kMaxKeyLength = 1 << 16;
// Counts come from the file: a hostile one can claim as many elements as its bytes allow, and each
// element costs more in memory (up to 160 bytes) than its minimum size in the file (8-13 bytes),
// multiplied again by every nesting level that is open at once. Reserving up front is therefore
// capped; vectors grow with what is actually parsed.
constexpr uint64_t kMaxReserve = 1 << 16;
size_t capped(uint64_t n) {
  return static_cast<size_t>(std::min(n, kMaxReserve));
}

size_t scalar_size(GgufValueType t) {
  switch (t) {
    case GgufValueType::UINT8:
    case GgufValueType::INT8:
    case GgufValueType::BOOL:
      return 1;
    case GgufValueType::UINT16:
    case GgufValueType::INT16:
      return 2;
    case GgufValueType::UINT32:
    case GgufValueType::INT32:
    case GgufValueType::FLOAT32:
      return 4;
    case GgufValueType::UINT64:
    case GgufValueType::INT64:
    case GgufValueType::FLOAT64:
      return 8;
    default:
      return 0;
  }
}

bool valid_value_type(uint32_t t) {
  return t <= static_cast<uint32_t>(GgufValueType::FLOAT64);
}

template <class T>
T load_le(const uint8_t* p) {
  T x;
  std::memcpy(&x, p, sizeof x);
  return x;
}

// An integer of type T into both views: u64 and i64 hold the same bits (a negative value
// sign-extends into u64, a large UINT64 wraps into i64).
template <class T>
void set_integer(const uint8_t* p, GgufValue& v) {
  const T x = load_le<T>(p);
  // A signed T sign-extends on purpose (int8 -1 is u64 0xffff...): the views say the same bits.
  v.u64 = static_cast<uint64_t>(x);  // NOLINT(bugprone-signed-char-misuse)
  v.i64 = static_cast<int64_t>(x);   // NOLINT(bugprone-signed-char-misuse)
}

// One scalar of type t at p (scalar_size(t) bytes, already bounds-checked by the caller).
void read_scalar(const uint8_t* p, GgufValueType t, GgufValue& v) {
  v.type = t;
  switch (t) {
    case GgufValueType::UINT8:
      return set_integer<uint8_t>(p, v);
    case GgufValueType::INT8:
      return set_integer<int8_t>(p, v);
    case GgufValueType::UINT16:
      return set_integer<uint16_t>(p, v);
    case GgufValueType::INT16:
      return set_integer<int16_t>(p, v);
    case GgufValueType::UINT32:
      return set_integer<uint32_t>(p, v);
    case GgufValueType::INT32:
      return set_integer<int32_t>(p, v);
    case GgufValueType::UINT64:
      return set_integer<uint64_t>(p, v);
    case GgufValueType::INT64:
      return set_integer<int64_t>(p, v);
    case GgufValueType::BOOL: {
      const bool x = load_le<uint8_t>(p) != 0;
      v.u64 = x;
      v.i64 = x;
      return;
    }
    case GgufValueType::FLOAT32:
      v.f64 = load_le<float>(p);
      return;
    case GgufValueType::FLOAT64:
      v.f64 = load_le<double>(p);
      return;
    default:
      return;
  }
}

GgufValue read_value(ByteReader& c, GgufValueType type, int depth) {
  GgufValue v;
  v.file_offset = c.pos();
  v.type = type;
  if (type == GgufValueType::STRING) {
    v.str = c.read_string("string value");
    return v;
  }
  if (type != GgufValueType::ARRAY) {
    const size_t n = scalar_size(type);
    read_scalar(c.skip(n, "scalar value"), type, v);
    v.type = type;
    return v;
  }
  if (depth >= kMaxArrayNesting) {
    c.fail(c.pos(), "arrays nested deeper than " + std::to_string(kMaxArrayNesting) + " levels");
  }
  const size_t type_at = c.pos();
  const uint32_t raw_elem = c.read<uint32_t>("array element type");
  if (!valid_value_type(raw_elem)) {
    c.fail(type_at, "expected an array element type 0..12, found " + std::to_string(raw_elem));
  }
  v.elem_type = static_cast<GgufValueType>(raw_elem);
  const size_t count_at = c.pos();
  v.count = c.read<uint64_t>("array length");
  // Every element occupies at least min_elem bytes, so a count the file cannot hold is caught
  // before anything is allocated.
  const uint64_t min_elem = v.elem_type == GgufValueType::STRING  ? 8
                            : v.elem_type == GgufValueType::ARRAY ? 12
                                                                  : scalar_size(v.elem_type);
  if (v.count > c.remaining() / min_elem) {
    c.fail(count_at, "array of " + std::to_string(v.count) + " elements of type " +
                         std::string(gguf_value_type_name(v.elem_type)) +
                         " does not fit in the remaining " + std::to_string(c.remaining()) +
                         " bytes");
  }
  if (v.elem_type == GgufValueType::STRING) {
    v.strings.reserve(capped(v.count));
    for (uint64_t i = 0; i < v.count; ++i) v.strings.push_back(c.read_string("array string"));
  } else if (v.elem_type == GgufValueType::ARRAY) {
    v.items.reserve(capped(v.count));
    for (uint64_t i = 0; i < v.count; ++i) {
      v.items.push_back(read_value(c, GgufValueType::ARRAY, depth + 1));
    }
  } else {
    v.elems = c.skip(v.count * min_elem, "array elements");
  }
  return v;
}

bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

}  // namespace

std::string_view gguf_value_type_name(GgufValueType type) {
  switch (type) {
    case GgufValueType::UINT8:
      return "uint8";
    case GgufValueType::INT8:
      return "int8";
    case GgufValueType::UINT16:
      return "uint16";
    case GgufValueType::INT16:
      return "int16";
    case GgufValueType::UINT32:
      return "uint32";
    case GgufValueType::INT32:
      return "int32";
    case GgufValueType::FLOAT32:
      return "float32";
    case GgufValueType::BOOL:
      return "bool";
    case GgufValueType::STRING:
      return "string";
    case GgufValueType::ARRAY:
      return "array";
    case GgufValueType::UINT64:
      return "uint64";
    case GgufValueType::INT64:
      return "int64";
    case GgufValueType::FLOAT64:
      return "float64";
  }
  return "unknown";
}

size_t gguf_scalar_size(GgufValueType type) {
  return scalar_size(type);
}

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufValueType::UINT8:
    case GgufValueType::INT8:
    case GgufValueType::UINT16:
    case GgufValueType::INT16:
    case GgufValueType::UINT32:
    case GgufValueType::INT32:
    case GgufValueType::UINT64:
    case GgufValueType::INT64:
      return true;
    default:
      return false;
  }
}

std::string GgufTensorInfo::shape_string() const {
  std::string s = "[";
  for (uint32_t i = 0; i < std::max<uint32_t>(n_dims, 1); ++i) {
    if (i) s += ", ";
    s += std::to_string(ne[i]);
  }
  return s + "]";
}

std::unique_ptr<GgufFile> GgufFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    throw Error(path + ": cannot stat: " + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(path + ": not a regular file");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < 24) {
    ::close(fd);
    throw Error(path + ": byte offset 0: expected a GGUF header of at least 24 bytes, found a " +
                std::to_string(size) + "-byte file");
  }
  void* p = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int e = errno;
  ::close(fd);
  if (p == MAP_FAILED) throw Error(path + ": mmap failed: " + std::strerror(e));
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  f->base_ = static_cast<const uint8_t*>(p);
  f->size_ = size;
  f->mapped_ = true;
  f->parse();
  return f;
}

std::unique_ptr<GgufFile> GgufFile::from_memory(const uint8_t* data, size_t size,
                                                const std::string& name) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = name;
  f->base_ = data;
  f->size_ = size;
  f->parse();
  return f;
}

GgufFile::~GgufFile() {
  if (mapped_ && base_) munmap(const_cast<uint8_t*>(base_), size_);
}

namespace {

struct GgufHeader {
  uint32_t version = 0;
  uint64_t n_tensors = 0;
  uint64_t n_kv = 0;
};

// Magic, version and the two counts (bytes 0..23), each count checked against the bytes left.
GgufHeader read_header(ByteReader& c, size_t file_size) {
  GgufHeader h;
  const auto magic = c.read<uint32_t>("magic");
  if (std::memcmp(&magic, "GGUF", 4) != 0) {
    char found[5] = {};
    std::memcpy(found, &magic, 4);
    for (char& ch : found) {
      if (ch && (ch < 32 || ch > 126)) ch = '?';
    }
    c.fail(0, std::string("expected magic \"GGUF\", found \"") + found + "\"");
  }
  h.version = c.read<uint32_t>("version");
  if (h.version != 2 && h.version != 3) {
    c.fail(4, "expected GGUF version 2 or 3, found " + std::to_string(h.version));
  }
  h.n_tensors = c.read<uint64_t>("tensor count");
  h.n_kv = c.read<uint64_t>("metadata count");
  // A key-value pair takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor info at least
  // 8 + 4 + 8 + 4 + 8.
  if (h.n_kv > c.remaining() / 13) {
    c.fail(16, "metadata count " + std::to_string(h.n_kv) + " cannot fit in a " +
                   std::to_string(file_size) + "-byte file");
  }
  if (h.n_tensors > c.remaining() / 32) {
    c.fail(8, "tensor count " + std::to_string(h.n_tensors) + " cannot fit in a " +
                  std::to_string(file_size) + "-byte file");
  }
  return h;
}

// One tensor info: name, dimensions, type, data offset (relative to the data section), each
// checked as it is read; nbytes follows from the shape and the type's block size.
GgufTensorInfo read_tensor_info(ByteReader& c, uint64_t alignment) {
  GgufTensorInfo t;
  t.name = std::string(c.read_string("tensor name", kMaxKeyLength));
  const size_t dims_at = c.pos();
  t.n_dims = c.read<uint32_t>("tensor dimension count");
  if (t.n_dims == 0 || t.n_dims > kMaxDims) {
    c.fail(dims_at,
           "tensor '" + t.name + "': expected 1..4 dimensions, found " + std::to_string(t.n_dims));
  }
  uint64_t n_elem = 1;
  for (uint32_t d = 0; d < t.n_dims; ++d) {
    const size_t dim_at = c.pos();
    const uint64_t ne = c.read<uint64_t>("tensor dimension");
    if (ne == 0 || ne > (uint64_t{1} << 40) || mul_overflows(n_elem, ne, &n_elem) ||
        n_elem > (uint64_t{1} << 48)) {
      c.fail(dim_at, "tensor '" + t.name + "': dimension " + std::to_string(d) + " = " +
                         std::to_string(ne) + " is zero or makes the tensor impossibly large");
    }
    t.ne[d] = static_cast<int64_t>(ne);
  }
  const size_t type_at = c.pos();
  const uint32_t raw_type = c.read<uint32_t>("tensor type");
  const auto tt = tensor_type_traits(raw_type);
  if (!tt) {
    c.fail(type_at,
           "tensor '" + t.name + "': unsupported ggml type id " + std::to_string(raw_type));
  }
  t.type = static_cast<TensorType>(raw_type);
  if (t.ne[0] % tt->block_size != 0) {
    c.fail(dims_at, "tensor '" + t.name + "': row length " + std::to_string(t.ne[0]) +
                        " is not a multiple of the " + std::string(tt->name) + " block size " +
                        std::to_string(tt->block_size));
  }
  t.nbytes = static_cast<size_t>(n_elem / tt->block_size) * tt->type_size;
  const size_t off_at = c.pos();
  t.offset = c.read<uint64_t>("tensor data offset");
  if (t.offset % alignment != 0) {
    c.fail(off_at, "tensor '" + t.name + "': data offset " + std::to_string(t.offset) +
                       " is not a multiple of the alignment " + std::to_string(alignment));
  }
  return t;
}

}  // namespace

// The file is read front to back: header, metadata, tensor infos, then the data section's
// placement. Every check fails with the byte offset of what it read (ByteReader::fail).
void GgufFile::parse() {
  ByteReader c(base_, size_, path_);
  const GgufHeader header = read_header(c, size_);
  version_ = header.version;
  const uint64_t n_tensors = header.n_tensors;
  const uint64_t n_kv = header.n_kv;

  kv_.reserve(capped(n_kv));
  for (uint64_t i = 0; i < n_kv; ++i) {
    const size_t key_at = c.pos();
    const std::string key(c.read_string("metadata key", kMaxKeyLength));
    const size_t type_at = c.pos();
    const uint32_t raw_type = c.read<uint32_t>("metadata value type");
    if (!valid_value_type(raw_type)) {
      c.fail(type_at,
             "key '" + key + "': expected a value type 0..12, found " + std::to_string(raw_type));
    }
    GgufValue v = read_value(c, static_cast<GgufValueType>(raw_type), 0);
    if (kv_index_.count(key)) c.fail(key_at, "duplicate metadata key '" + key + "'");
    kv_index_.emplace(key, kv_.size());
    kv_.emplace_back(key, std::move(v));
  }

  if (const GgufValue* a = find("general.alignment")) {
    if (!a->is_integer() || a->u64 == 0 || (a->u64 & (a->u64 - 1)) != 0 || a->u64 > (1u << 20)) {
      c.fail(a->file_offset, "general.alignment: expected a power of two up to 1 MiB, found " +
                                 (a->is_integer() ? std::to_string(a->u64)
                                                  : std::string(gguf_value_type_name(a->type))));
    }
    alignment_ = a->u64;
  }

  tensors_.reserve(capped(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    const size_t name_at = c.pos();
    GgufTensorInfo t = read_tensor_info(c, alignment_);
    if (tensor_index_.count(t.name)) c.fail(name_at, "duplicate tensor name '" + t.name + "'");
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment after the header.
  size_t data_start = c.pos();
  if (data_start % alignment_) data_start += alignment_ - data_start % alignment_;
  if (n_tensors > 0 && data_start > size_) {
    c.fail(c.pos(), "expected tensor data to start at byte " + std::to_string(data_start) +
                        ", but the file has only " + std::to_string(size_) + " bytes");
  }
  data_offset_ = data_start;
  for (auto& t : tensors_) {
    uint64_t end = 0;
    if (__builtin_add_overflow(static_cast<uint64_t>(data_start), t.offset, &end) ||
        __builtin_add_overflow(end, static_cast<uint64_t>(t.nbytes), &end) || end > size_) {
      throw Error(path_ + ": tensor '" + t.name + "' " + t.shape_string() + " " +
                  std::string(traits(t.type).name) + ": expected " + std::to_string(t.nbytes) +
                  " bytes at byte offset " + std::to_string(data_start + t.offset) +
                  ", but the file ends at " + std::to_string(size_) + " (truncated file?)");
    }
    t.data = base_ + data_start + t.offset;
  }
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {
[[noreturn]] void wrong_type(const std::string& path, std::string_view key, const GgufValue& v,
                             const char* expected) {
  throw Error(path + ": metadata key '" + std::string(key) + "': expected " + expected +
              ", found " + std::string(gguf_value_type_name(v.type)));
}
[[noreturn]] void missing(const std::string& path, std::string_view key, const char* expected) {
  throw Error(path + ": missing required metadata key '" + std::string(key) + "' (" + expected +
              ")");
}
}  // namespace

std::optional<std::string_view> GgufFile::get_string_opt(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != GgufValueType::STRING) wrong_type(path_, key, *v, "a string");
  return v->str;
}

std::string_view GgufFile::get_string(std::string_view key) const {
  auto s = get_string_opt(key);
  if (!s) missing(path_, key, "a string");
  return *s;
}

std::optional<uint64_t> GgufFile::get_u64_opt(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_integer()) wrong_type(path_, key, *v, "an unsigned integer");
  if (v->i64 < 0 && v->type != GgufValueType::UINT64) {
    throw Error(path_ + ": metadata key '" + std::string(key) +
                "': expected a non-negative integer, found " + std::to_string(v->i64));
  }
  return v->u64;
}

uint64_t GgufFile::get_u64(std::string_view key) const {
  auto x = get_u64_opt(key);
  if (!x) missing(path_, key, "an unsigned integer");
  return *x;
}

int64_t GgufFile::get_i64_or(std::string_view key, int64_t fallback) const {
  const GgufValue* v = find(key);
  if (!v) return fallback;
  if (!v->is_integer()) wrong_type(path_, key, *v, "an integer");
  return v->i64;
}

std::optional<double> GgufFile::get_f64_opt(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->is_float()) return v->f64;
  if (v->is_integer()) return static_cast<double>(v->i64);
  wrong_type(path_, key, *v, "a number");
}

double GgufFile::get_f64(std::string_view key) const {
  auto x = get_f64_opt(key);
  if (!x) missing(path_, key, "a number");
  return *x;
}

bool GgufFile::get_bool_or(std::string_view key, bool fallback) const {
  const GgufValue* v = find(key);
  if (!v) return fallback;
  if (v->type == GgufValueType::BOOL || v->is_integer()) return v->u64 != 0;
  wrong_type(path_, key, *v, "a bool");
}

const std::vector<std::string_view>& GgufFile::get_string_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) missing(path_, key, "an array of strings");
  if (v->type != GgufValueType::ARRAY || v->elem_type != GgufValueType::STRING) {
    wrong_type(path_, key, *v, "an array of strings");
  }
  return v->strings;
}

std::vector<float> GgufFile::get_f32_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) missing(path_, key, "an array of numbers");
  if (v->type != GgufValueType::ARRAY || v->elem_type == GgufValueType::STRING ||
      v->elem_type == GgufValueType::ARRAY) {
    wrong_type(path_, key, *v, "an array of numbers");
  }
  std::vector<float> out(v->count);
  const size_t es = scalar_size(v->elem_type);
  for (uint64_t i = 0; i < v->count; ++i) {
    GgufValue e;
    read_scalar(v->elems + i * es, v->elem_type, e);
    out[i] = e.is_float() ? static_cast<float>(e.f64) : static_cast<float>(e.i64);
  }
  return out;
}

std::vector<int64_t> GgufFile::get_int_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) missing(path_, key, "an array of integers");
  if (v->type != GgufValueType::ARRAY || v->elem_type == GgufValueType::STRING ||
      v->elem_type == GgufValueType::ARRAY || v->elem_type == GgufValueType::FLOAT32 ||
      v->elem_type == GgufValueType::FLOAT64) {
    wrong_type(path_, key, *v, "an array of integers");
  }
  std::vector<int64_t> out(v->count);
  const size_t es = scalar_size(v->elem_type);
  for (uint64_t i = 0; i < v->count; ++i) {
    GgufValue e;
    read_scalar(v->elems + i * es, v->elem_type, e);
    out[i] = e.i64;
  }
  return out;
}

}  // namespace tandem
