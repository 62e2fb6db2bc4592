// The engine's numeric kernels. Every reduction uses the library's one fixed order
// (src/base/kernels.h): lane l of 8 accumulates the terms i = l, l+8, l+16, ... in increasing i
// with one fused multiply-add each (acc_l = fma(a_i, b_i, acc_l), from +0), then
// ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)); a weighted sum s += p * v is s = fma(p, v, s). Blocking
// over output rows or SIMD only changes which rows are computed together, never the order within a
// row, so results are bit-identical to kernels::dot whatever the instruction set
// (-ffp-contract=off, no fast-math; see CMakeLists).
#pragma once

#include <cmath>
#include <cstdint>

#include "veloxquant/types.h"

namespace vq::engine::ops {

// The fixed-order dot product, inlinable for short vectors (attention over head_dim).
inline float dot(const float* a, const float* b, std::int64_t n) noexcept {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) acc[l] = std::fma(a[i + l], b[i + l], acc[l]);
  }
  for (int l = 0; i + l < n; ++l) acc[l] = std::fma(a[i + l], b[i + l], acc[l]);
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

// x <- e^x elementwise: Cody-Waite range reduction and a degree-7 polynomial (Cephes expf),
// within 2 ulp of e^x, subnormal results included; -inf and x < -104 give 0, x > 88.72 gives
// inf, NaN stays NaN. Plain IEEE operations in one fixed order, so the result does not depend
// on vectorisation or the libm in use (std::exp may differ between hosts).
void exp_inplace(float* x, std::int64_t n) noexcept;

// x <- softmax(x / divisor): y = x / divisor, exp(y - max y) / sum, exp as exp_inplace, sum in
// the fixed lane order; -inf entries become exactly 0.
void softmax(float* x, std::int64_t n, float divisor = 1.0f) noexcept;

// Raw attention scores of n_q queries (q_j = q + j * D) over the rows of one KV head:
// scores[j * ld + r] = dot(q_j, key_r) when positions[r] <= pos, else -inf (the 1/sqrt(D)
// scale is applied by softmax(..., sqrt(D))).
// Keys are rows of `dtype` at keys + r * stride elements. dot is ops::dot's order.
void attention_scores(const float* q, std::int64_t n_q, std::int64_t D, const void* keys,
                      DType dtype, std::int64_t stride, const std::int32_t* positions,
                      std::int64_t n_rows, std::int64_t pos, float* scores, std::int64_t ld,
                      float* scratch) noexcept;

// out_j[d] = sum over rows r with positions[r] <= pos of probs[j * ld + r] * value_r[d], for
// j < n_q (out_j = out + j * D). Fixed order: four partial sums s_k over the rows r = k mod 4,
// each in increasing r as s_k = fma(p_r, value_r[d], s_k), then (s0 + s2) + (s1 + s3) (independent
// chains hide the add latency). sums: scratch of n_q * 4 * D floats (the partial sums).
void attention_values(const float* probs, std::int64_t n_q, std::int64_t ld, std::int64_t D,
                      const void* values, DType dtype, std::int64_t stride,
                      const std::int32_t* positions, std::int64_t n_rows, std::int64_t pos,
                      float* out, float* sums) noexcept;

// attention_values in pieces, for rows read a block at a time: sums ([n_q][4][D], query j's
// partial sum k of channel d at sums[(j * 4 + k) * D + d]) starts at +0; each call adds rows
// [0, n_rows) of a block whose first row's index in the whole is a multiple of 4 (so a row's
// partial sum is the same as in one call over all rows); finish writes out_j[d] =
// (s0 + s2) + (s1 + s3). Blocks passed in increasing row order give attention_values' result.
void attention_values_add(const float* probs, std::int64_t n_q, std::int64_t ld, std::int64_t D,
                          const void* values, DType dtype, std::int64_t stride,
                          const std::int32_t* positions, std::int64_t n_rows, std::int64_t pos,
                          float* sums) noexcept;
// attention_values_add for queries at different positions (a tile of a prompt chunk's tokens):
// query j adds the rows with positions[r] <= pos[j]. Each query's partial sums are exactly
// those attention_values_add gives it alone at its own position.
void attention_values_add_each(const float* probs, std::int64_t n_q, std::int64_t ld,
                               std::int64_t D, const void* values, DType dtype,
                               std::int64_t stride, const std::int32_t* positions,
                               std::int64_t n_rows, const std::int64_t* pos,
                               float* sums) noexcept;
void attention_values_finish(const float* sums, std::int64_t n_q, std::int64_t D,
                             float* out) noexcept;

// x[i] <- silu(x[i]) * up[i], silu(v) = v * (1 / (1 + exp(-v))) (run.c's form, exp as
// exp_inplace).
void swiglu(float* x, const float* up, std::int64_t n) noexcept;

}  // namespace vq::engine::ops
