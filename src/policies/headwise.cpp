#include "policies/headwise.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "veloxquant/errors.h"

namespace vq::detail {

HeadwiseRule headwise_rule_from(const CacheConfig& config) {
  HeadwiseRule rule;
  if (config.has("headwise")) rule.on = config.get_bool("headwise");
  if (config.has("headwise_floor")) rule.floor = config.get_float("headwise_floor");
  return rule;
}

namespace {

// Whether candidate (x, row a) leaves before (y, row b): NaN first, then the lower value, ties
// to the lower row (newer_first: the higher).
bool leaves_before(float x, std::int64_t a, float y, std::int64_t b, bool newer_first) {
  const bool nx = std::isnan(x), ny = std::isnan(y);
  if (nx || ny) {
    if (!(nx && ny)) return nx;
  } else if (x != y) {
    return x < y;
  }
  return newer_first ? a > b : a < b;
}

struct Candidate {
  float score;
  std::int64_t head;
  std::int64_t row;
};

}  // namespace

void headwise_losers(const std::vector<std::vector<float>>& ranking, std::int64_t budget,
                     double alpha, std::vector<std::vector<std::int64_t>>& losers,
                     bool newer_first) {
  const std::int64_t H = static_cast<std::int64_t>(ranking.size());
  losers.resize(static_cast<std::size_t>(H));
  for (auto& l : losers) l.clear();
  std::int64_t total = 0;
  for (const auto& r : ranking) total += static_cast<std::int64_t>(r.size());
  const std::int64_t keep_total = H * budget;
  if (budget < 0 || total <= keep_total) return;
  const float inf = std::numeric_limits<float>::infinity();
  std::int64_t guaranteed = 0;
  std::vector<Candidate> pool;
  std::vector<std::int64_t> order;
  for (std::int64_t h = 0; h < H; ++h) {
    const std::vector<float>& rank = ranking[static_cast<std::size_t>(h)];
    const std::int64_t n = static_cast<std::int64_t>(rank.size());
    order.clear();
    for (std::int64_t i = 0; i < n; ++i) {
      if (!(rank[static_cast<std::size_t>(i)] == inf)) order.push_back(i);
    }
    const std::int64_t p = n - static_cast<std::int64_t>(order.size());
    VQ_ASSERT(p <= budget, "head-wise cut with more protected rows than the budget");
    // Leaving order; the floor keeps the last f of it.
    std::sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
      return leaves_before(rank[static_cast<std::size_t>(a)], a, rank[static_cast<std::size_t>(b)], b,
                           newer_first);
    });
    const auto f = std::min(
        static_cast<std::int64_t>(order.size()),
        static_cast<std::int64_t>(
            std::floor(alpha * static_cast<double>(std::max<std::int64_t>(0, budget - p)))));
    guaranteed += p + f;
    const std::int64_t open = static_cast<std::int64_t>(order.size()) - f;
    for (std::int64_t k = 0; k < open; ++k) {
      const std::int64_t i = order[static_cast<std::size_t>(k)];
      pool.push_back(Candidate{rank[static_cast<std::size_t>(i)], h, i});
    }
  }
  VQ_ASSERT(guaranteed <= keep_total, "head-wise floors exceed the layer's budget");
  const std::int64_t leave = total - keep_total;  // <= pool.size() since guaranteed <= keep_total
  // The pool is in head order, so the stable sort breaks full ties to the lowest head.
  std::stable_sort(pool.begin(), pool.end(), [&](const Candidate& a, const Candidate& b) {
    return leaves_before(a.score, a.row, b.score, b.row, newer_first);
  });
  for (std::int64_t k = 0; k < leave; ++k) {
    const Candidate& c = pool[static_cast<std::size_t>(k)];
    losers[static_cast<std::size_t>(c.head)].push_back(c.row);
  }
  for (auto& l : losers) std::sort(l.begin(), l.end());
}

}  // namespace vq::detail
