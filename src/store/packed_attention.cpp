#include "store/packed_attention.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <vector>

#include "base/kernels.h"
#include "veloxquant/types.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define VQ_ATTN_X86 1
#define VQ_AVX2 __attribute__((target("avx2,f16c")))
#endif

#ifdef __FAST_MATH__
#error "VeloxQuant kernels must not be compiled with -ffast-math: results would depend on flags"
#endif

namespace vq::detail::attn {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// A float buffer on the stack when it fits (the usual head sizes), else on the heap.
class Buf {
 public:
  explicit Buf(std::int64_t n) {
    if (n > static_cast<std::int64_t>(small_.size())) {
      big_.resize(static_cast<std::size_t>(n));
      p_ = big_.data();
    } else {
      p_ = small_.data();
    }
  }
  float* data() noexcept { return p_; }

 private:
  std::array<float, 1024> small_;
  std::vector<float> big_;
  float* p_;
};

inline float reduce_lanes(const float a[8]) noexcept {
  return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}
inline bool is_plain(Fmt f) noexcept { return f == Fmt::kF32 || f == Fmt::kF16; }
inline bool is_asym(Fmt f) noexcept { return f == Fmt::kU2 || f == Fmt::kU4; }
inline std::int64_t group_of(const RowSet& s, std::int64_t D) noexcept {
  return is_plain(s.fmt) ? D : s.group;
}
inline float scale_of(const RowSet& s, std::int64_t r, std::int64_t g) noexcept {
  return half_to_float(s.scale[r * s.param_stride + g]);
}
inline float zero_of(const RowSet& s, std::int64_t r, std::int64_t g) noexcept {
  return half_to_float(s.zero[r * s.param_stride + g]);
}

// Rows [r0, n) of s as a set of their own (row 0 = row r0).
RowSet tail_of(const RowSet& s, std::int64_t r0) noexcept {
  RowSet t = s;
  t.data = s.data + r0 * s.row_bytes;
  if (s.scale != nullptr) t.scale = s.scale + r0 * s.param_stride;
  if (s.zero != nullptr) t.zero = s.zero + r0 * s.param_stride;
  t.positions = s.positions + r0;
  t.n = s.n - r0;
  return t;
}
RowSet head_of(const RowSet& s, std::int64_t n) noexcept {
  RowSet t = s;
  t.n = n;
  return t;
}

// ---- Scalar definitions ----------------------------------------------------------------------

void token_scores_scalar(const RowSet& s, std::int64_t D, const float* q, std::int64_t n_q,
                         std::int64_t pos, float* out, std::int64_t ld) noexcept {
  const bool plain = is_plain(s.fmt), asym = is_asym(s.fmt);
  const std::int64_t G = group_of(s, D), n_groups = (D + G - 1) / G;
  for (std::int64_t r = 0; r < s.n; ++r) {
    if (s.positions[r] > pos) {
      for (std::int64_t j = 0; j < n_q; ++j) out[j * ld + r] = kNegInf;
      continue;
    }
    for (std::int64_t j = 0; j < n_q; ++j) {
      const float* qj = q + j * D;
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (std::int64_t g = 0; g < n_groups; ++g) {
        const std::int64_t c0 = g * G, c1 = std::min(D, c0 + G);
        float t[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (std::int64_t c = c0; c < c1; ++c) t[c % 8] += qj[c] * element(s, r, c);
        const float w = plain ? 1.0f : scale_of(s, r, g);
        for (int l = 0; l < 8; ++l) acc[l] += plain ? t[l] : w * t[l];
      }
      float score = reduce_lanes(acc);
      if (asym) {
        float zt = 0.0f;
        for (std::int64_t g = 0; g < n_groups; ++g) {
          const std::int64_t c0 = g * G, c1 = std::min(D, c0 + G);
          zt += zero_of(s, r, g) * kernels::sum(qj + c0, c1 - c0);
        }
        score = score + zt;
      }
      out[j * ld + r] = score;
    }
  }
}

void channel_scores_scalar(const RowSet& s, const std::uint16_t* scale, const std::uint16_t* zero,
                           std::int64_t D, const float* q, std::int64_t n_q, std::int64_t pos,
                           float* out, std::int64_t ld) noexcept {
  Buf qs(D), zf(D), x(D);
  for (std::int64_t c = 0; c < D; ++c) zf.data()[c] = half_to_float(zero[c]);
  for (std::int64_t j = 0; j < n_q; ++j) {
    const float* qj = q + j * D;
    for (std::int64_t c = 0; c < D; ++c) qs.data()[c] = qj[c] * half_to_float(scale[c]);
    const float zq = kernels::dot(qj, zf.data(), D);
    for (std::int64_t r = 0; r < s.n; ++r) {
      if (s.positions[r] > pos) {
        out[j * ld + r] = kNegInf;
        continue;
      }
      for (std::int64_t c = 0; c < D; ++c) x.data()[c] = element(s, r, c);
      out[j * ld + r] = kernels::dot(qs.data(), x.data(), D) + zq;
    }
  }
}

void token_values_scalar(const RowSet& s, std::int64_t first, std::int64_t D, const float* probs,
                         std::int64_t n_q, std::int64_t ld, std::int64_t pos, float* A, float* Z,
                         std::int64_t zs) noexcept {
  const bool plain = is_plain(s.fmt), asym = is_asym(s.fmt);
  const std::int64_t G = group_of(s, D), n_groups = (D + G - 1) / G;
  for (std::int64_t r = 0; r < s.n; ++r) {
    if (s.positions[r] > pos) continue;
    const std::int64_t k = (first + r) & 3;
    for (std::int64_t j = 0; j < n_q; ++j) {
      const float p = probs[j * ld + r];
      float* a = A + (j * 4 + k) * D;
      for (std::int64_t g = 0; g < n_groups; ++g) {
        const std::int64_t c0 = g * G, c1 = std::min(D, c0 + G);
        const float w = plain ? p : p * scale_of(s, r, g);
        for (std::int64_t c = c0; c < c1; ++c) a[c] += w * element(s, r, c);
        if (asym) Z[(j * 4 + k) * zs + g] += p * zero_of(s, r, g);
      }
    }
  }
}

// ---- AVX2 ------------------------------------------------------------------------------------
#ifdef VQ_ATTN_X86

VQ_AVX2 inline float h2f(std::uint16_t h) noexcept { return _cvtsh_ss(h); }  // exact

VQ_AVX2 inline float reduce_tree(__m256 v) noexcept {
  const __m128 t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 u = _mm_add_ps(t, _mm_movehl_ps(t, t));
  return _mm_cvtss_f32(_mm_add_ss(u, _mm_shuffle_ps(u, u, 1)));
}

// reduce_tree of eight vectors at once (out lane k = reduce_tree(v[k])), by transposition; every
// addition pairs the lanes reduce_tree pairs.
VQ_AVX2 inline __m256 reduce_tree8(const __m256 v[8]) noexcept {
  __m256 t[4];
  for (int k = 0; k < 4; ++k) {
    t[k] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * k], v[2 * k + 1], 0x20),
                         _mm256_permute2f128_ps(v[2 * k], v[2 * k + 1], 0x31));
  }
  const __m256 u0 = _mm256_add_ps(_mm256_shuffle_ps(t[0], t[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm256_shuffle_ps(t[0], t[1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 u1 = _mm256_add_ps(_mm256_shuffle_ps(t[2], t[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm256_shuffle_ps(t[2], t[3], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 w = _mm256_add_ps(_mm256_shuffle_ps(u0, u1, _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm256_shuffle_ps(u0, u1, _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm256_permutevar8x32_ps(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// Elements [c, c + 8) of a row (c a multiple of 8) as exact floats, unpacked in registers.
template <Fmt F>
VQ_AVX2 inline __m256 load8(const std::uint8_t* row, std::int64_t c) noexcept {
  if constexpr (F == Fmt::kF32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + c);
  } else if constexpr (F == Fmt::kF16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * c)));
  } else if constexpr (F == Fmt::kU2) {
    std::uint16_t w;
    std::memcpy(&w, row + c / 4, sizeof w);
    const __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32(w),
                                        _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
    return _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(3)));
  } else if constexpr (F == Fmt::kU4) {
    std::uint32_t w;
    std::memcpy(&w, row + c / 2, sizeof w);
    const __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(w)),
                                        _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
    return _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(15)));
  } else if constexpr (F == Fmt::kQ8_0) {
    return _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + c))));
  } else {  // kQ4_0: chunk w of its block: bytes 8 (w & 1).., low nibbles for w < 2, else high
    const std::int64_t b = c / 32, w = (c % 32) / 8;
    __m256i v = _mm256_cvtepu8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + 16 * b + 8 * (w & 1))));
    if (w >= 2) v = _mm256_srli_epi32(v, 4);
    v = _mm256_sub_epi32(_mm256_and_si256(v, _mm256_set1_epi32(15)), _mm256_set1_epi32(8));
    return _mm256_cvtepi32_ps(v);
  }
}

