// Key/value cache: for every layer, sequence slot and position, the rotated key and the value
// of each KV head, in f32.
//
// Memory is reserved up front but only touched as positions fill, so a large n_ctx costs
// address space, not resident memory, until it is used.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace tandem {

class KvCache {
 public:
  KvCache(int n_layer, int n_seq, int n_ctx, int kv_dim, int v_dim);

  int n_layer() const { return n_layer_; }
  int n_seq() const { return n_seq_; }
  int n_ctx() const { return n_ctx_; }
  int kv_dim() const { return kv_dim_; }
  int v_dim() const { return v_dim_; }

  // Keys of one layer and sequence: [n_ctx][kv_dim]; values: [n_ctx][v_dim].
  float* keys(int layer, int seq) { return k_.get() + offset(layer, seq, kv_dim_); }
  float* values(int layer, int seq) { return v_.get() + offset(layer, seq, v_dim_); }

  // Number of positions filled for a sequence; positions [0, length) are valid.
  int length(int seq) const { return len_[seq]; }
  void set_length(int seq, int n) { len_[seq] = n; }

  size_t bytes() const;
  // Sets the length to 0 and returns the sequence's whole pages to the OS (madvise DONTNEED);
  // the memory reads as zeros and is faulted in again when written.
  void release(int seq);

 private:
  size_t offset(int layer, int seq, int dim) const {
    return (static_cast<size_t>(layer) * n_seq_ + seq) * static_cast<size_t>(n_ctx_) * dim;
  }

  int n_layer_, n_seq_, n_ctx_, kv_dim_, v_dim_;
  std::unique_ptr<float[]> k_;  // [n_layer][n_seq][n_ctx][kv_dim]
  std::unique_ptr<float[]> v_;  // [n_layer][n_seq][n_ctx][v_dim]
  std::vector<int> len_;        // [n_seq]
};

}  // namespace tandem
