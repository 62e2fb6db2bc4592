// The paired percentile bootstrap of `eval --windows` (eval/report/bootstrap.h) against values worked
// out by hand: quantiles of small sorted lists, an interval from explicit resampling indices,
// and the exact resampling distribution of a three-window case (27 equally likely resamples).
// tests/bootstrap_reference.py checks result files against a NumPy re-implementation.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "eval/report/bootstrap.h"
#include "veloxquant/errors.h"

namespace vq::eval {
namespace {

TEST(Bootstrap, QuantilesInterpolateLinearlyAsNumPyDoes) {
  const std::vector<double> s = {1, 2, 3, 4};
  EXPECT_DOUBLE_EQ(quantile_sorted(s, 0.0), 1.0);
  EXPECT_DOUBLE_EQ(quantile_sorted(s, 1.0), 4.0);
  EXPECT_DOUBLE_EQ(quantile_sorted(s, 0.25), 1.75);  // h = 0.75: 1 + 0.75 (2 - 1)
  EXPECT_DOUBLE_EQ(quantile_sorted(s, 0.5), 2.5);
  EXPECT_DOUBLE_EQ(quantile_sorted({7}, 0.3), 7.0);
}

TEST(Bootstrap, IntervalFromExplicitIndices) {
  // Two windows, x = {0, 1}; the four resamples (0,0) (0,1) (1,1) (1,0) have means 0, .5, 1, .5.
  // Sorted {0, .5, .5, 1}: the 2.5% quantile at h = 0.025 * 3 = 0.075 is 0.075 * 0.5 = 0.0375,
  // the 97.5% quantile at h = 2.925 is 0.5 + 0.925 * 0.5 = 0.9625.
  const PairedBootstrap boot(2, std::vector<std::int64_t>{0, 0, 0, 1, 1, 1, 1, 0});
  EXPECT_EQ(boot.samples(), 4);
  const Interval i = boot.interval({0.0, 1.0});
  EXPECT_NEAR(i.lo, 0.0375, 1e-12);
  EXPECT_NEAR(i.hi, 0.9625, 1e-12);
  EXPECT_THROW(PairedBootstrap(2, std::vector<std::int64_t>{0, 2}), Error);
  EXPECT_THROW(PairedBootstrap(2, std::vector<std::int64_t>{0, 1, 1}), Error);
}

TEST(Bootstrap, ResamplingMatchesTheExactDistributionOfThreeWindows) {
  // x = {0, 0, 3}: a resample's mean is k (the number of times window 2 is drawn), k ~
  // Binomial(3, 1/3): P = 8/27, 12/27, 6/27, 1/27 for means 0, 1, 2, 3. So the 2.5% quantile is
  // 0 and the 97.5% quantile is 3 (P(mean <= 2) = 26/27 = 0.963 < 0.975).
  const std::int64_t B = 20000;
  const PairedBootstrap boot(3, B, 7);
  const std::vector<double> means = boot.resample_means({0.0, 0.0, 3.0});
  std::map<double, double> share;
  for (const double m : means) share[m] += 1.0 / static_cast<double>(B);
  const double p[] = {8.0 / 27, 12.0 / 27, 6.0 / 27, 1.0 / 27};
  for (int k = 0; k < 4; ++k) {
    // Within 5 standard errors of a binomial share over B resamples.
    const double se = std::sqrt(p[k] * (1 - p[k]) / static_cast<double>(B));
    EXPECT_NEAR(share[static_cast<double>(k)], p[k], 5 * se) << "mean " << k;
  }
  const Interval i = boot.interval({0.0, 0.0, 3.0});
  EXPECT_EQ(i.lo, 0.0);
  EXPECT_EQ(i.hi, 3.0);
}

TEST(Bootstrap, PairingRemovesTheSharedWindowEffect) {
  // b varies a lot from window to window; a = b + 2 on every window. The paired difference is
  // exactly 2 in every resample; the unpaired interval of a is wide.
  const std::vector<double> b = {1, 5, 2, 8, 3, 13};
  std::vector<double> a;
  for (const double v : b) a.push_back(v + 2);
  const PairedBootstrap boot(6, 5000, 3);
  const Interval d = boot.paired_difference(a, b);
  EXPECT_EQ(d.lo, 2.0);
  EXPECT_EQ(d.hi, 2.0);
  const Interval ia = boot.interval(a);
  EXPECT_GT(ia.hi - ia.lo, 4.0);
  EXPECT_THROW((void)boot.paired_difference(a, {1, 2}), Error);
}

TEST(Bootstrap, SameSeedSameIndicesAndEveryIndexInRange) {
  const PairedBootstrap a(16, 1000, 42), b(16, 1000, 42), c(16, 1000, 43);
  bool differs = false;
  std::vector<std::int64_t> count(16, 0);
  for (std::int64_t s = 0; s < 1000; ++s) {
    for (std::int64_t j = 0; j < 16; ++j) {
      ASSERT_EQ(a.index(s, j), b.index(s, j));
      ASSERT_GE(a.index(s, j), 0);
      ASSERT_LT(a.index(s, j), 16);
      ++count[static_cast<std::size_t>(a.index(s, j))];
      differs = differs || a.index(s, j) != c.index(s, j);
    }
  }
  EXPECT_TRUE(differs);
  // 16000 draws, 1000 expected per window: each within 5 binomial standard errors (~30.6).
  for (const std::int64_t n : count) EXPECT_NEAR(static_cast<double>(n), 1000.0, 5 * 30.6);
  EXPECT_THROW(PairedBootstrap(0, 10, 1), Error);
  EXPECT_THROW(PairedBootstrap(4, 0, 1), Error);
}

}  // namespace
}  // namespace vq::eval
