// Per-layer budget schedules.
#pragma once

#include <cstdint>
#include <vector>

namespace vq::detail {

// PyramidKV: a straight line from the bottom layer (largest) to the top (smallest) whose mean
// is `average`. With the protected window w: min = (C - w) / beta, max = 2 (C - w) - min,
// b_l = max - l (max - min) / (L - 1) + w. Integer budgets whose sum is exactly L * C: each
// b_l rounded down, the deficit given one row each to the largest fractional parts (ties to
// the lower layer); layers below `floor` are raised to it and the excess is taken one row at a
// time from the largest budget (ties to the higher layer), so the schedule stays
// non-increasing. Needs floor <= average (the config check guarantees it). L = 1 gives C.
std::vector<std::int64_t> pyramid_budgets(std::int64_t average, std::int64_t n_layers, double beta,
                                          std::int64_t window, std::int64_t floor);

// 1-D k-means with k = min(3, distinct values): centroids start at the smallest, median and
// largest value; points go to the nearest centroid (ties to the lower one); iterates until
// stable (at most 100 rounds). Returns each point's cluster, clusters numbered by increasing
// centroid.
std::vector<int> kmeans_1d(const std::vector<double>& values);

// SqueezeAttention: the layers of the least important cluster (lowest importance) get
// C - strength * (C - max(floor, round(C * fraction))); what they give up is shared evenly by the
// other layers (remainder to the lowest layer indices), so the total stays L * C. Uniform when
// there is a single cluster.
std::vector<std::int64_t> squeeze_budgets(const std::vector<double>& importance,
                                          std::int64_t average, double strength, double fraction,
                                          std::int64_t floor);

double mean_of(const std::vector<std::int64_t>& budgets);

}  // namespace vq::detail