// A whole q4_0 block (32 channels, 16 bytes) at once: x[w] = channels [8w, 8w + 8) as exact
// floats (code - 8), the same numbers load8<kQ4_0> gives chunk by chunk.
VQ_AVX2 inline void load_q4_block(const std::uint8_t* block, __m256 x[4]) noexcept {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block));
  const __m128i m = _mm_set1_epi8(15), eight = _mm_set1_epi8(8);
  const __m128i lo = _mm_sub_epi8(_mm_and_si128(b, m), eight);                     // ch 0..15
  const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(b, 4), m), eight);  // ch 16..31
  x[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
  x[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
  x[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
  x[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
}

// Rows [r0, r1) fetched ahead of their use (a prefetch past the end cannot fault).
VQ_AVX2 inline void prefetch_rows(const RowSet& s, std::int64_t r0, std::int64_t r1) noexcept {
  for (std::int64_t r = r0; r < r1; ++r) {
    const auto* row = reinterpret_cast<const char*>(s.data + r * s.row_bytes);
    for (std::int64_t b = 0; b < s.row_bytes; b += 64) _mm_prefetch(row + b, _MM_HINT_T0);
  }
}

VQ_AVX2 inline __m256 hidden8(const RowSet& s, std::int64_t r, std::int64_t pos) noexcept {
  return _mm256_castsi256_ps(
      _mm256_cmpgt_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s.positions + r)),
                         _mm256_set1_epi32(static_cast<std::int32_t>(pos))));
}

