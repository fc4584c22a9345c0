// Rewrites a GGUF file with its weights in another type: the engine behind `tandem quantize`.
//
// Every tensor is planned with plan_tensor_types (llama.cpp's rules), converted to f32 (from
// F32/F16/BF16 or by dequantizing an already-quantized tensor) and quantized row by row on a
// thread pool; tensors whose type does not change are copied byte for byte. All metadata is
// kept; general.file_type is set to llama.cpp's LLAMA_FTYPE number, general.quantization_version
// to 2, and general.quantized_by = "tandem", tandem.quantize.type = the file type name and
// tandem.quantize.pure = --pure are recorded.
#pragma once

// QuantizeOptions, QuantizeReport and quantize_file are declared in the public API (the CLI
// calls them).
#include "quantize/type_mix.h"
#include "tandem/quantize.h"
