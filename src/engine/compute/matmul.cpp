#include "engine/compute/matmul.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <type_traits>
#include <vector>

#include "engine/compute/block_matmul.h"
#include "engine/compute/parallel.h"
#include "engine/compute/prefetch.h"
#include "engine/compute/quants.h"
#include "veloxquant/errors.h"
#include "veloxquant/types.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define VQ_MATMUL_X86 1
#endif

#ifdef __FAST_MATH__
#error "VeloxQuant kernels must not be compiled with -ffast-math: results would depend on flags"
#endif

namespace vq::engine {

using cpu::Isa;

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
    case WeightType::kQ4_0:
      return "q4_0";
    case WeightType::kQ4_1:
      return "q4_1";
    case WeightType::kQ5_0:
      return "q5_0";
    case WeightType::kQ5_1:
      return "q5_1";
    case WeightType::kQ2_K:
      return "q2_k";
    case WeightType::kQ3_K:
      return "q3_k";
    case WeightType::kQ4_K:
      return "q4_k";
    case WeightType::kQ5_K:
      return "q5_k";
    case WeightType::kQ6_K:
      return "q6_k";
  }
  return "?";
}

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

// The definition: the fixed lane order over the row converted to fp32, one fused multiply-add
// (one rounding) per element.
template <WeightType T>
float dot_scalar(const std::uint8_t* row, const float* x, std::int64_t n) noexcept {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    for (int l = 0; l < 8; ++l) acc[l] = std::fma(element<T>(row, j + l), x[j + l], acc[l]);
  }
  for (int l = 0; j + l < n; ++l) acc[l] = std::fma(element<T>(row, j + l), x[j + l], acc[l]);
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

// Q8_0 weights x Q8_0 activations, the definition: block b's integer dot (exact) times its two
// scales' product (exact: an 11-bit times 11-bit significand), rounded to fp32 once, added to
// lane b % 8; the lanes are summed by tree(). xq[nb * 32] codes, xd[nb] scales as fp32.
// (The codes are read through an int8 pointer: GCC 12's vectorizer turned the same loop over
// static_cast<std::int8_t>(uint8 byte) into an unsigned-times-signed dot product.)
inline std::int32_t block_isum_scalar(const std::uint8_t* blk, const std::int8_t* xq) noexcept {
  const auto* wq = reinterpret_cast<const std::int8_t*>(blk + 2);
  std::int32_t isum = 0;
  for (int j = 0; j < 32; ++j) isum += static_cast<std::int32_t>(wq[j]) * xq[j];
  return isum;
}

float dot_q8q8_scalar(const std::uint8_t* row, const std::int8_t* xq, const float* xd,
                      std::int64_t nb) noexcept {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::uint8_t* blk = row + b * 34;
    const float dd = half_to_float(load_u16(blk)) * xd[b];
    acc[b % 8] += static_cast<float>(block_isum_scalar(blk, xq + b * 32)) * dd;
  }
  return tree(acc);
}

void rows_q8q8_scalar(float* out, const std::int8_t* xq, const float* xd, const WeightMatrix& w,
                      std::int64_t S, std::int64_t begin, std::int64_t end) noexcept {
  const std::int64_t nb = w.cols / kQ8_0BlockSize;
  for (std::int64_t i = begin; i < end; ++i) {
    for (std::int64_t s = 0; s < S; ++s)
      out[s * w.rows + i] = dot_q8q8_scalar(w.row(i), xq + s * w.cols, xd + s * nb, nb);
  }
}

// A block type other than Q8_0 with fp32 activations: the row dequantized (ggml's values, exact)
// a block at a time, in dot_scalar's order (blocks are multiples of 8 values, so lane l still
// sums j = l, l+8, ... in increasing j). One code for every family.
void rows_dequantized(float* out, const float* x, const WeightMatrix& w, std::int64_t S,
                      std::int64_t begin, std::int64_t end) noexcept {
  const std::int64_t B = weight_block_size(w.type), bytes = weight_block_bytes(w.type);
  const std::int64_t nb = w.cols / B;
  const GgmlType gt = ggml_type_of(w.type);
  float vals[256];
  for (std::int64_t i = begin; i < end; ++i) {
    const std::uint8_t* row = w.row(i);
    for (std::int64_t s = 0; s < S; ++s) {
      const float* xs = x + s * w.cols;
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (std::int64_t b = 0; b < nb; ++b) {
        dequantize(gt, row + b * bytes, vals, B);
        for (std::int64_t j = 0; j < B; ++j)
          acc[j % 8] = std::fma(vals[j], xs[b * B + j], acc[j % 8]);
      }
      out[s * w.rows + i] = tree(acc);
    }
  }
}

