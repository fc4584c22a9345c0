// What a loaded Model is made of, for the layers inside src/ (the runtime, and above it the
// router, client and server that need the tokenizer or the configuration): engine.h hands out
// the text API only, and forward-declares none of these types.
//
//   const Tokenizer& tok = ModelInternals::tokenizer(model);
//   const ModelConfig& c = ModelInternals::config(model);
#pragma once

#include <memory>
#include <vector>

#include "gguf/gguf.h"
#include "kernels/kernels.h"
#include "model/model_config.h"
#include "model/model_weights.h"
#include "tandem/engine.h"
#include "tokenizer/tokenizer.h"

namespace tandem {

struct Model::Parts {
  std::unique_ptr<GgufFile> file;
  std::unique_ptr<ModelConfig> config;
  std::unique_ptr<ModelWeights> weights;
  std::unique_ptr<Tokenizer> tokenizer;
  std::vector<std::vector<float>> owned;                        // f32 copies when dequantize_to_f32
  std::vector<std::unique_ptr<kernels::PackedWeights>> packed;  // when repack
};

struct ModelInternals {
  static const Tokenizer& tokenizer(const Model& m) { return *m.parts_->tokenizer; }
  static const ModelConfig& config(const Model& m) { return *m.parts_->config; }
  static const ModelWeights& weights(const Model& m) { return *m.parts_->weights; }
  static const GgufFile& file(const Model& m) { return *m.parts_->file; }
};

}  // namespace tandem
