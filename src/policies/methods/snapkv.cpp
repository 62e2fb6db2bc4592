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
#include "policies/prefill_only.h"

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

// SnapKV's window score and its prefill-only cut (policies/prefill_only.h, shared with
// criticalkv); the selection keeps the top (budget - n_sink - w) pooled scores.
class SnapKVPolicy final : public WindowScoredPolicy {
 public:
  explicit SnapKVPolicy(const PolicyContext& ctx) : WindowScoredPolicy(ctx) {}

 protected:
  void select(HeadCtx& h, std::int64_t keep) override {
    const std::int64_t n = h.n_live();
    const std::int64_t m = pool(h);
    const std::int64_t w = n - m;
    // Keep the top (budget - n_sink - w) candidates by pooled score, ties to the lowest index.
    keep_top(h, pooled_.data(), n_sink_, m, keep - n_sink_ - w);
  }
};

}  // namespace

MethodInfo snapkv_method() { return method_card(kCard, &check, &make_policy_of<SnapKVPolicy>); }

}  // namespace vq::detail
