// Block-quantized weights times quantized activations: the definition (block_matmul.h), its
// scalar code and the AVX2 family. Each family has a decoder per type (a block's bytes to
// integer codes and scales, the same values for every family) and the integer dots; the fp32
// steps (block value, lanes, tree) are one shared piece of code, so the families agree bit for
// bit as long as the integer sums are exact, which the comments at each SIMD dot show.
#include "engine/compute/block_matmul.h"
#include "engine/compute/prefetch.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "veloxquant/types.h"

#if defined(__x86_64__) || defined(__i386__)
// GCC 12's AVX-512 intrinsics start some results from _mm512_undefined_*() (a self-initialised
// variable), which -Wmaybe-uninitialized reports inside the header; the header's lines only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#define VQ_BLOCKS_X86 1
#endif

namespace vq::engine {

using cpu::Isa;

const char* to_string(ActType a) noexcept {
  switch (a) {
    case ActType::kQ8_0:
      return "q8_0";
    case ActType::kQ8_1:
      return "q8_1";
    case ActType::kQ8_K:
      return "q8_k";
  }
  return "?";
}

namespace {

constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: (v + kRound) - kRound rounds |v| < 2^22
                                       // to an integer, half to even

inline float load_half(const std::uint8_t* p) noexcept {
  std::uint16_t bits;
  std::memcpy(&bits, p, 2);
  return half_to_float(bits);
}
inline std::uint32_t load_u32(const std::uint8_t* p) noexcept {
  return static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8 |
         static_cast<std::uint32_t>(p[2]) << 16 | static_cast<std::uint32_t>(p[3]) << 24;
}
inline float tree(const float* a) noexcept {
  return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

// Q4_K / Q5_K's 6-bit scale and min of sub-block j (0..7), packed in 12 bytes (quants.h).
inline void scale_min_k4(int j, const std::uint8_t* s, int* sc, int* m) noexcept {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}
// Q3_K's 6-bit scale of 16-group g, minus 32.
inline int scale_q3k(int g, const std::uint8_t* s) noexcept {
  return (((s[g % 8] >> (4 * (g / 8))) & 0xF) | (((s[8 + g % 4] >> (2 * (g / 4))) & 3) << 4)) - 32;
}

constexpr bool has_min(WeightType t) noexcept {
  return t == WeightType::kQ4_1 || t == WeightType::kQ5_1 || t == WeightType::kQ2_K ||
         t == WeightType::kQ4_K || t == WeightType::kQ5_K;
}
constexpr bool is_k(WeightType t) noexcept {
  return t == WeightType::kQ2_K || t == WeightType::kQ3_K || t == WeightType::kQ4_K ||
         t == WeightType::kQ5_K || t == WeightType::kQ6_K;
}
// Codes that can be negative (dots need the sign trick on x86); the others are in [0, 31].
constexpr bool signed_codes(WeightType t) noexcept {
  return t == WeightType::kQ4_0 || t == WeightType::kQ5_0 || t == WeightType::kQ3_K ||
         t == WeightType::kQ6_K;
}
constexpr ActType act_type(WeightType t) noexcept {
  return is_k(t) ? ActType::kQ8_K : has_min(t) ? ActType::kQ8_1 : ActType::kQ8_0;
}

// The one switch over the block types this file computes: calls f(Type<T>{}) for t's type T
// (the kernels are templates over T, reading the traits above), and returns false without
// calling f for any other type (F32/F16/BF16/Q8_0: matmul.cpp's kernels).
template <WeightType T>
using Type = std::integral_constant<WeightType, T>;
template <class F>
bool with_block_type(WeightType t, F&& f) {
  switch (t) {
    case WeightType::kQ4_0: f(Type<WeightType::kQ4_0>{}); return true;
    case WeightType::kQ4_1: f(Type<WeightType::kQ4_1>{}); return true;
    case WeightType::kQ5_0: f(Type<WeightType::kQ5_0>{}); return true;
    case WeightType::kQ5_1: f(Type<WeightType::kQ5_1>{}); return true;
    case WeightType::kQ2_K: f(Type<WeightType::kQ2_K>{}); return true;
    case WeightType::kQ3_K: f(Type<WeightType::kQ3_K>{}); return true;
    case WeightType::kQ4_K: f(Type<WeightType::kQ4_K>{}); return true;
    case WeightType::kQ5_K: f(Type<WeightType::kQ5_K>{}); return true;
    case WeightType::kQ6_K: f(Type<WeightType::kQ6_K>{}); return true;
    default: return false;
  }
}

// A decoded block: codes (32 or 256), and for the K-quants per 16-group scale and min, plus the
// scales in the layout the SIMD dot reads (scx[k] = sc[2k] x 8, sc[2k+1] x 8 as int16).
struct Decoded {
  alignas(32) std::int8_t c[256];
  alignas(32) std::int16_t scx[8][16];
  alignas(32) std::int16_t mn[16];
  std::int16_t sc[16];
  float d, dmin;  // legacy: d and m
};

void fill_scx(Decoded* o) noexcept {
  for (int k = 0; k < 8; ++k) {
    for (int l = 0; l < 8; ++l) {
      o->scx[k][l] = o->sc[2 * k];
      o->scx[k][8 + l] = o->sc[2 * k + 1];
    }
  }
}

// ---- Scalar decoders (the definition's codes and scales, from quants.h's layouts) ----

// A K-quant super-block's scales: d, dmin and per 16-group the integer scale sc[g] and min mn[g]
// (0 where the type has none; dmin 0 too). A few bytes a block: every family decodes them with
// this code, inlined into each decoder (a call per block costs the AVX2 Q4_K matvec about 12%).
template <WeightType T>
[[gnu::always_inline]] inline void decode_k_scales(const std::uint8_t* blk, Decoded* o) noexcept {
  if constexpr (T == WeightType::kQ2_K) {
    o->d = load_half(blk + 80);
    o->dmin = load_half(blk + 82);
    for (int g = 0; g < 16; ++g) {
      o->sc[g] = static_cast<std::int16_t>(blk[g] & 0xF);
      o->mn[g] = static_cast<std::int16_t>(blk[g] >> 4);
    }
  } else if constexpr (T == WeightType::kQ3_K) {
    o->d = load_half(blk + 108);
    o->dmin = 0.0f;
    for (int g = 0; g < 16; ++g) {
      o->sc[g] = static_cast<std::int16_t>(scale_q3k(g, blk + 96));
      o->mn[g] = 0;
    }
  } else if constexpr (T == WeightType::kQ4_K || T == WeightType::kQ5_K) {
    o->d = load_half(blk);
    o->dmin = load_half(blk + 2);
    for (int s = 0; s < 8; ++s) {
      int sc, m;
      scale_min_k4(s, blk + 4, &sc, &m);
      o->sc[2 * s] = o->sc[2 * s + 1] = static_cast<std::int16_t>(sc);
      o->mn[2 * s] = o->mn[2 * s + 1] = static_cast<std::int16_t>(m);
    }
  } else {
    static_assert(T == WeightType::kQ6_K);
    o->d = load_half(blk + 208);
    o->dmin = 0.0f;
    for (int g = 0; g < 16; ++g) {
      o->sc[g] = static_cast<std::int8_t>(blk[192 + g]);
      o->mn[g] = 0;
    }
  }
}

template <WeightType T>
void decode_scalar(const std::uint8_t* blk, Decoded* o) noexcept {
  std::int8_t* c = o->c;
  if constexpr (T == WeightType::kQ4_0 || T == WeightType::kQ4_1) {
    constexpr bool kMin = T == WeightType::kQ4_1;
    o->d = load_half(blk);
    o->dmin = kMin ? load_half(blk + 2) : 0.0f;
    const std::uint8_t* qs = blk + (kMin ? 4 : 2);
    const int off = kMin ? 0 : 8;
    for (int j = 0; j < 16; ++j) {
      c[j] = static_cast<std::int8_t>((qs[j] & 0xF) - off);
      c[j + 16] = static_cast<std::int8_t>((qs[j] >> 4) - off);
    }
  } else if constexpr (T == WeightType::kQ5_0 || T == WeightType::kQ5_1) {
    constexpr bool kMin = T == WeightType::kQ5_1;
    o->d = load_half(blk);
    o->dmin = kMin ? load_half(blk + 2) : 0.0f;
    const std::uint32_t qh = load_u32(blk + (kMin ? 4 : 2));
    const std::uint8_t* qs = blk + (kMin ? 8 : 6);
    const int off = kMin ? 0 : 16;
    for (int j = 0; j < 16; ++j) {
      c[j] = static_cast<std::int8_t>(((qs[j] & 0xF) | (((qh >> j) & 1u) << 4)) - off);
      c[j + 16] = static_cast<std::int8_t>(((qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)) - off);
    }
  } else if constexpr (T == WeightType::kQ2_K) {
    decode_k_scales<T>(blk, o);
    for (int y = 0; y < 256; ++y) {
      const int n = y / 128, j = (y % 128) / 32, l = y % 32;
      c[y] = static_cast<std::int8_t>((blk[16 + 32 * n + l] >> (2 * j)) & 3);
    }
  } else if constexpr (T == WeightType::kQ3_K) {
    const std::uint8_t* hmask = blk;
    decode_k_scales<T>(blk, o);
    for (int y = 0; y < 256; ++y) {
      const int n = y / 128, j = (y % 128) / 32, l = y % 32;
      const int v = ((blk[32 + 32 * n + l] >> (2 * j)) & 3) - (((hmask[l] >> (4 * n + j)) & 1) ? 0 : 4);
      c[y] = static_cast<std::int8_t>(v);
    }
  } else if constexpr (T == WeightType::kQ4_K || T == WeightType::kQ5_K) {
    constexpr bool k5 = T == WeightType::kQ5_K;
    decode_k_scales<T>(blk, o);
    const std::uint8_t* qh = blk + 16;
    const std::uint8_t* qs = blk + (k5 ? 48 : 16);
    for (int y = 0; y < 256; ++y) {
      const int g = y / 64, hi = (y % 64) / 32, l = y % 32;
      const std::uint8_t byte = qs[32 * g + l];
      int v = hi ? byte >> 4 : byte & 0xF;
      if (k5) v |= ((qh[l] >> (2 * g + hi)) & 1) << 4;
      c[y] = static_cast<std::int8_t>(v);
    }
  } else {
    static_assert(T == WeightType::kQ6_K);
    const std::uint8_t* ql = blk;
    const std::uint8_t* qh = blk + 128;
    decode_k_scales<T>(blk, o);
    for (int y = 0; y < 256; ++y) {
      const int h = y / 128, k = (y % 128) / 32, l = y % 32;
      const std::uint8_t lo = ql[64 * h + 32 * (k % 2) + l];
      const int low4 = k < 2 ? lo & 0xF : lo >> 4;
      const int high2 = (qh[32 * h + l] >> (2 * k)) & 3;
      c[y] = static_cast<std::int8_t>((low4 | (high2 << 4)) - 32);
    }
  }
  if constexpr (is_k(T)) fill_scx(o);
}

// ---- Scalar integer dots ----

inline std::int32_t isum_scalar(const std::int8_t* c, const std::int8_t* q, int n) noexcept {
  std::int32_t s = 0;
  for (int j = 0; j < n; ++j) s += static_cast<std::int32_t>(c[j]) * q[j];
  return s;
}

// sumi = sum_g sc[g] * isum(group g); summ = sum_g mn[g] * bsums[g].
inline void kdot_scalar(const Decoded& dk, const std::int8_t* q, const std::int16_t* bsums,
                        bool with_min, std::int32_t* sumi, std::int32_t* summ) noexcept {
  std::int32_t a = 0, m = 0;
  for (int g = 0; g < 16; ++g) a += dk.sc[g] * isum_scalar(dk.c + 16 * g, q + 16 * g, 16);
  if (with_min) {
    for (int g = 0; g < 16; ++g) m += dk.mn[g] * bsums[g];
  }
  *sumi = a;
  *summ = m;
}

// ---- The shared fp32 steps of the definition ----

template <WeightType T>
inline float legacy_value(const Decoded& dw, std::int32_t isum, float dx, float sx) noexcept {
  const float v = static_cast<float>(isum) * (dw.d * dx);
  if constexpr (has_min(T)) {
    return v + dw.dmin * sx;
  } else {
    (void)sx;
    return v;
  }
}

template <WeightType T>
inline float k_value(const Decoded& dw, std::int32_t sumi, std::int32_t summ, float dx) noexcept {
  const float v = (dw.d * dx) * static_cast<float>(sumi);
  if constexpr (has_min(T)) {
    return v - (dw.dmin * dx) * static_cast<float>(summ);
  } else {
    (void)summ;
    return v;
  }
}

// The row kernel for one family: Decode(blk, Decoded*) and the dots IsumL (legacy) /
// KDot (K) are the family's; everything else is shared. One row's values for tokens
// [s0, s0 + nt): each weight block decoded once and dotted with the nt tokens' blocks.
constexpr int kTile = 4;          // tokens that share one decoded block (PrefillKernels::kRows)
constexpr int kPrefillTile = 16;  // the same for the prefill tiles (PrefillKernels::kTiles)

template <WeightType T, class Family>
inline void row_tokens(float* out, const BlockActs& a, const WeightMatrix& w, std::int64_t i,
                       std::int64_t s0, int nt, Decoded* dec) noexcept {
  constexpr std::int64_t B = is_k(T) ? 256 : 32;
  const std::int64_t nb = w.cols / B;
  const std::int64_t bytes = weight_block_bytes(T);
  const std::uint8_t* row = w.row(i);
  float acc[kPrefillTile][8];
  for (int t = 0; t < nt; ++t) std::fill(acc[t], acc[t] + 8, 0.0f);
  for (std::int64_t b = 0; b < nb; ++b) {
    Family::template decode<T>(row + b * bytes, dec);
    for (int t = 0; t < nt; ++t) {
      const std::int64_t s = s0 + t;
      const std::int8_t* q = a.q + s * w.cols + b * B;
      const float dx = a.d[s * nb + b];
      float v;
      if constexpr (is_k(T)) {
        std::int32_t sumi, summ;
        Family::template kdot<signed_codes(T)>(*dec, q, a.bsums + s * (w.cols / 16) + b * 16,
                                               has_min(T), &sumi, &summ);
        v = k_value<T>(*dec, sumi, summ, dx);
      } else {
        const std::int32_t isum = Family::template isum<signed_codes(T)>(dec->c, q);
        v = legacy_value<T>(*dec, isum, dx, has_min(T) ? a.s[s * nb + b] : 0.0f);
      }
      acc[t][b % 8] += v;
    }
  }
  for (int t = 0; t < nt; ++t) out[(s0 + t) * w.rows + i] = tree(acc[t]);
}

// Rows [begin, end) x S tokens. Prefill tiles (S > 1): tiles of kPrefillTile tokens outermost,
// so their activation blocks stay in L1 while the range's rows pass over them, each row's
// blocks decoded once per tile; otherwise (decode, or PrefillKernels::kRows) rows outermost,
// groups of kTile tokens. Every element gets the same operations either way.
template <WeightType T, class Family>
void rows_family(float* out, const BlockActs& a, const WeightMatrix& w, std::int64_t S,
                 std::int64_t begin, std::int64_t end) noexcept {
  Decoded dec;
  if (S > 1 && prefill_kernels() == PrefillKernels::kTiles) {
    for (std::int64_t s0 = 0; s0 < S; s0 += kPrefillTile) {
      const int nt = static_cast<int>(std::min<std::int64_t>(kPrefillTile, S - s0));
      for (std::int64_t i = begin; i < end; ++i) row_tokens<T, Family>(out, a, w, i, s0, nt, &dec);
    }
    return;
  }
  for (std::int64_t i = begin; i < end; ++i) {
    for (std::int64_t s0 = 0; s0 < S; s0 += kTile) {
      const int nt = static_cast<int>(std::min<std::int64_t>(kTile, S - s0));
      row_tokens<T, Family>(out, a, w, i, s0, nt, &dec);
    }
  }
}

struct ScalarFamily {
  template <WeightType T>
  static void decode(const std::uint8_t* blk, Decoded* o) noexcept {
    decode_scalar<T>(blk, o);
  }
  template <bool kSigned>
  static std::int32_t isum(const std::int8_t* c, const std::int8_t* q) noexcept {
    return isum_scalar(c, q, 32);
  }
  template <bool kSigned>
  static void kdot(const Decoded& dk, const std::int8_t* q, const std::int16_t* bsums,
                   bool with_min, std::int32_t* sumi, std::int32_t* summ) noexcept {
    kdot_scalar(dk, q, bsums, with_min, sumi, summ);
  }
};

#ifdef VQ_BLOCKS_X86
#define VQ_AVX2 __attribute__((target("avx2,f16c")))

VQ_AVX2 inline std::int32_t hsum_i32(__m256i v) noexcept {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// 32 codes times 32 activation codes as int16 pair sums. Unsigned codes (0..31) go straight into
// maddubs (a pair is at most 2 * 31 * 127 = 7874: no saturation); signed ones (|c| <= 32) as
// |c| times x with c's sign (x is never -128), a pair at most 2 * 32 * 127 = 8128.
template <bool kSigned>
VQ_AVX2 inline __m256i pairs16(__m256i cv, __m256i xv) noexcept {
  if constexpr (kSigned) {
    return _mm256_maddubs_epi16(_mm256_sign_epi8(cv, cv), _mm256_sign_epi8(xv, cv));
  } else {
    return _mm256_maddubs_epi16(cv, xv);
  }
}

// Byte j (< 32) = 0x10 where bit j of `bits` is set, else 0.
VQ_AVX2 inline __m256i bits_to_0x10(std::uint32_t bits) noexcept {
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3,
                       3, 3, 3, 3, 3, 3));
  const __m256i mask = _mm256_set1_epi64x(0x8040201008040201LL);
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, mask), mask);
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

// Bits `shift`, `shift`+1, ... of every byte: (v >> shift) & mask per byte (the 16-bit shift
// brings the next byte's bits into the top, which the mask removes).
VQ_AVX2 inline __m256i byte_bits(__m256i v, int shift, int mask) noexcept {
  return _mm256_and_si256(_mm256_srli_epi16(v, shift), _mm256_set1_epi8(static_cast<char>(mask)));
}

// The 32 codes of a legacy block (Q4_0, Q4_1, Q5_0, Q5_1) in one register.
template <WeightType T>
VQ_AVX2 inline __m256i legacy_codes(const std::uint8_t* blk) noexcept {
  constexpr bool k5 = T == WeightType::kQ5_0 || T == WeightType::kQ5_1;
  constexpr bool kMin = has_min(T);
  const std::uint8_t* qs = blk + (kMin ? 4 : 2) + (k5 ? 4 : 0);
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i lo = _mm_and_si128(q, _mm_set1_epi8(0x0F));
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), _mm_set1_epi8(0x0F));
  __m256i v = _mm256_set_m128i(hi, lo);
  if constexpr (k5) v = _mm256_or_si256(v, bits_to_0x10(load_u32(blk + (kMin ? 4 : 2))));
  if constexpr (!kMin) v = _mm256_sub_epi8(v, _mm256_set1_epi8(k5 ? 16 : 8));
  return v;
}

