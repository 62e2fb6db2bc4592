// Basic value types shared by the whole API: element dtypes, fp16 conversion, tensor views.
#pragma once

#include <cstddef>
#include <cstdint>

#include "veloxquant/export.h"

namespace vq {

// Element type of tensors handed to or stored by a cache.
enum class DType : std::uint8_t {
  kF32,  // IEEE binary32
  kF16,  // IEEE binary16, stored as raw uint16_t bits
};

VQ_API std::size_t dtype_size(DType dtype) noexcept;
VQ_API const char* to_string(DType dtype) noexcept;

// IEEE binary16 <-> binary32. float -> half rounds to nearest, ties to even (overflow gives
// +-inf, NaN stays NaN); half -> float is exact. Independent of the floating-point environment.
VQ_API std::uint16_t float_to_half(float value) noexcept;
VQ_API float half_to_float(std::uint16_t bits) noexcept;

// A read-only view of a 4-D tensor [B, H, S, D] (batch, heads, tokens, head_dim) with strides
// in elements. The innermost dimension D must be contiguous (stride 1); other strides are free,
// so an engine can hand over [S][H][D]-ordered buffers without copying.
struct VQ_API TensorRef {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  std::int64_t shape[4] = {0, 0, 0, 0};   // B, H, S, D
  std::int64_t stride[4] = {0, 0, 0, 0};  // elements; stride[3] must be 1

  std::int64_t batch() const noexcept { return shape[0]; }
  std::int64_t heads() const noexcept { return shape[1]; }
  std::int64_t tokens() const noexcept { return shape[2]; }
  std::int64_t head_dim() const noexcept { return shape[3]; }

  // Contiguous row-major [B, H, S, D] views.
  static TensorRef f32(const float* data, std::int64_t B, std::int64_t H, std::int64_t S,
                       std::int64_t D) noexcept;
  static TensorRef f16(const std::uint16_t* data, std::int64_t B, std::int64_t H, std::int64_t S,
                       std::int64_t D) noexcept;
  // Element (b, h, s, d) converted to float. For tests and tools, not hot loops.
  float at(std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t d) const noexcept;
};

}  // namespace vq
