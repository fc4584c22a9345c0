// tandem's own f32 vector kernels for the layers above the engine: the trained router's forward
// pass (tandem/router_mlp.h) runs through them. An entry point with no kernel types in it, so
// that the router includes no kernel headers (src/layers.txt) and still uses the SIMD kernels
// (Highway, the target chosen at run time), each tested against its scalar reference.
#pragma once

#include <cstdint>

namespace tandem {

// sum_i a[i] * b[i] over n floats (the kernels' dot_f32).
float vector_dot(const float* a, const float* b, int64_t n);

}  // namespace tandem