// Legacy rows, eight blocks at a time in the eight lanes (block b in lane b % 8, as the
// definition adds them): per group and token, the eight blocks' exact integer sums are reduced
// into one vector (the Q8_0 kernels' hadd tree), then v = float(isum) * (d_w * d_x) [+ m_w * s_x]
// per lane, added to the lane. A last, partial group has +0 in its missing lanes (codes, scales
// and sums 0: v = +0), which leaves a lane unchanged (a lane is never -0).
// One row i for tokens [s0, s0 + nt), nt <= kPrefillTile.
template <WeightType T>
VQ_AVX2 void legacy_row_tokens(float* out, const BlockActs& a, const WeightMatrix& w,
                               std::int64_t i, std::int64_t s0, int nt) noexcept {
  constexpr bool kMin = has_min(T);
  constexpr bool kSigned = signed_codes(T);
  const std::int64_t nb = w.cols / 32;
  const std::int64_t bytes = weight_block_bytes(T);
  const std::uint8_t* row = w.row(i);
  __m256 acc[kPrefillTile];
  for (int t = 0; t < nt; ++t) acc[t] = _mm256_setzero_ps();
  for (std::int64_t b0 = 0; b0 < nb; b0 += 8) {
    const int cnt = static_cast<int>(std::min<std::int64_t>(8, nb - b0));
    __m256i c[8];
    alignas(32) float dw[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    alignas(32) float mw[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int k = 0; k < 8; ++k) {
      if (k < cnt) {
        const std::uint8_t* blk = row + (b0 + k) * bytes;
        c[k] = legacy_codes<T>(blk);
        dw[k] = load_half(blk);
        if constexpr (kMin) mw[k] = load_half(blk + 2);
      } else {
        c[k] = _mm256_setzero_si256();
      }
    }
    const __m256 dwv = _mm256_load_ps(dw);
    for (int t = 0; t < nt; ++t) {
      const std::int64_t s = s0 + t;
      const std::int8_t* q = a.q + s * w.cols + b0 * 32;
      __m256i v[8];
      for (int k = 0; k < 8; ++k) {
        v[k] =
            k < cnt
                ? _mm256_madd_epi16(
                      pairs16<kSigned>(
                          c[k], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * k))),
                      _mm256_set1_epi16(1))
                : _mm256_setzero_si256();
      }
      const __m256i h01 =
          _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
      const __m256i h47 =
          _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
      const __m256i isum = _mm256_add_epi32(_mm256_permute2x128_si256(h01, h47, 0x20),
                                            _mm256_permute2x128_si256(h01, h47, 0x31));
      alignas(32) float dx[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      alignas(32) float sx[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int k = 0; k < cnt; ++k) {
        dx[k] = a.d[s * nb + b0 + k];
        if constexpr (kMin) sx[k] = a.s[s * nb + b0 + k];
      }
      __m256 val = _mm256_mul_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dwv, _mm256_load_ps(dx)));
      if constexpr (kMin) {
        val = _mm256_add_ps(val, _mm256_mul_ps(_mm256_load_ps(mw), _mm256_load_ps(sx)));
      }
      acc[t] = _mm256_add_ps(acc[t], val);
    }
  }
  for (int t = 0; t < nt; ++t) {
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, acc[t]);
    out[(s0 + t) * w.rows + i] = tree(lanes);
  }
}

