#include "model/kv_cache.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cassert>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/kernels.h"

namespace tandem {

namespace {

size_t element_size(TensorType t, const char* what) {
  if (t == TensorType::F32) return 4;
  if (t == TensorType::F16) return 2;
  throw std::invalid_argument(std::string("KV cache ") + what + " type " +
                              std::string(traits(t).name) + ", expected f32 or f16");
}

void store_row(TensorType t, const float* src, void* dst, int n) {
  if (t == TensorType::F32) {
    std::memcpy(dst, src, sizeof(float) * static_cast<size_t>(n));
  } else {
    kernels::quantize_activation_row(TensorType::F16, src, dst, n);
  }
}

}  // namespace

KvCache::KvCache(int n_layer, int n_seq, int n_ctx, int kv_dim, int v_dim, TensorType key_type,
                 TensorType value_type)
    : n_layer_(n_layer),
      n_seq_(n_seq),
      n_ctx_(n_ctx),
      kv_dim_(kv_dim),
      v_dim_(v_dim),
      key_type_(key_type),
      value_type_(value_type),
      key_size_(element_size(key_type, "key")),
      value_size_(element_size(value_type, "value")) {
  const size_t slots = static_cast<size_t>(n_layer) * n_seq * static_cast<size_t>(n_ctx);
  // new std::byte[] without () leaves the pages untouched until written.
  k_.reset(new std::byte[slots * kv_dim * key_size_]);
  v_.reset(new std::byte[slots * v_dim * value_size_]);
  len_.assign(n_seq, 0);
}

void KvCache::store(int layer, int seq, int pos, const float* key, const float* value) {
  assert(pos >= 0 && pos < n_ctx_);
  store_row(
      key_type_, key,
      static_cast<std::byte*>(keys(layer, seq)) + static_cast<size_t>(pos) * kv_dim_ * key_size_,
      kv_dim_);
  store_row(
      value_type_, value,
      static_cast<std::byte*>(values(layer, seq)) + static_cast<size_t>(pos) * v_dim_ * value_size_,
      v_dim_);
}

void KvCache::copy_positions(int src, int dst, int from, int to) {
  assert(from >= 0 && from <= len_[dst] && to <= len_[src]);
  if (to > from) {
    const size_t n = static_cast<size_t>(to - from);
    const size_t k_row = static_cast<size_t>(kv_dim_) * key_size_;
    const size_t v_row = static_cast<size_t>(v_dim_) * value_size_;
    for (int l = 0; l < n_layer_; ++l) {
      std::memcpy(static_cast<std::byte*>(keys(l, dst)) + from * k_row,
                  static_cast<const std::byte*>(keys(l, src)) + from * k_row, n * k_row);
      std::memcpy(static_cast<std::byte*>(values(l, dst)) + from * v_row,
                  static_cast<const std::byte*>(values(l, src)) + from * v_row, n * v_row);
    }
  }
  len_[dst] = to;
}

size_t KvCache::bytes_per_position() const {
  return static_cast<size_t>(n_layer_) * (kv_dim_ * key_size_ + v_dim_ * value_size_);
}

size_t KvCache::bytes() const {
  return static_cast<size_t>(n_seq_) * static_cast<size_t>(n_ctx_) * bytes_per_position();
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
    drop_pages(keys(l, seq), static_cast<size_t>(n_ctx_) * kv_dim_ * key_size_);
    drop_pages(values(l, seq), static_cast<size_t>(n_ctx_) * v_dim_ * value_size_);
  }
}

}  // namespace tandem
