#include "veloxquant/types.h"

#include <cstring>

namespace vq {

std::size_t dtype_size(DType dtype) noexcept { return dtype == DType::kF32 ? 4 : 2; }

const char* to_string(DType dtype) noexcept { return dtype == DType::kF32 ? "f32" : "f16"; }

// Integer-only conversions: exact, round-to-nearest-even, and independent of MXCSR/FTZ/DAZ.
std::uint16_t float_to_half(float value) noexcept {
  std::uint32_t x;
  std::memcpy(&x, &value, sizeof x);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) {  // inf or NaN (NaN keeps its top payload bits and stays quiet)
    if (absx == 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7c00u);
    return static_cast<std::uint16_t>(sign | 0x7e00u | ((absx >> 13) & 0x3ffu));
  }
  if (absx >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  if (absx < 0x38800000u) {  // below 2^-14: half subnormal or zero
    if (absx < 0x33000000u) return static_cast<std::uint16_t>(sign);  // < 2^-25 rounds to 0
    const std::uint32_t e = absx >> 23;
    const std::uint32_t m = (absx & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - e;  // 14..24
    std::uint32_t h = m >> shift;
    const std::uint32_t rem = m & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return static_cast<std::uint16_t>(sign | h);
  }
  const std::uint32_t r = absx - 0x38000000u;  // rebias exponent 127 -> 15
  std::uint32_t h = r >> 13;
  const std::uint32_t rem = r & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<std::uint16_t>(sign | h);
}

float half_to_float(std::uint16_t bits) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  std::uint32_t e = (bits >> 10) & 0x1fu;
  std::uint32_t m = bits & 0x3ffu;
  std::uint32_t out;
  if (e == 0) {
    if (m == 0) {
      out = sign;
    } else {  // subnormal: normalise
      e = 113;
      while (!(m & 0x400u)) {
        m <<= 1;
        --e;
      }
      out = sign | (e << 23) | ((m & 0x3ffu) << 13);
    }
  } else if (e == 31) {
    out = sign | 0x7f800000u | (m << 13);
  } else {
    out = sign | ((e + 112u) << 23) | (m << 13);
  }
  float f;
  std::memcpy(&f, &out, sizeof f);
  return f;
}

TensorRef TensorRef::f32(const float* data, std::int64_t B, std::int64_t H, std::int64_t S,
                         std::int64_t D) noexcept {
  TensorRef t;
  t.data = data;
  t.dtype = DType::kF32;
  t.shape[0] = B, t.shape[1] = H, t.shape[2] = S, t.shape[3] = D;
  t.stride[3] = 1, t.stride[2] = D, t.stride[1] = S * D, t.stride[0] = H * S * D;
  return t;
}

TensorRef TensorRef::f16(const std::uint16_t* data, std::int64_t B, std::int64_t H,
                         std::int64_t S, std::int64_t D) noexcept {
  TensorRef t = f32(nullptr, B, H, S, D);
  t.data = data;
  t.dtype = DType::kF16;
  return t;
}

float TensorRef::at(std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t d) const noexcept {
  const std::int64_t off = b * stride[0] + h * stride[1] + s * stride[2] + d * stride[3];
  if (dtype == DType::kF32) return static_cast<const float*>(data)[off];
  return half_to_float(static_cast<const std::uint16_t*>(data)[off]);
}

}  // namespace vq
