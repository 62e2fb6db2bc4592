#include "policies/prefill_only.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "policies/fields.h"

namespace vq::detail {

void PrefillOnlyPolicy::rank_desc(const float* score, std::int64_t lo, std::int64_t hi,
                                  std::vector<std::int64_t>& order) {
  order.resize(static_cast<std::size_t>(std::max<std::int64_t>(0, hi - lo)));
  std::iota(order.begin(), order.end(), lo);
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
    const float pa = score[a], pb = score[b];
    if (std::isnan(pb)) return !std::isnan(pa);  // NaN never wins a keep
    return pa > pb;
  });
}

void PrefillOnlyPolicy::keep_top(HeadCtx& h, const float* score, std::int64_t lo,
                                 std::int64_t hi, std::int64_t n_keep) {
  rank_desc(score, lo, hi, keep_order_);
  const std::size_t keep = static_cast<std::size_t>(std::max<std::int64_t>(0, n_keep));
  keep_losers_.assign(
      keep_order_.begin() + static_cast<std::ptrdiff_t>(std::min(keep, keep_order_.size())),
      keep_order_.end());
  std::sort(keep_losers_.begin(), keep_losers_.end());
  evict_rows(h, keep_losers_);
}

WindowScoredPolicy::WindowScoredPolicy(const PolicyContext& ctx)
    : PrefillOnlyPolicy(ctx),
      window_(ctx.config.get_int(ctx.config.info().prefix + "_obs_window")),
      kernel_(ctx.config.get_int(ctx.config.info().prefix + "_kernel")),
      avg_(ctx.config.get_enum(ctx.config.info().prefix + "_pool") == "avg") {}

void WindowScoredPolicy::eviction_scores(HeadCtx& h, float* out) {
  const std::int64_t n = h.n_live();
  const std::int64_t m = pool(h);
  const float inf = std::numeric_limits<float>::infinity();
  for (std::int64_t j = 0; j < n; ++j) {
    out[j] = (j < n_sink_ || j >= m) ? inf : rank_of(pooled_[static_cast<std::size_t>(j)]);
  }
}

std::int64_t WindowScoredPolicy::pool(HeadCtx& h) {
  const std::int64_t n = h.n_live();
  const std::int64_t w = std::min(window_, n);
  const std::int64_t m = n - w;  // rows before the window
  // Window attention mass of every earlier row.
  mass_.assign(static_cast<std::size_t>(m), 0.0f);
  if (source_.attention()) {
    // The real queries of the window rows that are new in this step (queries exist only for
    // the step's tokens: the physical rows from this head's prev on; with demote= the live
    // rows are not the physical rows).
    for (std::int64_t r = m; r < n; ++r) {
      const std::int64_t query = h.hs.live[static_cast<std::size_t>(r)] - h.hs.prev;
      if (query < 0) continue;
      const float* a = attention_row(h, query);
      for (std::int64_t j = 0; j < m; ++j) {
        mass_[static_cast<std::size_t>(j)] += a[h.hs.live[static_cast<std::size_t>(j)]];
      }
    }
  } else {
    weights_.resize(static_cast<std::size_t>(n));
    for (std::int64_t r = m; r < n; ++r) {
      proxy_weights(h, key_of(h, r), r + 1, weights_.data());
      for (std::int64_t j = 0; j < m; ++j) {
        mass_[static_cast<std::size_t>(j)] += weights_[static_cast<std::size_t>(j)];
      }
    }
  }
  // 1-D pooling along the sequence.
  pooled_.resize(static_cast<std::size_t>(m));
  const std::int64_t half = kernel_ / 2;
  for (std::int64_t j = 0; j < m; ++j) {
    const std::int64_t lo = std::max<std::int64_t>(0, j - half), hi = std::min(m - 1, j + half);
    float acc = avg_ ? 0.0f : mass_[static_cast<std::size_t>(lo)];
    for (std::int64_t i = lo; i <= hi; ++i) {
      const float x = mass_[static_cast<std::size_t>(i)];
      acc = avg_ ? acc + x : std::max(acc, x);
    }
    pooled_[static_cast<std::size_t>(j)] = avg_ ? acc / static_cast<float>(kernel_) : acc;
  }
  for (std::int64_t j = 0; j < m; ++j) {
    h.hs.score[static_cast<std::size_t>(j)] = mass_[static_cast<std::size_t>(j)];
  }
  return m;
}

}  // namespace vq::detail
