#include "policies/schedules.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "veloxquant/errors.h"

namespace vq::detail {

std::vector<std::int64_t> pyramid_budgets(std::int64_t average, std::int64_t n_layers, double beta,
                                          std::int64_t window, std::int64_t floor) {
  std::vector<std::int64_t> out(static_cast<std::size_t>(n_layers), average);
  if (n_layers <= 1) return out;
  VQ_ASSERT(floor <= average, "pyramid: the floor exceeds the average (the config check rejects it)");
  const std::int64_t total = average * n_layers;
  const double span = static_cast<double>(average - window);
  const double lo = span / beta;
  const double hi = 2.0 * span - lo;
  // The line, rounded down; the rounding deficit goes, one row each, to the layers with the
  // largest fractional parts (ties to the lower layer), so the total is exactly L * C.
  std::vector<double> frac(static_cast<std::size_t>(n_layers));
  std::int64_t sum = 0;
  for (std::int64_t l = 0; l < n_layers; ++l) {
    const double b = hi - static_cast<double>(l) * (hi - lo) / static_cast<double>(n_layers - 1) +
                     static_cast<double>(window);
    const double f = std::floor(b);
    out[static_cast<std::size_t>(l)] = static_cast<std::int64_t>(f);
    frac[static_cast<std::size_t>(l)] = b - f;
    sum += out[static_cast<std::size_t>(l)];
  }
  std::vector<std::int64_t> order(static_cast<std::size_t>(n_layers));
  std::iota(order.begin(), order.end(), std::int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
    return frac[static_cast<std::size_t>(a)] > frac[static_cast<std::size_t>(b)];
  });
  for (std::size_t k = 0; sum < total; k = (k + 1) % order.size()) {
    ++out[static_cast<std::size_t>(order[k])];
    ++sum;
  }
  // Layers below the floor are raised to it; the excess comes off the largest budgets, one row
  // at a time (ties to the higher layer, so the schedule stays non-increasing).
  for (auto& b : out) {
    if (b < floor) sum += floor - b, b = floor;
  }
  while (sum > total) {
    std::size_t top = 0;
    for (std::size_t l = 1; l < out.size(); ++l) {
      if (out[l] >= out[top]) top = l;
    }
    VQ_ASSERT(out[top] > floor, "pyramid: no budget above the floor to take from");
    --out[top];
    --sum;
  }
  return out;
}

std::vector<int> kmeans_1d(const std::vector<double>& values) {
  const std::size_t n = values.size();
  std::vector<int> assign(n, 0);
  if (n == 0) return assign;
  std::vector<double> sorted(values);
  std::sort(sorted.begin(), sorted.end());
  std::vector<double> distinct(sorted);
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  if (distinct.size() == 1) return assign;
  std::vector<double> c;
  if (distinct.size() == 2) {
    c = {distinct.front(), distinct.back()};
  } else {
    c = {sorted.front(), sorted[n / 2], sorted.back()};
    if (c[1] == c[0] || c[1] == c[2]) c[1] = distinct[distinct.size() / 2];
  }
  for (int round = 0; round < 100; ++round) {
    bool changed = round == 0;
    for (std::size_t i = 0; i < n; ++i) {
      int best = 0;
      for (int k = 1; k < static_cast<int>(c.size()); ++k) {
        if (std::fabs(values[i] - c[static_cast<std::size_t>(k)]) <
            std::fabs(values[i] - c[static_cast<std::size_t>(best)])) {
          best = k;
        }
      }
      if (assign[i] != best) changed = true;
      assign[i] = best;
    }
    if (!changed) break;
    for (std::size_t k = 0; k < c.size(); ++k) {
      double sum = 0;
      int count = 0;
      for (std::size_t i = 0; i < n; ++i) {
        if (assign[i] == static_cast<int>(k)) sum += values[i], ++count;
      }
      if (count > 0) c[k] = sum / count;
    }
  }
  // Renumber clusters by increasing centroid, dropping empty ones.
  std::vector<int> order(c.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return c[static_cast<std::size_t>(a)] < c[static_cast<std::size_t>(b)];
  });
  std::vector<int> rank(c.size(), -1);
  int next = 0;
  for (int k : order) {
    if (std::count(assign.begin(), assign.end(), k) > 0) rank[static_cast<std::size_t>(k)] = next++;
  }
  for (auto& a : assign) a = rank[static_cast<std::size_t>(a)];
  return assign;
}

std::vector<std::int64_t> squeeze_budgets(const std::vector<double>& importance,
                                          std::int64_t average, double strength, double fraction,
                                          std::int64_t floor) {
  const std::size_t L = importance.size();
  std::vector<std::int64_t> out(L, average);
  const std::vector<int> cluster = kmeans_1d(importance);
  const std::int64_t n_low = std::count(cluster.begin(), cluster.end(), 0);
  if (n_low == 0 || n_low == static_cast<std::int64_t>(L)) return out;
  const std::int64_t reduced_full = std::max(
      floor, static_cast<std::int64_t>(std::floor(static_cast<double>(average) * fraction + 0.5)));
  const std::int64_t low = std::min(
      average, static_cast<std::int64_t>(std::floor(
                   static_cast<double>(average) -
                   strength * static_cast<double>(average - reduced_full) + 0.5)));
  const std::int64_t freed = (average - low) * n_low;
  const std::int64_t n_other = static_cast<std::int64_t>(L) - n_low;
  std::int64_t remainder = freed % n_other;
  for (std::size_t l = 0; l < L; ++l) {
    if (cluster[l] == 0) {
      out[l] = low;
    } else {
      out[l] = average + freed / n_other + (remainder > 0 ? 1 : 0);
      if (remainder > 0) --remainder;
    }
  }
  return out;
}

double mean_of(const std::vector<std::int64_t>& budgets) {
  if (budgets.empty()) return 0.0;
  return static_cast<double>(std::accumulate(budgets.begin(), budgets.end(), std::int64_t{0})) /
         static_cast<double>(budgets.size());
}

}  // namespace vq::detail
