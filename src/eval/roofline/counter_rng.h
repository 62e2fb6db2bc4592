// The random data of `bench kernels` (weights, rows, queries): a counter-based generator, value
// i of stream `key` is splitmix64 of the mixed counter, so the data do not depend on the thread
// that writes them.
#pragma once

#include <cstdint>

namespace vq::eval {

inline std::uint64_t counter_mix(std::uint64_t seed, std::uint64_t key, std::uint64_t i) {
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ull + key * 0xD1B54A32D192ED03ull + i;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [-a, a).
inline float counter_uniform(std::uint64_t seed, std::uint64_t key, std::uint64_t i, float a) {
  const double u = static_cast<double>(counter_mix(seed, key, i) >> 11) * 0x1.0p-53;
  return static_cast<float>((2.0 * u - 1.0) * a);
}

}  // namespace vq::eval