#ifdef VQ_MATMUL_X86
#define VQ_AVX2 __attribute__((target("avx2,f16c,fma")))

// Eight consecutive weights j .. j+7 of a row (not Q8_0) as fp32, exactly.
template <WeightType T>
VQ_AVX2 inline __m256 load8(const std::uint8_t* row, std::int64_t j) noexcept {
  if constexpr (T == WeightType::kQ8_0) {
    // d * q as fp32 (one rounding, the element's value), as dot_rows_avx2 forms it.
    const std::uint8_t* blk = row + (j / kQ8_0BlockSize) * 34;
    const __m256 qf = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 2 + j % kQ8_0BlockSize))));
    return _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(load_u16(blk))), qf);
  } else if constexpr (T == WeightType::kF32) {
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
    const std::uint8_t* ahead = w0 + 2 * R * row_bytes;  // as below
    for (std::int64_t b = 0; b < nb; ++b) {
      prefetch_span(ahead + R * 34 * b, R * 34);
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
          acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d[r], qf), xv, acc[r]);
        }
      }
    }
    j = nb * kQ8_0BlockSize;
  } else {
    constexpr std::int64_t kEl = T == WeightType::kF32 ? 4 : 2;
    // Software prefetch of the rows two groups ahead (the next-but-one R rows), R lines every
    // 64 bytes of the rows, in address order (prefetch.h): without it a thread reads the
    // weights at about a third of the machine's bandwidth (the hardware prefetchers do not
    // follow R short interleaved streams), and interleaved as the rows are read at about half.
    const std::uint8_t* ahead = w0 + 2 * R * row_bytes;
    for (; j + 8 <= n; j += 8) {
      if ((j * kEl) % 64 == 0) prefetch_span(ahead + R * j * kEl, R * 64);
      const __m256 xv = _mm256_loadu_ps(x + j);
      for (int r = 0; r < R; ++r)
        acc[r] = _mm256_fmadd_ps(load8<T>(w0 + r * row_bytes, j), xv, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, acc[r]);
    for (int l = 0; j + l < n; ++l)
      lanes[l] = std::fma(element<T>(w0 + r * row_bytes, j + l), x[j + l], lanes[l]);
    out[r] = tree(lanes);
  }
}

// Prefill tiles: out[t][r] for rows r < R and tokens t < TT, each the dot of row r (at
// w0 + r * row_bytes) with token t's activations (at x0 + t * x_stride) in the definition's
// order: lane l of (r, t)'s own accumulator fuses w[j] * x[j] into it (one vfmadd, one rounding)
// for j = l, l+8, ... in increasing j, the tail j >= n - n % 8 is added to the lanes in scalar
// code (std::fma), then tree(). The same
// operations as dot_rows_avx2 on each element; only which element is computed when differs.
// Each chunk of 8 weights is loaded and converted once for TT tokens, each chunk of x once for
// R rows. (R, TT) = (3, 4) keeps 12 accumulators, 3 weight chunks and a product in the 16 ymm
// registers.
template <WeightType T, int R, int TT>
VQ_AVX2 void tile_avx2(const std::uint8_t* w0, std::int64_t row_bytes, const float* x0,
                       std::int64_t x_stride, std::int64_t n, float* out,
                       std::int64_t out_stride) noexcept {
  __m256 acc[R][TT];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < TT; ++t) acc[r][t] = _mm256_setzero_ps();
  }
  std::int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    __m256 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = load8<T>(w0 + r * row_bytes, j);
    for (int t = 0; t < TT; ++t) {
      const __m256 xv = _mm256_loadu_ps(x0 + t * x_stride + j);
      for (int r = 0; r < R; ++r) acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < TT; ++t) {
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, acc[r][t]);
      const float* x = x0 + t * x_stride;
      for (int l = 0; j + l < n; ++l)
        lanes[l] = std::fma(element<T>(w0 + r * row_bytes, j + l), x[j + l], lanes[l]);
      out[t * out_stride + r] = tree(lanes);
    }
  }
}