// ---- Legacy prefill tiles ----
// As the Q8_0 x Q8_0 tiles (matmul_q8q8_x86.inc): eight blocks' 32 codes are packed
// (transposed) so that vector k holds, in lane l, codes 4k .. 4k+3 of block l, the
// activations' codes alike; per (row, token) pair the eight vectors' four-byte dots (maddubs,
// madd: exact, pairs at most 8128) summed lane by lane are exactly block l's isum in lane l,
// with no horizontal reduction. Then v = float(isum) * (d_w * d_x) [+ m_w * s_x] and the lane
// add, legacy_value's operations lane for lane. Padding blocks (a last, partial group) have zero
// codes and scales: +0 in their lanes.

// out[k] lane l = in[l] dword k.
VQ_AVX2 inline void transpose8(const __m256i* in, __m256i* out) noexcept {
  __m256i t[8], u[8];
  for (int p = 0; p < 4; ++p) {
    t[2 * p] = _mm256_unpacklo_epi32(in[2 * p], in[2 * p + 1]);
    t[2 * p + 1] = _mm256_unpackhi_epi32(in[2 * p], in[2 * p + 1]);
  }
  for (int h = 0; h < 2; ++h) {
    u[4 * h + 0] = _mm256_unpacklo_epi64(t[4 * h + 0], t[4 * h + 2]);
    u[4 * h + 1] = _mm256_unpackhi_epi64(t[4 * h + 0], t[4 * h + 2]);
    u[4 * h + 2] = _mm256_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
    u[4 * h + 3] = _mm256_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
  }
  for (int k = 0; k < 4; ++k) {
    out[k] = _mm256_permute2x128_si256(u[k], u[4 + k], 0x20);
    out[k + 4] = _mm256_permute2x128_si256(u[k], u[4 + k], 0x31);
  }
}

