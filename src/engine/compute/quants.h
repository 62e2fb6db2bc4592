// GGML tensor element types as stored in GGUF files, and conversion of their raw bytes to fp32.
//
// Block layouts (little-endian; "f16" is IEEE binary16), as ggml defines them:
//   Q8_0  32 values in 34 bytes: f16 d, int8 q[32];              x[j] = d * q[j]
//   Q4_0  32 values in 18 bytes: f16 d, uint8 qs[16];            x[j] = d * ((qs[j] & 15) - 8),
//                                                               x[j + 16] = d * ((qs[j] >> 4) - 8)
//   Q4_K  256 values in 144 bytes: f16 d, f16 dmin, uint8 scales[12], uint8 qs[128]. Eight
//         sub-blocks of 32 with 6-bit scale sc[s] and min m[s] packed in `scales`; sub-blocks
//         2g and 2g+1 take the low and high nibbles of qs[32g .. 32g+31]:
//         x = d * sc[s] * nibble - dmin * m[s]
//   Q6_K  256 values in 210 bytes: uint8 ql[128], uint8 qh[64], int8 scales[16], f16 d. Two
//         halves of 128; in half h, for l < 32 the 6-bit values (low 4 bits from ql, high 2 bits
//         from qh) of x[l], x[l+32], x[l+64], x[l+96] are
//           (ql[64h+l] & 15) | (qh[32h+l] & 3) << 4,   (ql[64h+l+32] & 15) | (qh[32h+l] >> 2 & 3)
//           << 4, (ql[64h+l] >> 4) | (qh[32h+l] >> 4 & 3) << 4, (ql[64h+l+32] >> 4) | (qh[32h+l] >>
//           6) << 4;
//         x = d * scales[8h + l/16 + 2k] * (value - 32) for the k-th of those four.
//   Q4_1  32 values in 20 bytes: f16 d, f16 m, uint8 qs[16];     x[j] = nib_j * d + m (nibbles as Q4_0)
//   Q5_0  32 values in 22 bytes: f16 d, uint32 qh, uint8 qs[16]; value j (< 16) = (qs[j] & 15) |
//         (bit j of qh) << 4, value j + 16 = (qs[j] >> 4) | (bit j + 16 of qh) << 4;
//         x = d * (value - 16)
//   Q5_1  32 values in 24 bytes: f16 d, f16 m, uint32 qh, uint8 qs[16]; values as Q5_0,
//         x = value * d + m
//   Q2_K  256 values in 84 bytes: uint8 scales[16], uint8 qs[64], f16 d, f16 dmin. Value y = 128n
//         + 32j + l (n < 2, j < 4, l < 32) is (qs[32n + l] >> 2j) & 3; its 16-group g = y / 16
//         has scale scales[g] & 15 and min scales[g] >> 4: x = (d * sc) * value - dmin * m
//   Q3_K  256 values in 110 bytes: uint8 hmask[32], uint8 qs[64], uint8 scales[12], f16 d. Value
//         y = 128n + 32j + l is ((qs[32n + l] >> 2j) & 3) - (bit 4n + j of hmask[l] ? 0 : 4); the
//         16-group g has the 6-bit scale (low four bits: scales[g % 8] >> 4 (g / 8), high two:
//         scales[8 + g % 4] >> 2 (g / 4)) minus 32: x = (d * sc) * value
//   Q5_K  256 values in 176 bytes: f16 d, f16 dmin, uint8 scales[12] (as Q4_K), uint8 qh[32],
//         uint8 qs[128]: Q4_K's nibbles plus 16 * (bit s of qh[l]) for sub-block s
// Dequantization evaluates in the same order as ggml's reference code, so values match it bit
// for bit.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "engine/compute/weights.h"

namespace vq::engine {

enum class GgmlType : std::uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kBF16 = 30,
};

struct GgmlTypeInfo {
  const char* name;          // "F32", "Q8_0", ...
  std::int64_t block_size;   // values per block (1 for plain types)
  std::int64_t block_bytes;  // bytes per block
};

// The type with GGUF id `id`, or nullopt when this engine does not support it.
std::optional<GgmlType> ggml_type_from_id(std::uint32_t id) noexcept;
const GgmlTypeInfo& type_info(GgmlType type) noexcept;
// ggml's name for any type id ("Q5_K", "IQ2_XS", ...), or "type <id>" when unknown; for errors.
std::string ggml_type_name(std::uint32_t id);

// The matmul type of a GGUF tensor type (every supported type has one) and back.
WeightType weight_type_of(GgmlType type) noexcept;
GgmlType ggml_type_of(WeightType type) noexcept;

// Bytes that `n` values of `type` take; n must be a multiple of the block size (the caller checks).
std::int64_t type_bytes(GgmlType type, std::int64_t n) noexcept;

// Converts `n` values (a multiple of the type's block size) stored at `src` into `dst[n]`.
// `src` needs no alignment.
void dequantize(GgmlType type, const std::uint8_t* src, float* dst, std::int64_t n);

// Stores `n` fp32 values as `type` (F32, F16, BF16 or Q8_0; n a multiple of the block size):
//  - F16: round to nearest even (vq::float_to_half);
//  - BF16: round to nearest even on the top 16 bits (NaN kept quiet), as ggml does;
//  - Q8_0: per block d = max|x| / 127 (stored as f16), q = round-half-away(x / d) computed with
//    the reciprocal of the fp32 d, as ggml's reference quantizer does.
// Throws Error(kInvalidArgument) for another type.
void quantize(GgmlType type, const float* src, std::uint8_t* dst, std::int64_t n);

// Single-value bf16 conversions: engine/weights.h (bf16_to_float, float_to_bf16).

}  // namespace vq::engine
