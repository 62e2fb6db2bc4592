// snapkv: compress at prefill with an observation window of the chunk's last rows.
//
// Paper: Li et al., "SnapKV: LLM Knows What You are Looking for Before Generation",
// NeurIPS 2024.
//
// Rule: on a step with S > 1 new rows (a prefill chunk) that leaves more than budget rows,
// with w = min(snap_obs_window, R) window rows (the last w of the R rows): each window row r,
// acting as a query with its key (proxy), gives softmax(K[0..r] . k_r / sqrt(d)) over rows
// 0..r (causal); these are summed over the window rows for every earlier row j < R - w, then
// pooled along the sequence (kernel snap_kernel, stride 1, padding kernel/2: max, or avg
// dividing by the kernel size). The cache keeps the sinks, the w window rows and the
// (budget - n_sink - w) other rows with the highest pooled score (ties to the lowest index),
// in position order. Single-token steps (decode) append without eviction, so the cache grows
// past the budget during generation, as in the paper.
//
// Fields: snap_budget=512, snap_obs_window=32, snap_n_sink=4, snap_kernel=7, snap_pool=max;
// shared: merge=drop (+gate, keys; the gate compares the unpooled window mass), quantize...,
// seed, kv_dtype.
// Attention source (the paper's rule): the window's real query rows, i.e. the attention the
// step's last min(w, S) queries paid (folded over query heads by gqa_reduce), replace the
// proxy softmax; pooling and selection are the same.
// Head-wise budgets (headwise=true, AdaKV's own pairing, policies/headwise.h): at a prefill
// chunk every head keeps its sinks and its window, and the layer's remaining rows go to the
// highest pooled scores of all heads together, each head keeping at least its floor.
// Deviations from the paper: with the proxy source the window rows' keys stand in for their
// queries; sinks are protected; later prefill chunks are scored together with the rows kept
// earlier.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "base/kernels.h"
#include "policies/fields.h"
#include "policies/methods.h"
#include "policies/policy.h"

namespace vq::detail {

// The registry entry (methods.h, method_card): what `veloxquant list` and the README table
// show, the field table and the shared field groups.
constexpr std::string_view kCard = R"(
id: snapkv
prefix: snap
summary: SnapKV: at prefill, keep the rows an observation window of the last rows attends to
  (pooled); decode appends
paper: Li et al., SnapKV: LLM Knows What You are Looking for Before Generation, NeurIPS 2024
disposition: drop (merge optional)
score: observation-window attention, pooled
budget: uniform at prefill (decode grows)
deviations: proxy source: window keys stand in for queries (source=attention: the window's real
  query rows); sinks protected
paper config: `snapkv:obs_window=32,kernel=7,pool=max,n_sink=0,source=attention` (window 32, max
  pooling with kernel 7)
prefill only: yes
| snap_budget | int | 512 | [1, 16777216] | rows kept per KV head after a prefill chunk, sinks and
  window included
| snap_obs_window | int | 32 | [1, 16777216] | last rows of the chunk used as queries
| snap_n_sink | int | 4 | [0, 16777216] | leading rows never evicted
| snap_kernel | int | 7 | [1, 1023] | pooling kernel along the sequence (odd)
| snap_pool | enum | max | {max, avg} | pooling of the window attention mass
attention: yes
)";

namespace {
void check(const CacheConfig& c) {
  require_less(c, "snap_n_sink", "snap_budget");
  require_sum_less(c, "snap_n_sink", "snap_obs_window", "snap_budget");
  if (c.get_int("snap_kernel") % 2 == 0) {
    config_error(c, "snap_kernel must be odd (pooling is centred), got " +
                        std::to_string(c.get_int("snap_kernel")));
  }
}

class SnapKVPolicy final : public TokenPolicy {
 public:
  explicit SnapKVPolicy(const PolicyContext& ctx)
      : TokenPolicy(ctx), window_(ctx.config.get_int("snap_obs_window")),
        kernel_(ctx.config.get_int("snap_kernel")), avg_(ctx.config.get_enum("snap_pool") == "avg") {}

 protected:
  // A prefill chunk (S > 1) is one decision with the window's scores; a decode step appends.
  void on_token(HeadCtx& h, std::int64_t row) override { push_row(h.hs, row, 0.0f); }
  bool decides_chunk_at_once() const noexcept override { return true; }
  std::int64_t step_budget(const LayerState& st) const override {
    return st.step_new > 1 ? budget_ : -1;
  }
  void cut_head(HeadCtx& h, std::int64_t keep) override {
    if (h.n_live() > keep) select(h);
  }
  bool ties_evict_newer() const noexcept override { return true; }  // as select() keeps

  // Head-wise ranking (headwise_cut): the pooled window mass of the candidates; the sinks and
  // the window rows are protected (+inf), each head keeping its own window.
  void eviction_scores(HeadCtx& h, float* out) override {
    const std::int64_t n = h.n_live();
    const std::int64_t m = pool(h);
    const float inf = std::numeric_limits<float>::infinity();
    for (std::int64_t j = 0; j < n; ++j) {
      out[j] = (j < n_sink_ || j >= m) ? inf : rank_of(pooled_[static_cast<std::size_t>(j)]);
    }
  }

 private:
  // Scores the live rows of the open step: the window's attention mass of every row before the
  // window (into hs.score, for the merge gate) and its pooled form (pooled_). Returns m, the
  // number of rows before the window.
  std::int64_t pool(HeadCtx& h) {
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
        for (std::int64_t j = 0; j < m; ++j) mass_[static_cast<std::size_t>(j)] += a[h.hs.live[static_cast<std::size_t>(j)]];
      }
    } else {
      weights_.resize(static_cast<std::size_t>(n));
      for (std::int64_t r = m; r < n; ++r) {
        proxy_weights(h, key_of(h, r), r + 1, weights_.data());
        for (std::int64_t j = 0; j < m; ++j) mass_[static_cast<std::size_t>(j)] += weights_[static_cast<std::size_t>(j)];
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
    for (std::int64_t j = 0; j < m; ++j) h.hs.score[static_cast<std::size_t>(j)] = mass_[static_cast<std::size_t>(j)];
    return m;
  }

  void select(HeadCtx& h) {
    const std::int64_t n = h.n_live();
    const std::int64_t m = pool(h);
    const std::int64_t w = n - m;
    // Keep the top (budget - n_sink - w) candidates by pooled score, ties to the lowest index.
    order_.resize(static_cast<std::size_t>(std::max<std::int64_t>(0, m - n_sink_)));
    std::iota(order_.begin(), order_.end(), n_sink_);
    std::stable_sort(order_.begin(), order_.end(), [&](std::int64_t a, std::int64_t b) {
      const float pa = pooled_[static_cast<std::size_t>(a)], pb = pooled_[static_cast<std::size_t>(b)];
      if (std::isnan(pb)) return !std::isnan(pa);  // NaN never wins a keep
      return pa > pb;
    });
    const std::size_t keep = static_cast<std::size_t>(std::max<std::int64_t>(0, budget_ - n_sink_ - w));
    losers_.assign(order_.begin() + static_cast<std::ptrdiff_t>(std::min(keep, order_.size())), order_.end());
    std::sort(losers_.begin(), losers_.end());
    evict_rows(h, losers_);
  }

  std::int64_t window_, kernel_;
  bool avg_;
  std::vector<float> mass_, pooled_;
  std::vector<std::int64_t> order_, losers_;
};

}  // namespace

MethodInfo snapkv_method() { return method_card(kCard, &check, &make_policy_of<SnapKVPolicy>); }

}  // namespace vq::detail