constexpr int kLegacyRows = 4, kLegacyTokens = 4;
constexpr std::int64_t kLegacyMaxCols = 8192;
constexpr std::int64_t kLegacyXBytes = 32 << 10;

// Packed row: per group g, wp[16g + k] the packed codes, wp[16g + 8 + k] their absolute values
// (signed types); dw[8g + l], mw[8g + l] block l's scale and min (0 for padding).
template <WeightType T>
VQ_AVX2 void legacy_pack_row(const std::uint8_t* row, std::int64_t nb, __m256i* wp, float* dw,
                             float* mw) noexcept {
  const std::int64_t bytes = weight_block_bytes(T);
  for (std::int64_t b = 0, g = 0; b < nb; b += 8, ++g) {
    const int count = static_cast<int>(std::min<std::int64_t>(8, nb - b));
    __m256i in[8];
    for (int l = 0; l < 8; ++l) {
      const std::uint8_t* blk = row + (b + l) * bytes;
      in[l] = l < count ? legacy_codes<T>(blk) : _mm256_setzero_si256();
      dw[8 * g + l] = l < count ? load_half(blk) : 0.0f;
      mw[8 * g + l] = has_min(T) && l < count ? load_half(blk + 2) : 0.0f;
    }
    transpose8(in, wp + 16 * g);
    for (int k = 0; k < 8; ++k) wp[16 * g + 8 + k] = _mm256_sign_epi8(wp[16 * g + k], wp[16 * g + k]);
  }
}

