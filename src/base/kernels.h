// Numeric kernels used by scoring and blending. Every reduction has one fixed order, so results
// are identical whatever the compiler vectorises (the build forbids -ffast-math and FMA
// contraction, -ffp-contract=off; see CMakeLists.txt: a fused multiply-add happens only where
// the code writes one).
//
// THE LIBRARY'S DEFINITION OF AN FP32 DOT PRODUCT (every kernel family, every file that sums
// products -- kernels, engine ops and matmuls, the packed-KV attention -- follows it, and tests
// hold each SIMD twin to it bit for bit):
//   dot(a, b, n): lane l (0..7) holds acc_l, +0 at the start; for i = l, l+8, l+16, ... < n in
//        increasing i, acc_l = fma(a_i, b_i, acc_l) -- ONE rounding (std::fma in scalar code,
//        vfmadd in vectors); then ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)), plain additions.
//   A weighted accumulation s += p * v is likewise s = fma(p, v, s). Plain sums (sum(), the
//   lane tree, partial sums combined) stay additions.
#pragma once

#include <cstdint>

#include "veloxquant/types.h"

namespace vq::kernels {

float dot(const float* a, const float* b, std::int64_t n) noexcept;
// a holds fp16 bits; converted exactly to fp32 before the fma. Same order as dot().
float dot_f16(const std::uint16_t* a, const float* b, std::int64_t n) noexcept;

inline float dot_row(const void* row, DType dtype, const float* q, std::int64_t n) noexcept {
  return dtype == DType::kF32 ? dot(static_cast<const float*>(row), q, n)
                              : dot_f16(static_cast<const std::uint16_t*>(row), q, n);
}

// out[i] = dot_row(rows + i * stride elements, dtype, q, n) for i < count, bit for bit (with
// AVX2 + FMA, eight rows at a time).
void dot_rows(const void* rows, DType dtype, std::int64_t stride, const float* q, std::int64_t n,
              std::int64_t count, float* out) noexcept;

// Row conversion: dtype -> fp32 (exact) and fp32 -> dtype (round to nearest even).
void load_row(const void* row, DType dtype, float* out, std::int64_t n) noexcept;
void store_row(const float* in, DType dtype, void* row, std::int64_t n) noexcept;
void f32_to_f16(const float* in, std::uint16_t* out, std::int64_t n) noexcept;
void f16_to_f32(const std::uint16_t* in, float* out, std::int64_t n) noexcept;

// In place: x_i <- exp(x_i - max) / sum_j exp(x_j - max). Sum in dot()'s lane order.
void softmax(float* x, std::int64_t n) noexcept;

// Sum in dot()'s lane order.
float sum(const float* x, std::int64_t n) noexcept;

// Index of the row to evict: the smallest value, NaN ranking below everything, ties to the
// lowest index. -1 when n == 0.
std::int64_t argmin_evict(const float* x, std::int64_t n) noexcept;
// Index of the largest value; NaN never wins; ties to the lowest index. -1 when n == 0 or all
// values are NaN.
std::int64_t argmax_keep(const float* x, std::int64_t n) noexcept;

// cos(a, b) = dot / (|a| |b|); 0 when either norm is 0.
float cosine(const float* a, const float* b, std::int64_t n) noexcept;

}  // namespace vq::kernels
