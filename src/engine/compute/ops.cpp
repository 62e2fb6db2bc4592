#include "engine/compute/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "base/kernels.h"

#if defined(__AVX__) && defined(__FMA__)
#include <immintrin.h>
#define VQ_ENGINE_AVX 1
#endif

#ifdef __FAST_MATH__
#error "VeloxQuant kernels must not be compiled with -ffast-math: results would depend on flags"
#endif

namespace vq::engine::ops {
namespace {

#ifdef VQ_ENGINE_AVX
// ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)): dot()'s lane tree, as three SIMD adds.
inline float reduce_tree(__m256 v) noexcept {
  const __m128 t =
      _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));  // l_i + l_{i+4}
  const __m128 u = _mm_add_ps(t, _mm_movehl_ps(t, t));                     // (t0 + t2), (t1 + t3)
  return _mm_cvtss_f32(_mm_add_ss(u, _mm_shuffle_ps(u, u, 1)));
}

// The lanes i < rem of an 8-lane mask (tails: the other lanes load as 0 and add nothing).
inline __m256i tail_mask(std::int64_t rem) noexcept {
  alignas(32) static const std::int32_t m[16] = {-1, -1, -1, -1, -1, -1, -1, -1,
                                                 0,  0,  0,  0,  0,  0,  0,  0};
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(m + 8 - rem));
}

