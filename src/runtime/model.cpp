#include "common/error.h"
#include "gguf/gguf.h"
#include "kernels/kernels.h"
#include "model/model_config.h"
#include "model/model_weights.h"
#include "runtime/model_internals.h"
#include "tandem/engine.h"
#include "tokenizer/tokenizer.h"

namespace tandem {

Model::Model() : parts_(std::make_unique<Parts>()) {}
Model::~Model() = default;

std::unique_ptr<Model> Model::load(const std::string& path, const LoadOptions& options) {
  std::unique_ptr<Model> m(new Model());
  m->parts_->file = GgufFile::open(path);
  m->parts_->config = std::make_unique<ModelConfig>(config_from_gguf(*m->parts_->file));
  m->parts_->weights =
      std::make_unique<ModelWeights>(bind_weights(*m->parts_->file, *m->parts_->config));
  if (options.dequantize_to_f32) dequantize_weights(*m->parts_->weights, m->parts_->owned);
  if (options.repack) pack_weights(*m->parts_->weights, m->parts_->packed);
  m->parts_->tokenizer = Tokenizer::from_gguf(*m->parts_->file);
  const ModelConfig& c = *m->parts_->config;
  if (m->parts_->tokenizer->n_vocab() > c.n_vocab) {
    throw Error(path + ": the tokenizer has " + std::to_string(m->parts_->tokenizer->n_vocab()) +
                " tokens but token_embd.weight has only " + std::to_string(c.n_vocab) + " rows");
  }
  ModelInfo& info = m->info_;
  info.arch = c.arch_name;
  info.name = c.name;
  info.path = path;
  info.n_vocab = c.n_vocab;
  info.vocab_hash = m->parts_->tokenizer->fingerprint_hex();
  info.n_embd = c.n_embd;
  info.n_layer = c.n_layer;
  info.n_head = c.n_head;
  info.n_head_kv = c.n_head_kv;
  info.n_ctx_train = c.n_ctx_train;
  info.file_bytes = m->parts_->file->file_size();
  for (const auto& t : m->parts_->file->tensors())
    info.n_params += static_cast<uint64_t>(t.n_elements());
  for (const auto& p : m->parts_->packed) info.packed_bytes += p->bytes();
  return m;
}

std::string simd_target() {
  return kernels::simd_target_name();
}

void set_simd_target(const std::string& name) {
  kernels::set_simd_target(name);
}

}  // namespace tandem
