// Bulk unpacking of low-bit codes packed row by row, the layout of the KIVI store
// (kivi_store.cpp) and the mixed-precision tier (mixed_store.cpp): `bits` (2 or 4) per code,
// code c at bit (c * bits) % 8 of byte (c * bits) / 8. A byte is unpacked at once through a
// lookup table of its codes as floats (the value static_cast<float>(code) has), so a reader
// dequantizes with one multiply and one add per element instead of a shift, a mask and a
// conversion.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

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

// Codes [0, n) of `row` (bits 2 or 4) dequantized: out[c] = code_c * scale[c] + zero[c] with
// kPerChannel, else code_c * scale[0] + zero[0]; a multiply, then an add (two roundings), as
// unpack_codes followed by that loop gives, bit for bit. With AVX2, eight codes at a time:
// their bytes broadcast, shifted per lane, masked and converted (exact: codes are < 16).
template <int kBits, bool kPerChannel>
inline void dequantize_codes_as(const std::uint8_t* row, std::int64_t n, const float* scale,
                                const float* zero, float* out) noexcept {
  std::int64_t c = 0;
#if defined(__AVX2__)
  using Word = std::conditional_t<kBits == 2, std::uint16_t, std::uint32_t>;  // eight codes
  const __m256i shift = kBits == 2 ? _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)
                                   : _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  const __m256i mask = _mm256_set1_epi32((1 << kBits) - 1);
  __m256 s = _mm256_set1_ps(scale[0]), z = _mm256_set1_ps(zero[0]);
  for (; c + 8 <= n; c += 8) {
    Word word;
    std::memcpy(&word, row + c * kBits / 8, sizeof(Word));
    const __m256i codes =
        _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(word)), shift), mask);
    if constexpr (kPerChannel) {
      s = _mm256_loadu_ps(scale + c);
      z = _mm256_loadu_ps(zero + c);
    }
    _mm256_storeu_ps(out + c, _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(codes), s), z));
  }
#endif
  if (c < n) {
    // The rest (or all, without AVX2): c is a multiple of 8, so a whole byte boundary.
    unpack_codes(row + c * kBits / 8, kBits, n - c, out + c);
    for (std::int64_t j = c; j < n; ++j)
      out[j] = out[j] * scale[kPerChannel ? j : 0] + zero[kPerChannel ? j : 0];
  }
}

template <bool kPerChannel>
inline void dequantize_codes(const std::uint8_t* row, int bits, std::int64_t n, const float* scale,
                             const float* zero, float* out) noexcept {
  if (bits == 2) {
    dequantize_codes_as<2, kPerChannel>(row, n, scale, zero, out);
  } else {
    dequantize_codes_as<4, kPerChannel>(row, n, scale, zero, out);
  }
}

}  // namespace vq::detail
