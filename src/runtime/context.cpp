#include <algorithm>

#include "common/error.h"
#include "common/thread_pool.h"
#include "model/forward.h"
#include "model/kv_cache.h"
#include "model/model_config.h"
#include "model/model_weights.h"
#include "runtime/model_internals.h"
#include "tandem/engine.h"

namespace tandem {

struct Context::Engine {
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<KvCache> cache;
  std::unique_ptr<Forward> forward;
  std::unique_ptr<ForwardOutputs> out;
};

Context::Context(const Model& model, const ContextParams& params) : model_(model) {
  const ModelConfig& c = ModelInternals::config(model);
  n_ctx_ = params.n_ctx > 0 ? params.n_ctx : std::min(c.n_ctx_train, 4096);
  if (n_ctx_ <= 0 || n_ctx_ > (1 << 20)) {
    throw Error("context size " + std::to_string(params.n_ctx) + " is out of range 1..1048576");
  }
  if (params.n_seq < 1 || params.n_seq > 4096) {
    throw Error("number of sequences " + std::to_string(params.n_seq) + " is out of range 1..4096");
  }
  n_seq_ = params.n_seq;
  const int threads = params.n_threads > 0 ? params.n_threads : default_thread_count();
  engine_ = std::make_unique<Engine>();
  engine_->pool = std::make_unique<ThreadPool>(threads);
  const auto tensor_type = [](KvCacheType t) {
    return t == KvCacheType::F16 ? TensorType::F16 : TensorType::F32;
  };
  engine_->cache =
      std::make_unique<KvCache>(c.n_layer, n_seq_, n_ctx_, c.kv_dim(), c.v_dim(),
                                tensor_type(params.type_k), tensor_type(params.type_v));
  engine_->forward = std::make_unique<Forward>(c, ModelInternals::weights(model), *engine_->pool);
  engine_->out = std::make_unique<ForwardOutputs>();
}

Context::~Context() = default;

const char* kv_cache_type_name(KvCacheType t) {
  return t == KvCacheType::F16 ? "f16" : "f32";
}

KvCacheType parse_kv_cache_type(const std::string& name) {
  if (name == "f32") return KvCacheType::F32;
  if (name == "f16") return KvCacheType::F16;
  throw Error("KV cache type '" + name + "': expected f32 or f16");
}

KvCacheType Context::type_k() const {
  return engine_->cache->key_type() == TensorType::F16 ? KvCacheType::F16 : KvCacheType::F32;
}

KvCacheType Context::type_v() const {
  return engine_->cache->value_type() == TensorType::F16 ? KvCacheType::F16 : KvCacheType::F32;
}

size_t Context::kv_bytes_per_position() const {
  return engine_->cache->bytes_per_position();
}

int Context::n_threads() const {
  return engine_->pool->size();
}

void Context::decode(std::span<const BatchToken> batch) {
  if (batch.empty()) throw Error("decode: the batch is empty");
  const int n_vocab = ModelInternals::config(model_).n_vocab;
  // Validate everything before touching the cache, so a bad batch changes nothing.
  std::vector<int> next(n_seq_);
  for (int s = 0; s < n_seq_; ++s) next[s] = engine_->cache->length(s);
  for (size_t i = 0; i < batch.size(); ++i) {
    const BatchToken& t = batch[i];
    if (t.token < 0 || t.token >= n_vocab) {
      throw Error("decode: batch token " + std::to_string(i) + ": token id " +
                  std::to_string(t.token) + " is outside the vocabulary [0, " +
                  std::to_string(n_vocab) + ")");
    }
    if (t.seq < 0 || t.seq >= n_seq_) {
      throw Error("decode: batch token " + std::to_string(i) + ": sequence " +
                  std::to_string(t.seq) + " is outside [0, " + std::to_string(n_seq_) + ")");
    }
    if (t.pos != next[t.seq]) {
      throw Error("decode: batch token " + std::to_string(i) + ": sequence " +
                  std::to_string(t.seq) + " expects position " + std::to_string(next[t.seq]) +
                  ", found " + std::to_string(t.pos));
    }
    if (t.pos >= n_ctx_) {
      throw Error("decode: sequence " + std::to_string(t.seq) + " is full: position " +
                  std::to_string(t.pos) + " does not fit a context of " + std::to_string(n_ctx_) +
                  " tokens");
    }
    ++next[t.seq];
  }
  LayerProbe probe = probe_;
  engine_->forward->run(batch, *engine_->cache, *engine_->out, probe ? &probe : nullptr);
  out_row_.assign(batch.size(), -1);
  out_has_logits_.assign(batch.size(), 0);
  for (size_t r = 0; r < engine_->out->out_index.size(); ++r) {
    out_row_[engine_->out->out_index[r]] = static_cast<int32_t>(r);
    out_has_logits_[engine_->out->out_index[r]] = batch[engine_->out->out_index[r]].want_logits;
  }
}

std::span<const float> Context::logits(int i) const {
  if (i < 0 || i >= static_cast<int>(out_row_.size()) || out_row_[i] < 0 || !out_has_logits_[i]) {
    throw Error("logits: batch index " + std::to_string(i) +
                " did not ask for logits in the last decode");
  }
  const size_t V = ModelInternals::config(model_).n_vocab;
  return {engine_->out->logits.data() + out_row_[i] * V, V};
}

std::span<const float> Context::hidden(int i) const {
  if (i < 0 || i >= static_cast<int>(out_row_.size()) || out_row_[i] < 0) {
    throw Error("hidden: batch index " + std::to_string(i) +
                " asked for neither logits nor hidden state in the last decode");
  }
  const size_t D = ModelInternals::config(model_).n_embd;
  return {engine_->out->hidden.data() + out_row_[i] * D, D};
}

int Context::seq_length(int seq) const {
  if (seq < 0 || seq >= n_seq_) throw Error("sequence " + std::to_string(seq) + " out of range");
  return engine_->cache->length(seq);
}

void Context::truncate(int seq, int n_keep) {
  if (seq < 0 || seq >= n_seq_) throw Error("sequence " + std::to_string(seq) + " out of range");
  if (n_keep < 0) throw Error("truncate: negative length " + std::to_string(n_keep));
  engine_->cache->set_length(seq, std::min(n_keep, engine_->cache->length(seq)));
}

void Context::copy_positions(int src, int dst, int from, int to) {
  for (const int seq : {src, dst}) {
    if (seq < 0 || seq >= n_seq_) throw Error("sequence " + std::to_string(seq) + " out of range");
  }
  if (src == dst)
    throw Error("copy_positions: source and destination are both sequence " + std::to_string(src));
  KvCache& cache = *engine_->cache;
  if (from < 0 || from > cache.length(dst) || to < from || to > cache.length(src)) {
    throw Error("copy_positions: positions [" + std::to_string(from) + ", " + std::to_string(to) +
                ") of sequence " + std::to_string(src) + " (" + std::to_string(cache.length(src)) +
                " filled) onto sequence " + std::to_string(dst) + " (" +
                std::to_string(cache.length(dst)) + " filled)");
  }
  cache.copy_positions(src, dst, from, to);
}

void Context::release(int seq) {
  if (seq < 0 || seq >= n_seq_) throw Error("sequence " + std::to_string(seq) + " out of range");
  engine_->cache->release(seq);
}

void Context::set_layer_probe(std::function<void(int, const float*, int)> probe) {
  probe_ = std::move(probe);
}

}  // namespace tandem
