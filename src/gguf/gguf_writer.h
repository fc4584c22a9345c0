// GGUF writer (format version 3).
//
// Collects metadata and tensors, then writes the file in one go:
//
//   header      "GGUF", version 3, tensor count, metadata count
//   metadata    key, value type, value   (in insertion order; setting a key again replaces it
//                                         in place)
//   tensor info name, n_dims, ne[0..n_dims), type, offset   (offsets relative to the data start)
//   padding     to the alignment
//   data        each tensor at a multiple of the alignment, zero padding between and after
//
// The alignment is 32 unless set_alignment() (or a copied general.alignment) says otherwise.
// write() goes to a temporary file beside the target, fsyncs it and renames it over the target, so
// a reader never sees a half-written file. Errors throw tandem::Error naming the key, tensor or
// file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "common/tensor_type.h"
#include "gguf/gguf.h"

namespace tandem {

class GgufWriter {
 public:
  GgufWriter() = default;

  // ---- metadata -------------------------------------------------------------------------------
  void set_u8(std::string_view key, uint8_t v);
  void set_i8(std::string_view key, int8_t v);
  void set_u16(std::string_view key, uint16_t v);
  void set_i16(std::string_view key, int16_t v);
  void set_u32(std::string_view key, uint32_t v);
  void set_i32(std::string_view key, int32_t v);
  void set_u64(std::string_view key, uint64_t v);
  void set_i64(std::string_view key, int64_t v);
  void set_f32(std::string_view key, float v);
  void set_f64(std::string_view key, double v);
  void set_bool(std::string_view key, bool v);
  void set_string(std::string_view key, std::string_view v);

  // Numeric arrays: T is one of uint8_t..int64_t, float, double (bool arrays: set_bool_array).
  template <typename T>
  void set_array(std::string_view key, std::span<const T> values) {
    static_assert(std::is_arithmetic_v<T> && !std::is_same_v<T, bool>);
    set_numeric_array(key, numeric_type<T>(), values.size(), values.data(), sizeof(T));
  }
  template <typename T>
  void set_array(std::string_view key, const std::vector<T>& values) {
    set_array(key, std::span<const T>(values));
  }
  void set_bool_array(std::string_view key, const std::vector<bool>& values);
  void set_string_array(std::string_view key, std::span<const std::string> values);
  void set_string_array(std::string_view key, std::span<const std::string_view> values);
  // Raw packed little-endian elements of a scalar type (count elements, count * size bytes).
  void set_numeric_array(std::string_view key, GgufValueType elem_type, uint64_t count,
                         const void* elems, size_t elem_size);
  // Any value as the reader returns it, arrays of arrays included (the value is copied).
  void set_value(std::string_view key, const GgufValue& value);

  // Copies every metadata key of `src` (a copied general.alignment also sets the alignment).
  void copy_metadata(const GgufFile& src);

  bool has(std::string_view key) const;
  void remove(std::string_view key);
  size_t metadata_count() const { return kv_.size(); }

  // Sets the data alignment (a power of two up to 1 MiB) and writes it as general.alignment.
  void set_alignment(uint64_t alignment);
  uint64_t alignment() const { return alignment_; }

  // ---- tensors --------------------------------------------------------------------------------
  // ne in ggml order (ne[0] contiguous), 1..4 dimensions; data must hold exactly the tensor's
  // bytes. add_tensor copies the data; add_tensor_view keeps only a pointer, so the caller keeps
  // the bytes alive until write() (use it for data from a mapped GgufFile).
  void add_tensor(std::string_view name, TensorType type, std::span<const int64_t> ne,
                  std::span<const uint8_t> data);
  void add_tensor_view(std::string_view name, TensorType type, std::span<const int64_t> ne,
                       std::span<const uint8_t> data);
  // Copies a tensor's description and data view from a mapped file (which must outlive write()).
  void add_tensor_view(const GgufTensorInfo& t);
  size_t tensor_count() const { return tensors_.size(); }

  // ---- output ---------------------------------------------------------------------------------
  std::vector<uint8_t> to_bytes() const;
  void write(const std::string& path) const;

 private:
  struct Kv {
    std::string key;
    std::vector<uint8_t> bytes;  // value type (u32) followed by the encoded value
  };
  struct Tensor {
    std::string name;
    TensorType type;
    uint32_t n_dims;
    int64_t ne[4];
    std::vector<uint8_t> owned;
    const uint8_t* data;
    size_t nbytes;
  };

  template <typename T>
  static constexpr GgufValueType numeric_type() {
    if constexpr (std::is_same_v<T, uint8_t>)
      return GgufValueType::UINT8;
    else if constexpr (std::is_same_v<T, int8_t>)
      return GgufValueType::INT8;
    else if constexpr (std::is_same_v<T, uint16_t>)
      return GgufValueType::UINT16;
    else if constexpr (std::is_same_v<T, int16_t>)
      return GgufValueType::INT16;
    else if constexpr (std::is_same_v<T, uint32_t>)
      return GgufValueType::UINT32;
    else if constexpr (std::is_same_v<T, int32_t>)
      return GgufValueType::INT32;
    else if constexpr (std::is_same_v<T, uint64_t>)
      return GgufValueType::UINT64;
    else if constexpr (std::is_same_v<T, int64_t>)
      return GgufValueType::INT64;
    else if constexpr (std::is_same_v<T, float>)
      return GgufValueType::FLOAT32;
    else if constexpr (std::is_same_v<T, double>)
      return GgufValueType::FLOAT64;
    else
      static_assert(sizeof(T) == 0, "unsupported GGUF array element type");
  }

  void put(std::string_view key, std::vector<uint8_t> bytes);
  Tensor& new_tensor(std::string_view name, TensorType type, std::span<const int64_t> ne,
                     size_t data_size);
  template <typename Sink>
  void emit(Sink& sink) const;

  std::vector<Kv> kv_;
  std::vector<Tensor> tensors_;
  uint64_t alignment_ = 32;
};

}  // namespace tandem
