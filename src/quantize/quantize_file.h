// Rewrites a GGUF file with its weights in another type: the engine behind `tandem quantize`.
//
// Every tensor is planned with plan_tensor_types (llama.cpp's rules), converted to f32 (from
// F32/F16/BF16 or by dequantizing an already-quantized tensor) and quantized row by row on a
// thread pool; tensors whose type does not change are copied byte for byte. All metadata is
// kept; general.file_type is set to llama.cpp's LLAMA_FTYPE number, general.quantization_version
// to 2, and general.quantized_by = "tandem", tandem.quantize.type = the file type name and
// tandem.quantize.pure = --pure are recorded.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "quantize/type_mix.h"

namespace tandem::quant {

struct QuantizeOptions {
  FileType file_type;
  bool pure = false;  // every quantizable tensor gets the file type's type (no mix rules)
  int n_threads = 0;  // 0: default thread count
  // Called after each tensor: (index in output order, count, plan, bytes in, bytes out).
  std::function<void(size_t, size_t, const TensorPlan&, size_t, size_t)> on_tensor;
};

struct QuantizeReport {
  std::vector<TensorPlan> plans;
  uint64_t in_file_bytes = 0;
  uint64_t out_file_bytes = 0;
  uint64_t in_tensor_bytes = 0;
  uint64_t out_tensor_bytes = 0;
  uint64_t n_params = 0;
  int n_quantized = 0;
  int n_copied = 0;
  int n_fallback = 0;
  double seconds = 0;
};

QuantizeReport quantize_file(const std::string& in_path, const std::string& out_path,
                             const QuantizeOptions& opt);

}  // namespace tandem::quant