constexpr std::int64_t kMaxGroups = 32;  // D <= 256 with groups of >= 8 channels

template <Fmt F>
VQ_AVX2 void token_scores_avx2(const RowSet& s, std::int64_t D, const float* q, std::int64_t n_q,
                               std::int64_t pos, float* out, std::int64_t ld) noexcept {
  constexpr bool kPlain = F == Fmt::kF32 || F == Fmt::kF16;
  constexpr bool kAsym = F == Fmt::kU2 || F == Fmt::kU4;
  const std::int64_t G = kPlain ? D : s.group, n_groups = (D + G - 1) / G;
  // Q[j * n_groups + g]: the query's sum over group g (the zeros' term).
  Buf Q(kAsym ? n_q * n_groups : 1);
  if constexpr (kAsym) {
    for (std::int64_t j = 0; j < n_q; ++j) {
      for (std::int64_t g = 0; g < n_groups; ++g)
        Q.data()[j * n_groups + g] = kernels::sum(q + j * D + g * G, std::min(G, D - g * G));
    }
  }
  std::int64_t r = 0;
  for (; r + 8 <= s.n; r += 8) {
    prefetch_rows(s, r + 16, std::min(s.n, r + 24));
    const __m256 hidden = hidden8(s, r, pos);
    const std::uint8_t* rows = s.data + r * s.row_bytes;
    // The block's scales and zeros as floats, once for every query: [k * n_groups + g].
    float sc[8 * kMaxGroups], zr[8 * kMaxGroups];
    if constexpr (!kPlain) {
      for (int k = 0; k < 8; ++k) {
        for (std::int64_t g = 0; g < n_groups; ++g) {
          sc[k * n_groups + g] = h2f(s.scale[(r + k) * s.param_stride + g]);
          if constexpr (kAsym) zr[k * n_groups + g] = h2f(s.zero[(r + k) * s.param_stride + g]);
        }
      }
    }
    for (std::int64_t j = 0; j < n_q; ++j) {
      const float* qj = q + j * D;
      __m256 acc[8];
      for (int k = 0; k < 8; ++k) acc[k] = _mm256_setzero_ps();
      if constexpr (kPlain) {
        for (std::int64_t c = 0; c < D; c += 8) {
          const __m256 qv = _mm256_loadu_ps(qj + c);
          for (int k = 0; k < 8; ++k)
            acc[k] = _mm256_add_ps(acc[k], _mm256_mul_ps(qv, load8<F>(rows + k * s.row_bytes, c)));
        }
      } else if constexpr (F == Fmt::kQ4_0) {  // group = block = 32 channels
        for (std::int64_t g = 0; g < n_groups; ++g) {
          for (int k = 0; k < 8; ++k) {
            __m256 x[4];
            load_q4_block(rows + k * s.row_bytes + 16 * g, x);
            __m256 t = _mm256_setzero_ps();
            for (int w = 0; w < 4; ++w)
              t = _mm256_add_ps(t, _mm256_mul_ps(_mm256_loadu_ps(qj + 32 * g + 8 * w), x[w]));
            acc[k] = _mm256_add_ps(acc[k], _mm256_mul_ps(_mm256_set1_ps(sc[k * n_groups + g]), t));
          }
        }
      } else {
        for (std::int64_t g = 0; g < n_groups; ++g) {
          for (int k = 0; k < 8; ++k) {
            const std::uint8_t* row = rows + k * s.row_bytes;
            __m256 t = _mm256_setzero_ps();
            for (std::int64_t c = g * G, c1 = std::min(D, g * G + G); c < c1; c += 8)
              t = _mm256_add_ps(t, _mm256_mul_ps(_mm256_loadu_ps(qj + c), load8<F>(row, c)));
            acc[k] = _mm256_add_ps(acc[k], _mm256_mul_ps(_mm256_set1_ps(sc[k * n_groups + g]), t));
          }
        }
      }
      __m256 res = reduce_tree8(acc);
      if constexpr (kAsym) {
        alignas(32) float zt[8];
        for (int k = 0; k < 8; ++k) {
          float z = 0.0f;
          for (std::int64_t g = 0; g < n_groups; ++g)
            z += zr[k * n_groups + g] * Q.data()[j * n_groups + g];
          zt[k] = z;
        }
        res = _mm256_add_ps(res, _mm256_load_ps(zt));
      }
      _mm256_storeu_ps(out + j * ld + r, _mm256_blendv_ps(res, _mm256_set1_ps(kNegInf), hidden));
    }
  }
  if (r < s.n) {
    float* o = out + r;
    token_scores_scalar(tail_of(s, r), D, q, n_q, pos, o, ld);
  }
}

