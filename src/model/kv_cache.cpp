#include "model/kv_cache.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>

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

namespace {

// Drops the whole pages inside [p, p + bytes); partial pages at the ends stay (they are shared
// with the neighbouring slots).
void drop_pages(void* p, size_t bytes) {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + page - 1) & ~(page - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(page - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

}  // namespace

void KvCache::release(int seq) {
  len_[seq] = 0;
  for (int l = 0; l < n_layer_; ++l) {
    drop_pages(keys(l, seq), static_cast<size_t>(n_ctx_) * kv_dim_ * sizeof(float));
    drop_pages(values(l, seq), static_cast<size_t>(n_ctx_) * v_dim_ * sizeof(float));
  }
}

}  // namespace tandem
