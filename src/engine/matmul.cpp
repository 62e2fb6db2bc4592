#include "engine/matmul.h"

#include <algorithm>
#include <cmath>

#include "engine/parallel.h"
#include "veloxquant/types.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define VQ_MATMUL_X86 1
#endif

#ifdef __FAST_MATH__
#error "VeloxQuant kernels must not be compiled with -ffast-math: results would depend on flags"
#endif

namespace vq::engine {

const char* to_string(WeightType type) noexcept {
  switch (type) {
    case WeightType::kF32:
      return "f32";
    case WeightType::kF16:
      return "f16";
    case WeightType::kBF16:
      return "bf16";
    case WeightType::kQ8_0:
      return "q8_0";
  }
  return "?";
}

const char* to_string(Isa isa) noexcept { return isa == Isa::kAvx2 ? "avx2+f16c" : "scalar"; }

std::uint16_t float_to_bf16(float value) noexcept {
  std::uint32_t bits;
  std::memcpy(&bits, &value, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);
  const std::uint32_t round = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>((bits + round) >> 16);
}

namespace {

inline std::uint16_t load_u16(const std::uint8_t* p) noexcept {
  std::uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Element j of a row, as fp32 (engine/weights.h's definitions).
template <WeightType T>
inline float element(const std::uint8_t* row, std::int64_t j) noexcept {
  if constexpr (T == WeightType::kF32) {
    float v;
    std::memcpy(&v, row + 4 * j, 4);
    return v;
  } else if constexpr (T == WeightType::kF16) {
    return half_to_float(load_u16(row + 2 * j));
  } else if constexpr (T == WeightType::kBF16) {
    return bf16_to_float(load_u16(row + 2 * j));
  } else {
    const auto* b = row + (j / kQ8_0BlockSize) * static_cast<std::int64_t>(sizeof(BlockQ8_0));
    const float d = half_to_float(load_u16(b));
    return d * static_cast<float>(static_cast<std::int8_t>(b[2 + j % kQ8_0BlockSize]));
  }
}

inline float tree(const float* a) noexcept {
  return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

// The definition: ops::dot's order over the row converted to fp32.
template <WeightType T>
float dot_scalar(const std::uint8_t* row, const float* x, std::int64_t n) noexcept {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    for (int l = 0; l < 8; ++l) acc[l] += element<T>(row, j + l) * x[j + l];
  }
  for (int l = 0; j + l < n; ++l) acc[l] += element<T>(row, j + l) * x[j + l];
  return tree(acc);
}

template <WeightType T>
void rows_scalar(float* out, const float* x, const WeightMatrix& w, std::int64_t S,
                 std::int64_t begin, std::int64_t end) noexcept {
  for (std::int64_t i = begin; i < end; ++i) {
    const std::uint8_t* row = w.row(i);
    for (std::int64_t s = 0; s < S; ++s)
      out[s * w.rows + i] = dot_scalar<T>(row, x + s * w.cols, w.cols);
  }
}

#ifdef VQ_MATMUL_X86
#define VQ_AVX2 __attribute__((target("avx2,f16c")))

// Eight consecutive weights j .. j+7 of a row (not Q8_0) as fp32, exactly.
template <WeightType T>
VQ_AVX2 inline __m256 load8(const std::uint8_t* row, std::int64_t j) noexcept {
  if constexpr (T == WeightType::kF32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + j);
  } else if constexpr (T == WeightType::kF16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * j)));
  } else {
    const __m256i wide =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * j)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
}

// out[r] = dot of rows r < R (row r at w0 + r * row_bytes) with x, in the definition's order.
template <WeightType T, int R>
VQ_AVX2 void dot_rows_avx2(const std::uint8_t* w0, std::int64_t row_bytes, const float* x,
                           std::int64_t n, float* out) noexcept {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  std::int64_t j = 0;
  if constexpr (T == WeightType::kQ8_0) {
    const std::int64_t nb = n / kQ8_0BlockSize;
    for (std::int64_t b = 0; b < nb; ++b) {
      __m256 d[R];
      for (int r = 0; r < R; ++r) {
        const std::uint8_t* blk = w0 + r * row_bytes + b * 34;
        d[r] = _mm256_set1_ps(_cvtsh_ss(load_u16(blk)));
      }
      for (int c = 0; c < 4; ++c) {
        const __m256 xv = _mm256_loadu_ps(x + b * 32 + 8 * c);
        for (int r = 0; r < R; ++r) {
          const std::uint8_t* q = w0 + r * row_bytes + b * 34 + 2 + 8 * c;
          const __m256 qf = _mm256_cvtepi32_ps(
              _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q))));
          acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(_mm256_mul_ps(d[r], qf), xv));
        }
      }
    }
    j = nb * kQ8_0BlockSize;
  } else {
    for (; j + 8 <= n; j += 8) {
      const __m256 xv = _mm256_loadu_ps(x + j);
      for (int r = 0; r < R; ++r)
        acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(load8<T>(w0 + r * row_bytes, j), xv));
    }
  }
  for (int r = 0; r < R; ++r) {
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, acc[r]);
    for (int l = 0; j + l < n; ++l) lanes[l] += element<T>(w0 + r * row_bytes, j + l) * x[j + l];
    out[r] = tree(lanes);
  }
}