// Packed token s: xp[8g + k] its packed codes, dx / sx [8g + l] block l's d and s (0 padding).
VQ_AVX2 void legacy_pack_token(const BlockActs& a, std::int64_t s, std::int64_t nb, bool with_s,
                               __m256i* xp, float* dx, float* sx) noexcept {
  const std::int8_t* q = a.q + s * a.cols;
  for (std::int64_t b = 0, g = 0; b < nb; b += 8, ++g) {
    const int count = static_cast<int>(std::min<std::int64_t>(8, nb - b));
    __m256i in[8];
    for (int l = 0; l < 8; ++l) {
      in[l] = l < count ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + (b + l) * 32))
                        : _mm256_setzero_si256();
      dx[8 * g + l] = l < count ? a.d[s * nb + b + l] : 0.0f;
      sx[8 * g + l] = with_s && l < count ? a.s[s * nb + b + l] : 0.0f;
    }
    transpose8(in, xp + 8 * g);
  }
}

template <WeightType T, int R, int TT>
VQ_AVX2 void legacy_tile(const __m256i* const* wp, const float* const* dw, const float* const* mw,
                         const __m256i* xp, const float* dx, const float* sx, std::int64_t stride,
                         std::int64_t ng, float* out, std::int64_t out_stride) noexcept {
  __m256 acc[R][TT];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < TT; ++t) acc[r][t] = _mm256_setzero_ps();
  }
  for (std::int64_t g = 0; g < ng; ++g) {
    for (int r = 0; r < R; ++r) {
      const __m256i* w = wp[r] + 16 * g;
      const __m256 dwv = _mm256_loadu_ps(dw[r] + 8 * g);
      for (int t = 0; t < TT; ++t) {
        const __m256i* x = xp + t * stride + 8 * g;
        __m256i isum = _mm256_setzero_si256();
        for (int k = 0; k < 8; ++k) {
          const __m256i p16 = signed_codes(T)
                                  ? _mm256_maddubs_epi16(w[8 + k], _mm256_sign_epi8(x[k], w[k]))
                                  : _mm256_maddubs_epi16(w[k], x[k]);
          isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
        }
        __m256 val = _mm256_mul_ps(_mm256_cvtepi32_ps(isum),
                                   _mm256_mul_ps(dwv, _mm256_loadu_ps(dx + t * stride + 8 * g)));
        if constexpr (has_min(T)) {
          val = _mm256_add_ps(val, _mm256_mul_ps(_mm256_loadu_ps(mw[r] + 8 * g),
                                                 _mm256_loadu_ps(sx + t * stride + 8 * g)));
        }
        acc[r][t] = _mm256_add_ps(acc[r][t], val);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < TT; ++t) {
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, acc[r][t]);
      out[t * out_stride + r] = tree(lanes);
    }
  }
}

template <WeightType T, int R>
VQ_AVX2 inline void legacy_tile_tt(int tt, const __m256i* const* wp, const float* const* dw,
                                   const float* const* mw, const __m256i* xp, const float* dx,
                                   const float* sx, std::int64_t stride, std::int64_t ng,
                                   float* out, std::int64_t out_stride) noexcept {
  switch (tt) {
    case 4:
      return legacy_tile<T, R, 4>(wp, dw, mw, xp, dx, sx, stride, ng, out, out_stride);
    case 3:
      return legacy_tile<T, R, 3>(wp, dw, mw, xp, dx, sx, stride, ng, out, out_stride);
    case 2:
      return legacy_tile<T, R, 2>(wp, dw, mw, xp, dx, sx, stride, ng, out, out_stride);
    default:
      return legacy_tile<T, R, 1>(wp, dw, mw, xp, dx, sx, stride, ng, out, out_stride);
  }
}

// Rows [begin, end) x S tokens: token blocks of up to kLegacyXBytes of packed codes, row tiles
// packed once per block (stack buffers, at most about 110 KiB at kLegacyMaxCols).
template <WeightType T>
VQ_AVX2 void rows_legacy_tiled(float* out, const BlockActs& a, const WeightMatrix& w,
                               std::int64_t S, std::int64_t begin, std::int64_t end) noexcept {
  const std::int64_t nb = w.cols / 32, ng = (nb + 7) / 8, stride = ng * 8;
  const std::int64_t sb =
      std::min(S, kLegacyXBytes / (ng * 256) / kLegacyTokens * kLegacyTokens);
  alignas(32) __m256i xbuf[kLegacyXBytes / 32];
  alignas(32) float dxbuf[kLegacyXBytes / 32], sxbuf[kLegacyXBytes / 32];
  alignas(32) __m256i wbuf[kLegacyRows][kLegacyMaxCols / 256 * 16];
  alignas(32) float dwbuf[kLegacyRows][kLegacyMaxCols / 32], mwbuf[kLegacyRows][kLegacyMaxCols / 32];
  const __m256i* wp[kLegacyRows];
  const float* dw[kLegacyRows];
  const float* mw[kLegacyRows];
  for (int r = 0; r < kLegacyRows; ++r) {
    wp[r] = wbuf[r];
    dw[r] = dwbuf[r];
    mw[r] = mwbuf[r];
  }
  for (std::int64_t s0 = 0; s0 < S; s0 += sb) {
    const std::int64_t s1 = std::min(S, s0 + sb);
    for (std::int64_t s = s0; s < s1; ++s) {
      const std::int64_t o = (s - s0) * stride;
      legacy_pack_token(a, s, nb, has_min(T), xbuf + o, dxbuf + o, sxbuf + o);
    }
    for (std::int64_t i = begin; i < end; i += kLegacyRows) {
      const int rr = static_cast<int>(std::min<std::int64_t>(kLegacyRows, end - i));
      for (int r = 0; r < rr; ++r) legacy_pack_row<T>(w.row(i + r), nb, wbuf[r], dwbuf[r], mwbuf[r]);
      for (std::int64_t s = s0; s < s1; s += kLegacyTokens) {
        const int tt = static_cast<int>(std::min<std::int64_t>(kLegacyTokens, s1 - s));
        const std::int64_t o = (s - s0) * stride;
        float* dst = out + s * w.rows + i;
        switch (rr) {
          case 4:
            legacy_tile_tt<T, 4>(tt, wp, dw, mw, xbuf + o, dxbuf + o, sxbuf + o, stride, ng, dst, w.rows);
            break;
          case 3:
            legacy_tile_tt<T, 3>(tt, wp, dw, mw, xbuf + o, dxbuf + o, sxbuf + o, stride, ng, dst, w.rows);
            break;
          case 2:
            legacy_tile_tt<T, 2>(tt, wp, dw, mw, xbuf + o, dxbuf + o, sxbuf + o, stride, ng, dst, w.rows);
            break;
          default:
            legacy_tile_tt<T, 1>(tt, wp, dw, mw, xbuf + o, dxbuf + o, sxbuf + o, stride, ng, dst, w.rows);
            break;
        }
      }
    }
  }
}

