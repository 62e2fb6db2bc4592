#include "eval/report/bootstrap.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "base/rng.h"
#include "veloxquant/errors.h"

namespace vq::eval {

double quantile_sorted(const std::vector<double>& s, double q) {
  if (s.empty()) throw Error(ErrorCode::kInvalidArgument, "[bootstrap] quantile of no values");
  const double h = q * static_cast<double>(s.size() - 1);
  const auto i = static_cast<std::size_t>(std::floor(h));
  if (i + 1 >= s.size()) return s.back();
  return s[i] + (h - static_cast<double>(i)) * (s[i + 1] - s[i]);
}

double mean_of(const std::vector<double>& x) {
  double sum = 0;
  for (const double v : x) sum += v;
  return x.empty() ? 0.0 : sum / static_cast<double>(x.size());
}

PairedBootstrap::PairedBootstrap(std::int64_t n_windows, std::int64_t samples, std::uint64_t seed)
    : n_(n_windows), b_(samples) {
  if (n_windows < 1 || samples < 1) {
    throw Error(ErrorCode::kInvalidArgument,
                "[bootstrap] needs at least one window and one resample, got " +
                    std::to_string(n_windows) + " windows and " + std::to_string(samples) +
                    " resamples");
  }
  const CounterRng rng(seed, 0, 0);
  idx_.resize(static_cast<std::size_t>(b_ * n_));
  const auto n = static_cast<double>(n_);
  for (std::int64_t c = 0; c < b_ * n_; ++c) {
    const auto j = static_cast<std::int64_t>(rng.uniform(static_cast<std::uint64_t>(c)) * n);
    idx_[static_cast<std::size_t>(c)] = std::min(j, n_ - 1);  // uniform < 1: never clamps
  }
}

PairedBootstrap::PairedBootstrap(std::int64_t n_windows, std::vector<std::int64_t> indices)
    : n_(n_windows), b_(0), idx_(std::move(indices)) {
  if (n_ < 1 || idx_.empty() || idx_.size() % static_cast<std::size_t>(n_) != 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "[bootstrap] indices must be a non-empty [samples][n_windows] table");
  }
  for (const std::int64_t i : idx_) {
    if (i < 0 || i >= n_)
      throw Error(ErrorCode::kInvalidArgument, "[bootstrap] index out of range");
  }
  b_ = static_cast<std::int64_t>(idx_.size()) / n_;
}

std::vector<double> PairedBootstrap::resample_means(const std::vector<double>& x) const {
  if (static_cast<std::int64_t>(x.size()) != n_) {
    throw Error(ErrorCode::kInvalidArgument,
                "[bootstrap] " + std::to_string(x.size()) + " values for " + std::to_string(n_) +
                    " windows");
  }
  std::vector<double> means(static_cast<std::size_t>(b_));
  for (std::int64_t b = 0; b < b_; ++b) {
    double sum = 0;
    for (std::int64_t j = 0; j < n_; ++j) sum += x[static_cast<std::size_t>(index(b, j))];
    means[static_cast<std::size_t>(b)] = sum / static_cast<double>(n_);
  }
  return means;
}

Interval PairedBootstrap::interval(const std::vector<double>& x) const {
  std::vector<double> m = resample_means(x);
  std::sort(m.begin(), m.end());
  const double tail = (1.0 - kLevel) / 2.0;
  return {quantile_sorted(m, tail), quantile_sorted(m, 1.0 - tail)};
}

Interval PairedBootstrap::paired_difference(const std::vector<double>& a,
                                            const std::vector<double>& b) const {
  if (a.size() != b.size()) {
    throw Error(ErrorCode::kInvalidArgument, "[bootstrap] paired values of different lengths");
  }
  std::vector<double> d(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return interval(d);
}

}  // namespace vq::eval
