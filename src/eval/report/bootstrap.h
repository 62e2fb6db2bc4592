// Paired percentile bootstrap over evaluation windows (`veloxquant eval --windows`).
//
// A run over N windows gives one value per window for every configuration (mean NLL, KL, top-1
// agreement). The bootstrap draws B resamples of N window indices with replacement, the SAME
// indices for every configuration (paired: a method and the full cache, or two methods, are
// always compared on the same windows), and takes the mean of each resample. The 95% interval
// is the percentile interval: the 2.5% and 97.5% quantiles of the B resample means, with
// NumPy's default ("linear") quantile rule: q-quantile of sorted s[0..B) at h = q (B - 1),
// s[floor h] + (h - floor h) (s[floor h + 1] - s[floor h]).
//
// Resampling indices (so another implementation can replay them exactly): with the counter RNG
// of base/rng.h, rng = CounterRng(seed, 0, 0), index j of resample b is
//   floor(rng.uniform(b * N + j) * N),   uniform(c) = (mix64(key + (c + 1) * golden) >> 11) * 2^-53
// in IEEE double. A resample mean is the sequential double sum of its N values divided by N.
// tests/bootstrap_reference.py re-implements this from the definition (NumPy).
#pragma once

#include <cstdint>
#include <vector>

namespace vq::eval {

struct Interval {
  double lo = 0, hi = 0;
  bool contains(double v) const noexcept { return lo <= v && v <= hi; }
};

// The q-quantile (q in [0, 1]) of `sorted` (ascending, not empty) by linear interpolation.
double quantile_sorted(const std::vector<double>& sorted, double q);

// The mean of x: the sequential sum divided by the count (0 for an empty vector).
double mean_of(const std::vector<double>& x);

class PairedBootstrap {
 public:
  static constexpr double kLevel = 0.95;
  // n_windows >= 1, samples >= 1; throws Error(kInvalidArgument) otherwise.
  PairedBootstrap(std::int64_t n_windows, std::int64_t samples, std::uint64_t seed);
  // Explicit resampling indices ([samples][n_windows], each in [0, n_windows)), for tests.
  PairedBootstrap(std::int64_t n_windows, std::vector<std::int64_t> indices);

  std::int64_t n_windows() const noexcept { return n_; }
  std::int64_t samples() const noexcept { return b_; }
  // Index j of resample b.
  std::int64_t index(std::int64_t b, std::int64_t j) const noexcept {
    return idx_[static_cast<std::size_t>(b * n_ + j)];
  }
  // The B resample means of x ([n_windows] per-window values), in resample order.
  std::vector<double> resample_means(const std::vector<double>& x) const;
  // The 95% percentile interval of the mean of x.
  Interval interval(const std::vector<double>& x) const;
  // The 95% interval of the mean of the paired differences a - b (same windows, same sizes).
  Interval paired_difference(const std::vector<double>& a, const std::vector<double>& b) const;

 private:
  std::int64_t n_, b_;
  std::vector<std::int64_t> idx_;  // [b_][n_]
};

}  // namespace vq::eval
