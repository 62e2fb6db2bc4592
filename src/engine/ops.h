// The engine's numeric kernels. Every reduction uses the library's one fixed order
// (src/core/kernels.h): lane l of 8 sums the terms i = l, l+8, l+16, ... in increasing i, then
// ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)). Blocking over output rows or SIMD only changes which
// rows are computed together, never the order within a row, so results are bit-identical to
// kernels::dot whatever the instruction set (-ffp-contract=off, no fast-math; see CMakeLists).
#pragma once

#include <cstdint>

#include "veloxquant/types.h"

namespace vq::engine::ops {

// The fixed-order dot product, inlinable for short vectors (attention over head_dim).
inline float dot(const float* a, const float* b, std::int64_t n) noexcept {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  }
  for (int l = 0; i + l < n; ++l) acc[l] += a[i + l] * b[i + l];
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

// out[s][i] = sum_j w[i][j] * x[s][j] for s < S, i < n_out: x is [S][n_in], w is [n_out][n_in],
// out is [S][n_out]. Each element equals ops::dot(w[i], x[s], n_in) bit for bit.
void matmul(float* out, const float* x, const float* w, std::int64_t S, std::int64_t n_in,
            std::int64_t n_out) noexcept;

// out = weight * (x * 1/sqrt(mean(x^2) + eps)) (run.c's form); out may alias x.
void rmsnorm(float* out, const float* x, const float* weight, std::int64_t n, float eps) noexcept;

// Rows of `dtype` (fp32 or fp16 bits) converted to fp32 (exact).
void load_row(const void* row, DType dtype, float* out, std::int64_t n) noexcept;

// x <- exp(x - max) / sum, sum in the fixed lane order; -inf entries become exactly 0.
void softmax(float* x, std::int64_t n) noexcept;

// x[i] <- silu(x[i]) * up[i], silu(v) = v * (1 / (1 + exp(-v))) (run.c's form).
void swiglu(float* x, const float* up, std::int64_t n) noexcept;

}  // namespace vq::engine::ops
