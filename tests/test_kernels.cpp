// fp16 conversion, the fixed-order kernels (each against a plain scalar reference written
// out in the documented order), the counter RNG and the floating-point environment guard.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "base/float_env.h"
#include "base/kernels.h"
#include "base/rng.h"
#include "test_util.h"

namespace vq {
namespace {

std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(Half, EveryHalfRoundTripsExactly) {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    const float f = half_to_float(bits);
    const bool nan = ((h >> 10) & 0x1f) == 0x1f && (h & 0x3ff) != 0;
    if (nan) {
      EXPECT_TRUE(std::isnan(f)) << h;
      EXPECT_EQ(float_to_half(f) & 0x7c00, 0x7c00);
      continue;
    }
    ASSERT_EQ(float_to_half(f), bits) << "half 0x" << std::hex << h;
  }
}

TEST(Half, MatchesCompilerFloat16RoundingOnRandomAndEdgeFloats) {
  // _Float16 (GCC) is an independent reference for IEEE round-to-nearest-even.
  std::vector<float> xs = {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, 1e-8f, 2.98023224e-8f,
                           5.96046448e-8f, 6.1035156e-5f, 6.1e-5f, 1.0f + 1.0f / 2048.0f,
                           1.0f + 3.0f / 2048.0f, std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::denorm_min()};
  CounterRng rng(1, 2, 3);
  for (std::uint64_t i = 0; i < 200000; ++i) {
    // Random bit patterns over the whole range, excluding NaN.
    const std::uint32_t u = static_cast<std::uint32_t>(rng.bits(i));
    const float f = from_bits(u);
    if (!std::isnan(f)) xs.push_back(f);
  }
  for (float x : xs) {
    const _Float16 ref = static_cast<_Float16>(x);
    std::uint16_t ref_bits;
    std::memcpy(&ref_bits, &ref, 2);
    ASSERT_EQ(float_to_half(x), ref_bits) << "x = " << x << " bits 0x" << std::hex << bits_of(x);
  }
}

TEST(Half, BulkConversionMatchesScalar) {
  auto xs = test::randn(1003, 5, 300.0f);
  xs[7] = 1e-6f;  // subnormal in fp16
  xs[8] = -3e-8f;
  std::vector<std::uint16_t> h(xs.size());
  kernels::f32_to_f16(xs.data(), h.data(), static_cast<std::int64_t>(xs.size()));
  std::vector<float> back(xs.size());
  kernels::f16_to_f32(h.data(), back.data(), static_cast<std::int64_t>(xs.size()));
  for (std::size_t i = 0; i < xs.size(); ++i) {
    ASSERT_EQ(h[i], float_to_half(xs[i])) << i;
    ASSERT_EQ(bits_of(back[i]), bits_of(half_to_float(h[i]))) << i;
  }
}

// The documented order: lane l = i mod 8 accumulates in increasing i with one fused
// multiply-add per term (std::fma: a single rounding), then ((l0+l4)+(l2+l6)) +
// ((l1+l5)+(l3+l7)).
float reference_dot(const float* a, const float* b, std::int64_t n) {
  float lane[8] = {};
  for (std::int64_t i = 0; i < n; ++i) lane[i % 8] = std::fma(a[i], b[i], lane[i % 8]);
  return ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
}

// A value worked out by hand where a fused multiply-add and a multiply-then-add differ: lane 0
// gets 1 * -1 = -1 (i = 0), then (1 + 2^-12)^2 = 1 + 2^-11 + 2^-24 (i = 8). Fused, the sum is
// exact: 2^-11 + 2^-24. A separate multiply would first round the square to 1 + 2^-11 (2^-24 is
// half an ulp of 1: a tie, to even) and give 2^-11. Every other term is 0. With fp16 rows: a =
// 1 + 2^-10 (an fp16), b = 1 + 2^-14: the product 1 + 2^-10 + 2^-14 + 2^-24 is exact fused
// (2^-10 + 2^-14 + 2^-24 after the -1), 2^-10 + 2^-14 rounded first.
TEST(Kernels, DotFusesEachMultiplyAddIntoOneRounding) {
  for (const std::int64_t n : {9, 16, 24}) {  // scalar tail (9) and whole blocks of 8
    std::vector<float> a(static_cast<std::size_t>(n), 0.0f), b = a;
    a[0] = 1.0f;
    b[0] = -1.0f;
    a[8] = b[8] = 1.0f + std::ldexp(1.0f, -12);
    const float want = std::ldexp(1.0f, -11) + std::ldexp(1.0f, -24);  // exact in fp32
    EXPECT_EQ(kernels::dot(a.data(), b.data(), n), want) << n;
    EXPECT_NE(want, std::ldexp(1.0f, -11));
    // The eight-row path (n a multiple of 8): every row the same.
    if (n % 8 == 0) {
      std::vector<float> rows;
      for (int r = 0; r < 9; ++r) rows.insert(rows.end(), a.begin(), a.end());
      std::vector<float> got(9);
      kernels::dot_rows(rows.data(), DType::kF32, n, b.data(), n, 9, got.data());
      for (int r = 0; r < 9; ++r)
        EXPECT_EQ(got[static_cast<std::size_t>(r)], want) << n << " " << r;
    }
    std::vector<std::uint16_t> ah(static_cast<std::size_t>(n), float_to_half(0.0f));
    ah[0] = float_to_half(1.0f);
    ah[8] = float_to_half(1.0f + std::ldexp(1.0f, -10));
    ASSERT_EQ(half_to_float(ah[8]), 1.0f + std::ldexp(1.0f, -10));
    b[8] = 1.0f + std::ldexp(1.0f, -14);
    const float want16 = std::ldexp(1.0f, -10) + std::ldexp(1.0f, -14) + std::ldexp(1.0f, -24);
    EXPECT_EQ(kernels::dot_f16(ah.data(), b.data(), n), want16) << n;
    if (n % 8 == 0) {
      std::vector<std::uint16_t> rows;
      for (int r = 0; r < 9; ++r) rows.insert(rows.end(), ah.begin(), ah.end());
      std::vector<float> got(9);
      kernels::dot_rows(rows.data(), DType::kF16, n, b.data(), n, 9, got.data());
      for (int r = 0; r < 9; ++r)
        EXPECT_EQ(got[static_cast<std::size_t>(r)], want16) << n << " " << r;
    }
  }
}

TEST(Kernels, DotIsBitIdenticalToTheDocumentedOrder) {
  for (std::int64_t n : {0, 1, 3, 7, 8, 9, 15, 16, 17, 64, 100, 128, 257}) {
    const auto a = test::randn(static_cast<std::size_t>(n), 10 + n, 3.0f);
    const auto b = test::randn(static_cast<std::size_t>(n), 20 + n, 0.1f);
    const float got = kernels::dot(a.data(), b.data(), n);
    const float want = reference_dot(a.data(), b.data(), n);
    ASSERT_EQ(bits_of(got), bits_of(want)) << "n = " << n;
    // fp16 rows: same order on the exactly converted values.
    std::vector<std::uint16_t> ah(a.size());
    std::vector<float> af(a.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      ah[i] = float_to_half(a[i]);
      af[i] = half_to_float(ah[i]);
    }
    ASSERT_EQ(bits_of(kernels::dot_f16(ah.data(), b.data(), n)),
              bits_of(reference_dot(af.data(), b.data(), n)))
        << "n = " << n;
  }
}

TEST(Kernels, BatchedRowDotsEqualTheDocumentedOrderPerRow) {
  // dot_rows (eight rows at a time with AVX2 when n is a multiple of 8) against the documented
  // order, row by row: row counts around the block of 8, strides past the row, fp32 and fp16.
  for (const std::int64_t n : {1, 7, 8, 16, 64, 128}) {
    for (const std::int64_t count : {0, 1, 7, 8, 9, 17, 40}) {
      const std::int64_t stride = n + 5;
      const auto rows = test::randn(static_cast<std::size_t>(count * stride + 1), 30 + n, 2.0f);
      const auto q = test::randn(static_cast<std::size_t>(n), 40 + count, 0.5f);
      std::vector<std::uint16_t> rh(rows.size());
      std::vector<float> rf(rows.size());
      for (std::size_t i = 0; i < rows.size(); ++i) {
        rh[i] = float_to_half(rows[i]);
        rf[i] = half_to_float(rh[i]);
      }
      std::vector<float> got(static_cast<std::size_t>(count) + 1, -7.0f);
      kernels::dot_rows(rows.data(), DType::kF32, stride, q.data(), n, count, got.data());
      for (std::int64_t r = 0; r < count; ++r) {
        ASSERT_EQ(bits_of(got[static_cast<std::size_t>(r)]),
                  bits_of(reference_dot(rows.data() + r * stride, q.data(), n)))
            << "f32 n " << n << " count " << count << " row " << r;
      }
      ASSERT_EQ(got[static_cast<std::size_t>(count)], -7.0f) << "wrote past count";
      kernels::dot_rows(rh.data(), DType::kF16, stride, q.data(), n, count, got.data());
      for (std::int64_t r = 0; r < count; ++r) {
        ASSERT_EQ(bits_of(got[static_cast<std::size_t>(r)]),
                  bits_of(reference_dot(rf.data() + r * stride, q.data(), n)))
            << "f16 n " << n << " count " << count << " row " << r;
      }
    }
  }
}

TEST(Kernels, SoftmaxIsExpMinusMaxNormalised) {
  std::vector<float> x = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f, -200.0f, 10.0f, 9.99f, 0.0f};
  std::vector<float> want(x.size());
  float m = -INFINITY;
  for (float v : x) m = std::max(m, v);
  for (std::size_t i = 0; i < x.size(); ++i) want[i] = std::exp(x[i] - m);
  const float s = reference_dot(want.data(), std::vector<float>(x.size(), 1.0f).data(),
                                static_cast<std::int64_t>(x.size()));
  for (auto& w : want) w = w / s;
  kernels::softmax(x.data(), static_cast<std::int64_t>(x.size()));
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_EQ(bits_of(x[i]), bits_of(want[i])) << i;
  // exp(-210) underflows to exactly 0 in fp32: no flush-to-zero games, a true IEEE zero.
  EXPECT_EQ(x[5], 0.0f);
}

