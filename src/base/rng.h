// Counter-based random numbers: draw n of stream (seed, layer, kv head) is a pure function of
// those four values (SplitMix64 output function over key + (n + 1) * golden ratio), so results
// never depend on call order, threads or batch composition.
#pragma once

#include <cmath>
#include <cstdint>

namespace vq {

constexpr std::uint64_t mix64(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

class CounterRng {
 public:
  static constexpr std::uint64_t kGolden = 0x9e3779b97f4a7c15ull;

  constexpr CounterRng(std::uint64_t seed, std::uint64_t layer, std::uint64_t head) noexcept
      : key_(mix64(mix64(mix64(seed + kGolden) ^ (layer + 0x632be59bd9b4e019ull)) ^
                   (head + 0x8cb92ba72f3d8dd7ull))) {}

  constexpr std::uint64_t bits(std::uint64_t counter) const noexcept {
    return mix64(key_ + (counter + 1) * kGolden);
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform(std::uint64_t counter) const noexcept {
    return static_cast<double>(bits(counter) >> 11) * 0x1.0p-53;
  }
  // Uniform in (0, 1): never 0, for logs.
  double uniform_open(std::uint64_t counter) const noexcept {
    return (static_cast<double>(bits(counter) >> 11) + 0.5) * 0x1.0p-53;
  }
  // Standard normal from draws 2n and 2n+1 (Box-Muller).
  double normal(std::uint64_t n) const noexcept {
    const double u1 = uniform_open(2 * n);
    const double u2 = uniform(2 * n + 1);
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  std::uint64_t key() const noexcept { return key_; }

 private:
  std::uint64_t key_;
};

}  // namespace vq
