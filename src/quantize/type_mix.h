// File types ("Q4_K_M", "Q8_0", ...) and the per-tensor type rules of llama.cpp's quantizer
// (llama_tensor_get_type), so that `tandem quantize` picks the same type for every tensor as
// `llama-quantize` does.
//
// Which tensors are quantized at all: names ending in "weight" with at least 2 dimensions,
// except *_norm.weight, ffn_gate_inp, pos_embd/token_types, ssm_conv1d and attn_rel_b; all
// others (norms, biases, rope_freqs) are copied unchanged. A tensor whose chosen type equals its
// current type is copied unchanged too.
//
// Mix rules (not with --pure): output.weight, and token_embd.weight when the model has no
// separate output (tied), get Q6_K (Q8_0 when ne0 is not a multiple of the default type's block
// size; Q8_0 files keep Q8_0). For the K mixes, with use_more_bits(i, n) = i < n/8 || i >= 7n/8
// || (i - n/8) % 3 == 2:
//   Q2_K    attn_v Q4_K if n_head/n_head_kv >= 4 else Q3_K; ffn_down Q3_K; attn_output Q3_K
//   Q3_K_S  -
//   Q3_K_M  attn_v Q5_K for the first two, else Q4_K; ffn_down Q5_K for i < n/16 else Q4_K;
//           attn_output Q4_K
//   Q3_K_L  attn_v, ffn_down, attn_output Q5_K
//   Q4_K_S  attn_v Q5_K for i < 4; ffn_down Q5_K for i < n/8
//   Q4_K_M  attn_v, ffn_down Q6_K where use_more_bits
//   Q5_K_M  attn_v, ffn_down Q6_K where use_more_bits
// (the attn_v index counts attn_v tensors in layer order, the ffn_down index is the layer).
//
// Row-length fallback (ne0 not a multiple of the type's block size), as llama.cpp: Q4_K ->
// Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0; Q2_K/Q3_K -> llama.cpp uses IQ4_NL, which tandem does not
// support, so tandem uses Q4_0 (same 4.5 bits per weight and block size 32); if even that block
// does not fit, F16. A non-K type (Q4_0 ... Q8_0, block 32) whose block does not divide ne0 falls
// back to F16 (llama.cpp refuses such a file). The fallback also applies with --pure (llama.cpp
// would abort there).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/tensor_type.h"
#include "tandem/quantize.h"  // FileType, TensorPlan, parse_file_type, file_type_names

namespace tandem {
class GgufFile;
}

namespace tandem::quant {

// Hyper-parameters the rules need (read from the GGUF metadata by plan_from_file).
struct MixModel {
  std::string arch;
  int n_layer = 0;
  int n_head = 0;
  int n_head_kv = 0;
};

// Chooses the output type of every tensor of `f`, in llama.cpp's order (by layer, then name).
std::vector<TensorPlan> plan_tensor_types(const GgufFile& f, const FileType& ft, bool pure);

// The same for a list of tensors that are not in a file yet (index = position in the list).
struct TensorDesc {
  std::string name;
  uint32_t n_dims = 1;
  int64_t ne0 = 0;
  TensorType type = TensorType::F32;  // current type
};
std::vector<TensorPlan> plan_tensor_types(const std::vector<TensorDesc>& tensors, const MixModel& m,
                                          const FileType& ft, bool pure);
// Reads the hyper-parameters the rules need from a file's metadata.
MixModel mix_model_from_file(const GgufFile& f);

// The rule for one tensor (exposed for tests). i_attn_v: index among attn_v tensors;
// n_attn_v: their count; has_output: the model has a separate output.weight. ne0: row length.
TensorType mix_type(const FileType& ft, const MixModel& m, const std::string& name, int64_t ne0,
                    int i_attn_v, int n_attn_v, int i_ffn_down, bool has_output);

// The row-length fallback; returns `type` when ne0 fits, and sets *why otherwise.
TensorType fallback_type(TensorType type, int64_t ne0, std::string* why);

// True for tensors llama.cpp quantizes (name, dims); see the header comment.
bool is_quantizable(const std::string& name, uint32_t n_dims);

}  // namespace tandem::quant