TEST(Kernels, SoftmaxKeepsSubnormalWeightsEvenUnderFlushToZero) {
  // exp(-100) ~ 3.7e-44 is an fp32 subnormal: with FTZ it would become 0 and tie.
  std::vector<float> x = {0.0f, -100.0f, -101.0f};
  {
    FloatEnvGuard guard;  // what the cache does around scoring
    kernels::softmax(x.data(), 3);
  }
  EXPECT_GT(x[1], 0.0f);
  EXPECT_GT(x[1], x[2]);
}

#ifdef VQ_HAVE_MXCSR
TEST(Kernels, FloatEnvGuardClearsAndRestoresFtzDaz) {
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | FloatEnvGuard::kFtz | FloatEnvGuard::kDaz);
  {
    FloatEnvGuard guard;
    EXPECT_EQ(_mm_getcsr() & (FloatEnvGuard::kFtz | FloatEnvGuard::kDaz), 0u);
    volatile float tiny = 1e-39f;  // subnormal
    volatile float half = 0.5f;
    EXPECT_GT(tiny * half, 0.0f);
  }
  EXPECT_EQ(_mm_getcsr() & (FloatEnvGuard::kFtz | FloatEnvGuard::kDaz),
            FloatEnvGuard::kFtz | FloatEnvGuard::kDaz);
  _mm_setcsr(saved);
}

