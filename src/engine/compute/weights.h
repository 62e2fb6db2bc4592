// Weight matrices in the type their file stores them: fp32, fp16, bf16 or one of GGUF's block
// types (Q8_0, the legacy Q4_0/Q4_1/Q5_0/Q5_1 and the K-quants Q2_K..Q6_K).
// A WeightMatrix is a view (type, rows, cols, pointer to row 0); the Model keeps the storage
// alive, usually a read-only memory mapping of the checkpoint, so an F16/BF16/Q8_0 checkpoint
// costs its file size in memory and in bytes read per token.
//
// Element values (all exact in fp32; the matmul kernels use exactly these):
//   kF32   w = the float
//   kF16   w = IEEE half -> float
//   kBF16  w = bits << 16 reinterpreted as float
//   kQ8_0  rows are blocks of 32 weights, each block 34 bytes, GGUF's block_q8_0 layout:
//            uint16 d      IEEE half scale, little-endian
//            int8   q[32]  quants
//          w[32 * b + j] = float(d) * float(q[j]) (an 11-bit times 8-bit product: exact in fp32).
//          cols must be a multiple of 32; a row is cols / 32 consecutive blocks, rows follow
//          each other with no padding (GGUF's tensor data for a 2-D Q8_0 tensor [rows][cols]).
//   kQ4_0 .. kQ6_K  GGUF's blocks of that type, laid out as engine/quants.h documents (32 values
//          per block for Q4_0/Q4_1/Q5_0/Q5_1, 256 for the K-quants); element values are ggml's
//          dequantization (engine/quants.h's dequantize, bit for bit). cols must be a multiple of
//          the block size; rows follow each other with no padding, as in the file.
#pragma once

#include <cstdint>
#include <cstring>

namespace vq::engine {

enum class WeightType : std::uint8_t {
  kF32,
  kF16,
  kBF16,
  kQ8_0,
  kQ4_0,
  kQ4_1,
  kQ5_0,
  kQ5_1,
  kQ2_K,
  kQ3_K,
  kQ4_K,
  kQ5_K,
  kQ6_K,
};
const char* to_string(WeightType type) noexcept;

inline constexpr std::int64_t kQ8_0BlockSize = 32;  // weights per block
struct BlockQ8_0 {
  std::uint16_t d;    // fp16 scale
  std::int8_t q[32];  // quants
};
static_assert(sizeof(BlockQ8_0) == 34, "GGUF block_q8_0 is 34 bytes with no padding");

// Values per block and bytes per block of a type (1 and the element size for F32/F16/BF16).
inline std::int64_t weight_block_size(WeightType type) noexcept {
  switch (type) {
    case WeightType::kF32:
    case WeightType::kF16:
    case WeightType::kBF16:
      return 1;
    case WeightType::kQ8_0:
    case WeightType::kQ4_0:
    case WeightType::kQ4_1:
    case WeightType::kQ5_0:
    case WeightType::kQ5_1:
      return 32;
    case WeightType::kQ2_K:
    case WeightType::kQ3_K:
    case WeightType::kQ4_K:
    case WeightType::kQ5_K:
    case WeightType::kQ6_K:
      return 256;
  }
  return 1;
}
inline std::int64_t weight_block_bytes(WeightType type) noexcept {
  switch (type) {
    case WeightType::kF32:
      return 4;
    case WeightType::kF16:
    case WeightType::kBF16:
      return 2;
    case WeightType::kQ8_0:
      return 34;
    case WeightType::kQ4_0:
      return 18;
    case WeightType::kQ4_1:
      return 20;
    case WeightType::kQ5_0:
      return 22;
    case WeightType::kQ5_1:
      return 24;
    case WeightType::kQ2_K:
      return 84;
    case WeightType::kQ3_K:
      return 110;
    case WeightType::kQ4_K:
      return 144;
    case WeightType::kQ5_K:
      return 176;
    case WeightType::kQ6_K:
      return 210;
  }
  return 4;
}
// True for the block types read with quantized activations (every type but F32/F16/BF16).
inline bool is_block_type(WeightType type) noexcept { return weight_block_size(type) > 1; }

// Bytes of one row of `cols` weights of `type` (cols must be a multiple of the block size).
inline std::int64_t weight_row_bytes(WeightType type, std::int64_t cols) noexcept {
  return cols / weight_block_size(type) * weight_block_bytes(type);
}

inline float bf16_to_float(std::uint16_t bits) noexcept {
  const std::uint32_t wide = static_cast<std::uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &wide, 4);
  return f;
}
// fp32 -> bf16, round to nearest even; NaN stays a (quiet) NaN.
std::uint16_t float_to_bf16(float value) noexcept;

// A [rows][cols] weight matrix of `type` at `data` (row-major, rows contiguous). 2-byte types
// need 2-byte alignment, fp32 4-byte; block types have none.
struct WeightMatrix {
  WeightType type = WeightType::kF32;
  std::int64_t rows = 0, cols = 0;
  const void* data = nullptr;

  std::int64_t row_bytes() const noexcept { return weight_row_bytes(type, cols); }
  std::int64_t bytes() const noexcept { return rows * row_bytes(); }
  const std::uint8_t* row(std::int64_t i) const noexcept {
    return static_cast<const std::uint8_t*>(data) + i * row_bytes();
  }
};

// Row i as fp32 (exact; see the element values above): out[cols].
void dequantize_row(const WeightMatrix& w, std::int64_t i, float* out) noexcept;

// fp32 values -> one Q8_0 row (GGUF's quantizer: d = max|x| / 127 rounded to fp16,
// q = round(x / d) with ties away from zero, q = 0 when d = 0). n must be a multiple of 32.
void quantize_row_q8_0(const float* x, BlockQ8_0* out, std::int64_t n) noexcept;

}  // namespace vq::engine
