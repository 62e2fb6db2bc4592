// Bulk unpacking of low-bit codes packed row by row, the layout of the KIVI store
// (kivi_store.cpp) and the mixed-precision tier (mixed_store.cpp): `bits` (2 or 4) per code,
// code c at bit (c * bits) % 8 of byte (c * bits) / 8. A byte is unpacked at once through a
// lookup table of its codes as floats (the value static_cast<float>(code) has), so a reader
// dequantizes with one multiply and one add per element instead of a shift, a mask and a
// conversion.
#pragma once

#include <cstdint>
#include <cstring>

namespace vq::detail {

struct CodeTables {
  float two[256][4];   // [byte][j]: code j of a byte of 2-bit codes, (byte >> 2j) & 3
  float four[256][2];  // [byte][j]: code j of a byte of 4-bit codes, (byte >> 4j) & 15
};

constexpr CodeTables make_code_tables() noexcept {
  CodeTables t{};
  for (unsigned b = 0; b < 256; ++b) {
    for (unsigned j = 0; j < 4; ++j) t.two[b][j] = static_cast<float>((b >> (2 * j)) & 3u);
    for (unsigned j = 0; j < 2; ++j) t.four[b][j] = static_cast<float>((b >> (4 * j)) & 15u);
  }
  return t;
}

inline constexpr CodeTables kCodeTables = make_code_tables();

// Codes [0, n) of `row` (bits 2 or 4) as floats: out[c] = code c. out: [n].
inline void unpack_codes(const std::uint8_t* row, int bits, std::int64_t n, float* out) noexcept {
  const int per_byte = 8 / bits;
  const std::int64_t full = n / per_byte, rest = n % per_byte;
  if (bits == 2) {
    for (std::int64_t i = 0; i < full; ++i) std::memcpy(out + 4 * i, kCodeTables.two[row[i]], 16);
    for (std::int64_t j = 0; j < rest; ++j) out[4 * full + j] = kCodeTables.two[row[full]][j];
  } else {
    for (std::int64_t i = 0; i < full; ++i) std::memcpy(out + 2 * i, kCodeTables.four[row[i]], 8);
    for (std::int64_t j = 0; j < rest; ++j) out[2 * full + j] = kCodeTables.four[row[full]][j];
  }
}

}  // namespace vq::detail
