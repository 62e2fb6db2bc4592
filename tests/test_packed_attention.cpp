// The fused attention kernels on packed rows (src/store/packed_attention.h): every SIMD family
// this CPU runs (AVX2, AVX-512) bit-identical to the scalar definition, on every format, masked rows, odd row counts, partial
// sum offsets and group sizes; the scalar definition within rounding of attention computed in
// double from the dequantized rows (an independent derivation); ggml's q8_0 / q4_0 blocks
// against codes and scales worked out by hand; the q8_0 / q4_0 store's bytes and fused reads.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "attention_util.h"
#include "store/block_format.h"
#include "store/packed_attention.h"
#include "store/store.h"
#include "test_util.h"
#include "veloxquant/cache.h"
#include "veloxquant/registry.h"

namespace vq {
namespace {

using detail::attn::Fmt;
using cpu::Isa;
using detail::attn::RowSet;

std::uint32_t bits_of(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

const char* name(Fmt f) {
  switch (f) {
    case Fmt::kF32:
      return "f32";
    case Fmt::kF16:
      return "f16";
    case Fmt::kU2:
      return "u2";
    case Fmt::kU4:
      return "u4";
    case Fmt::kQ8_0:
      return "q8_0";
    case Fmt::kQ4_0:
      return "q4_0";
  }
  return "?";
}

// n plain fp32 rows of D channels held in `rows` (one group of D channels).
RowSet plain_f32_rows(const std::vector<float>& rows, std::int64_t D,
                      const std::int32_t* positions, std::int64_t n) {
  RowSet set;
  set.fmt = Fmt::kF32;
  set.data = reinterpret_cast<const std::uint8_t*>(rows.data());
  set.row_bytes = 4 * D;
  set.group = D;
  set.positions = positions;
  set.n = n;
  return set;
}

// Random rows of one format and their data.
struct Rows {
  RowSet set;
  std::vector<std::uint8_t> data;
  std::vector<std::uint16_t> scale, zero;
  std::vector<std::int32_t> positions;
};

Rows make_rows(std::mt19937& rng, Fmt fmt, std::int64_t n, std::int64_t D, std::int64_t G,
               std::int64_t pos) {
  Rows r;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> sc(0.01f, 2.0f), zr(-3.0f, 3.0f);
  const bool plain = fmt == Fmt::kF32 || fmt == Fmt::kF16;
  std::int64_t row_bytes = 0;
  switch (fmt) {
    case Fmt::kF32:
      row_bytes = 4 * D;
      break;
    case Fmt::kF16:
      row_bytes = 2 * D;
      break;
    case Fmt::kU2:
      row_bytes = (2 * D + 7) / 8;
      break;
    case Fmt::kU4:
      row_bytes = (4 * D + 7) / 8;
      break;
    case Fmt::kQ8_0:
      row_bytes = D;
      break;
    case Fmt::kQ4_0:
      row_bytes = D / 2;
      break;
  }
  r.data.resize(static_cast<std::size_t>(n * row_bytes + 8));
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint8_t* row = r.data.data() + i * row_bytes;
    for (std::int64_t c = 0; c < D; ++c) {
      if (fmt == Fmt::kF32) {
        const float x = normal(rng);
        std::memcpy(row + 4 * c, &x, 4);
      } else if (fmt == Fmt::kF16) {
        const std::uint16_t h = float_to_half(normal(rng));
        std::memcpy(row + 2 * c, &h, 2);
      }
    }
    if (!plain) {
      for (std::int64_t b = 0; b < row_bytes; ++b) row[b] = static_cast<std::uint8_t>(rng());
    }
  }
  const std::int64_t ng = plain ? 1 : (D + G - 1) / G;
  for (std::int64_t i = 0; i < n * ng; ++i) {
    r.scale.push_back(float_to_half(sc(rng)));
    r.zero.push_back(float_to_half(zr(rng)));
  }
  for (std::int64_t i = 0; i < n; ++i) {
    // Mostly visible; about one row in six past pos (masked).
    r.positions.push_back(static_cast<std::int32_t>(rng() % 6 == 0 ? pos + 1 + rng() % 3
                                                                   : rng() % (pos + 1)));
  }
  r.set.fmt = fmt;
  r.set.data = r.data.data();
  r.set.row_bytes = row_bytes;
  r.set.scale = plain ? nullptr : r.scale.data();
  r.set.zero = fmt == Fmt::kU2 || fmt == Fmt::kU4 ? r.zero.data() : nullptr;
  r.set.param_stride = ng;
  r.set.group = plain ? D : G;
  r.set.positions = r.positions.data();
  r.set.n = n;
  return r;
}

// Row r's value at channel c, dequantized in double (the independent reference).
double value_of(const Rows& r, std::int64_t i, std::int64_t c) {
  const double x = detail::attn::element(r.set, i, c);
  if (r.set.fmt == Fmt::kF32 || r.set.fmt == Fmt::kF16) return x;
  const std::int64_t g = c / r.set.group;
  const double s = half_to_float(r.set.scale[i * r.set.param_stride + g]);
  if (r.set.zero == nullptr) return x * s;
  return x * s + half_to_float(r.set.zero[i * r.set.param_stride + g]);
}

std::vector<float> random_vec(std::mt19937& rng, std::int64_t n) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = normal(rng);
  return v;
}

struct Shape {
  Fmt fmt;
  std::int64_t D, G;
};

std::vector<Shape> shapes() {
  std::vector<Shape> s;
  for (Fmt f : {Fmt::kF32, Fmt::kF16}) {
    for (std::int64_t D : {5, 8, 64, 128, 256}) s.push_back({f, D, D});
  }
  for (Fmt f : {Fmt::kU2, Fmt::kU4}) {
    for (std::int64_t D : {7, 16, 64, 72, 128}) {
      for (std::int64_t G : {5, 8, 32, 64}) s.push_back({f, D, G});
    }
  }
  for (Fmt f : {Fmt::kQ8_0, Fmt::kQ4_0}) {
    for (std::int64_t D : {32, 64, 128, 256}) s.push_back({f, D, 32});
  }
  return s;
}

// Scalar definition vs the double reference, and every supported SIMD family vs the scalar
// definition bit for bit: token_scores, token_values + finish_values.
TEST(PackedAttention, TokenKernelsMatchScalarAndReference) {
  std::mt19937 rng(4242);
  for (const Shape& sh : shapes()) {
    for (std::int64_t n : {0, 1, 7, 8, 13, 37, 70}) {
      for (std::int64_t n_q : {1, 3, 6}) {
        const std::int64_t pos = 100, first = static_cast<std::int64_t>(rng() % 4);
        const std::string what = std::string(name(sh.fmt)) + " D " + std::to_string(sh.D) +
                                 " G " + std::to_string(sh.G) + " n " + std::to_string(n) +
                                 " n_q " + std::to_string(n_q);
        const Rows rows = make_rows(rng, sh.fmt, n, sh.D, sh.G, pos);
        const std::vector<float> q = random_vec(rng, n_q * sh.D);
        const std::int64_t ld = n + 3;
        std::vector<float> s0(static_cast<std::size_t>(n_q * ld), 7.0f), s1 = s0;
        detail::attn::token_scores(Isa::kScalar, rows.set, sh.D, q.data(), n_q, pos, s0.data(),
                                   ld);
        // Probabilities: positive, masked rows 0.
        std::vector<float> p(static_cast<std::size_t>(n_q * ld), 0.0f);
        for (std::int64_t j = 0; j < n_q; ++j) {
          for (std::int64_t r = 0; r < n; ++r) {
            const std::size_t at = static_cast<std::size_t>(j * ld + r);
            if (rows.positions[static_cast<std::size_t>(r)] > pos) {
              ASSERT_TRUE(std::isinf(s0[at]) && s0[at] < 0) << what;
              continue;
            }
            double ref = 0.0, mag = 0.0;
            for (std::int64_t c = 0; c < sh.D; ++c) {
              const double t = static_cast<double>(q[static_cast<std::size_t>(j * sh.D + c)]) *
                               value_of(rows, r, c);
              ref += t;
              mag += std::fabs(t);
            }
            ASSERT_NEAR(s0[at], ref, 2e-6 * (mag + 1.0) * std::sqrt(sh.D)) << what << " row " << r;
            p[at] = static_cast<float>(rng() % 1000 + 1) / 1000.0f;
          }
        }
        const std::int64_t zs = sh.D;  // >= the number of groups
        std::vector<float> A0(static_cast<std::size_t>(n_q * 4 * sh.D), 0.0f), A1 = A0;
        std::vector<float> Z0(static_cast<std::size_t>(n_q * 4 * zs), 0.0f), Z1 = Z0;
        std::vector<float> o0(static_cast<std::size_t>(n_q * sh.D)), o1 = o0;
        const bool asym = sh.fmt == Fmt::kU2 || sh.fmt == Fmt::kU4;
        detail::attn::token_values(Isa::kScalar, rows.set, first, sh.D, p.data(), n_q, ld, pos,
                                   A0.data(), Z0.data(), zs);
        detail::attn::finish_values(A0.data(), asym ? Z0.data() : nullptr, zs, rows.set.group, n_q,
                                    sh.D, o0.data());
        for (std::int64_t j = 0; j < n_q; ++j) {
          for (std::int64_t c = 0; c < sh.D; ++c) {
            double ref = 0.0, mag = 0.0;
            for (std::int64_t r = 0; r < n; ++r) {
              if (rows.positions[static_cast<std::size_t>(r)] > pos) continue;
              const double t = static_cast<double>(p[static_cast<std::size_t>(j * ld + r)]) *
                               value_of(rows, r, c);
              ref += t;
              mag += std::fabs(t);
            }
            ASSERT_NEAR(o0[static_cast<std::size_t>(j * sh.D + c)], ref, 1e-5 * (mag + 1.0))
                << what << " value " << j << "," << c;
          }
        }
        for (const Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
          if (!cpu::isa_supported(isa)) continue;
          const std::string w = what + " " + cpu::to_string(isa);
          std::fill(s1.begin(), s1.end(), 7.0f);
          std::fill(A1.begin(), A1.end(), 0.0f);
          std::fill(Z1.begin(), Z1.end(), 0.0f);
          detail::attn::token_scores(isa, rows.set, sh.D, q.data(), n_q, pos, s1.data(), ld);
          for (std::size_t i = 0; i < s0.size(); ++i)
            ASSERT_EQ(bits_of(s0[i]), bits_of(s1[i])) << w << " score " << i;
          detail::attn::token_values(isa, rows.set, first, sh.D, p.data(), n_q, ld, pos,
                                     A1.data(), Z1.data(), zs);
          detail::attn::finish_values(A1.data(), asym ? Z1.data() : nullptr, zs, rows.set.group,
                                      n_q, sh.D, o1.data());
          for (std::size_t i = 0; i < A0.size(); ++i)
            ASSERT_EQ(bits_of(A0[i]), bits_of(A1[i])) << w << " partial sum " << i;
          for (std::size_t i = 0; i < Z0.size(); ++i)
            ASSERT_EQ(bits_of(Z0[i]), bits_of(Z1[i])) << w << " zero sum " << i;
          for (std::size_t i = 0; i < o0.size(); ++i)
            ASSERT_EQ(bits_of(o0[i]), bits_of(o1[i])) << w << " value " << i;
        }
      }
    }
  }
}

// Per-token parameters spaced wider than the groups (param_stride > groups, as a store with
// room for more groups keeps them): the families read them row by row, the contiguous case
// eight at a time; both are bit for bit the scalar definition, which gives the same numbers
// as with the parameters packed tight.
TEST(PackedAttention, SpacedParametersMatchScalar) {
  std::mt19937 rng(31337);
  for (Fmt fmt : {Fmt::kU2, Fmt::kU4, Fmt::kQ8_0, Fmt::kQ4_0}) {
    for (std::int64_t D : {64, 128}) {
      for (std::int64_t n : {8, 24, 37}) {
        for (std::int64_t n_q : {1, 3}) {
          const std::int64_t G = 32, ng = D / G, stride = ng + 3, pos = 100;
          const std::string what = std::string(name(fmt)) + " D " + std::to_string(D) + " n " +
                                   std::to_string(n) + " n_q " + std::to_string(n_q);
          Rows rows = make_rows(rng, fmt, n, D, G, pos);
          for (std::int32_t& p : rows.positions) p = static_cast<std::int32_t>(rng() % (pos + 1));
          std::vector<std::uint16_t> scale(static_cast<std::size_t>(n * stride), 0x7e00),
              zero = scale;  // NaN in the gaps: read by mistake, they would show
          for (std::int64_t r = 0; r < n; ++r) {
            for (std::int64_t g = 0; g < ng; ++g) {
              scale[static_cast<std::size_t>(r * stride + g)] =
                  rows.scale[static_cast<std::size_t>(r * ng + g)];
              zero[static_cast<std::size_t>(r * stride + g)] =
                  rows.zero[static_cast<std::size_t>(r * ng + g)];
            }
          }
          RowSet spaced = rows.set;
          spaced.scale = scale.data();
          if (spaced.zero != nullptr) spaced.zero = zero.data();
          spaced.param_stride = stride;
          const std::vector<float> q = random_vec(rng, n_q * D);
          std::vector<float> tight(static_cast<std::size_t>(n_q * n)), s0 = tight, s1 = tight;
          detail::attn::token_scores(Isa::kScalar, rows.set, D, q.data(), n_q, pos, tight.data(),
                                     n);
          detail::attn::token_scores(Isa::kScalar, spaced, D, q.data(), n_q, pos, s0.data(), n);
          for (std::size_t i = 0; i < s0.size(); ++i)
            ASSERT_EQ(bits_of(tight[i]), bits_of(s0[i])) << what << " score " << i;
          std::vector<float> p(static_cast<std::size_t>(n_q * n));
          for (float& x : p) x = static_cast<float>(rng() % 1000 + 1) / 1000.0f;
          const std::int64_t zs = ng;
          std::vector<float> A0(static_cast<std::size_t>(n_q * 4 * D), 0.0f), A1 = A0;
          std::vector<float> Z0(static_cast<std::size_t>(n_q * 4 * zs), 0.0f), Z1 = Z0;
          detail::attn::token_values(Isa::kScalar, spaced, 0, D, p.data(), n_q, n, pos, A0.data(),
                                     Z0.data(), zs);
          for (const Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
            if (!cpu::isa_supported(isa)) continue;
            const std::string w = what + " " + cpu::to_string(isa);
            std::fill(s1.begin(), s1.end(), 7.0f);
            detail::attn::token_scores(isa, spaced, D, q.data(), n_q, pos, s1.data(), n);
            for (std::size_t i = 0; i < s0.size(); ++i)
              ASSERT_EQ(bits_of(s0[i]), bits_of(s1[i])) << w << " score " << i;
            std::fill(A1.begin(), A1.end(), 0.0f);
            std::fill(Z1.begin(), Z1.end(), 0.0f);
            detail::attn::token_values(isa, spaced, 0, D, p.data(), n_q, n, pos, A1.data(),
                                       Z1.data(), zs);
            for (std::size_t i = 0; i < A0.size(); ++i)
              ASSERT_EQ(bits_of(A0[i]), bits_of(A1[i])) << w << " partial sum " << i;
            for (std::size_t i = 0; i < Z0.size(); ++i)
              ASSERT_EQ(bits_of(Z0[i]), bits_of(Z1[i])) << w << " zero sum " << i;
          }
        }
      }
    }
  }
}

// Value sums over whole blocks of visible rows (the SIMD families' block path: the weights and
// the zeros' sums eight at a time when the rows' parameters and Z are contiguous), with Z's
// stride tight (the stores' layout: one partial sum per group) and loose, several queries (a GQA
// group) and every partial-sum offset: bit for bit the scalar definition. (The test above masks
// about one row in six, so its blocks of 32 rows are rarely whole.)
TEST(PackedAttention, WholeBlockValueSumsMatchScalar) {
  std::mt19937 rng(777);
  for (const Shape& sh : shapes()) {
    if (sh.fmt == Fmt::kF32 || sh.fmt == Fmt::kF16) continue;
    const std::int64_t ng = (sh.D + sh.G - 1) / sh.G;
    for (std::int64_t n : {4, 12, 32, 64, 101}) {
      for (std::int64_t n_q : {1, 2, 4, 5}) {
        for (std::int64_t zs : {ng, ng + 3}) {
          const std::int64_t pos = 1000, first = static_cast<std::int64_t>(rng() % 4);
          const std::string what = std::string(name(sh.fmt)) + " D " + std::to_string(sh.D) +
                                   " G " + std::to_string(sh.G) + " n " + std::to_string(n) +
                                   " n_q " + std::to_string(n_q) + " zs " + std::to_string(zs) +
                                   " first " + std::to_string(first);
          Rows rows = make_rows(rng, sh.fmt, n, sh.D, sh.G, pos);
          for (std::int32_t& p : rows.positions) p = static_cast<std::int32_t>(rng() % (pos + 1));
          const std::int64_t ld = n + 5;
          std::vector<float> probs(static_cast<std::size_t>(n_q * ld));
          for (float& p : probs) p = static_cast<float>(rng() % 100000 + 1) / 100000.0f;
          std::vector<float> A0(static_cast<std::size_t>(n_q * 4 * sh.D), 0.0f), A1;
          std::vector<float> Z0(static_cast<std::size_t>(n_q * 4 * zs), 0.0f), Z1;
          // Nonzero starting sums, as a head's second run of rows finds them.
          for (float& a : A0) a = static_cast<float>(rng() % 1000) / 64.0f;
          for (float& z : Z0) z = static_cast<float>(rng() % 1000) / 64.0f;
          A1 = A0;
          Z1 = Z0;
          detail::attn::token_values(Isa::kScalar, rows.set, first, sh.D, probs.data(), n_q, ld,
                                     pos, A0.data(), Z0.data(), zs);
          for (const Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
            if (!cpu::isa_supported(isa)) continue;
            std::vector<float> A2 = A1, Z2 = Z1;
            detail::attn::token_values(isa, rows.set, first, sh.D, probs.data(), n_q, ld, pos,
                                       A2.data(), Z2.data(), zs);
            const std::string w = what + " " + cpu::to_string(isa);
            for (std::size_t i = 0; i < A0.size(); ++i)
              ASSERT_EQ(bits_of(A0[i]), bits_of(A2[i])) << w << " partial sum " << i;
            for (std::size_t i = 0; i < Z0.size(); ++i)
              ASSERT_EQ(bits_of(Z0[i]), bits_of(Z2[i])) << w << " zero sum " << i;
          }
        }
      }
    }
  }
}

// KIVI's key groups: the query folded into per-channel scales.
TEST(PackedAttention, ChannelScoresMatchScalarAndReference) {
  std::mt19937 rng(99);
  for (Fmt fmt : {Fmt::kU2, Fmt::kU4}) {
    for (std::int64_t D : {3, 8, 64, 72, 128, 256}) {
      // One query (codes unpacked in registers) and GQA groups (unpacked once per row block).
      for (const auto& [n, n_q] : std::vector<std::pair<std::int64_t, std::int64_t>>{
               {1, 1}, {5, 2}, {8, 1}, {8, 4}, {32, 1}, {32, 2}, {32, 4}, {45, 1}, {45, 3}}) {
        const std::int64_t pos = 50;
        const std::string what = std::string(name(fmt)) + " D " + std::to_string(D) + " n " +
                                 std::to_string(n) + " n_q " + std::to_string(n_q);
        Rows rows = make_rows(rng, fmt, n, D, D, pos);
        std::vector<std::uint16_t> scale, zero;
        std::uniform_real_distribution<float> sc(0.01f, 2.0f), zr(-3.0f, 3.0f);
        for (std::int64_t c = 0; c < D; ++c) {
          scale.push_back(float_to_half(sc(rng)));
          zero.push_back(float_to_half(zr(rng)));
        }
        const std::vector<float> q = random_vec(rng, n_q * D);
        std::vector<float> s0(static_cast<std::size_t>(n_q * n)), s1 = s0;
        detail::attn::channel_scores(Isa::kScalar, rows.set, scale.data(), zero.data(), D,
                                     q.data(), n_q, pos, s0.data(), n);
        for (std::int64_t j = 0; j < n_q; ++j) {
          for (std::int64_t r = 0; r < n; ++r) {
            const float got = s0[static_cast<std::size_t>(j * n + r)];
            if (rows.positions[static_cast<std::size_t>(r)] > pos) {
              ASSERT_TRUE(std::isinf(got) && got < 0) << what;
              continue;
            }
            double ref = 0.0, mag = 0.0;
            for (std::int64_t c = 0; c < D; ++c) {
              const double v = detail::attn::element(rows.set, r, c) *
                                   static_cast<double>(half_to_float(scale[c])) +
                               half_to_float(zero[c]);
              ref += q[static_cast<std::size_t>(j * D + c)] * v;
              mag += std::fabs(q[static_cast<std::size_t>(j * D + c)] * v);
            }
            ASSERT_NEAR(got, ref, 2e-6 * (mag + 1.0) * std::sqrt(D)) << what;
          }
        }
        for (const Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
          if (!cpu::isa_supported(isa)) continue;
          std::fill(s1.begin(), s1.end(), 7.0f);
          detail::attn::channel_scores(isa, rows.set, scale.data(), zero.data(), D, q.data(), n_q,
                                       pos, s1.data(), n);
          for (std::size_t i = 0; i < s0.size(); ++i)
            ASSERT_EQ(bits_of(s0[i]), bits_of(s1[i]))
                << what << " " << cpu::to_string(isa) << " score " << i;
        }
      }
    }
  }
}

// ggml's q8_0 by hand. amax 127: d = 127 / 127 = 1 (fp16 0x3C00), id = 1, code = roundf(x):
// halves round away from zero (2.5 -> 3, -2.5 -> -3), not to even.
// Values worked out by hand where one fused multiply-add and a multiply-then-add differ (the
// library's definition is the fused one, kernels.h), on every family this CPU runs. 8 identical
// rows (one SIMD block), every row visible.
TEST(PackedAttention, FusedMultiplyAddsWorkedOutByHand) {
  const float e12 = 1.0f + std::ldexp(1.0f, -12);
  std::vector<std::int32_t> positions(8, 0);
  for (const Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (isa != Isa::kScalar && !cpu::isa_supported(isa)) continue;
    const std::string what = cpu::to_string(isa);
    // Plain fp32 scores, D = 16: lane 0 sums 1 * -1 (c = 0), then (1 + 2^-12)^2 (c = 8). Fused:
    // exactly 2^-11 + 2^-24; rounding the square first (to 1 + 2^-11, a tie to even) would
    // give 2^-11.
    {
      std::vector<float> rows(8 * 16, 0.0f), q(16, 0.0f);
      for (int r = 0; r < 8; ++r) {
        rows[static_cast<std::size_t>(r * 16)] = -1.0f;
        rows[static_cast<std::size_t>(r * 16 + 8)] = e12;
      }
      q[0] = 1.0f;
      q[8] = e12;
      const RowSet set = plain_f32_rows(rows, 16, positions.data(), 8);
      std::vector<float> out(8, 7.0f);
      detail::attn::token_scores(isa, set, 16, q.data(), 1, 0, out.data(), 8);
      for (float x : out) EXPECT_EQ(x, std::ldexp(1.0f, -11) + std::ldexp(1.0f, -24)) << what;
    }
    // Grouped q8_0 scores, D = 16, groups of 8: lane 0 has t = 1 * -1 in group 0 (scale 1), so
    // acc = -1; in group 1 t = q_8 * 1 = q_8 = 1 + 2^-14 + 2^-20 and the scale is 1 + 2^-10:
    // acc = fma(1 + 2^-10, q_8, -1) = 2^-10 + 2^-14 + 2^-20 + 2^-24 + 2^-30 exactly (21
    // significant bits). Rounded first, s * t = 1 + 2^-10 + 2^-14 + 2^-20 + 2^-23 (2^-24 + 2^-30
    // is over half an ulp), and the score would end in 2^-23.
    {
      std::vector<std::uint8_t> rows(8 * 16, 0);
      std::vector<std::uint16_t> scale;
      for (int r = 0; r < 8; ++r) {
        rows[static_cast<std::size_t>(r * 16)] = 0xff;  // int8 -1
        rows[static_cast<std::size_t>(r * 16 + 8)] = 1;
        scale.push_back(float_to_half(1.0f));
        scale.push_back(float_to_half(1.0f + std::ldexp(1.0f, -10)));
      }
      ASSERT_EQ(half_to_float(scale[1]), 1.0f + std::ldexp(1.0f, -10));
      std::vector<float> q(16, 0.0f);
      q[0] = 1.0f;
      q[8] = 1.0f + std::ldexp(1.0f, -14) + std::ldexp(1.0f, -20);
      RowSet set;
      set.fmt = Fmt::kQ8_0;
      set.data = rows.data();
      set.row_bytes = 16;
      set.scale = scale.data();
      set.param_stride = 2;
      set.group = 8;
      set.positions = positions.data();
      set.n = 8;
      std::vector<float> out(8, 7.0f);
      detail::attn::token_scores(isa, set, 16, q.data(), 1, 0, out.data(), 8);
      const float want = std::ldexp(1.0f, -10) + std::ldexp(1.0f, -14) + std::ldexp(1.0f, -20) +
                         std::ldexp(1.0f, -24) + std::ldexp(1.0f, -30);
      for (float x : out) EXPECT_EQ(x, want) << what;
    }
    // Plain fp32 value sums, D = 8: rows 0 and 4 share partial sum 0: p_0 = 1 times -1, then
    // p_4 = 1 + 2^-12 times 1 + 2^-12; every other row has p = 0. Each channel: 2^-11 + 2^-24.
    {
      std::vector<float> rows(8 * 8, 0.0f), probs(8, 0.0f);
      for (int c = 0; c < 8; ++c) {
        rows[static_cast<std::size_t>(c)] = -1.0f;
        rows[static_cast<std::size_t>(4 * 8 + c)] = e12;
      }
      probs[0] = 1.0f;
      probs[4] = e12;
      const RowSet set = plain_f32_rows(rows, 8, positions.data(), 8);
      std::vector<float> A(4 * 8, 0.0f), out(8, 7.0f);
      detail::attn::token_values(isa, set, 0, 8, probs.data(), 1, 8, 0, A.data(), nullptr, 0);
      detail::attn::finish_values(A.data(), nullptr, 0, 8, 1, 8, out.data());
      for (float x : out) EXPECT_EQ(x, std::ldexp(1.0f, -11) + std::ldexp(1.0f, -24)) << what;
    }
  }
}

TEST(BlockFormat, Q8_0ByHand) {
  float x[32] = {};
  x[0] = 127.0f;
  x[1] = 2.5f;
  x[2] = -2.5f;
  x[3] = 0.49f;
  x[4] = -126.6f;
  x[5] = 3.5f;
  std::int8_t q[32];
  std::uint16_t d = 0;
  detail::quantize_q8_0_block(x, q, &d);
  EXPECT_EQ(d, 0x3C00);
  const int expect[6] = {127, 3, -3, 0, -127, 4};
  for (int j = 0; j < 6; ++j) EXPECT_EQ(q[j], expect[j]) << j;
  for (int j = 6; j < 32; ++j) EXPECT_EQ(q[j], 0) << j;
  // amax 63.5: d = 0.5 (fp16 0x3800), id = 2: 1.25 -> 2.5 -> 3; -0.75 -> -1.5 -> -2; 0.2 -> 0.4
  // -> 0.
  float y[32] = {};
  y[7] = -63.5f;
  y[8] = 1.25f;
  y[9] = -0.75f;
  y[10] = 0.2f;
  detail::quantize_q8_0_block(y, q, &d);
  EXPECT_EQ(d, 0x3800);
  EXPECT_EQ(q[7], -127);
  EXPECT_EQ(q[8], 3);
  EXPECT_EQ(q[9], -2);
  EXPECT_EQ(q[10], 0);
  // All zero: d = 0, id = 0, codes 0.
  float z[32] = {};
  detail::quantize_q8_0_block(z, q, &d);
  EXPECT_EQ(d, 0x0000);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(q[j], 0);
}

// ggml's q4_0 by hand. x[0] = -16 has the largest |x| (x[1] = 16 ties but comes later), so
// d = -16 / -8 = 2 (fp16 0x4000), id = 0.5, code = min(15, trunc(x * 0.5 + 8.5)):
//   -16 -> 0.5 -> 0;  16 -> 16.5 -> 15;  3 -> 10;  2.9 -> 9.95 -> 9;  0 -> 8.5 -> 8;
//   x[16] = -1 -> 8;  x[17] = 5 -> 11.
// Bytes: j | (j + 16) << 4: 0x80, 0xBF, 0x8A, 0x89, then 0x88.
TEST(BlockFormat, Q4_0ByHand) {
  float x[32] = {};
  x[0] = -16.0f;
  x[1] = 16.0f;
  x[2] = 3.0f;
  x[3] = 2.9f;
  x[16] = -1.0f;
  x[17] = 5.0f;
  std::uint8_t q[16];
  std::uint16_t d = 0;
  detail::quantize_q4_0_block(x, q, &d);
  EXPECT_EQ(d, 0x4000);
  EXPECT_EQ(q[0], 0x80);
  EXPECT_EQ(q[1], 0xBF);
  EXPECT_EQ(q[2], 0x8A);
  EXPECT_EQ(q[3], 0x89);
  for (int j = 4; j < 16; ++j) EXPECT_EQ(q[j], 0x88) << j;
  // The largest |x| positive: x = 8 gives d = -1, id = -1: 8 -> 0.5 -> 0 (value (0 - 8) * -1
  // = 8); -4 -> 12.5 -> 12 (value -4).
  float y[32] = {};
  y[5] = 8.0f;
  y[6] = -4.0f;
  detail::quantize_q4_0_block(y, q, &d);
  EXPECT_EQ(d, 0xBC00);  // -1
  EXPECT_EQ(q[5], 0x80);
  EXPECT_EQ(q[6], 0x8C);
}

// The store: the hand-made block read back (key_at = code * d), kept bytes exact, the fused
// scores and value sums against the dequantized rows, rows kept after an eviction.
TEST(BlockStore, HoldsGgmlBlocksAndAttendsOnThem) {
  for (bool q4 : {false, true}) {
    const std::int64_t D = 64;
    auto s = detail::make_block_store(q4, D);
    std::mt19937 rng(q4 ? 5 : 6);
    std::vector<float> k = random_vec(rng, 5 * D), v = random_vec(rng, 5 * D);
    // Row 0's first block: the q4_0 / q8_0 hand cases above.
    for (std::int64_t c = 0; c < 32; ++c) k[static_cast<std::size_t>(c)] = 0.0f;
    if (q4) {
      k[0] = -16.0f, k[1] = 16.0f, k[2] = 3.0f, k[3] = 2.9f, k[16] = -1.0f, k[17] = 5.0f;
    } else {
      k[0] = 127.0f, k[1] = 2.5f, k[2] = -2.5f, k[3] = 0.49f;
    }
    s->append(TensorRef::f32(k.data(), 1, 1, 5, D), TensorRef::f32(v.data(), 1, 1, 5, D), 0, 0,
              10);
    const HeadRows rows = s->rows();
    ASSERT_NE(rows.packed, nullptr);
    if (q4) {
      const float expect[6] = {-16.0f, 14.0f, 4.0f, 2.0f, 0.0f, 6.0f};  // (code - 8) * 2
      const int at[6] = {0, 1, 2, 3, 16, 17};
      for (int j = 0; j < 6; ++j) EXPECT_EQ(rows.packed->key_at(0, at[j]), expect[j]) << at[j];
    } else {
      const float expect[4] = {127.0f, 3.0f, -3.0f, 0.0f};
      for (int j = 0; j < 4; ++j) EXPECT_EQ(rows.packed->key_at(0, j), expect[j]) << j;
    }
    // Bytes: per row, keys and values: codes (D or D / 2) + 2 fp16 scales.
    const std::int64_t per_row = 2 * ((q4 ? D / 2 : D) + 2 * 2);
    EXPECT_EQ(s->bytes(), 5 * per_row);
    // Dropping row 1 keeps the others' numbers.
    std::vector<float> before(static_cast<std::size_t>(D));
    rows.packed->load_value(2, before.data());
    const std::int64_t idx[4] = {0, 2, 3, 4};
    s->keep(idx, 4);
    EXPECT_EQ(s->bytes(), 4 * per_row);
    EXPECT_LE(s->allocated_bytes(), s->resident_bytes());
    std::vector<float> after(static_cast<std::size_t>(D));
    s->rows().packed->load_value(1, after.data());
    EXPECT_EQ(before, after);
    // Fused attention against the dequantized rows (double).
    const HeadRows r2 = s->rows();
    const std::vector<float> q = random_vec(rng, 2 * D);
    std::vector<float> scores(2 * 4), out(2 * D), scratch(8 * 2 * D);
    r2.packed->attend_scores(q.data(), 2, 100, scores.data(), 4);
    std::vector<float> p = {0.1f, 0.2f, 0.3f, 0.4f, 0.25f, 0.25f, 0.25f, 0.25f};
    r2.packed->attend_values(p.data(), 2, 4, 100, out.data(), scratch.data());
    std::vector<float> kr(static_cast<std::size_t>(D)), vr(static_cast<std::size_t>(D));
    for (std::int64_t j = 0; j < 2; ++j) {
      std::vector<double> o(static_cast<std::size_t>(D), 0.0);
      for (std::int64_t r = 0; r < 4; ++r) {
        r2.packed->load_key(r, kr.data());
        r2.packed->load_value(r, vr.data());
        double ref = 0.0;
        for (std::int64_t c = 0; c < D; ++c) {
          ref += static_cast<double>(q[static_cast<std::size_t>(j * D + c)]) * kr[c];
          o[static_cast<std::size_t>(c)] += static_cast<double>(p[j * 4 + r]) * vr[c];
        }
        EXPECT_NEAR(scores[static_cast<std::size_t>(j * 4 + r)], ref, 1e-3 * (std::fabs(ref) + 1));
      }
      for (std::int64_t c = 0; c < D; ++c)
        EXPECT_NEAR(out[static_cast<std::size_t>(j * D + c)], o[static_cast<std::size_t>(c)], 1e-5);
    }
  }
  EXPECT_THROW(detail::make_block_store(false, 48), Error);
}

// kv_dtype=q8_0 / q4_0 on every method (merges included: a merged row is re-quantized), fed
// with true attention in chunks: deterministic, the full cache's rows within a step of ggml's
// grid, kept_bytes exactly the rows' codes and scales; the exclusive combinations are refused by name.
TEST(BlockStore, EveryMethodWithGgmlTypes) {
  constexpr std::int64_t H = 2, Hq = 4, D = 32, S = 90;
  const test::KV kv(1, H, S, D, 17);
  const std::vector<float> q = test::randn(static_cast<std::size_t>(Hq * S * D), 18);
  for (const char* type : {"q8_0", "q4_0"}) {
    for (const std::string& id : method_ids()) {
      const std::string spec = id + ":kv_dtype=" + type;
      if (id == "kivi") {
        test::expect_error([&] { CacheConfig::parse(spec); }, ErrorCode::kInvalidConfig,
                           {std::string("kv_dtype=") + type + " and kivi are exclusive"});
        continue;
      }
      // A method that prunes key channels by default (think) stores f16/f32 rows only.
      if (const CacheConfig d(id); d.has("think") && d.get_float("think") > 0.0) {
        test::expect_error([&] { CacheConfig::parse(spec); }, ErrorCode::kInvalidConfig,
                           {std::string("and kv_dtype=") + type + " are exclusive"});
        continue;
      }
      CacheConfig config = CacheConfig::parse(spec);
      if (has_token_budget(config)) config = with_token_budget(config, 40);
      auto run = [&]() {
        LayerCache c(config, LayerShape{H, D, Hq, 0, 1});
        test::give_key_filters(c, H, D);
        test::feed_attention(c, kv, q, Hq, 30, 0, 30);
        test::feed_attention(c, kv, q, Hq, 7, 30, S);
        return c;
      };
      const LayerCache a = run(), b = run();
      EXPECT_TRUE(test::snapshot(a, 1, H) == test::snapshot(b, 1, H)) << spec;
      const bool q4 = std::string(type) == "q4_0";
      std::int64_t rows = 0;
      for (std::int64_t h = 0; h < H; ++h) {
        const HeadRows r = a.stored(0, h);
        ASSERT_NE(r.packed, nullptr) << spec;
        rows += r.n_rows;
        // Rows never merged into (full: every row) are the input's, quantized: within half a
        // step of the input row at the row's position.
        if (id != "full") continue;
        for (std::int64_t i = 0; i < r.n_rows; ++i) {
          const float* x = kv.k.data() + (h * S + r.positions[i]) * D;
          float amax = 0.0f;
          for (std::int64_t c = 0; c < D; ++c) amax = std::max(amax, std::fabs(x[c]));
          // q8_0: half a step, plus the fp16 rounding of d (<= 127 * d * 2^-11); q4_0: a whole
          // step, which the clamp at code 15 reaches on the side opposite the block's max.
          const float bound = q4 ? amax / 8.0f * 1.1f : amax / 127.0f * 0.6f;
          for (std::int64_t c = 0; c < D; ++c)
            ASSERT_LE(std::fabs(r.key(i, c) - x[c]), bound + 1e-6f) << spec;
        }
      }
      EXPECT_EQ(a.stats().kept_bytes, rows * 2 * ((q4 ? D / 2 : D) + 2)) << spec;
      EXPECT_GE(a.stats().resident_bytes, a.stats().kept_bytes) << spec;
    }
  }
  test::expect_error([] { CacheConfig::parse("h2o:kv_dtype=q8_0,quantize=kivi2"); },
                     ErrorCode::kInvalidConfig,
                     {"kv_dtype=q8_0 and quantize=kivi2 are exclusive"});
  test::expect_error([] { CacheConfig::parse("h2o:kv_dtype=q4_0,demote=kivi4"); },
                     ErrorCode::kInvalidConfig, {"kv_dtype=q4_0 and demote=kivi4 are exclusive"});
}

}  // namespace
}  // namespace vq
