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

// Shape limits of every cache (LayerCache, ModelCache, and the C and Python APIs over them).
// They sit far above any released model (the largest have about 128 layers, 128 query heads
// and a head_dim of 256) and low enough that what a cache allocates from a shape alone stays
// small: per layer a policy and its state (n_layers x a few KiB), per (batch, KV head) a row
// store (B x Hkv x a few hundred bytes before any row), per row D elements. A shape past them
// is refused with Error(kInvalidArgument) naming the limit, before anything is allocated, so a
// hostile or mistyped shape (10^8 layers) fails at once instead of after minutes and gigabytes.
inline constexpr std::int64_t kMaxLayers = 4096;       // ModelShape / LayerShape n_layers
inline constexpr std::int64_t kMaxHeads = 4096;        // KV heads, and query heads, per layer
inline constexpr std::int64_t kMaxHeadDim = 65536;     // D
inline constexpr std::int64_t kMaxBatchHeads = 65536;  // B x Hkv of a step: one row store each

// A read-only view of a 4-D tensor [B, H, S, D] (batch, heads, tokens, head_dim) with strides
// in elements. The innermost dimension D must be contiguous (stride 1); other strides are free,
// so an engine can hand over [S][H][D]-ordered buffers without copying, but every (b, h, s) row
// must have D elements of its own: strides under which two rows overlap (a zero stride along a
// dimension of size > 1, as a broadcast has, or a stride smaller than the rows inside it) are
// refused by LayerCache::begin_step with Error(kInvalidArgument). A view that names 2^28 rows
// of one buffer would otherwise make the cache copy them all (gigabytes from a few bytes).
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
