// Key/value cache: for every layer, sequence slot and position, the rotated key and the value
// of each KV head, in f32 or f16 (keys and values each; llama.cpp's -ctk/-ctv).
//
// Memory is reserved up front but only touched as positions fill, so a large n_ctx costs
// address space, not resident memory, until it is used.
#pragma once

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/tensor_type.h"

namespace tandem {

class KvCache {
 public:
  // key_type, value_type: TensorType::F32 or F16 (std::invalid_argument otherwise).
  KvCache(int n_layer, int n_seq, int n_ctx, int kv_dim, int v_dim,
          TensorType key_type = TensorType::F32, TensorType value_type = TensorType::F32);

  int n_layer() const { return n_layer_; }
  int n_seq() const { return n_seq_; }
  int n_ctx() const { return n_ctx_; }
  int kv_dim() const { return kv_dim_; }
  int v_dim() const { return v_dim_; }
  TensorType key_type() const { return key_type_; }
  TensorType value_type() const { return value_type_; }
  size_t key_size() const { return key_size_; }  // bytes per key element
  size_t value_size() const { return value_size_; }

  // Keys of one layer and sequence: [n_ctx][kv_dim] of key_type; values: [n_ctx][v_dim] of
  // value_type.
  void* keys(int layer, int seq) { return k_.get() + offset(layer, seq, kv_dim_, key_size_); }
  void* values(int layer, int seq) { return v_.get() + offset(layer, seq, v_dim_, value_size_); }
  // Writes the key and value of one position from f32 (rounded to nearest even into f16).
  void store(int layer, int seq, int pos, const float* key, const float* value);

  // Makes positions [from, to) of sequence dst those of sequence src (keys and values, every
  // layer) and dst's length `to`. The caller has checked 0 <= from <= length(dst) and
  // to <= length(src): dst keeps the prefix it shares with src.
  void copy_positions(int src, int dst, int from, int to);

  // Number of positions filled for a sequence; positions [0, length) are valid.
  int length(int seq) const { return len_[seq]; }
  void set_length(int seq, int n) {
    assert(n >= 0 && n <= n_ctx_);
    len_[seq] = n;
  }

  size_t bytes() const;
  // Bytes one position of one sequence takes over all layers (keys and values).
  size_t bytes_per_position() const;
  // Sets the length to 0 and returns the sequence's whole pages to the OS (madvise DONTNEED);
  // the memory reads as zeros and is faulted in again when written.
  void release(int seq);

 private:
  // Callers (the forward pass, Context) have validated every index against the sizes; a slot
  // outside them here is a bug, not bad input.
  size_t offset(int layer, int seq, int dim, size_t elem) const {
    assert(layer >= 0 && layer < n_layer_ && seq >= 0 && seq < n_seq_);
    return (static_cast<size_t>(layer) * n_seq_ + seq) * static_cast<size_t>(n_ctx_) * dim * elem;
  }

  int n_layer_, n_seq_, n_ctx_, kv_dim_, v_dim_;
  TensorType key_type_, value_type_;
  size_t key_size_, value_size_;    // bytes per element
  std::unique_ptr<std::byte[]> k_;  // [n_layer][n_seq][n_ctx][kv_dim] of key_type
  std::unique_ptr<std::byte[]> v_;  // [n_layer][n_seq][n_ctx][v_dim] of value_type
  std::vector<int> len_;            // [n_seq]
};

}  // namespace tandem
