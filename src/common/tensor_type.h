// The ggml tensor types tandem knows, with their block geometry. Numbering follows the GGUF
// file format (ggml_type), so values read from a file map directly onto this enum.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace tandem {

enum class TensorType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  BF16 = 30,
};

struct TensorTypeTraits {
  std::string_view name;
  uint32_t block_size;  // elements per block (1 for plain types)
  uint32_t type_size;   // bytes per block
  bool is_quantized;
};

// Traits for a raw type id read from a file; nullopt for ids tandem does not support.
std::optional<TensorTypeTraits> tensor_type_traits(uint32_t raw_type);
const TensorTypeTraits& traits(TensorType type);
std::optional<TensorType> tensor_type_from_name(std::string_view name);

// Bytes needed for a row of n elements; n must be a multiple of the block size.
inline size_t row_bytes(TensorType type, int64_t n) {
  const auto& t = traits(type);
  return static_cast<size_t>(n / t.block_size) * t.type_size;
}

}  // namespace tandem