template <Fmt F>
VQ_AVX2 void channel_scores_avx2(const RowSet& s, const std::uint16_t* scale,
                                 const std::uint16_t* zero, std::int64_t D, const float* q,
                                 std::int64_t n_q, std::int64_t pos, float* out,
                                 std::int64_t ld) noexcept {
  // The query folded into the group's scales once: qs[j * D + c] = q_jc * s_c; zq[j] = q_j . z.
  Buf qs(n_q * D), zf(D), zq(n_q);
  kernels::f16_to_f32(zero, zf.data(), D);
  Buf sf(D);
  kernels::f16_to_f32(scale, sf.data(), D);
  for (std::int64_t j = 0; j < n_q; ++j) {
    for (std::int64_t c = 0; c < D; c += 8) {
      _mm256_storeu_ps(qs.data() + j * D + c, _mm256_mul_ps(_mm256_loadu_ps(q + j * D + c),
                                                            _mm256_loadu_ps(sf.data() + c)));
    }
    zq.data()[j] = kernels::dot(q + j * D, zf.data(), D);
  }
  std::int64_t r = 0;
  for (; r + 8 <= s.n; r += 8) {
    prefetch_rows(s, r + 16, std::min(s.n, r + 24));
    const __m256 hidden = hidden8(s, r, pos);
    const std::uint8_t* rows = s.data + r * s.row_bytes;
    for (std::int64_t j = 0; j < n_q; ++j) {
      const float* qj = qs.data() + j * D;
      __m256 acc[8];
      for (int k = 0; k < 8; ++k) acc[k] = _mm256_setzero_ps();
      for (std::int64_t c = 0; c < D; c += 8) {
        const __m256 qv = _mm256_loadu_ps(qj + c);
        for (int k = 0; k < 8; ++k)
          acc[k] = _mm256_add_ps(acc[k], _mm256_mul_ps(qv, load8<F>(rows + k * s.row_bytes, c)));
      }
      const __m256 res = _mm256_add_ps(reduce_tree8(acc), _mm256_set1_ps(zq.data()[j]));
      _mm256_storeu_ps(out + j * ld + r, _mm256_blendv_ps(res, _mm256_set1_ps(kNegInf), hidden));
    }
  }
  for (; r < s.n; ++r) {  // the last rows one at a time, the same sums
    const std::uint8_t* row = s.data + r * s.row_bytes;
    for (std::int64_t j = 0; j < n_q; ++j) {
      if (s.positions[r] > pos) {
        out[j * ld + r] = kNegInf;
        continue;
      }
      __m256 acc = _mm256_setzero_ps();
      for (std::int64_t c = 0; c < D; c += 8)
        acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(qs.data() + j * D + c),
                                               load8<F>(row, c)));
      out[j * ld + r] = reduce_tree(acc) + zq.data()[j];
    }
  }
}

