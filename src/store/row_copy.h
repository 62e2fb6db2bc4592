// One row of a step's keys or values (TensorRef, fp32 or fp16) copied into a store's row of T
// (float or the fp16 bits, std::uint16_t), converting where the types differ. Shared by the
// plain-row store (store.cpp) and the pruned-key store (think_store.cpp).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "base/kernels.h"
#include "veloxquant/types.h"

namespace vq::detail {

template <class T>
void copy_step_row(const TensorRef& t, std::int64_t b, std::int64_t h, std::int64_t s,
                   std::int64_t d, T* out) {
  const std::int64_t off = b * t.stride[0] + h * t.stride[1] + s * t.stride[2];
  if (t.dtype == DType::kF32) {
    const float* src = static_cast<const float*>(t.data) + off;
    if constexpr (std::is_same_v<T, float>) {
      std::memcpy(out, src, static_cast<std::size_t>(d) * sizeof(float));
    } else {
      kernels::f32_to_f16(src, out, d);
    }
  } else {
    const std::uint16_t* src = static_cast<const std::uint16_t*>(t.data) + off;
    if constexpr (std::is_same_v<T, float>) {
      kernels::f16_to_f32(src, out, d);
    } else {
      std::memcpy(out, src, static_cast<std::size_t>(d) * sizeof(std::uint16_t));
    }
  }
}

}  // namespace vq::detail
