// ggml's q8_0 and q4_0 blocks (llama.cpp's --cache-type-k/-v q8_0|q4_0), one block of 32
// consecutive channels of one row at a time, as ggml's reference quantizers
// (quantize_row_q8_0_ref / quantize_row_q4_0_ref in ggml-quants.c) define them:
//   q8_0: amax = max |x|, d = amax / 127, id = d != 0 ? 1 / d : 0, code = round(x * id) (half
//         away from zero, roundf), value = code * fp16(d);
//   q4_0: max = the x of largest |x| (the first one on ties), d = max / -8, id as above,
//         code = min(15, trunc(x * id + 8.5)), value = (code - 8) * fp16(d);
// d is stored as fp16 (round to nearest even); the codes are computed with the fp32 d, as in
// ggml. q4_0's nibbles are ggml's: byte j holds channel j (low nibble) and channel j + 16 (high
// nibble). Inputs that are not finite (which ggml leaves undefined): a code is clamped to its
// range, a NaN product gives code 0 (q8_0) or 8 (q4_0, value 0).
#pragma once

#include <cmath>
#include <cstdint>

#include "veloxquant/types.h"

namespace vq::detail {

inline constexpr std::int64_t kBlock32 = 32;  // channels per q8_0 / q4_0 block

// x[0..32) -> codes[0..32) (int8), *d = fp16 scale bits.
inline void quantize_q8_0_block(const float* x, std::int8_t* codes, std::uint16_t* d) noexcept {
  float amax = 0.0f;
  for (std::int64_t j = 0; j < kBlock32; ++j) {
    const float a = std::fabs(x[j]);
    amax = amax > a ? amax : a;
  }
  const float dd = amax / 127.0f;
  const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
  *d = float_to_half(dd);
  for (std::int64_t j = 0; j < kBlock32; ++j) {
    const float v = std::round(x[j] * id);
    codes[j] = static_cast<std::int8_t>(v != v ? 0.0f : v < -127.0f ? -127.0f : v > 127.0f ? 127.0f : v);
  }
}

// x[0..32) -> 16 bytes of nibbles, *d = fp16 scale bits.
inline void quantize_q4_0_block(const float* x, std::uint8_t* codes, std::uint16_t* d) noexcept {
  float amax = 0.0f, max = 0.0f;
  for (std::int64_t j = 0; j < kBlock32; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  const float dd = max / -8.0f;
  const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
  *d = float_to_half(dd);
  auto code = [&](float v) -> std::uint8_t {
    const float t = v * id + 8.5f;
    if (t != t) return 8;
    if (t >= 15.0f) return 15;
    if (t < 0.0f) return 0;
    return static_cast<std::uint8_t>(t);  // truncation, as ggml's (int8_t) cast
  };
  for (std::int64_t j = 0; j < kBlock32 / 2; ++j) {
    codes[j] = static_cast<std::uint8_t>(code(x[j]) | (code(x[j + 16]) << 4));
  }
}

}  // namespace vq::detail