template <WeightType T, int R>
VQ_AVX2 inline void tile_avx2_tt(int tt, const std::uint8_t* w0, std::int64_t row_bytes,
                                 const float* x0, std::int64_t x_stride, std::int64_t n, float* out,
                                 std::int64_t out_stride) noexcept {
  switch (tt) {
    case 4:
      return tile_avx2<T, R, 4>(w0, row_bytes, x0, x_stride, n, out, out_stride);
    case 3:
      return tile_avx2<T, R, 3>(w0, row_bytes, x0, x_stride, n, out, out_stride);
    case 2:
      return tile_avx2<T, R, 2>(w0, row_bytes, x0, x_stride, n, out, out_stride);
    default:
      return tile_avx2<T, R, 1>(w0, row_bytes, x0, x_stride, n, out, out_stride);
  }
}

// Tokens per block of the prefill loops: the block's activations (about 256 KiB) stay in L2
// while every row tile of the range passes over them; at least one token tile.
inline std::int64_t token_block(std::int64_t row_bytes_of_x, std::int64_t tile) noexcept {
  const std::int64_t fit = (std::int64_t{256} << 10) / std::max<std::int64_t>(1, row_bytes_of_x);
  return std::max(tile, fit / tile * tile);
}

// Rows [begin, end) x all S tokens in tiles of kR x kT (the rows' and tokens' remainders in
// smaller tiles), token blocks outermost.
template <WeightType T>
VQ_AVX2 void rows_tiled_avx2(float* out, const float* x, const WeightMatrix& w, std::int64_t S,
                             std::int64_t begin, std::int64_t end) noexcept {
  constexpr int kR = 3, kT = 4;
  const std::int64_t rb = w.row_bytes();
  const std::int64_t sb = token_block(w.cols * 4, kT);
  for (std::int64_t s0 = 0; s0 < S; s0 += sb) {
    const std::int64_t s1 = std::min(S, s0 + sb);
    for (std::int64_t i = begin; i < end; i += kR) {
      const int rr = static_cast<int>(std::min<std::int64_t>(kR, end - i));
      for (std::int64_t s = s0; s < s1; s += kT) {
        const int tt = static_cast<int>(std::min<std::int64_t>(kT, s1 - s));
        const float* xs = x + s * w.cols;
        float* o = out + s * w.rows + i;
        if (rr == 3) {
          tile_avx2_tt<T, 3>(tt, w.row(i), rb, xs, w.cols, w.cols, o, w.rows);
        } else if (rr == 2) {
          tile_avx2_tt<T, 2>(tt, w.row(i), rb, xs, w.cols, w.cols, o, w.rows);
        } else {
          tile_avx2_tt<T, 1>(tt, w.row(i), rb, xs, w.cols, w.cols, o, w.rows);
        }
      }
    }
  }
}

template <WeightType T>
VQ_AVX2 void rows_avx2(float* out, const float* x, const WeightMatrix& w, std::int64_t S,
                       std::int64_t begin, std::int64_t end) noexcept {
  if (S > 1 && prefill_kernels() == PrefillKernels::kTiles) {
    return rows_tiled_avx2<T>(out, x, w, S, begin, end);
  }
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

// The integer dot of one Q8_0 weight block's codes with 32 activation codes as 8 int32 lanes
// (exact), for both x86 families: |w| as unsigned bytes times x with w's sign (x is never -128;
// w = -128 gives the unsigned 128). AVX2 sums pairs to int16 (at most 2 * 128 * 127: no
// saturation), then to int32; AVX-VNNI's vpdpbusd sums groups of four straight to int32 (at most
// 4 * 128 * 127, no saturation either). The kernels built on them: matmul_q8q8_x86.inc.
//
// The prefill tiles (matmul_q8q8_x86.inc) form the same exact sums from weights and
// activations packed eight blocks at a time. AVX2 (VQ_Q8Q8_FLIP 0): |w| times x with w's sign,
// as above. AVX-VNNI (VQ_Q8Q8_FLIP 1): the activations are read with their sign bit flipped,
// u = x + 128 as unsigned bytes; vpdpbusd(c, u, w) adds the sums of (x + 128) * w per group of
// four to c, and starting from c = -128 * (the block's sum of w) (|sum w| <= 4096) the block's
// lane ends at exactly its isum (every partial sum within 2^21: no overflow): one instruction
// per 32 bytes and token, the weights' sums formed once for the tile's tokens.
namespace q8q8_avx2 {
#define VQ_Q8Q8_TARGET VQ_AVX2
#define VQ_Q8Q8_FLIP 0
VQ_Q8Q8_TARGET inline __m256i block_dot(const std::uint8_t* wq, __m256i xv) noexcept {
  const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wq));
  const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
  return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
}
#include "engine/compute/matmul_q8q8_x86.inc"
#undef VQ_Q8Q8_TARGET
#undef VQ_Q8Q8_FLIP
}  // namespace q8q8_avx2

