// The quantizer's entry points for the CLI (`tandem quantize`, `tandem synth`), so that it
// includes no header of src/quantize: file types and their llama.cpp type mixes, rewriting a
// GGUF file in another type, random-weight files of real models' shapes. The rules themselves
// are described where they are implemented (src/quantize/type_mix.h, quantize_file.h, synth.h).
// Perplexity's statistics are an evaluation: tandem/perplexity.h.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

// A tensor element type (src/common/tensor_type.h); named by tensor_type_name below.
enum class TensorType : uint32_t;

}  // namespace tandem

namespace tandem::quant {

// ---- file types and per-tensor plans (src/quantize/type_mix.h) ----

struct FileType {
  std::string name;         // canonical name, e.g. "Q4_K_M"
  uint32_t llama_ftype;     // llama.cpp's LLAMA_FTYPE_* number (general.file_type)
  TensorType default_type;  // type of the ordinary 2-D weights
};

// Parses a file type name (case-insensitive; Q3_K, Q4_K, Q5_K are aliases of the _M mixes).
std::optional<FileType> parse_file_type(std::string_view name);
// All accepted names, for --help.
std::vector<std::string> file_type_names();

// "Q4_K", "F32", ...: the name of a tensor type, as a plan's types print.
std::string_view tensor_type_name(TensorType type);

struct TensorPlan {
  size_t index = 0;  // into GgufFile::tensors()
  std::string name;
  TensorType src_type{};  // TensorType::F32 (0), as the enum is declared here without values
  TensorType dst_type{};  // F32
  bool quantize = false;  // false: bytes copied unchanged (dst_type == src_type)
  std::string fallback;   // non-empty: why dst_type differs from the rule's choice
};

// ---- rewriting a file in another type (src/quantize/quantize_file.h) ----

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

// ---- random-weight files of real models' shapes (src/quantize/synth.h) ----

struct SynthShape {
  std::string name;  // "gemma3-270m"
  std::string arch;  // "gemma3", "qwen2", "llama", "qwen3"
  int n_vocab = 0, n_embd = 0, n_layer = 0, n_head = 0, n_head_kv = 0, head_dim = 0, n_ff = 0;
  bool tied = true;
  bool qkv_bias = false;
  bool qk_norm = false;
  bool post_norms = false;
  float rope_base = 10000.f;
  float rope_base_swa = 10000.f;
  int sliding_window = 0;
  int context_length = 4096;
  float rms_eps = 1e-6f;
};

// Known shapes: gemma3-270m, qwen2.5-0.5b, qwen2.5-1.5b.
const std::vector<SynthShape>& synth_shapes();
const SynthShape* find_synth_shape(const std::string& name);

struct SynthOptions {
  FileType file_type;
  bool pure = false;
  uint64_t seed = 1;
  int n_threads = 0;
  std::string vocab_from;  // optional GGUF whose tokenizer.* keys are copied
  std::function<void(size_t, size_t, const TensorPlan&)> on_tensor;
};

struct SynthReport {
  std::vector<TensorPlan> plans;
  uint64_t n_params = 0;
  uint64_t file_bytes = 0;
  double seconds = 0;
};

SynthReport write_synth_model(const SynthShape& shape, const std::string& out_path,
                              const SynthOptions& opt);

}  // namespace tandem::quant