// Rows [begin, end) x S tokens: the packed tiles for prefill (rows up to kLegacyMaxCols wide),
// otherwise rows_family's two loop orders.
template <WeightType T>
VQ_AVX2 void rows_legacy_avx2(float* out, const BlockActs& a, const WeightMatrix& w, std::int64_t S,
                              std::int64_t begin, std::int64_t end) noexcept {
  if (S > 1 && prefill_kernels() == PrefillKernels::kTiles) {
    if (w.cols <= kLegacyMaxCols) return rows_legacy_tiled<T>(out, a, w, S, begin, end);
    for (std::int64_t s0 = 0; s0 < S; s0 += kPrefillTile) {
      const int nt = static_cast<int>(std::min<std::int64_t>(kPrefillTile, S - s0));
      for (std::int64_t i = begin; i < end; ++i) legacy_row_tokens<T>(out, a, w, i, s0, nt);
    }
    return;
  }
  for (std::int64_t i = begin; i < end; ++i) {
    for (std::int64_t s0 = 0; s0 < S; s0 += kTile) {
      const int nt = static_cast<int>(std::min<std::int64_t>(kTile, S - s0));
      legacy_row_tokens<T>(out, a, w, i, s0, nt);
    }
  }
}

// Plain functions rather than lambdas: clang does not give a lambda the target attribute of the
// function it is written in (the fuzz build uses clang).
VQ_AVX2 inline void store32(Decoded* o, int k, __m256i v) noexcept {
  _mm256_store_si256(reinterpret_cast<__m256i*>(o->c + 32 * k), v);
}
VQ_AVX2 inline __m256i load32(const std::uint8_t* p) noexcept {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

struct Avx2Family {
  template <WeightType T>
  VQ_AVX2 static void decode(const std::uint8_t* blk, Decoded* o) noexcept {
    if constexpr (!is_k(T)) {
      constexpr bool kMin = has_min(T);
      o->d = load_half(blk);
      o->dmin = kMin ? load_half(blk + 2) : 0.0f;
      store32(o, 0, legacy_codes<T>(blk));
    } else {
      decode_k_scales<T>(blk, o);  // a few bytes a block: the scalar code
      if constexpr (T == WeightType::kQ2_K) {
        for (int n = 0; n < 2; ++n) {
          const __m256i q = load32(blk + 16 + 32 * n);
          for (int j = 0; j < 4; ++j) store32(o, 4 * n + j, byte_bits(q, 2 * j, 3));
        }
      } else if constexpr (T == WeightType::kQ3_K) {
        const __m256i hm = load32(blk);
        for (int n = 0; n < 2; ++n) {
          const __m256i q = load32(blk + 32 + 32 * n);
          for (int j = 0; j < 4; ++j) {
            // low two bits + 4 * high bit - 4: the value minus 4 where the high bit is clear.
            const __m256i hb = _mm256_slli_epi16(byte_bits(hm, 4 * n + j, 1), 2);
            store32(o, 4 * n + j, _mm256_sub_epi8(_mm256_add_epi8(byte_bits(q, 2 * j, 3), hb),
                                             _mm256_set1_epi8(4)));
          }
        }
      } else if constexpr (T == WeightType::kQ4_K || T == WeightType::kQ5_K) {
        constexpr bool k5 = T == WeightType::kQ5_K;
        const __m256i qh = k5 ? load32(blk + 16) : _mm256_setzero_si256();
        for (int g = 0; g < 4; ++g) {
          const __m256i q = load32(blk + (k5 ? 48 : 16) + 32 * g);
          __m256i lo = byte_bits(q, 0, 0xF), hi = byte_bits(q, 4, 0xF);
          if constexpr (k5) {
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(byte_bits(qh, 2 * g, 1), 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(byte_bits(qh, 2 * g + 1, 1), 4));
          }
          store32(o, 2 * g, lo);
          store32(o, 2 * g + 1, hi);
        }
      } else {
        static_assert(T == WeightType::kQ6_K);
        for (int h = 0; h < 2; ++h) {
          const __m256i l0 = load32(blk + 64 * h), l1 = load32(blk + 64 * h + 32);
          const __m256i qh = load32(blk + 128 + 32 * h);
          const __m256i low[4] = {byte_bits(l0, 0, 0xF), byte_bits(l1, 0, 0xF),
                                  byte_bits(l0, 4, 0xF), byte_bits(l1, 4, 0xF)};
          for (int k = 0; k < 4; ++k) {
            const __m256i high = _mm256_slli_epi16(byte_bits(qh, 2 * k, 3), 4);
            store32(o, 4 * h + k,
                  _mm256_sub_epi8(_mm256_or_si256(low[k], high), _mm256_set1_epi8(32)));
          }
        }
      }
      fill_scx(o);
    }
  }

  // sum of 32 products (exact: 16 pair sums of at most 8128 summed into int32).
  template <bool kSigned>
  VQ_AVX2 static std::int32_t isum(const std::int8_t* c, const std::int8_t* q) noexcept {
    const __m256i cv = _mm256_load_si256(reinterpret_cast<const __m256i*>(c));
    const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
    return hsum_i32(_mm256_madd_epi16(pairs16<kSigned>(cv, xv), _mm256_set1_epi16(1)));
  }

  // sumi: per 32 codes, the int16 pair sums (at most 8128) times the groups' scales (|sc| <=
  // 128) summed pairwise into int32 (at most 2 * 8128 * 128 = 2.1e6), eight of those per lane
  // (at most 1.7e7): exact. summ: |mn| <= 63 times |bsums| <= 2032, pairwise, then summed.
  // The codes of a K type are signed (Q3_K, Q6_K: the sign trick) or in [0, 31] (Q2_K, Q4_K,
  // Q5_K: straight into maddubs, pairs at most 2 * 31 * 127 = 7874); the pair sums are the same.
  template <bool kSigned>
  VQ_AVX2 static void kdot(const Decoded& dk, const std::int8_t* q, const std::int16_t* bsums,
                           bool with_min, std::int32_t* sumi, std::int32_t* summ) noexcept {
    __m256i acc = _mm256_setzero_si256();
    for (int k = 0; k < 8; ++k) {
      const __m256i cv = _mm256_load_si256(reinterpret_cast<const __m256i*>(dk.c + 32 * k));
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * k));
      const __m256i sc = _mm256_load_si256(reinterpret_cast<const __m256i*>(dk.scx[k]));
      acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pairs16<kSigned>(cv, xv), sc));
    }
    *sumi = hsum_i32(acc);
    if (with_min) {
      const __m256i mn = _mm256_load_si256(reinterpret_cast<const __m256i*>(dk.mn));
      const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bsums));
      *summ = hsum_i32(_mm256_madd_epi16(mn, bs));
    } else {
      *summ = 0;
    }
  }
};

