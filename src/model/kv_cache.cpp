#include "model/kv_cache.h"

namespace tandem {

KvCache::KvCache(int n_layer, int n_seq, int n_ctx, int kv_dim, int v_dim)
    : n_layer_(n_layer), n_seq_(n_seq), n_ctx_(n_ctx), kv_dim_(kv_dim), v_dim_(v_dim) {
  const size_t slots = static_cast<size_t>(n_layer) * n_seq * static_cast<size_t>(n_ctx);
  // new float[] without () leaves the pages untouched until written.
  k_.reset(new float[slots * kv_dim]);
  v_.reset(new float[slots * v_dim]);
  len_.assign(n_seq, 0);
}

size_t KvCache::bytes() const {
  return static_cast<size_t>(n_layer_) * n_seq_ * static_cast<size_t>(n_ctx_) * (kv_dim_ + v_dim_) *
         sizeof(float);
}

}  // namespace tandem