// Value sums of a block of m rows (m a multiple of 4, at most kValueBlock, every row visible,
// row 0's partial sum index 0) for NQ queries.
constexpr std::int64_t kValueBlock = 32;

template <Fmt F, int NQ>
VQ_AVX2 void values_block(const RowSet& s, std::int64_t r, std::int64_t m, std::int64_t D,
                          const float* probs, std::int64_t ld, float* A, float* Z,
                          std::int64_t zs) noexcept {
  constexpr bool kPlain = F == Fmt::kF32 || F == Fmt::kF16;
  constexpr bool kAsym = F == Fmt::kU2 || F == Fmt::kU4;
  const std::int64_t G = kPlain ? D : s.group, n_groups = (D + G - 1) / G;
  // W[(j * kValueBlock + i) * kMaxGroups + g]: row r + i's weight in group g for query j.
  alignas(32) float W[NQ * kValueBlock * kMaxGroups];
  for (std::int64_t i = 0; i < m; ++i) {
    const std::int64_t k = i & 3;
    for (int j = 0; j < NQ; ++j) {
      const float p = probs[j * ld + r + i];
      float* w = W + (j * kValueBlock + i) * kMaxGroups;
      for (std::int64_t g = 0; g < n_groups; ++g) {
        w[g] = kPlain ? p : p * h2f(s.scale[(r + i) * s.param_stride + g]);
        if constexpr (kAsym) Z[(j * 4 + k) * zs + g] += p * h2f(s.zero[(r + i) * s.param_stride + g]);
      }
    }
  }
  const std::uint8_t* rows = s.data + r * s.row_bytes;
  for (std::int64_t c = 0; c < D; c += 8) {
    const std::int64_t g = kPlain ? 0 : c / G;
    __m256 part[NQ][4];
    for (int j = 0; j < NQ; ++j) {
      for (int k = 0; k < 4; ++k) part[j][k] = _mm256_loadu_ps(A + (j * 4 + k) * D + c);
    }
    for (std::int64_t i = 0; i < m; i += 4) {
      for (int k = 0; k < 4; ++k) {
        const __m256 x = load8<F>(rows + (i + k) * s.row_bytes, c);
        for (int j = 0; j < NQ; ++j) {
          const __m256 w = _mm256_set1_ps(W[(j * kValueBlock + i + k) * kMaxGroups + g]);
          part[j][k] = _mm256_add_ps(part[j][k], _mm256_mul_ps(w, x));
        }
      }
    }
    for (int j = 0; j < NQ; ++j) {
      for (int k = 0; k < 4; ++k) _mm256_storeu_ps(A + (j * 4 + k) * D + c, part[j][k]);
    }
  }
}