// K-quant prefill tiles, eight tokens in the eight lanes: per decoded block, each token's
// exact (sumi, summ) (Avx2Family::kdot's integer sums, reduced with the Q8_0 kernels' hadd
// tree so token u's sums land in lane u), then v = (d_w * d_x) * float(sumi) [- (dmin_w * d_x) *
// float(summ)] and acc[b % 8] += v lane by lane: per token exactly k_value's operations and the
// definition's lanes; tree() at the end lane by lane. Lanes of absent tokens (past nt) compute
// zeros that are never stored.
VQ_AVX2 inline __m256i reduce8(const __m256i* v) noexcept {
  const __m256i h01 =
      _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
  const __m256i h47 =
      _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
  return _mm256_add_epi32(_mm256_permute2x128_si256(h01, h47, 0x20),
                          _mm256_permute2x128_si256(h01, h47, 0x31));
}

// Both families' kernels, differing only in how the exact integer sums are accumulated.
namespace k_avx2 {
#define VQ_K_TARGET VQ_AVX2
#define VQ_K_VNNI 0
#include "engine/compute/block_matmul_k_x86.inc"
#undef VQ_K_TARGET
#undef VQ_K_VNNI
}  // namespace k_avx2

namespace k_vnni {
#define VQ_K_TARGET __attribute__((target("avx2,f16c,avxvnni")))
#define VQ_K_VNNI 1
#include "engine/compute/block_matmul_k_x86.inc"
#undef VQ_K_TARGET
#undef VQ_K_VNNI
}  // namespace k_vnni

// GCC 12's AVX-512 headers read an intentionally undefined vector (_mm512_undefined_epi32) in
// their shuffles and report it (GCC bug 105593); nothing of ours is uninitialised. The
// decode kernels (mv512) and the prefill tiles (p512) both use them.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
namespace mv512 {
#include "engine/compute/block_matvec_avx512.inc"
}  // namespace mv512
#include "engine/compute/block_prefill_avx512.inc"
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

// A block of 32 activations with a NaN or an infinity: d (and s) NaN, codes 0.
bool finite_block(const float* x, std::int64_t n) noexcept {
  for (std::int64_t j = 0; j < n; ++j) {
    if (!std::isfinite(x[j])) return false;
  }
  return true;
}

}  // namespace

namespace {
std::atomic<bool> g_avx512_prefill{true};
}  // namespace

void set_avx512_prefill(bool on) noexcept { g_avx512_prefill.store(on); }
bool avx512_prefill() noexcept {
  return g_avx512_prefill.load() &&
         (cpu::avx512_prefill_supported() || cpu::isa_supported(Isa::kAvx512Vnni));
}

void quantize_activations_q8_1(const float* x, std::int64_t n, std::int8_t* q, float* d,
                               float* s) noexcept {
  quantize_activations_q8_0(x, n, q, d);
  if (s == nullptr) return;
  for (std::int64_t b = 0; b < n / 32; ++b) {
    const float* xb = x + 32 * b;
    if (!finite_block(xb, 32)) {
      s[b] = std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    float amax = 0.0f;
    std::int32_t sum = 0;
    for (int j = 0; j < 32; ++j) {
      amax = std::max(amax, std::fabs(xb[j]));
      sum += q[32 * b + j];
    }
    s[b] = half_to_float(float_to_half((amax / 127.0f) * static_cast<float>(sum)));
  }
}

namespace {
#ifdef VQ_BLOCKS_X86
// One finite super-block of quantize_activations_q8_k with AVX-512 (F, BW, DQ), its values
// bit for bit: amax by max (exact, any order), max = the first value of |x| = amax (the scalar
// loop's strict >), then per value the same three fp32 operations (iscale * x, + kRound,
// - kRound) and the min with 127, lane by lane; each 16-group's sum of codes exactly (int32).
// false, with nothing written, when the block holds a NaN or an infinity (the caller's path).
__attribute__((target("avx2,avx512f,avx512bw,avx512dq,avx512vl"))) bool q8_k_block_avx512(
    const float* xb, std::int8_t* qb, float* d, std::int16_t* bs) noexcept {
  __m512 v[16], a[16];
  __m512 amax = _mm512_setzero_ps();
  __mmask16 finite = 0xFFFF;
  for (int g = 0; g < 16; ++g) {
    v[g] = _mm512_loadu_ps(xb + 16 * g);
    a[g] = _mm512_abs_ps(v[g]);
    // |x| <= FLT_MAX is false for NaN and infinities.
    finite &= _mm512_cmp_ps_mask(a[g], _mm512_set1_ps(std::numeric_limits<float>::max()), _CMP_LE_OQ);
    // GCC 12's _mm512_max_ps passes _mm512_undefined_ps() as its unused masked source, which
    // the sanitizer build's -Werror=uninitialized refuses; the zero-masked form is the same max.
    amax = _mm512_maskz_max_ps(0xFFFF, amax, a[g]);
  }
  if (finite != 0xFFFF) return false;
  // The largest |x| (max is exact in any order), reduced by hand for the same reason
  // (_mm512_reduce_max_ps is built on _mm512_max_ps).
  const __m256 m8 = _mm256_max_ps(_mm512_castps512_ps256(amax), _mm512_extractf32x8_ps(amax, 1));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
  const float am = _mm_cvtss_f32(m4);
  if (am == 0.0f) {
    *d = 0.0f;
    std::memset(qb, 0, 256);
    std::memset(bs, 0, 32);
    return true;
  }
  float max = 0.0f;
  for (int g = 0; g < 16; ++g) {
    const __mmask16 m = _mm512_cmp_ps_mask(a[g], _mm512_set1_ps(am), _CMP_EQ_OQ);
    if (m != 0) {
      max = xb[16 * g + __builtin_ctz(m)];
      break;
    }
  }
  const float iscale = -127.0f / max;
  const __m512 is = _mm512_set1_ps(iscale), round = _mm512_set1_ps(kRound);
  const __m512 top = _mm512_set1_ps(127.0f);
  for (int g = 0; g < 16; ++g) {
    const __m512 r = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(is, v[g]), round), round);
    // std::min(127.0f, r) is (r < 127) ? r : 127, as vminps(r, 127) (also for a NaN r).
    const __m512i c = _mm512_cvttps_epi32(_mm512_min_ps(r, top));  // integral: exact
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qb + 16 * g), _mm512_cvtepi32_epi8(c));
    bs[g] = static_cast<std::int16_t>(_mm512_reduce_add_epi32(c));
  }
  *d = 1.0f / iscale;
  return true;
}
#endif
}  // namespace

