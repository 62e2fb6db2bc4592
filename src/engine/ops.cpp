#include "engine/ops.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "core/kernels.h"

#if defined(__AVX__)
#include <immintrin.h>
#define VQ_ENGINE_AVX 1
#endif

#ifdef __FAST_MATH__
#error "VeloxQuant kernels must not be compiled with -ffast-math: results would depend on flags"
#endif

namespace vq::engine::ops {
namespace {

inline float reduce8(const float acc[8]) noexcept {
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

// Four output rows at once: out[r] = dot(w + r * n, x, n) for r < 4, in dot()'s order.
inline void dot4(const float* w, const float* x, std::int64_t n, float* out) noexcept {
  const float* w0 = w;
  const float* w1 = w + n;
  const float* w2 = w + 2 * n;
  const float* w3 = w + 3 * n;
  alignas(32) float acc[4][8];
  std::int64_t j = 0;
#ifdef VQ_ENGINE_AVX
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  for (; j + 8 <= n; j += 8) {
    const __m256 xv = _mm256_loadu_ps(x + j);
    a0 = _mm256_add_ps(a0, _mm256_mul_ps(_mm256_loadu_ps(w0 + j), xv));
    a1 = _mm256_add_ps(a1, _mm256_mul_ps(_mm256_loadu_ps(w1 + j), xv));
    a2 = _mm256_add_ps(a2, _mm256_mul_ps(_mm256_loadu_ps(w2 + j), xv));
    a3 = _mm256_add_ps(a3, _mm256_mul_ps(_mm256_loadu_ps(w3 + j), xv));
  }
  _mm256_store_ps(acc[0], a0);
  _mm256_store_ps(acc[1], a1);
  _mm256_store_ps(acc[2], a2);
  _mm256_store_ps(acc[3], a3);
#else
  for (int r = 0; r < 4; ++r) {
    for (int l = 0; l < 8; ++l) acc[r][l] = 0.0f;
  }
  for (; j + 8 <= n; j += 8) {
    for (int l = 0; l < 8; ++l) {
      const float xv = x[j + l];
      acc[0][l] += w0[j + l] * xv;
      acc[1][l] += w1[j + l] * xv;
      acc[2][l] += w2[j + l] * xv;
      acc[3][l] += w3[j + l] * xv;
    }
  }
#endif
  for (int l = 0; j + l < n; ++l) {
    const float xv = x[j + l];
    acc[0][l] += w0[j + l] * xv;
    acc[1][l] += w1[j + l] * xv;
    acc[2][l] += w2[j + l] * xv;
    acc[3][l] += w3[j + l] * xv;
  }
  for (int r = 0; r < 4; ++r) out[r] = reduce8(acc[r]);
}

}  // namespace

void matmul(float* out, const float* x, const float* w, std::int64_t S, std::int64_t n_in,
            std::int64_t n_out) noexcept {
  std::int64_t i = 0;
  for (; i + 4 <= n_out; i += 4) {
    const float* wi = w + i * n_in;
    for (std::int64_t s = 0; s < S; ++s) {
      float r[4];
      dot4(wi, x + s * n_in, n_in, r);
      float* o = out + s * n_out + i;
      o[0] = r[0];
      o[1] = r[1];
      o[2] = r[2];
      o[3] = r[3];
    }
  }
  for (; i < n_out; ++i) {
    for (std::int64_t s = 0; s < S; ++s) out[s * n_out + i] = dot(w + i * n_in, x + s * n_in, n_in);
  }
}

void rmsnorm(float* out, const float* x, const float* weight, std::int64_t n, float eps) noexcept {
  float ss = dot(x, x, n);
  ss /= static_cast<float>(n);
  ss += eps;
  ss = 1.0f / std::sqrt(ss);
  for (std::int64_t i = 0; i < n; ++i) out[i] = weight[i] * (ss * x[i]);
}

void load_row(const void* row, DType dtype, float* out, std::int64_t n) noexcept {
  kernels::load_row(row, dtype, out, n);
}

void softmax(float* x, std::int64_t n) noexcept {
  if (n <= 0) return;
  float m = -std::numeric_limits<float>::infinity();
  for (std::int64_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  for (std::int64_t i = 0; i < n; ++i) x[i] = std::exp(x[i] - m);
  const float s = kernels::sum(x, n);
  for (std::int64_t i = 0; i < n; ++i) x[i] = x[i] / s;
}

void swiglu(float* x, const float* up, std::int64_t n) noexcept {
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    x[i] = v * (1.0f / (1.0f + std::exp(-v)));
    x[i] = x[i] * up[i];
  }
}

}  // namespace vq::engine::ops
