// The public f32 vector entry points (include/tandem/vector_ops.h) over the kernels.
#include "tandem/vector_ops.h"

#include "kernels/kernels.h"

namespace tandem {

float vector_dot(const float* a, const float* b, int64_t n) {
  return kernels::dot_f32(a, b, n);
}

}  // namespace tandem