template <Fmt F>
VQ_AVX2 void token_values_avx2(const RowSet& s, std::int64_t first, std::int64_t D,
                               const float* probs, std::int64_t n_q, std::int64_t ld,
                               std::int64_t pos, float* A, float* Z, std::int64_t zs) noexcept {
  // The first rows up to a multiple of 4 in the head, then blocks of whole fours; a block with a
  // masked row, and the last rows, by the definition itself (the same additions).
  std::int64_t r = std::min(s.n, (4 - (first & 3)) & 3);
  if (r > 0) token_values_scalar(head_of(s, r), first, D, probs, n_q, ld, pos, A, Z, zs);
  while (s.n - r >= 4) {
    const std::int64_t m = std::min(kValueBlock, (s.n - r) / 4 * 4);
    prefetch_rows(s, r + m, std::min(s.n, r + m + kValueBlock));
    bool visible = true;
    for (std::int64_t i = r; i < r + m && visible; ++i) visible = s.positions[i] <= pos;
    if (!visible) {
      token_values_scalar(head_of(tail_of(s, r), m), first + r, D, probs + r, n_q, ld, pos, A, Z,
                          zs);
    } else {
      for (std::int64_t j0 = 0; j0 < n_q; j0 += 4) {
        const std::int64_t nj = std::min<std::int64_t>(4, n_q - j0);
        const float* p = probs + j0 * ld;
        float* a = A + j0 * 4 * D;
        float* z = Z == nullptr ? nullptr : Z + j0 * 4 * zs;
        switch (nj) {
          case 4:
            values_block<F, 4>(s, r, m, D, p, ld, a, z, zs);
            break;
          case 3:
            values_block<F, 3>(s, r, m, D, p, ld, a, z, zs);
            break;
          case 2:
            values_block<F, 2>(s, r, m, D, p, ld, a, z, zs);
            break;
          default:
            values_block<F, 1>(s, r, m, D, p, ld, a, z, zs);
        }
      }
    }
    r += m;
  }
  if (r < s.n) {
    token_values_scalar(tail_of(s, r), first + r, D, probs + r, n_q, ld, pos, A, Z, zs);
  }
}

// Whether the AVX2 kernels take this shape (else the scalar definition runs).
bool avx2_shape(const RowSet& s, std::int64_t D) noexcept {
  if (D % 8 != 0 || D > 256) return false;
  if (is_plain(s.fmt)) return true;
  if (s.fmt == Fmt::kQ4_0 && s.group != 32) return false;
  return s.group % 8 == 0 && (D + s.group - 1) / s.group <= kMaxGroups;
}
#endif  // VQ_ATTN_X86

}  // namespace

const char* to_string(Isa isa) noexcept { return isa == Isa::kAvx2 ? "avx2+f16c" : "scalar"; }

