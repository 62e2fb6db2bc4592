#include "store/packed_attention.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "base/kernels.h"
#include "veloxquant/types.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define VQ_ATTN_X86 1
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
        for (std::int64_t c = c0; c < c1; ++c)
          t[c % 8] = std::fma(qj[c], element(s, r, c), t[c % 8]);
        const float w = plain ? 1.0f : scale_of(s, r, g);
        for (int l = 0; l < 8; ++l) acc[l] = plain ? acc[l] + t[l] : std::fma(w, t[l], acc[l]);
      }
      float score = reduce_lanes(acc);
      if (asym) {
        float zt = 0.0f;
        for (std::int64_t g = 0; g < n_groups; ++g) {
          const std::int64_t c0 = g * G, c1 = std::min(D, c0 + G);
          zt = std::fma(zero_of(s, r, g), kernels::sum(qj + c0, c1 - c0), zt);
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
        for (std::int64_t c = c0; c < c1; ++c) a[c] = std::fma(w, element(s, r, c), a[c]);
        if (asym) {
          float& z = Z[(j * 4 + k) * zs + g];
          z = std::fma(p, zero_of(s, r, g), z);
        }
      }
    }
  }
}

// ---- x86 SIMD families -----------------------------------------------------------------------
#ifdef VQ_ATTN_X86
constexpr std::int64_t kMaxGroups = 32;  // D <= 256 with groups of >= 8 channels
constexpr std::int64_t kValueBlock = 32;  // rows per block of the value sums

namespace avx2 {
#define VQ_ATTN_TARGET __attribute__((target("avx2,f16c,fma")))
#include "store/packed_attention_x86.inc"
#undef VQ_ATTN_TARGET
}  // namespace avx2

namespace avx512 {
#define VQ_ATTN_TARGET __attribute__((target("avx2,f16c,fma,avx512f,avx512vl,avx512bw,avx512dq")))
#include "store/packed_attention_x86.inc"
#undef VQ_ATTN_TARGET
}  // namespace avx512

// Whether the SIMD kernels take this shape (else the scalar definition runs).
bool simd_shape(const RowSet& s, std::int64_t D) noexcept {
  if (D % 8 != 0 || D > 256) return false;
  if (is_plain(s.fmt)) return true;
  if (s.fmt == Fmt::kQ4_0 && s.group != 32) return false;
  return s.group % 8 == 0 && (D + s.group - 1) / s.group <= kMaxGroups;
}
#endif  // VQ_ATTN_X86

}  // namespace

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

void token_scores(cpu::Isa isa, const RowSet& rows, std::int64_t D, const float* q,
                  std::int64_t n_q, std::int64_t pos, float* out, std::int64_t ld) noexcept {
  if (rows.n <= 0) return;
#ifdef VQ_ATTN_X86
  if (kernels_for(isa) != cpu::Isa::kScalar && simd_shape(rows, D)) {
    if (kernels_for(isa) == cpu::Isa::kAvx512) {
      return avx512::scores_any(rows, D, q, n_q, pos, out, ld);
    }
    return avx2::scores_any(rows, D, q, n_q, pos, out, ld);
  }
#else
  (void)isa;
#endif
  token_scores_scalar(rows, D, q, n_q, pos, out, ld);
}

void channel_scores(cpu::Isa isa, const RowSet& rows, const std::uint16_t* scale,
                    const std::uint16_t* zero, std::int64_t D, const float* q, std::int64_t n_q,
                    std::int64_t pos, float* out, std::int64_t ld) noexcept {
  if (rows.n <= 0) return;
#ifdef VQ_ATTN_X86
  if (kernels_for(isa) != cpu::Isa::kScalar && D % 8 == 0 && D <= 256) {
    if (kernels_for(isa) == cpu::Isa::kAvx512) {
      return avx512::channel_any(rows, scale, zero, D, q, n_q, pos, out, ld);
    }
    return avx2::channel_any(rows, scale, zero, D, q, n_q, pos, out, ld);
  }
#else
  (void)isa;
#endif
  channel_scores_scalar(rows, scale, zero, D, q, n_q, pos, out, ld);
}

void token_values(cpu::Isa isa, const RowSet& rows, std::int64_t first, std::int64_t D,
                  const float* probs, std::int64_t n_q, std::int64_t ld, std::int64_t pos,
                  float* A, float* Z, std::int64_t zs) noexcept {
  if (rows.n <= 0) return;
#ifdef VQ_ATTN_X86
  if (kernels_for(isa) != cpu::Isa::kScalar && simd_shape(rows, D)) {
    if (kernels_for(isa) == cpu::Isa::kAvx512) {
      return avx512::values_any(rows, first, D, probs, n_q, ld, pos, A, Z, zs);
    }
    return avx2::values_any(rows, first, D, probs, n_q, ld, pos, A, Z, zs);
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
