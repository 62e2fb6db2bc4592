// qfilters — Godey et al., "Q-Filters: Leveraging QK Geometry for Efficient KV Cache
// Compression", 2025 (arXiv 2503.02812).
//
// The paper's observation: in each attention head the queries (after RoPE) concentrate along one
// direction. Take u, the first right singular vector of a head's calibration queries (the
// dominant eigenvector of Q^T Q, no centring), oriented so that the queries' mean projection on
// it is positive. Then <q, k> is on average <q, u><k, u> plus terms that average out, so a key
// with a small projection <k, u> draws little attention from the queries to come. Q-Filters keeps
// the keys with the largest <k, u> and evicts the rest, without looking at any attention.
//
// Rule as implemented: a key's score is s = <k, u_h>, with u_h the filter of its KV head (its
// group's queries, below), computed once when the row enters the cache (keys are post-RoPE, as
// the filters are). While a head is over budget the live row with the lowest score is evicted,
// token by token as the cache fills; the first n_sink rows and the newest `grace` rows are never
// evicted (knorm's and keydiff's protection). Ties evict the oldest row; a NaN score is evicted
// first. With a merge rule the gate compares exp(score), and a survivor's score stays the
// projection of its key (recomputed when merge_keys blends the key).
//
// The filters come from outside the cache: LayerCache::set_key_filters / ModelCache::
// set_key_filters ([n_layers][n_kv_heads][head_dim]; C API vq_layer_set_key_filters and
// vq_model_cache_set_key_filters). `veloxquant calibrate` computes them from a model's queries
// over a text and writes `<model>.qfilters` (tools/cmd_calibrate.cpp,
// src/engine/run/qfilters_file.h); the engine loads that file (or --qfilters FILE) for this
// method. A cache with no filters set throws Error(kInvalidState) naming set_key_filters at its
// first step with new rows (the step is rolled back).
//
// Calibration (src/engine/run/qfilters_file.cpp): per layer and query head, u = the unit
// eigenvector of the largest eigenvalue of Q^T Q (Q: the head's post-RoPE queries over the
// calibration text), by cyclic Jacobi in double precision; its sign makes sum_t <q_t, u> > 0.
// A KV head's filter is the mean of its group's query-head vectors (GQA), as the authors'
// calibration averages the group's filters.
//
// Fields: qf_budget=512 (rows kept per KV head, sinks included), qf_n_sink=4 (leading rows never
// evicted), qf_grace=16 (newest rows protected), and the shared options: merge (drop by
// default), quantize/demote, seed, kv_dtype.
//
// Deviations from the paper: eviction is token by token as the cache fills (the paper compresses
// a prompt once, and during generation keeps a window); a recent window of `grace` rows and
// n_sink sinks are protected; the sign is chosen by the queries' mean projection (the authors'
// script takes the majority sign of the projections; the two agree whenever the direction is
// clearly dominant); the file stores u itself (kvpress's released filters store -u and score
// -<k, filter>, the same ranking).
#include <cmath>
#include <limits>
#include <string>

#include "base/kernels.h"
#include "policies/fields.h"
#include "policies/methods.h"
#include "policies/policy.h"
#include "veloxquant/errors.h"

namespace vq::detail {

constexpr std::string_view kQfiltersCard = R"(
id: qfilters
prefix: qf
summary: Q-Filters: evict the key with the lowest projection on its head's calibrated query
  direction (veloxquant calibrate); no attention needed
paper: Godey et al., Q-Filters: Leveraging QK Geometry for Efficient KV Cache Compression, 2025
disposition: drop (merge optional)
score: key projection on the head's dominant query direction (low is evicted)
budget: uniform
deviations: token-by-token eviction as the cache fills (paper: one pass over the prompt); sinks and
  a recent window protected; filters from `veloxquant calibrate` (`<model>.qfilters`), set with
  `set_key_filters`
paper config: - (the paper prunes the prompt once; a token-by-token spec cannot express it)
| qf_budget | int | 512 | [1, 16777216] | rows kept per KV head, sinks included
| qf_n_sink | int | 4 | [0, 16777216] | leading rows never evicted
| qf_grace | int | 16 | [0, 16777216] | newest rows protected from eviction
)";

namespace {

class QFiltersPolicy final : public TokenPolicy {
 public:
  explicit QFiltersPolicy(const PolicyContext& ctx)
      : TokenPolicy(ctx), grace_(ctx.config.get_int("qf_grace")) {}

  bool needs_key_filters() const noexcept override { return true; }

  void end_step(LayerState& st, const AttentionRef* attention) override {
    // Before anything is decided, so the cache rolls the step back (cache.h, end_step).
    const std::int64_t want = st.shape.n_kv_heads * st.shape.head_dim;
    if (st.key_filters.empty()) {
      throw Error(ErrorCode::kInvalidState,
                  "[qfilters] no key filters: call LayerCache::set_key_filters (or ModelCache::"
                  "set_key_filters, C API vq_model_cache_set_key_filters) with the model's "
                  "filters before the first step; `veloxquant calibrate` makes them "
                  "(<model>.qfilters)");
    }
    if (static_cast<std::int64_t>(st.key_filters.size()) != want) {
      throw Error(ErrorCode::kInvalidState,
                  "[qfilters] set_key_filters gave " + std::to_string(st.key_filters.size()) +
                      " floats, but this cache's steps are n_kv_heads x head_dim = " +
                      std::to_string(st.shape.n_kv_heads) + " x " +
                      std::to_string(st.shape.head_dim) + " = " + std::to_string(want));
    }
    TokenPolicy::end_step(st, attention);
  }

 protected:
  void on_token(HeadCtx& h, std::int64_t row) override {
    const float* k = key_of_row(h, row);
    const float* u = h.st.key_filters.data() + h.st.kv_head_of(h.index) * h.head_dim;
    push_row(h.hs, row, kernels::dot(k, u, h.head_dim));
  }

  void eviction_scores(HeadCtx& h, float* out) override {
    const std::int64_t n = h.n_live();
    const float* score = h.hs.score.data();
    const float inf = std::numeric_limits<float>::infinity();
    for (std::int64_t i = 0; i < n; ++i) {
      out[i] = (i < n_sink_ || i >= n - grace_) ? inf : rank_of(score[i]);
    }
  }

  // A merged row keeps the score of its key: unchanged when only values blend, the projection of
  // the blended key with merge_keys (a sum of projections, the default bookkeeping, would rank
  // by how many rows a survivor absorbed rather than by its key).
  void on_merge(HeadCtx& h, std::int64_t target, std::int64_t /*loser*/) override {
    if (!merge_.keys) return;
    const float* k = key_of(h, target);
    const float* u = h.st.key_filters.data() + h.st.kv_head_of(h.index) * h.head_dim;
    h.hs.score[static_cast<std::size_t>(target)] = kernels::dot(k, u, h.head_dim);
  }

  float gate_score(const HeadCtx& h, std::int64_t i) const override {
    return std::exp(h.hs.score[static_cast<std::size_t>(i)]);
  }

 private:
  std::int64_t grace_;
};

// Guards: n_sink < budget and n_sink + grace < budget.
void check(const CacheConfig& c) {
  require_less(c, "qf_n_sink", "qf_budget");
  require_sum_less(c, "qf_n_sink", "qf_grace", "qf_budget");
}

}  // namespace

MethodInfo qfilters_method() {
  return method_card(kQfiltersCard, &check, &make_policy_of<QFiltersPolicy>);
}

}  // namespace vq::detail