bool isa_supported(Isa isa) noexcept {
  if (isa == Isa::kScalar) return true;
#ifdef VQ_ATTN_X86
  unsigned a = 0, b = 0, c = 0, d = 0;  // F16C: CPUID leaf 1, ECX bit 29
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

float element(const RowSet& s, std::int64_t r, std::int64_t c) noexcept {
  const std::uint8_t* row = s.data + r * s.row_bytes;
  switch (s.fmt) {
    case Fmt::kF32: {
      float x;
      std::memcpy(&x, row + 4 * c, sizeof x);
      return x;
    }
    case Fmt::kF16: {
      std::uint16_t h;
      std::memcpy(&h, row + 2 * c, sizeof h);
      return half_to_float(h);
    }
    case Fmt::kU2:
      return static_cast<float>((row[c / 4] >> (2 * (c % 4))) & 3);
    case Fmt::kU4:
      return static_cast<float>((row[c / 2] >> (4 * (c % 2))) & 15);
    case Fmt::kQ8_0:
      return static_cast<float>(static_cast<std::int8_t>(row[c]));
    case Fmt::kQ4_0: {
      const std::int64_t i = c % 32;
      const std::uint8_t byte = row[16 * (c / 32) + i % 16];
      return static_cast<float>((i < 16 ? byte & 15 : byte >> 4) - 8);
    }
  }
  return 0.0f;
}

void token_scores(Isa isa, const RowSet& rows, std::int64_t D, const float* q, std::int64_t n_q,
                  std::int64_t pos, float* out, std::int64_t ld) noexcept {
  if (rows.n <= 0) return;
#ifdef VQ_ATTN_X86
  if (isa == Isa::kAvx2 && avx2_shape(rows, D)) {
    switch (rows.fmt) {
      case Fmt::kF32:
        return token_scores_avx2<Fmt::kF32>(rows, D, q, n_q, pos, out, ld);
      case Fmt::kF16:
        return token_scores_avx2<Fmt::kF16>(rows, D, q, n_q, pos, out, ld);
      case Fmt::kU2:
        return token_scores_avx2<Fmt::kU2>(rows, D, q, n_q, pos, out, ld);
      case Fmt::kU4:
        return token_scores_avx2<Fmt::kU4>(rows, D, q, n_q, pos, out, ld);
      case Fmt::kQ8_0:
        return token_scores_avx2<Fmt::kQ8_0>(rows, D, q, n_q, pos, out, ld);
      case Fmt::kQ4_0:
        return token_scores_avx2<Fmt::kQ4_0>(rows, D, q, n_q, pos, out, ld);
    }
  }
#else
  (void)isa;
#endif
  token_scores_scalar(rows, D, q, n_q, pos, out, ld);
}

void channel_scores(Isa isa, const RowSet& rows, const std::uint16_t* scale,
                    const std::uint16_t* zero, std::int64_t D, const float* q, std::int64_t n_q,
                    std::int64_t pos, float* out, std::int64_t ld) noexcept {
  if (rows.n <= 0) return;
#ifdef VQ_ATTN_X86
  if (isa == Isa::kAvx2 && D % 8 == 0 && D <= 256) {
    if (rows.fmt == Fmt::kU2)
      return channel_scores_avx2<Fmt::kU2>(rows, scale, zero, D, q, n_q, pos, out, ld);
    return channel_scores_avx2<Fmt::kU4>(rows, scale, zero, D, q, n_q, pos, out, ld);
  }
#else
  (void)isa;
#endif
  channel_scores_scalar(rows, scale, zero, D, q, n_q, pos, out, ld);
}

void token_values(Isa isa, const RowSet& rows, std::int64_t first, std::int64_t D,
                  const float* probs, std::int64_t n_q, std::int64_t ld, std::int64_t pos,
                  float* A, float* Z, std::int64_t zs) noexcept {
  if (rows.n <= 0) return;
#ifdef VQ_ATTN_X86
  if (isa == Isa::kAvx2 && avx2_shape(rows, D)) {
    switch (rows.fmt) {
      case Fmt::kF32:
        return token_values_avx2<Fmt::kF32>(rows, first, D, probs, n_q, ld, pos, A, Z, zs);
      case Fmt::kF16:
        return token_values_avx2<Fmt::kF16>(rows, first, D, probs, n_q, ld, pos, A, Z, zs);
      case Fmt::kU2:
        return token_values_avx2<Fmt::kU2>(rows, first, D, probs, n_q, ld, pos, A, Z, zs);
      case Fmt::kU4:
        return token_values_avx2<Fmt::kU4>(rows, first, D, probs, n_q, ld, pos, A, Z, zs);
      case Fmt::kQ8_0:
        return token_values_avx2<Fmt::kQ8_0>(rows, first, D, probs, n_q, ld, pos, A, Z, zs);
      case Fmt::kQ4_0:
        return token_values_avx2<Fmt::kQ4_0>(rows, first, D, probs, n_q, ld, pos, A, Z, zs);
    }
  }
#else
  (void)isa;
#endif
  token_values_scalar(rows, first, D, probs, n_q, ld, pos, A, Z, zs);
}

void finish_values(const float* A, const float* Z, std::int64_t zs, std::int64_t group,
                   std::int64_t n_q, std::int64_t D, float* out) noexcept {
  for (std::int64_t j = 0; j < n_q; ++j) {
    const float* a = A + j * 4 * D;
    for (std::int64_t c = 0; c < D; ++c)
      out[j * D + c] = (a[c] + a[2 * D + c]) + (a[D + c] + a[3 * D + c]);
    if (Z == nullptr) continue;
    const float* z = Z + j * 4 * zs;
    for (std::int64_t c = 0; c < D; ++c) {
      const std::int64_t g = c / group;
      out[j * D + c] = out[j * D + c] + ((z[g] + z[2 * zs + g]) + (z[zs + g] + z[3 * zs + g]));
    }
  }
}

}  // namespace vq::detail::attn