namespace q8q8_vnni {
#define VQ_Q8Q8_TARGET __attribute__((target("avx2,f16c,avxvnni")))
#define VQ_Q8Q8_FLIP 1
VQ_Q8Q8_TARGET inline __m256i block_dot(const std::uint8_t* wq, __m256i xv) noexcept {
  const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wq));
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(wv, wv),
                                 _mm256_sign_epi8(xv, wv));
}
#include "engine/compute/matmul_q8q8_x86.inc"
#undef VQ_Q8Q8_TARGET
#undef VQ_Q8Q8_FLIP
}  // namespace q8q8_vnni

// GCC 12's AVX-512 headers read an intentionally undefined vector in their broadcasts and
// report it (GCC bug 105593, as in block_matmul.cpp); nothing of ours is uninitialised.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include "engine/compute/matmul_gemm_avx512.inc"
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

}  // namespace

void matmul_rows(Isa isa, float* out, const float* x, const WeightMatrix& w, std::int64_t S,
                 std::int64_t begin, std::int64_t end) noexcept {
  // The AVX-512 families: their own GEMM for S > 1 (prefill tiles), avx512_base()'s row kernels
  // for one token (decode reads each weight once either way).
  const bool use_gemm512 = cpu::uses_avx512(isa) && S > 1 && w.cols >= 8 &&
                       prefill_kernels() == PrefillKernels::kTiles;
  if (cpu::uses_avx512(isa)) isa = cpu::avx512_base();
#ifndef VQ_MATMUL_X86
  (void)isa;
  (void)use_gemm512;
#endif
  const auto rows = [&](auto type) {
    constexpr WeightType T = decltype(type)::value;
#ifdef VQ_MATMUL_X86
    if (use_gemm512) {
      thread_local gemm512::Scratch scratch;
      if (gemm512::reserve(scratch, w, S)) return gemm512::rows<T>(out, x, w, S, begin, end, scratch);
    }
    // kAvx2 and kAvx2Vnni run the same kernels for fp32 activations.
    if (isa == Isa::kAvx2 || isa == Isa::kAvx2Vnni) return rows_avx2<T>(out, x, w, S, begin, end);
#endif
    rows_scalar<T>(out, x, w, S, begin, end);
  };
  switch (w.type) {  // the types read in place; the block types are dequantized first
    case WeightType::kF32: return rows(std::integral_constant<WeightType, WeightType::kF32>{});
    case WeightType::kF16: return rows(std::integral_constant<WeightType, WeightType::kF16>{});
    case WeightType::kBF16: return rows(std::integral_constant<WeightType, WeightType::kBF16>{});
    case WeightType::kQ8_0: return rows(std::integral_constant<WeightType, WeightType::kQ8_0>{});
    default: return rows_dequantized(out, x, w, S, begin, end);
  }
}

void quantize_activations_q8_0(const float* x, std::int64_t n, std::int8_t* q, float* d) noexcept {
  for (std::int64_t b = 0; b < n / kQ8_0BlockSize; ++b) {
    const float* xb = x + b * kQ8_0BlockSize;
    std::int8_t* qb = q + b * kQ8_0BlockSize;
    float amax = 0.0f;
    bool finite = true;
    for (std::int64_t j = 0; j < kQ8_0BlockSize; ++j) {
      finite = finite && std::isfinite(xb[j]);
      amax = std::max(amax, std::fabs(xb[j]));
    }
    if (!finite) {
      d[b] = std::numeric_limits<float>::quiet_NaN();
      std::fill(qb, qb + kQ8_0BlockSize, std::int8_t{0});
      continue;
    }
    d[b] = half_to_float(float_to_half(amax / 127.0f));
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    // |x_j * id| <= 127 up to two roundings, so the codes stay in [-127, 127]. Rounding half to
    // even: adding and subtracting 1.5 * 2^23 leaves |v| < 2^22 rounded to an integer in the
    // default rounding mode, which the library never changes (std::nearbyint, the same value,
    // is a libm call on the baseline x86-64 target).
    constexpr float kRound = 12582912.0f;  // 1.5 * 2^23
    for (std::int64_t j = 0; j < kQ8_0BlockSize; ++j)
      qb[j] = static_cast<std::int8_t>((xb[j] * id + kRound) - kRound);
  }
}

