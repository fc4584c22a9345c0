#include "common/tensor_type.h"

#include <array>

#include "common/error.h"

namespace tandem {
namespace {

struct Entry {
  TensorType type;
  TensorTypeTraits traits;
};

constexpr std::array<Entry, 20> kTypes = {{
    {TensorType::F32, {"F32", 1, 4, false}},      {TensorType::F16, {"F16", 1, 2, false}},
    {TensorType::Q4_0, {"Q4_0", 32, 18, true}},   {TensorType::Q4_1, {"Q4_1", 32, 20, true}},
    {TensorType::Q5_0, {"Q5_0", 32, 22, true}},   {TensorType::Q5_1, {"Q5_1", 32, 24, true}},
    {TensorType::Q8_0, {"Q8_0", 32, 34, true}},   {TensorType::Q8_1, {"Q8_1", 32, 36, true}},
    {TensorType::Q2_K, {"Q2_K", 256, 84, true}},  {TensorType::Q3_K, {"Q3_K", 256, 110, true}},
    {TensorType::Q4_K, {"Q4_K", 256, 144, true}}, {TensorType::Q5_K, {"Q5_K", 256, 176, true}},
    {TensorType::Q6_K, {"Q6_K", 256, 210, true}}, {TensorType::Q8_K, {"Q8_K", 256, 292, true}},
    {TensorType::I8, {"I8", 1, 1, false}},        {TensorType::I16, {"I16", 1, 2, false}},
    {TensorType::I32, {"I32", 1, 4, false}},      {TensorType::I64, {"I64", 1, 8, false}},
    {TensorType::F64, {"F64", 1, 8, false}},      {TensorType::BF16, {"BF16", 1, 2, false}},
}};

}  // namespace

std::optional<TensorTypeTraits> tensor_type_traits(uint32_t raw_type) {
  for (const auto& e : kTypes) {
    if (static_cast<uint32_t>(e.type) == raw_type) return e.traits;
  }
  return std::nullopt;
}

const TensorTypeTraits& traits(TensorType type) {
  for (const auto& e : kTypes) {
    if (e.type == type) return e.traits;
  }
  throw Error("unknown tensor type id " + std::to_string(static_cast<uint32_t>(type)));
}

std::optional<TensorType> tensor_type_from_name(std::string_view name) {
  for (const auto& e : kTypes) {
    if (e.traits.name == name) return e.type;
  }
  return std::nullopt;
}

}  // namespace tandem