TEST(Kernels, CacheDecisionsDoNotDependOnTheCallersFtzSetting) {
  // Proxy logits with gaps over 100 give subnormal weights; FTZ would change the ranking.
  test::KV kv(1, 2, 96, 16, 77);
  for (auto& x : kv.k) x *= 12.0f;
  auto run = [&](bool ftz) {
    const unsigned saved = _mm_getcsr();
    if (ftz) _mm_setcsr(saved | FloatEnvGuard::kFtz | FloatEnvGuard::kDaz);
    LayerCache c = test::make_cache("h2o:budget=24,grace=2,decay=1");
    test::feed(c, kv, 1);
    _mm_setcsr(saved);
    return test::snapshot(c, 1, 2);
  };
  EXPECT_TRUE(run(false) == run(true));
}
#endif

TEST(Kernels, ArgminEvictTiesAndNaN) {
  const float inf = INFINITY, nan = NAN;
  std::vector<float> a = {3, 1, 2, 1, inf};
  EXPECT_EQ(kernels::argmin_evict(a.data(), 5), 1);  // tie -> lowest index
  std::vector<float> b = {3, nan, 0, nan};
  EXPECT_EQ(kernels::argmin_evict(b.data(), 4), 1);  // NaN never wins a keep
  EXPECT_EQ(kernels::argmin_evict(b.data(), 0), -1);
  std::vector<float> c = {2, 5, nan, 5, 1};
  EXPECT_EQ(kernels::argmax_keep(c.data(), 5), 1);
  std::vector<float> d = {nan, nan};
  EXPECT_EQ(kernels::argmax_keep(d.data(), 2), -1);
}

TEST(Kernels, CosineHandlesZeroVectors) {
  std::vector<float> z(8, 0.0f), a = test::randn(8, 3);
  EXPECT_EQ(kernels::cosine(z.data(), a.data(), 8), 0.0f);
  EXPECT_NEAR(kernels::cosine(a.data(), a.data(), 8), 1.0f, 1e-6f);
  std::vector<float> neg(a);
  for (auto& x : neg) x = -x;
  EXPECT_NEAR(kernels::cosine(a.data(), neg.data(), 8), -1.0f, 1e-6f);
}

TEST(Rng, CounterStreamsArePureFunctionsOfTheirKey) {
  CounterRng a(42, 3, 1), b(42, 3, 1), c(43, 3, 1), d(42, 4, 1), e(42, 3, 2);
  for (std::uint64_t i = 0; i < 100; ++i) {
    EXPECT_EQ(a.bits(i), b.bits(i));
    EXPECT_NE(a.bits(i), c.bits(i));
    EXPECT_NE(a.bits(i), d.bits(i));
    EXPECT_NE(a.bits(i), e.bits(i));
  }
  // Draw 57 does not depend on whether draws 0..56 were made.
  EXPECT_EQ(CounterRng(42, 3, 1).uniform(57), a.uniform(57));
}

TEST(Rng, UniformIsInRangeWithTheRightMean) {
  CounterRng r(7, 0, 0);
  double sum = 0;
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    const double u = r.uniform(static_cast<std::uint64_t>(i));
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / n, 0.5, 0.005);
  double ss = 0;
  for (int i = 0; i < n; ++i) ss += r.normal(static_cast<std::uint64_t>(i));
  EXPECT_NEAR(ss / n, 0.0, 0.02);
}

}  // namespace
}  // namespace vq
