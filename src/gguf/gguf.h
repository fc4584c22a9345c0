// GGUF reader (format versions 2 and 3).
//
// The file is memory-mapped read-only; metadata strings and tensor data are views into the
// mapping, so a GgufFile must outlive everything taken from it. Every count, offset and size
// is checked against the file size before it is used: a corrupt or hostile file produces a
// tandem::Error naming the file, the byte offset and what was expected, never a crash or an
// allocation larger than the file itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/tensor_type.h"

namespace tandem {

enum class GgufValueType : uint32_t {
  UINT8 = 0,
  INT8 = 1,
  UINT16 = 2,
  INT16 = 3,
  UINT32 = 4,
  INT32 = 5,
  FLOAT32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  UINT64 = 10,
  INT64 = 11,
  FLOAT64 = 12,
};

std::string_view gguf_value_type_name(GgufValueType type);
// Bytes of one element of a scalar type; 0 for STRING, ARRAY and unknown types.
size_t gguf_scalar_size(GgufValueType type);

// One metadata value. Scalars are widened into the matching 64-bit member; arrays keep a
// pointer to their packed elements in the mapping (numeric), a list of views (strings) or a
// list of child values (arrays of arrays).
struct GgufValue {
  GgufValueType type = GgufValueType::UINT8;
  uint64_t u64 = 0;  // UINT8/16/32/64, BOOL
  int64_t i64 = 0;   // INT8/16/32/64 (also set for unsigned values that fit)
  double f64 = 0;    // FLOAT32/64
  std::string_view str;

  // Arrays only.
  GgufValueType elem_type = GgufValueType::UINT8;
  uint64_t count = 0;
  const uint8_t* elems = nullptr;          // packed numeric elements (unaligned), numeric arrays
  std::vector<std::string_view> strings;   // STRING arrays
  std::vector<GgufValue> items;            // ARRAY arrays
  uint64_t file_offset = 0;                // where the value starts in the file

  bool is_integer() const;
  bool is_float() const {
    return type == GgufValueType::FLOAT32 || type == GgufValueType::FLOAT64;
  }
};

struct GgufTensorInfo {
  std::string name;
  TensorType type = TensorType::F32;
  uint32_t n_dims = 0;
  int64_t ne[4] = {1, 1, 1, 1};  // ggml order: ne[0] is the contiguous (row) dimension
  uint64_t offset = 0;           // relative to the start of the data section
  size_t nbytes = 0;
  const uint8_t* data = nullptr;  // into the mapping

  int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  int64_t n_rows() const { return ne[1] * ne[2] * ne[3]; }
  std::string shape_string() const;  // e.g. "[640, 262144]"
};

class GgufFile {
 public:
  // Opens and validates the whole header and tensor table. Throws tandem::Error.
  static std::unique_ptr<GgufFile> open(const std::string& path);
  // Parses an in-memory image (used by the fuzzer and tests); the buffer must outlive the file.
  static std::unique_ptr<GgufFile> from_memory(const uint8_t* data, size_t size,
                                               const std::string& name = "<memory>");

  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  size_t file_size() const { return size_; }
  size_t data_offset() const { return data_offset_; }
  const uint8_t* base() const { return base_; }

  // Metadata, in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kv_; }
  const GgufValue* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }

  // Typed getters. The *_or variants return the fallback when the key is absent; all of them
  // throw when the key is present with a type that cannot represent the request.
  std::string_view get_string(std::string_view key) const;
  std::optional<std::string_view> get_string_opt(std::string_view key) const;
  uint64_t get_u64(std::string_view key) const;
  std::optional<uint64_t> get_u64_opt(std::string_view key) const;
  int64_t get_i64_or(std::string_view key, int64_t fallback) const;
  double get_f64(std::string_view key) const;
  std::optional<double> get_f64_opt(std::string_view key) const;
  bool get_bool_or(std::string_view key, bool fallback) const;
  // Array getters; throw when the key is missing or is not an array of the right kind.
  const std::vector<std::string_view>& get_string_array(std::string_view key) const;
  std::vector<float> get_f32_array(std::string_view key) const;
  std::vector<int64_t> get_int_array(std::string_view key) const;

  // Tensors, in file order.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;

 private:
  GgufFile() = default;
  void parse();

  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  size_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::map<std::string, size_t, std::less<>> kv_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace tandem
