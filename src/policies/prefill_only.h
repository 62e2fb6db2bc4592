// Prefill-only cuts: the hooks shared by the methods that compress a prompt once per prefill
// chunk and let decode steps append (snapkv, leverage, criticalkv), and SnapKV's
// observation-window score (snapkv, criticalkv).
#pragma once

#include <cstdint>
#include <vector>

#include "policies/policy.h"

namespace vq::detail {

// A step with S > 1 new rows (a prefill chunk) that leaves more than the budget is one decision,
// made by select() over the chunk's live rows; a single-token step (decode) appends without
// eviction, so the cache grows past the budget during generation. Head-wise budgets
// (headwise_cut) rank the heads by eviction_scores(), which the method defines; equal rankings
// lose the newer row first, as select()'s keep_top() keeps the earliest of equal scores.
class PrefillOnlyPolicy : public TokenPolicy {
 public:
  using TokenPolicy::TokenPolicy;

 protected:
  void on_token(HeadCtx& h, std::int64_t row) override { push_row(h.hs, row, 0.0f); }
  bool decides_chunk_at_once() const noexcept override { return true; }
  std::int64_t step_budget(const LayerState& st) const override {
    return st.step_new > 1 ? budget_ : -1;
  }
  void cut_head(HeadCtx& h, std::int64_t keep) override {
    if (h.n_live() > keep) select(h, keep);
  }
  bool ties_evict_newer() const noexcept override { return true; }  // as keep_top() keeps

  // The method's cut of head h's live rows to `keep` rows (called when it holds more).
  virtual void select(HeadCtx& h, std::int64_t keep) = 0;

  // Orders the live indices [lo, hi) by score[i] (indexed by live index), highest first, ties to
  // the lowest index, NaN last (a NaN score never wins a keep), into `order`.
  static void rank_desc(const float* score, std::int64_t lo, std::int64_t hi,
                        std::vector<std::int64_t>& order);
  // Keeps the n_keep best of the live indices [lo, hi) by score (rank_desc) and evicts the
  // others of that range (by the merge rule); rows outside the range stay.
  void keep_top(HeadCtx& h, const float* score, std::int64_t lo, std::int64_t hi,
                std::int64_t n_keep);

  std::vector<std::int64_t> keep_order_, keep_losers_;  // keep_top scratch
};

// SnapKV's observation-window score (Li et al., NeurIPS 2024), read from the fields
// <prefix>_obs_window, <prefix>_kernel (odd) and <prefix>_pool (max | avg) of the method: with
// w = min(obs_window, n) window rows (the last w live rows), each window row's attention over
// the rows before the window is summed (source=attention: the real queries of the window rows
// that are new in this step, folded over the group's query heads by gqa_reduce; proxy: the
// window row's key as its query, softmax over rows 0..r), then pooled along the sequence
// (kernel, stride 1, padding kernel / 2; max, or avg dividing by the kernel size).
class WindowScoredPolicy : public PrefillOnlyPolicy {
 public:
  explicit WindowScoredPolicy(const PolicyContext& ctx);

 protected:
  // Head-wise ranking: the pooled window mass of the candidates; the sinks and the window rows
  // are protected (+inf), each head keeping its own window.
  void eviction_scores(HeadCtx& h, float* out) override;

  // Scores the live rows of the open step: the window's attention mass of every row before the
  // window (into hs.score, for the merge gate) and its pooled form (pooled_). Returns m, the
  // number of rows before the window (the window is the live rows [m, n)).
  std::int64_t pool(HeadCtx& h);

  std::int64_t window_, kernel_;
  bool avg_;
  std::vector<float> mass_, pooled_;
};

}  // namespace vq::detail