void quantize_activations_q8_k(const float* x, std::int64_t n, std::int8_t* q, float* d,
                               std::int16_t* bsums) noexcept {
#ifdef VQ_BLOCKS_X86
  static const bool avx512 = cpu::isa_supported(Isa::kAvx512);
#endif
  for (std::int64_t b = 0; b < n / 256; ++b) {
    const float* xb = x + 256 * b;
    std::int8_t* qb = q + 256 * b;
    std::int16_t* bs = bsums + 16 * b;
#ifdef VQ_BLOCKS_X86
    if (avx512 && q8_k_block_avx512(xb, qb, d + b, bs)) continue;
#endif
    std::fill(bs, bs + 16, std::int16_t{0});
    if (!finite_block(xb, 256)) {
      d[b] = std::numeric_limits<float>::quiet_NaN();
      std::fill(qb, qb + 256, std::int8_t{0});
      continue;
    }
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 256; ++j) {
      const float ax = std::fabs(xb[j]);
      if (ax > amax) {
        amax = ax;
        max = xb[j];
      }
    }
    if (amax == 0.0f) {
      d[b] = 0.0f;
      std::fill(qb, qb + 256, std::int8_t{0});
      continue;
    }
    const float iscale = -127.0f / max;
    for (int j = 0; j < 256; ++j) {
      // |iscale * x| <= 127 up to one rounding, so the rounded value is in [-127, 127]; the
      // min(127, .) of the definition is kept for values a rounding could push to 128.
      const float r = (iscale * xb[j] + kRound) - kRound;
      qb[j] = static_cast<std::int8_t>(std::min(127.0f, r));
      bs[j / 16] = static_cast<std::int16_t>(bs[j / 16] + qb[j]);
    }
    d[b] = 1.0f / iscale;
  }
}

bool prefill_q8_0_avx512(Isa isa, float* out, const std::int8_t* xq, const float* xd,
                         const WeightMatrix& w, std::int64_t S, std::int64_t begin,
                         std::int64_t end) noexcept {
#ifdef VQ_BLOCKS_X86
  if (!p512::use(isa, w, S)) return false;
  p512::rows_legacy<WeightType::kQ8_0>(out, xq, xd, w, S, begin, end);
  return true;
#else
  (void)isa, (void)out, (void)xq, (void)xd, (void)w, (void)S, (void)begin, (void)end;
  return false;
#endif
}

bool matvec_q8_0_avx512(float* out, const std::int8_t* xq, const float* xd, const WeightMatrix& w,
                        std::int64_t begin, std::int64_t end) noexcept {
#ifdef VQ_BLOCKS_X86
  return mv512::legacy_matvec<WeightType::kQ8_0>(out, xq, xd, w, begin, end);
#else
  (void)out, (void)xq, (void)xd, (void)w, (void)begin, (void)end;
  return false;
#endif
}

namespace {

// Rows [begin, end) x S tokens of type T with the family `isa` (matmul_rows_blocks).
template <WeightType T>
void rows_of_type(Isa isa, float* out, const BlockActs& a, const WeightMatrix& w, std::int64_t S,
                  std::int64_t begin, std::int64_t end) noexcept {
#ifdef VQ_BLOCKS_X86
  // kAvx512Vnni: its own kernels for one token; the AVX-512 families run avx512_base()'s else.
  if (isa == Isa::kAvx512Vnni && S == 1 && mv512::matvec_blocks<T>(out, a, w, begin, end)) {
    return;
  }
  // The AVX-512 VNNI prefill tiles: asked by the family itself (kAvx512Vnni, also on CPUs whose
  // avx512_base() is kAvx2) or by kAvx2Vnni.
  if constexpr (T == WeightType::kQ4_0 || is_k(T)) {
    if (p512::use(isa, w, S)) {
      if constexpr (is_k(T)) return p512::rows_k<T>(out, a, w, S, begin, end);
      else return p512::rows_legacy<T>(out, a.q, a.d, w, S, begin, end);
    }
  }
  if (cpu::uses_avx512(isa)) isa = cpu::avx512_base();
  if (isa == Isa::kAvx2 || isa == Isa::kAvx2Vnni) {
    if constexpr (!is_k(T)) {
      return rows_legacy_avx2<T>(out, a, w, S, begin, end);
    } else {
      if (S > 1 && prefill_kernels() == PrefillKernels::kTiles) {
        return isa == Isa::kAvx2Vnni ? k_vnni::rows_k<T>(out, a, w, S, begin, end)
                                     : k_avx2::rows_k<T>(out, a, w, S, begin, end);
      }
      return rows_family<T, Avx2Family>(out, a, w, S, begin, end);
    }
  }
#else
  (void)isa;
#endif
  rows_family<T, ScalarFamily>(out, a, w, S, begin, end);
}

}  // namespace

ActType activation_type(WeightType w) noexcept {
  ActType act = ActType::kQ8_0;  // Q8_0 weights
  with_block_type(w, [&](auto type) { act = act_type(decltype(type)::value); });
  return act;
}

void matmul_rows_blocks(Isa isa, float* out, const BlockActs& a, const WeightMatrix& w,
                        std::int64_t S, std::int64_t begin, std::int64_t end) noexcept {
  with_block_type(w.type, [&](auto type) {
    rows_of_type<decltype(type)::value>(isa, out, a, w, S, begin, end);
  });
}

void decode_block(Isa isa, const WeightMatrix& w, std::int64_t row, std::int64_t block,
                  DecodedBlock* out) noexcept {
  if (cpu::uses_avx512(isa)) isa = cpu::avx512_base();
  Decoded dec{};
  const std::uint8_t* blk = w.row(row) + block * weight_block_bytes(w.type);
  with_block_type(w.type, [&](auto type) {
    constexpr WeightType T = decltype(type)::value;
#ifdef VQ_BLOCKS_X86
    if (isa == Isa::kAvx2 || isa == Isa::kAvx2Vnni) return Avx2Family::decode<T>(blk, &dec);
#endif
    ScalarFamily::decode<T>(blk, &dec);
  });
  std::memset(out, 0, sizeof(*out));
  const int n = weight_block_size(w.type) == 256 ? 256 : 32;
  std::memcpy(out->codes, dec.c, static_cast<std::size_t>(n));
  if (n == 256) {
    for (int g = 0; g < 16; ++g) {
      out->sc[g] = dec.sc[g];
      out->mn[g] = dec.mn[g];
    }
  }
  out->d = dec.d;
  out->dmin = dec.dmin;
}

}  // namespace vq::engine