void matmul_rows_q8_0(Isa isa, float* out, const std::int8_t* xq, const float* xd,
                      const WeightMatrix& w, std::int64_t S, std::int64_t begin,
                      std::int64_t end) noexcept {
  // kAvx512Vnni: its own kernel for one token; the AVX-512 families run avx512_base()'s else.
  if (isa == Isa::kAvx512Vnni && S == 1 && matvec_q8_0_avx512(out, xq, xd, w, begin, end)) {
    return;
  }
  // More tokens: the AVX-512 VNNI prefill tiles where the family takes them (engine/block_matmul.h).
  if (S > 1 && prefill_q8_0_avx512(isa, out, xq, xd, w, S, begin, end)) return;
  if (cpu::uses_avx512(isa)) isa = cpu::avx512_base();
#ifdef VQ_MATMUL_X86
  if (isa == Isa::kAvx2) return q8q8_avx2::rows(out, xq, xd, w, S, begin, end);
  if (isa == Isa::kAvx2Vnni) return q8q8_vnni::rows(out, xq, xd, w, S, begin, end);
#else
  (void)isa;
#endif
  rows_q8q8_scalar(out, xq, xd, w, S, begin, end);
}

namespace {
std::atomic<Q8_0Activations> g_q8_0_activations{Q8_0Activations::kQ8_0};
}  // namespace

const char* to_string(Q8_0Activations a) noexcept {
  return a == Q8_0Activations::kQ8_0 ? "q8_0" : "f32";
}
void set_q8_0_activations(Q8_0Activations a) noexcept { g_q8_0_activations.store(a); }
namespace {
std::atomic<PrefillKernels> g_prefill_kernels{PrefillKernels::kTiles};
}  // namespace
void set_prefill_kernels(PrefillKernels k) noexcept { g_prefill_kernels.store(k); }
PrefillKernels prefill_kernels() noexcept { return g_prefill_kernels.load(); }
Q8_0Activations q8_0_activations() noexcept { return g_q8_0_activations.load(); }