#ifdef __AVX2__
// reduce_tree of eight vectors at once, by transposition: out[r] = reduce_tree(v[r]). Every
// addition pairs the same lanes as reduce_tree does, so the results are bit-identical.
inline __m256 reduce_tree8(const __m256 v[8]) noexcept {
  __m256 t[4];  // t[k] = [v[2k]: l_i + l_{i+4} | v[2k+1]: l_i + l_{i+4}]
  for (int k = 0; k < 4; ++k) {
    t[k] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * k], v[2 * k + 1], 0x20),
                         _mm256_permute2f128_ps(v[2 * k], v[2 * k + 1], 0x31));
  }
  // u: per row, (t0 + t2) and (t1 + t3); rows 0, 2 | 1, 3 and 4, 6 | 5, 7.
  const __m256 u0 = _mm256_add_ps(_mm256_shuffle_ps(t[0], t[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm256_shuffle_ps(t[0], t[1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 u1 = _mm256_add_ps(_mm256_shuffle_ps(t[2], t[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm256_shuffle_ps(t[2], t[3], _MM_SHUFFLE(3, 2, 3, 2)));
  // rows 0, 2, 4, 6 | 1, 3, 5, 7: (t0 + t2) + (t1 + t3).
  const __m256 w = _mm256_add_ps(_mm256_shuffle_ps(u0, u1, _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm256_shuffle_ps(u0, u1, _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm256_permutevar8x32_ps(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}
#endif

// R output rows at once (R independent accumulators hide the add latency):
// out[r] = dot(w + r * n, x, n) for r < R, in dot()'s order.
template <int R>
inline void dot_rows(const float* w, const float* x, std::int64_t n, float* out) noexcept {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  std::int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 xv = _mm256_loadu_ps(x + j);
    for (int r = 0; r < R; ++r)
      acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(w + r * n + j), xv, acc[r]);
  }
  if (j < n) {  // lanes past the end load 0: fma(0, 0, acc) = acc, lanes unchanged
    const __m256i m = tail_mask(n - j);
    const __m256 xv = _mm256_maskload_ps(x + j, m);
    for (int r = 0; r < R; ++r)
      acc[r] = _mm256_fmadd_ps(_mm256_maskload_ps(w + r * n + j, m), xv, acc[r]);
  }
#ifdef __AVX2__
  if constexpr (R == 8) {
    _mm256_storeu_ps(out, reduce_tree8(acc));
    return;
  }
#endif
  for (int r = 0; r < R; ++r) out[r] = reduce_tree(acc[r]);
}
#else
template <int R>
inline void dot_rows(const float* w, const float* x, std::int64_t n, float* out) noexcept {
  for (int r = 0; r < R; ++r) out[r] = dot(w + r * n, x, n);
}
#endif

}  // namespace

void matmul(float* out, const float* x, const float* w, std::int64_t S, std::int64_t n_in,
            std::int64_t n_out) noexcept {
  std::int64_t i = 0;
  float r[8];
  for (; i + 8 <= n_out; i += 8) {
    for (std::int64_t s = 0; s < S; ++s) {
      dot_rows<8>(w + i * n_in, x + s * n_in, n_in, r);
      std::memcpy(out + s * n_out + i, r, sizeof r);
    }
  }
  for (; i < n_out; ++i) {
    for (std::int64_t s = 0; s < S; ++s) {
      dot_rows<1>(w + i * n_in, x + s * n_in, n_in, r);
      out[s * n_out + i] = r[0];
    }
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

namespace {

// 2^k as a float for integer k in [-126, 127] (built from the exponent bits).
inline float pow2i(std::int32_t k) noexcept {
  const std::uint32_t bits = static_cast<std::uint32_t>(k + 127) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline float exp1(float x) noexcept {
  // e^x = 2^n e^r with n = round(x / ln 2) (round-to-nearest by the 1.5 * 2^23 trick) and
  // r = x - n ln 2 in two steps (ln 2 split so n * 0.693359375 is exact).
  const float xc = x < -104.0f ? -104.0f : (x > 88.75f ? 88.75f : x);
  const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = (p * (r * r) + r) + 1.0f;
  // 2^n as two factors, so results near overflow and down into the subnormals round once.
  const auto k = static_cast<std::int32_t>(n);
  const std::int32_t k1 = k < -126 ? k + 64 : (k > 127 ? k - 1 : k);
  const float post = k < -126 ? 5.42101086242752217e-20f /* 2^-64 */ : (k > 127 ? 2.0f : 1.0f);
  float out = (er * pow2i(k1)) * post;
  if (x > 88.7228390f) out = std::numeric_limits<float>::infinity();
  if (x < -104.0f) out = 0.0f;
  return x != x ? x : out;  // NaN in, NaN out
}

}  // namespace

void exp_inplace(float* x, std::int64_t n) noexcept {
  for (std::int64_t i = 0; i < n; ++i) x[i] = exp1(x[i]);
}

void softmax(float* x, std::int64_t n, float divisor) noexcept {
  if (n <= 0) return;
  for (std::int64_t i = 0; i < n; ++i) x[i] = x[i] / divisor;
  // The maximum, NaN entries ignored (max is exact, so the lane split cannot change it).
  float m = -std::numeric_limits<float>::infinity();
  std::int64_t i = 0;
#ifdef VQ_ENGINE_AVX
  __m256 mv = _mm256_set1_ps(m);
  for (; i + 8 <= n; i += 8) mv = _mm256_max_ps(_mm256_loadu_ps(x + i), mv);  // NaN in x: keeps mv
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, mv);
  for (const float v : lanes) m = v > m ? v : m;
#endif
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  for (std::int64_t k = 0; k < n; ++k) x[k] = x[k] - m;
  exp_inplace(x, n);
  const float s = kernels::sum(x, n);
  for (std::int64_t k = 0; k < n; ++k) x[k] = x[k] / s;
}

namespace {

#ifdef VQ_ENGINE_AVX
// Eight fp32 lanes of a key/value row, from fp16 (F16C, exact) or fp32; the type fixed at
// compile time (kF16: fp16 rows), for inner loops.
template <bool kF16>
inline __m256 load8_as(const void* row, std::int64_t i) noexcept {
#if defined(__F16C__)
  if constexpr (kF16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(
        reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(row) + i)));
  }
#endif
  return _mm256_loadu_ps(static_cast<const float*>(row) + i);
}

// The same with the type chosen at run time.
inline __m256 load8(const void* row, DType dtype, std::int64_t i) noexcept {
  return dtype == DType::kF16 ? load8_as<true>(row, i) : load8_as<false>(row, i);
}

// Rows [r0, r1) (row r at base + r * row_bytes; their first `span` bytes) fetched into cache
// ahead of their use. A prefetch past the end reads nothing and cannot fault.
inline void prefetch_rows(const std::uint8_t* base, std::int64_t row_bytes, std::int64_t r0,
                          std::int64_t r1, std::int64_t span) noexcept {
  for (std::int64_t r = r0; r < r1; ++r) {
    const auto* row = reinterpret_cast<const char*>(base + r * row_bytes);
    for (std::int64_t b = 0; b < span; b += 64) _mm_prefetch(row + b, _MM_HINT_T0);
  }
}

inline bool simd_rows(DType dtype, std::int64_t D) noexcept {
#if defined(__F16C__)
  return D % 8 == 0 && D <= 256 && (dtype == DType::kF32 || dtype == DType::kF16);
#else
  return D % 8 == 0 && D <= 256 && dtype == DType::kF32;
#endif
}
#endif

#ifdef __AVX2__
// attention_scores' rows in blocks of eight, r < n_rows - n_rows % 8 (the rest: the caller);
// returns the first row not done. Masked rows are computed, then replaced by -inf.
template <bool kF16>
std::int64_t score_blocks(const float* q, std::int64_t n_q, std::int64_t D,
                          const std::uint8_t* base, std::int64_t row_bytes,
                          const std::int32_t* positions, std::int64_t n_rows, std::int64_t pos,
                          float* scores, std::int64_t ld) noexcept {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const std::int64_t C = D / 8;
  const std::int64_t row_span = D * (kF16 ? 2 : 4);  // bytes of a row read
  const __m256i limit = _mm256_set1_epi32(static_cast<std::int32_t>(pos));
  std::int64_t r = 0;
  for (; r + 8 <= n_rows; r += 8) {
    // The rows two blocks ahead, fetched while these are computed.
    prefetch_rows(base, row_bytes, r + 16, std::min(n_rows, r + 24), row_span);
    const __m256 hidden = _mm256_castsi256_ps(_mm256_cmpgt_epi32(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(positions + r)), limit));
    for (std::int64_t j = 0; j < n_q; ++j) {
      const float* qj = q + j * D;
      __m256 acc[8];
      for (int k = 0; k < 8; ++k) acc[k] = _mm256_setzero_ps();
      for (std::int64_t c = 0; c < C; ++c) {
        const __m256 qv = _mm256_loadu_ps(qj + 8 * c);
        for (int k = 0; k < 8; ++k) {
          acc[k] = _mm256_fmadd_ps(qv, load8_as<kF16>(base + (r + k) * row_bytes, 8 * c), acc[k]);
        }
      }
      _mm256_storeu_ps(scores + j * ld + r,
                       _mm256_blendv_ps(reduce_tree8(acc), _mm256_set1_ps(neg_inf), hidden));
    }
  }
  return r;
}
#endif

}  // namespace

void attention_scores(const float* q, std::int64_t n_q, std::int64_t D, const void* keys,
                      DType dtype, std::int64_t stride, const std::int32_t* positions,
                      std::int64_t n_rows, std::int64_t pos, float* scores, std::int64_t ld,
                      float* scratch) noexcept {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const std::int64_t esize = static_cast<std::int64_t>(dtype_size(dtype));
  const auto* base = static_cast<const std::uint8_t*>(keys);
  std::int64_t r = 0;
#ifdef VQ_ENGINE_AVX
  if (simd_rows(dtype, D)) {
    const std::int64_t C = D / 8;
#ifdef __AVX2__
    r = dtype == DType::kF16 ? score_blocks<true>(q, n_q, D, base, stride * esize, positions,
                                                  n_rows, pos, scores, ld)
                             : score_blocks<false>(q, n_q, D, base, stride * esize, positions,
                                                   n_rows, pos, scores, ld);
#endif
    for (; r < n_rows; ++r) {
      if (positions[r] > pos) {
        for (std::int64_t j = 0; j < n_q; ++j) scores[j * ld + r] = neg_inf;
        continue;
      }
      const void* row = base + r * stride * esize;
      for (std::int64_t j = 0; j < n_q; ++j) {
        const float* qj = q + j * D;
        __m256 acc = _mm256_setzero_ps();
        for (std::int64_t c = 0; c < C; ++c)
          acc = _mm256_fmadd_ps(_mm256_loadu_ps(qj + 8 * c), load8(row, dtype, 8 * c), acc);
        scores[j * ld + r] = reduce_tree(acc);
      }
    }
    return;
  }
#endif
  for (; r < n_rows; ++r) {
    if (positions[r] > pos) {
      for (std::int64_t j = 0; j < n_q; ++j) scores[j * ld + r] = neg_inf;
      continue;
    }
    load_row(base + r * stride * esize, dtype, scratch, D);
    for (std::int64_t j = 0; j < n_q; ++j) scores[j * ld + r] = dot(q + j * D, scratch, D);
  }
}

namespace {

#ifdef VQ_ENGINE_AVX
// Query j of the group sees the rows with positions[r] <= qpos[j]; a block whose rows every
// query sees takes the unmasked loop.
template <int NQ, bool kF16>
void values_group(const float* probs, std::int64_t ld, std::int64_t D, const std::uint8_t* base,
                  std::int64_t row_bytes, const std::int32_t* positions, std::int64_t n_rows,
                  const std::int64_t* qpos, float* sums) noexcept {
  std::int64_t pos = qpos[0], pos_max = qpos[0];  // the lowest and the highest query position
  for (int j = 1; j < NQ; ++j) {
    pos = std::min(pos, qpos[j]);
    pos_max = std::max(pos_max, qpos[j]);
  }
  // Rows in blocks of kBlock, each block's rows read for every 8-lane chunk while they are in
  // L1; the partial sums live in `sums` between blocks. Every partial sum still adds its rows in
  // increasing r, so blocking does not change a result.
  constexpr std::int64_t kBlock = 64;
  const std::int64_t C = D / 8;                      // <= 32 (simd_rows)
  const std::int64_t row_span = D * (kF16 ? 2 : 4);  // bytes of a row read
  // The partial sums: query j's sum k of channels [8c, 8c + 8) at sums + (j * 4 + k) * D + 8c.
  auto at = [&](int j, int k, std::int64_t c) { return sums + (j * 4 + k) * D + 8 * c; };
  for (std::int64_t r0 = 0; r0 < n_rows; r0 += kBlock) {
    const std::int64_t r1 = std::min(n_rows, r0 + kBlock);
    // The next block's rows, fetched while this one is summed.
    prefetch_rows(base, row_bytes, r1, std::min(n_rows, r1 + kBlock), row_span);
    // Whether every row of the block is visible (the usual case): then no row is skipped.
    bool all_visible = r1 - r0 == kBlock;
    for (std::int64_t r = r0; r < r1 && all_visible; ++r) all_visible = positions[r] <= pos;
    for (std::int64_t c = 0; c < C; ++c) {
      __m256 part[NQ][4];
      for (int j = 0; j < NQ; ++j) {
        for (int k = 0; k < 4; ++k) part[j][k] = _mm256_loadu_ps(at(j, k, c));
      }
      // Row r goes to partial sum r % 4 (r0 is a multiple of 4); the index is a constant in
      // the unrolled body, so the partial sums stay in registers.
      if (all_visible) {
        for (std::int64_t r = r0; r < r1; r += 4) {
          for (int k = 0; k < 4; ++k) {
            const __m256 v = load8_as<kF16>(base + (r + k) * row_bytes, 8 * c);
            for (int j = 0; j < NQ; ++j) {
              part[j][k] = _mm256_fmadd_ps(_mm256_set1_ps(probs[j * ld + r + k]), v, part[j][k]);
            }
          }
        }
      } else {
        for (std::int64_t r = r0; r < r1; r += 4) {
          for (int k = 0; k < 4; ++k) {
            if (r + k >= r1 || positions[r + k] > pos_max) continue;
            const __m256 v = load8_as<kF16>(base + (r + k) * row_bytes, 8 * c);
            for (int j = 0; j < NQ; ++j) {
              if (positions[r + k] > qpos[j]) continue;
              part[j][k] = _mm256_fmadd_ps(_mm256_set1_ps(probs[j * ld + r + k]), v, part[j][k]);
            }
          }
        }
      }
      for (int j = 0; j < NQ; ++j) {
        for (int k = 0; k < 4; ++k) _mm256_storeu_ps(at(j, k, c), part[j][k]);
      }
    }
  }
}

template <bool kF16>
void values_dispatch(std::int64_t nj, const float* probs, std::int64_t ld, std::int64_t D,
                     const std::uint8_t* base, std::int64_t row_bytes,
                     const std::int32_t* positions, std::int64_t n_rows, const std::int64_t* pos,
                     float* sums) noexcept {
  switch (nj) {
    case 4:
      return values_group<4, kF16>(probs, ld, D, base, row_bytes, positions, n_rows, pos, sums);
    case 3:
      return values_group<3, kF16>(probs, ld, D, base, row_bytes, positions, n_rows, pos, sums);
    case 2:
      return values_group<2, kF16>(probs, ld, D, base, row_bytes, positions, n_rows, pos, sums);
    default:
      return values_group<1, kF16>(probs, ld, D, base, row_bytes, positions, n_rows, pos, sums);
  }
}
#endif

}  // namespace

namespace {

// attention_values_add with query j's position at pos[j * pos_step] (pos_step 0: one position
// for every query).
void values_add(const float* probs, std::int64_t n_q, std::int64_t ld, std::int64_t D,
                const void* values, DType dtype, std::int64_t stride,
                const std::int32_t* positions, std::int64_t n_rows, const std::int64_t* pos,
                std::int64_t pos_step, float* sums) noexcept {
  const std::int64_t esize = static_cast<std::int64_t>(dtype_size(dtype));
  const auto* base = static_cast<const std::uint8_t*>(values);
#ifdef VQ_ENGINE_AVX
  if (simd_rows(dtype, D)) {
    // Queries in groups of up to four share each value row load.
    for (std::int64_t j0 = 0; j0 < n_q; j0 += 4) {
      const std::int64_t nj = std::min<std::int64_t>(4, n_q - j0);
      std::int64_t qpos[4];
      for (std::int64_t j = 0; j < nj; ++j) qpos[j] = pos[(j0 + j) * pos_step];
      if (dtype == DType::kF16) {
        values_dispatch<true>(nj, probs + j0 * ld, ld, D, base, stride * esize, positions, n_rows,
                              qpos, sums + j0 * 4 * D);
      } else {
        values_dispatch<false>(nj, probs + j0 * ld, ld, D, base, stride * esize, positions,
                               n_rows, qpos, sums + j0 * 4 * D);
      }
    }
    return;
  }
#endif
  for (std::int64_t j = 0; j < n_q; ++j) {
    const float* p = probs + j * ld;
    float* sj = sums + j * 4 * D;
    const std::int64_t pj = pos[j * pos_step];
    for (std::int64_t r = 0; r < n_rows; ++r) {
      if (positions[r] > pj) continue;
      const std::uint8_t* row = base + r * stride * esize;
      float* part = sj + (r & 3) * D;
      for (std::int64_t d = 0; d < D; ++d) {
        float v;
        if (dtype == DType::kF32) {
          std::memcpy(&v, row + d * 4, 4);
        } else {
          std::uint16_t h;
          std::memcpy(&h, row + d * 2, 2);
          v = half_to_float(h);
        }
        part[d] = std::fma(p[r], v, part[d]);
      }
    }
  }
}

}  // namespace

void attention_values_add(const float* probs, std::int64_t n_q, std::int64_t ld, std::int64_t D,
                          const void* values, DType dtype, std::int64_t stride,
                          const std::int32_t* positions, std::int64_t n_rows, std::int64_t pos,
                          float* sums) noexcept {
  values_add(probs, n_q, ld, D, values, dtype, stride, positions, n_rows, &pos, 0, sums);
}

void attention_values_add_each(const float* probs, std::int64_t n_q, std::int64_t ld,
                               std::int64_t D, const void* values, DType dtype,
                               std::int64_t stride, const std::int32_t* positions,
                               std::int64_t n_rows, const std::int64_t* pos,
                               float* sums) noexcept {
  values_add(probs, n_q, ld, D, values, dtype, stride, positions, n_rows, pos, 1, sums);
}

void attention_values_finish(const float* sums, std::int64_t n_q, std::int64_t D,
                             float* out) noexcept {
  for (std::int64_t j = 0; j < n_q; ++j) {
    const float* s = sums + j * 4 * D;
    for (std::int64_t d = 0; d < D; ++d)
      out[j * D + d] = (s[d] + s[2 * D + d]) + (s[D + d] + s[3 * D + d]);
  }
}

void attention_values(const float* probs, std::int64_t n_q, std::int64_t ld, std::int64_t D,
                      const void* values, DType dtype, std::int64_t stride,
                      const std::int32_t* positions, std::int64_t n_rows, std::int64_t pos,
                      float* out, float* sums) noexcept {
  std::fill(sums, sums + n_q * 4 * D, 0.0f);
  attention_values_add(probs, n_q, ld, D, values, dtype, stride, positions, n_rows, pos, sums);
  attention_values_finish(sums, n_q, D, out);
}

void swiglu(float* x, const float* up, std::int64_t n) noexcept {
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    x[i] = v * (1.0f / (1.0f + exp1(-v)));
    x[i] = x[i] * up[i];
  }
}

}  // namespace vq::engine::ops
