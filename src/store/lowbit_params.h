// Asymmetric low-bit group parameters shared by the KIVI store (kivi_store.cpp) and the
// mixed-precision tier (mixed_store.cpp): fp16 scale and zero rounded outward so a group's
// [lo, hi] lies inside its grid [zero, zero + levels * scale], and the code of a value.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "veloxquant/types.h"

namespace vq::detail {

inline constexpr float kScaleFloor = 6.103515625e-05f;  // 2^-14, fp16's smallest normal
inline constexpr std::uint16_t kHalfMax = 0x7BFF;       // 65504
inline constexpr std::uint16_t kHalfLowest = 0xFBFF;    // -65504

// The largest finite fp16 <= x (saturating at -65504).
inline std::uint16_t half_down(float x) noexcept {
  std::uint16_t h = float_to_half(x);
  if (half_to_float(h) > x) {
    h = h == 0x0000         ? std::uint16_t{0x8001}
        : (h & 0x8000) != 0 ? static_cast<std::uint16_t>(h + 1)
                            : static_cast<std::uint16_t>(h - 1);
  }
  if (h == 0xFC00) h = kHalfLowest;
  if (h == 0x7C00) h = kHalfMax;
  return h;
}
// The smallest finite fp16 >= x (saturating at 65504).
inline std::uint16_t half_up(float x) noexcept {
  std::uint16_t h = float_to_half(x);
  if (half_to_float(h) < x) {
    h = h == 0x8000         ? std::uint16_t{0x0001}
        : (h & 0x8000) != 0 ? static_cast<std::uint16_t>(h - 1)
                            : static_cast<std::uint16_t>(h + 1);
  }
  if (h == 0x7C00) h = kHalfMax;
  if (h == 0xFC00) h = kHalfLowest;
  return h;
}

// Parameters of the n values x[0], x[stride], ... for codes 0..levels: zero = lo rounded down
// to fp16, scale = max((hi - zero) / levels, 2^-14) rounded up to fp16. The fp16 bits go to
// *scale_h / *zero_h, their fp32 values to *scale / *zero.
inline void lowbit_params(const float* x, std::int64_t n, std::int64_t stride, std::uint32_t levels,
                          std::uint16_t* scale_h, std::uint16_t* zero_h, float* scale,
                          float* zero) noexcept {
  float lo = x[0], hi = x[0];
  for (std::int64_t i = 1; i < n; ++i) {
    lo = std::min(lo, x[i * stride]);
    hi = std::max(hi, x[i * stride]);
  }
  *zero_h = half_down(lo);
  *zero = half_to_float(*zero_h);
  *scale_h = half_up(std::max((hi - *zero) / static_cast<float>(levels), kScaleFloor));
  *scale = half_to_float(*scale_h);
}

// The code of x on the grid (scale, zero): round half up, clamped to [0, levels].
inline std::uint32_t lowbit_code(float x, float scale, float zero, std::uint32_t levels) noexcept {
  const float q = std::floor((x - zero) / scale + 0.5f);
  return static_cast<std::uint32_t>(std::clamp(q, 0.0f, static_cast<float>(levels)));
}

// Bytes reserved by v (its capacity).
template <typename T>
std::int64_t cap_bytes(const std::vector<T>& v) noexcept {
  return static_cast<std::int64_t>(v.capacity() * sizeof(T));
}

}  // namespace vq::detail