void matmul_fused(std::span<const MatmulOut> outs, const float* x, std::int64_t S) {
  constexpr std::size_t kMaxOuts = 8;
  if (outs.empty() || outs.size() > kMaxOuts) {
    throw Error(
        ErrorCode::kInvalidArgument,
        "[engine] matmul_fused products must be in [1, 8], got " + std::to_string(outs.size()));
  }
  const std::int64_t cols = outs[0].w->cols;
  for (const MatmulOut& o : outs) {
    if (o.w->cols != cols) {
      throw Error(ErrorCode::kInvalidArgument,
                  "[engine] matmul_fused matrices must share cols = " + std::to_string(cols) +
                      ", got " + std::to_string(o.w->cols));
    }
  }
  const Isa isa = cpu::best_isa();
  // The activations each weight type reads, quantized here once per call for all the matrices
  // that read them: Q8_0 codes (Q8_0 weights in kQ8_0 mode, Q4_0, Q5_0), Q8_1 (the same codes
  // and scales plus s: Q4_1, Q5_1), Q8_K (the K-quants). F32/F16/BF16 read x itself.
  bool need_q8 = false, need_s = false, need_k = false;
  for (const MatmulOut& o : outs) {
    const WeightType t = o.w->type;
    if (t == WeightType::kQ8_0) {
      need_q8 = need_q8 || q8_0_activations() == Q8_0Activations::kQ8_0;
    } else if (is_block_type(t)) {
      const ActType at = activation_type(t);
      need_q8 = need_q8 || at != ActType::kQ8_K;
      need_s = need_s || at == ActType::kQ8_1;
      need_k = need_k || at == ActType::kQ8_K;
    }
  }
  // Grow to the largest call, then are reused: no allocation per token.
  thread_local std::vector<std::int8_t> xq, kq;  // [S][cols] Q8_0/Q8_1 codes, Q8_K codes
  thread_local std::vector<float> xd, xs, kd;    // [S][cols/32] d and s, [S][cols/256] Q8_K d
  thread_local std::vector<std::int16_t> kbs;    // [S][cols/16] Q8_K group sums
  const auto n = static_cast<std::size_t>(S * cols);
  if (need_q8) {
    if (xq.size() < n) xq.resize(n);
    if (xd.size() < n / 32) xd.resize(n / 32);
    if (need_s && xs.size() < n / 32) xs.resize(n / 32);
    quantize_activations_q8_1(x, S * cols, xq.data(), xd.data(), need_s ? xs.data() : nullptr);
  }
  if (need_k) {
    if (cols % 256 != 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  "[engine] K-quant matrices need cols a multiple of 256, got " +
                      std::to_string(cols));
    }
    if (kq.size() < n) kq.resize(n);
    if (kd.size() < n / 256) kd.resize(n / 256);
    if (kbs.size() < n / 16) kbs.resize(n / 16);
    quantize_activations_q8_k(x, S * cols, kq.data(), kd.data(), kbs.data());
  }
  const std::int8_t* q = need_q8 ? xq.data() : nullptr;
  const float* d = need_q8 ? xd.data() : nullptr;
  const bool quantize = need_q8;
  BlockActs acts_q8{ActType::kQ8_0, cols, q, d, need_s ? xs.data() : nullptr, nullptr};
  BlockActs acts_k{ActType::kQ8_K, cols, need_k ? kq.data() : nullptr,
                   need_k ? kd.data() : nullptr, nullptr, need_k ? kbs.data() : nullptr};
  // Rows [begin, end) of matrix m, by one thread, exactly as matmul_rows / matmul_rows_q8_0 /
  // matmul_rows_blocks compute them.
  const auto rows = [&](std::size_t m, std::int64_t begin, std::int64_t end) {
    const MatmulOut& o = outs[m];
    const WeightType t = o.w->type;
    if (t == WeightType::kQ8_0 && quantize && q8_0_activations() == Q8_0Activations::kQ8_0) {
      matmul_rows_q8_0(isa, o.out, q, d, *o.w, S, begin, end);
    } else if (t != WeightType::kQ8_0 && is_block_type(t)) {
      const ActType at = activation_type(t);
      BlockActs a = at == ActType::kQ8_K ? acts_k : acts_q8;
      a.type = at;
      matmul_rows_blocks(isa, o.out, a, *o.w, S, begin, end);
    } else {
      matmul_rows(isa, o.out, x, *o.w, S, begin, end);
    }
  };
  // Units of 16 rows (a multiple of the kernels' 4-row groups), numbered through the matrices
  // in order; a unit's rows are computed by one thread exactly as matmul_rows computes them, so
  // neither the split nor the fusion changes a result.
  constexpr std::int64_t kUnit = 16;
  std::int64_t first_unit[kMaxOuts + 1];  // matrix m's units are [first_unit[m], first_unit[m+1])
  first_unit[0] = 0;
  std::int64_t work = 0;
  for (std::size_t m = 0; m < outs.size(); ++m) {
    first_unit[m + 1] = first_unit[m] + (outs[m].w->rows + kUnit - 1) / kUnit;
    work += outs[m].w->rows * cols * S;
  }
  const std::int64_t units = first_unit[outs.size()];
  const int nt = threads();
  if (nt <= 1 || units < 2 || work < (std::int64_t{1} << 16)) {
    for (std::size_t m = 0; m < outs.size(); ++m) rows(m, 0, outs[m].w->rows);
    return;
  }
  parallel_for(units, nt, [&](std::int64_t u0, std::int64_t u1) {
    for (std::size_t m = 0; m < outs.size(); ++m) {
      const std::int64_t b = std::max(u0, first_unit[m]), e = std::min(u1, first_unit[m + 1]);
      if (b < e) {
        rows(m, (b - first_unit[m]) * kUnit,
             std::min(outs[m].w->rows, (e - first_unit[m]) * kUnit));
      }
    }
  });
}

void matmul(float* out, const float* x, const WeightMatrix& w, std::int64_t S) {
  const MatmulOut one{out, &w};
  matmul_fused(std::span<const MatmulOut>(&one, 1), x, S);
}

void dequantize_row(const WeightMatrix& w, std::int64_t i, float* out) noexcept {
  const std::uint8_t* row = w.row(i);
  if (is_block_type(w.type) && w.type != WeightType::kQ8_0) {
    dequantize(ggml_type_of(w.type), row, out, w.cols);
    return;
  }
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
      default:
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
