// The inputs of tests/expected_attention_reference.py, shared by tests/test_expected_attention.cpp
// and tests/test_expected_attention_capi.cpp.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "veloxquant/veloxquant.h"

namespace vq::ea_ref {

constexpr std::int64_t kHkv = 2, kHq = 4, kD = 8;

// The inputs of tests/expected_attention_reference.py (exact in fp32).
inline float ref_key(std::int64_t t, std::int64_t h, std::int64_t c) {
  return static_cast<float>((7 * t * t + 13 * t * c + 31 * h + 5 * c * c + 3) % 29 - 14) / 8.0f;
}
inline float ref_value(std::int64_t t, std::int64_t h, std::int64_t c) {
  return static_cast<float>((3 * t * t + 11 * t * c + 17 * h + 2 * c * c + 1) % 23 - 11) / 8.0f;
}
inline float ref_query(std::int64_t t, std::int64_t q, std::int64_t c) {
  return static_cast<float>((5 * t * t + 3 * t * c + 19 * q + 7 * c * c + 2) % 31 - 15) / 8.0f;
}
inline std::vector<float> ref_freq() {
  std::vector<float> f(kD / 2);
  for (std::int64_t i = 0; i < kD / 2; ++i) {
    f[static_cast<std::size_t>(i)] =
        static_cast<float>(std::pow(50.0, -2.0 * static_cast<double>(i) / kD));
  }
  return f;
}

// Tokens [t0, t0 + S) as [1, H, S, D] tensors (owned).
struct Step {
  std::vector<float> k, v, q;
  Step(std::int64_t t0, std::int64_t S)
      : k(static_cast<std::size_t>(kHkv * S * kD)), v(k.size()),
        q(static_cast<std::size_t>(kHq * S * kD)) {
    for (std::int64_t s = 0; s < S; ++s) {
      for (std::int64_t c = 0; c < kD; ++c) {
        for (std::int64_t h = 0; h < kHkv; ++h) {
          k[static_cast<std::size_t>((h * S + s) * kD + c)] = ref_key(t0 + s, h, c);
          v[static_cast<std::size_t>((h * S + s) * kD + c)] = ref_value(t0 + s, h, c);
        }
        for (std::int64_t h = 0; h < kHq; ++h) {
          q[static_cast<std::size_t>((h * S + s) * kD + c)] = ref_query(t0 + s, h, c);
        }
      }
    }
  }
  std::int64_t S() const { return static_cast<std::int64_t>(k.size()) / (kHkv * kD); }
  TensorRef keys() const { return TensorRef::f32(k.data(), 1, kHkv, S(), kD); }
  TensorRef values() const { return TensorRef::f32(v.data(), 1, kHkv, S(), kD); }
  TensorRef queries() const { return TensorRef::f32(q.data(), 1, kHq, S(), kD); }
};

}  // namespace vq::ea_ref