template <WeightType T>
VQ_AVX2 void rows_avx2(float* out, const float* x, const WeightMatrix& w, std::int64_t S,
                       std::int64_t begin, std::int64_t end) noexcept {
  constexpr int kR = 4;
  const std::int64_t rb = w.row_bytes();
  float r4[kR];
  std::int64_t i = begin;
  for (; i + kR <= end; i += kR) {
    for (std::int64_t s = 0; s < S; ++s) {
      dot_rows_avx2<T, kR>(w.row(i), rb, x + s * w.cols, w.cols, r4);
      for (int r = 0; r < kR; ++r) out[s * w.rows + i + r] = r4[r];
    }
  }
  for (; i < end; ++i) {
    for (std::int64_t s = 0; s < S; ++s)
      dot_rows_avx2<T, 1>(w.row(i), rb, x + s * w.cols, w.cols, out + s * w.rows + i);
  }
}
#endif

}  // namespace

bool isa_supported(Isa isa) noexcept {
  if (isa == Isa::kScalar) return true;
#ifdef VQ_MATMUL_X86
  // F16C is CPUID leaf 1, ECX bit 29 (clang 14's __builtin_cpu_supports does not know "f16c").
  unsigned a = 0, b = 0, c = 0, d = 0;
  const bool f16c = __get_cpuid(1, &a, &b, &c, &d) != 0 && ((c >> 29) & 1u) != 0;
  return __builtin_cpu_supports("avx2") && f16c;
#else
  return false;
#endif
}

Isa best_isa() noexcept {
  static const Isa best = isa_supported(Isa::kAvx2) ? Isa::kAvx2 : Isa::kScalar;
  return best;
}

void matmul_rows(Isa isa, float* out, const float* x, const WeightMatrix& w, std::int64_t S,
                 std::int64_t begin, std::int64_t end) noexcept {
#ifdef VQ_MATMUL_X86
  if (isa == Isa::kAvx2) {
    switch (w.type) {
      case WeightType::kF32:
        return rows_avx2<WeightType::kF32>(out, x, w, S, begin, end);
      case WeightType::kF16:
        return rows_avx2<WeightType::kF16>(out, x, w, S, begin, end);
      case WeightType::kBF16:
        return rows_avx2<WeightType::kBF16>(out, x, w, S, begin, end);
      case WeightType::kQ8_0:
        return rows_avx2<WeightType::kQ8_0>(out, x, w, S, begin, end);
    }
  }
#else
  (void)isa;
#endif
  switch (w.type) {
    case WeightType::kF32:
      return rows_scalar<WeightType::kF32>(out, x, w, S, begin, end);
    case WeightType::kF16:
      return rows_scalar<WeightType::kF16>(out, x, w, S, begin, end);
    case WeightType::kBF16:
      return rows_scalar<WeightType::kBF16>(out, x, w, S, begin, end);
    case WeightType::kQ8_0:
      return rows_scalar<WeightType::kQ8_0>(out, x, w, S, begin, end);
  }
}

void matmul(float* out, const float* x, const WeightMatrix& w, std::int64_t S) noexcept {
  const Isa isa = best_isa();
  // Units of 16 rows (a multiple of the kernels' 4-row groups); a unit's rows are computed by
  // one thread exactly as matmul_rows computes them, so the split never changes a result.
  constexpr std::int64_t kUnit = 16;
  const std::int64_t units = (w.rows + kUnit - 1) / kUnit;
  const int nt = threads();
  if (nt <= 1 || units < 2 || w.rows * w.cols * S < (std::int64_t{1} << 16)) {
    matmul_rows(isa, out, x, w, S, 0, w.rows);
    return;
  }
  parallel_for(units, nt, [&](std::int64_t u0, std::int64_t u1) {
    matmul_rows(isa, out, x, w, S, u0 * kUnit, std::min(w.rows, u1 * kUnit));
  });
}

void dequantize_row(const WeightMatrix& w, std::int64_t i, float* out) noexcept {
  const std::uint8_t* row = w.row(i);
  for (std::int64_t j = 0; j < w.cols; ++j) {
    switch (w.type) {
      case WeightType::kF32:
        out[j] = element<WeightType::kF32>(row, j);
        break;
      case WeightType::kF16:
        out[j] = element<WeightType::kF16>(row, j);
        break;
      case WeightType::kBF16:
        out[j] = element<WeightType::kBF16>(row, j);
        break;
      case WeightType::kQ8_0:
        out[j] = element<WeightType::kQ8_0>(row, j);
        break;
    }
  }
}

void quantize_row_q8_0(const float* x, BlockQ8_0* out, std::int64_t n) noexcept {
  for (std::int64_t b = 0; b < n / kQ8_0BlockSize; ++b) {
    const float* xb = x + b * kQ8_0BlockSize;
    float amax = 0.0f;
    for (std::int64_t j = 0; j < kQ8_0BlockSize; ++j)
      amax = std::max(amax, xb[j] < 0 ? -xb[j] : xb[j]);
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    out[b].d = float_to_half(d);
    for (std::int64_t j = 0; j < kQ8_0BlockSize; ++j) {
      out[b].q[j] = static_cast<std::int8_t>(std::round(xb[j] * id));  // ties away from 0
    }
  }
}

}  // namespace vq::engine
