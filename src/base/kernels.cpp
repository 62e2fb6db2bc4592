#include "base/kernels.h"

#include <cmath>
#include <cstring>
#include <limits>

#if defined(__F16C__) && defined(__AVX__)
#include <immintrin.h>
#define VQ_HAVE_F16C 1
#endif

#ifdef __FAST_MATH__
#error "VeloxQuant kernels must not be compiled with -ffast-math: results would depend on flags"
#endif

namespace vq::kernels {
namespace {

inline float reduce_lanes(const float acc[8]) noexcept {
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

// Converts 8 halves to floats (exact either way).
inline void load8_f16(const std::uint16_t* in, float out[8]) noexcept {
#ifdef VQ_HAVE_F16C
  _mm256_storeu_ps(out, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in))));
#else
  for (int l = 0; l < 8; ++l) out[l] = half_to_float(in[l]);
#endif
}

}  // namespace

float dot(const float* a, const float* b, std::int64_t n) noexcept {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) acc[l] = std::fma(a[i + l], b[i + l], acc[l]);
  }
  for (int l = 0; i + l < n; ++l) acc[l] = std::fma(a[i + l], b[i + l], acc[l]);
  return reduce_lanes(acc);
}

float dot_f16(const std::uint16_t* a, const float* b, std::int64_t n) noexcept {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  float x[8];
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    load8_f16(a + i, x);
    for (int l = 0; l < 8; ++l) acc[l] = std::fma(x[l], b[i + l], acc[l]);
  }
  for (int l = 0; i + l < n; ++l) acc[l] = std::fma(half_to_float(a[i + l]), b[i + l], acc[l]);
  return reduce_lanes(acc);
}

namespace {
#if defined(VQ_HAVE_F16C) && defined(__AVX2__) && defined(__FMA__)
template <bool kF16>
inline __m256 load8_as(const void* row, std::int64_t i) noexcept {
  if constexpr (kF16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(
        reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(row) + i)));
  } else {
    return _mm256_loadu_ps(static_cast<const float*>(row) + i);
  }
}

// Eight rows' dots at once, n a multiple of 8: lane l of row k's accumulator sums i = l mod 8 in
// increasing i with one fused multiply-add per term, as dot() does; the lanes are reduced by
// reduce_lanes, row by row.
template <bool kF16>
void dot_rows8(const void* rows, std::int64_t stride, const float* q, std::int64_t n,
               std::int64_t count, float* out) noexcept {
  const std::int64_t esize = kF16 ? 2 : 4;
  const auto* base = static_cast<const std::uint8_t*>(rows);
  std::int64_t r = 0;
  for (; r + 8 <= count; r += 8) {
    __m256 acc[8];
    for (int k = 0; k < 8; ++k) acc[k] = _mm256_setzero_ps();
    for (std::int64_t i = 0; i < n; i += 8) {
      const __m256 qv = _mm256_loadu_ps(q + i);
      for (int k = 0; k < 8; ++k) {
        acc[k] = _mm256_fmadd_ps(load8_as<kF16>(base + (r + k) * stride * esize, i), qv, acc[k]);
      }
    }
    for (int k = 0; k < 8; ++k) {
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, acc[k]);
      out[r + k] = reduce_lanes(lanes);
    }
  }
  for (; r < count; ++r) {
    out[r] = kF16 ? dot_f16(reinterpret_cast<const std::uint16_t*>(base + r * stride * esize), q, n)
                  : dot(reinterpret_cast<const float*>(base + r * stride * esize), q, n);
  }
}
#endif
}  // namespace

void dot_rows(const void* rows, DType dtype, std::int64_t stride, const float* q, std::int64_t n,
              std::int64_t count, float* out) noexcept {
#if defined(VQ_HAVE_F16C) && defined(__AVX2__) && defined(__FMA__)
  if (n % 8 == 0) {
    if (dtype == DType::kF16) return dot_rows8<true>(rows, stride, q, n, count, out);
    return dot_rows8<false>(rows, stride, q, n, count, out);
  }
#endif
  const std::int64_t esize = dtype == DType::kF16 ? 2 : 4;
  for (std::int64_t r = 0; r < count; ++r)
    out[r] = dot_row(static_cast<const std::uint8_t*>(rows) + r * stride * esize, dtype, q, n);
}

void f16_to_f32(const std::uint16_t* in, float* out, std::int64_t n) noexcept {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) load8_f16(in + i, out + i);
  for (; i < n; ++i) out[i] = half_to_float(in[i]);
}

void f32_to_f16(const float* in, std::uint16_t* out, std::int64_t n) noexcept {
  std::int64_t i = 0;
#ifdef VQ_HAVE_F16C
  for (; i + 8 <= n; i += 8) {
    const __m128i h =
        _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
#endif
  for (; i < n; ++i) out[i] = float_to_half(in[i]);
}

void load_row(const void* row, DType dtype, float* out, std::int64_t n) noexcept {
  if (dtype == DType::kF32) {
    std::memcpy(out, row, static_cast<std::size_t>(n) * sizeof(float));
  } else {
    f16_to_f32(static_cast<const std::uint16_t*>(row), out, n);
  }
}

void store_row(const float* in, DType dtype, void* row, std::int64_t n) noexcept {
  if (dtype == DType::kF32) {
    std::memcpy(row, in, static_cast<std::size_t>(n) * sizeof(float));
  } else {
    f32_to_f16(in, static_cast<std::uint16_t*>(row), n);
  }
}

float sum(const float* x, std::int64_t n) noexcept {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) acc[l] += x[i + l];
  }
  for (int l = 0; i + l < n; ++l) acc[l] += x[i + l];
  return reduce_lanes(acc);
}

void softmax(float* x, std::int64_t n) noexcept {
  if (n <= 0) return;
  float m = -std::numeric_limits<float>::infinity();
  for (std::int64_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  for (std::int64_t i = 0; i < n; ++i) x[i] = std::exp(x[i] - m);
  const float s = sum(x, n);
  for (std::int64_t i = 0; i < n; ++i) x[i] = x[i] / s;
}

std::int64_t argmin_evict(const float* x, std::int64_t n) noexcept {
  std::int64_t best = -1;
  float best_value = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    if (std::isnan(v)) return i;  // the first NaN ranks below everything
    if (best < 0 || v < best_value) {
      best = i;
      best_value = v;
    }
  }
  return best;
}

std::int64_t argmax_keep(const float* x, std::int64_t n) noexcept {
  std::int64_t best = -1;
  float best_value = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    if (std::isnan(v)) continue;
    if (best < 0 || v > best_value) {
      best = i;
      best_value = v;
    }
  }
  return best;
}

float cosine(const float* a, const float* b, std::int64_t n) noexcept {
  const float ab = dot(a, b, n);
  const float na = std::sqrt(dot(a, a, n));
  const float nb = std::sqrt(dot(b, b, n));
  const float den = na * nb;
  if (!(den > 0.0f)) return 0.0f;
  return ab / den;
}

}  // namespace vq::kernels
