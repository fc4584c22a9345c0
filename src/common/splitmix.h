// splitmix64 (Steele, Lea and Flood): a small, fast stream of 64-bit values that is the same on
// every platform (the standard library's distributions are not). The project's seeded draws
// (sampling, synthetic weights, router training and the random router) and its hashes of ids
// all go through it.
#pragma once

#include <cstdint>

namespace tandem {

// The output function: a well-mixed 64-bit value of z.
inline uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The stream's step: advances state by the golden-ratio increment and returns the next value.
inline uint64_t splitmix64(uint64_t& state) {
  return splitmix64_mix(state += 0x9E3779B97F4A7C15ull);
}

// A double in [0, 1) from the top 53 bits of a value.
inline double unit_interval(uint64_t v) {
  return static_cast<double>(v >> 11) * 0x1.0p-53;
}

}  // namespace tandem
