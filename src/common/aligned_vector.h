// std::vector storage aligned to a cache line, for buffers the kernels write with streaming
// stores (which need vector-aligned addresses; malloc gives 16 bytes).
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace tandem {

template <class T, std::size_t kAlign = 64>
struct AlignedAllocator {
  using value_type = T;
  template <class U>
  struct rebind {
    using other = AlignedAllocator<U, kAlign>;
  };

  AlignedAllocator() = default;
  template <class U>
  AlignedAllocator(const AlignedAllocator<U, kAlign>&) {}

  T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(kAlign)));
  }
  void deallocate(T* p, std::size_t) { ::operator delete(p, std::align_val_t(kAlign)); }

  template <class U>
  bool operator==(const AlignedAllocator<U, kAlign>&) const {
    return true;
  }
};

template <class T>
using AlignedVector = std::vector<T, AlignedAllocator<T>>;

}  // namespace tandem
