// squeeze: SqueezeAttention's data-driven per-layer budgets over H2O's cumulative mass.
//
// Paper: Wang et al., "SqueezeAttention: 2D Management of KV-Cache in LLM Inference via
// Layer-wise Optimal Budget", ICLR 2025.
//
// Each layer measures an importance signal while the first tokens arrive (the prefill) and
// evicts nothing meanwhile; once every layer of the model has seen `squeeze_budget` = C tokens
// (when eviction first matters), the signals are clustered into 3 groups (1-D k-means), the
// least important group's budget is cut to C - strength * (C - C * squeeze_fraction), and what
// it gives up is spread evenly over the other layers (total L * C, unchanged). The layer that
// reports last then has every layer cut the rows it held to its own budget, in one decision per
// layer (H2O's ranking), so each layer keeps its own budget of prompt rows, as in the paper
// (budgets decided from the prefill's signal before the prefill is cut). The budgets then
// hold. The engine drives a step through every layer in order, so all layers report in the
// same step. strength = 0 keeps every layer at C: exactly h2o with the same n_sink, grace and
// decay (defaults as h2o's: squeeze_grace=-1, the recent window floor(squeeze_recent_ratio 0.5
// x (budget - n_sink)); squeeze_decay=0.98).
// Proxy signal (no hidden states): the mean normalised entropy H(a) / ln(n) of the proxy
// attention rows a; a layer whose attention is spread over many rows is more important.
// Attention source: the paper's signal, 1 - the mean over the steps so far of
// cos(hidden state entering the layer, hidden state after the attention residual add), which
// the engine reports with ModelCache::observe_layer_similarity() before each layer's end_step
// (without reports it falls back to the entropy of the true attention rows).
// Layers coordinate through the ModelCache; a LayerCache built on its own keeps budget C.
//
// Fields: squeeze_budget=512 (average), squeeze_n_sink=4, squeeze_strength=1,
// squeeze_fraction=0.3, squeeze_grace=-1, squeeze_recent_ratio=0.5, squeeze_decay=0.98;
// shared: merge=drop (+gate, keys), source=auto,
// quantize..., seed, kv_dtype.
// Deviations from the paper: with the proxy source the layer signal is the proxy attention's
// entropy, not the hidden-state cosine (which needs the engine: source=attention); within a
// layer tokens are ranked by H2O's mass (the paper pairs the budgets with any token policy).
// A merge gate comparing the current attention (merge_attention=current) uses the proxy at the
// deferred cut of the layers that finished their step before the decision.
#include <cmath>
#include <limits>

#include "policies/fields.h"
#include "policies/methods/h2o.h"
#include "policies/methods.h"
#include "policies/schedules.h"
#include "veloxquant/errors.h"

namespace vq::detail {

// The registry entry (methods.h, method_card): what `veloxquant list` and the README table
// show, the field table and the shared field groups.
constexpr std::string_view kCard = R"(
id: squeeze
token loop: yes
prefix: squeeze
summary: SqueezeAttention: H2O with per-layer budgets reallocated once from each layer's measured
  importance
paper: Wang et al., SqueezeAttention: 2D Management of KV-Cache in LLM Inference via Layer-wise
  Optimal Budget, ICLR 2025
disposition: drop (merge optional)
score: cumulative attention mass
budget: per-layer data-driven (mean = budget)
deviations: proxy source: layer importance from proxy-attention entropy (attention source: the
  paper's hidden-state cosine); H2O mass within a layer
paper config: `squeeze:strength=1,n_sink=0,decay=1,source=attention` (hidden-state cosine, 3
  k-means groups, H2O as the sequence-wise policy)
defaults: H2O's defaults within each layer (recent window = half the non-sink budget, decay 0.98,
  4 sinks) with the full reallocation
| squeeze_budget | int | 512 | [1, 16777216] | average rows kept per KV head over the layers,
  sinks included
| squeeze_n_sink | int | 4 | [0, 16777216] | leading rows never evicted
| squeeze_strength | float | 1 | [0, 1] | 0: uniform budgets (== h2o); 1: the full reallocation
| squeeze_fraction | float | 0.3 | [0, 1] | budget share the least important layers keep at
  strength 1
groups: mass
attention: yes
)";

namespace {

class SqueezePolicy final : public H2OPolicy {
 public:
  explicit SqueezePolicy(const PolicyContext& ctx)
      : H2OPolicy(ctx), average_(ctx.config.get_int("squeeze_budget")),
        strength_(ctx.config.get_float("squeeze_strength")),
        fraction_(ctx.config.get_float("squeeze_fraction")), layer_(ctx.shape.layer),
        group_(ctx.group) {}

  // The decided budget as soon as it exists (it takes effect at this layer's next step).
  std::int64_t budget() const noexcept override {
    if (group_ && !group_->budgets.empty()) return group_->budgets[static_cast<std::size_t>(layer_)];
    return budget_;
  }

  // Outside a ModelCache: H2O at the uniform budget C. Inside one: no row leaves before the
  // budgets are decided (the step that brings tokens_seen to C holds all its rows, a prefill
  // included); the layer that reports last decides the budgets and has every layer cut its
  // held rows to its own budget at once (apply_group_decision), before any layer computes the
  // next step. From then on each layer is H2O at its budget.
  void begin_step(LayerState& st) override {
    holding_ = group_ && group_->budgets.empty();
    if (group_) group_->members[static_cast<std::size_t>(layer_)] = {this, &st};
  }
  // Holding: score every token, evict nothing.
  std::int64_t step_budget(const LayerState& /*st*/) const override {
    return holding_ ? -1 : budget_;
  }
  void finish_step(LayerState& st) override {
    if (holding_ && !reported_ && st.tokens_seen >= average_) report();
  }

  // Called by the layer that completed the decision (report()), on every layer.
  void apply_group_decision(LayerState& st) override {
    budget_ = group_->budgets[static_cast<std::size_t>(layer_)];
    cut_stored(st, budget_);
  }

  // The layer's own state; the group's (signals, budgets) is saved once by the ModelCache.
  // Loading registers the layer with its group, as its first step would.
  void state(StateIO& io, LayerState& st) override {
    H2OPolicy::state(io, st);
    io.bounded<std::int64_t>(budget_, 0, std::numeric_limits<std::int32_t>::max(), "squeeze budget");
    io.value(reported_, "squeeze reported");
    io.value(entropy_sum_, "squeeze entropy sum");
    io.bounded<std::int64_t>(entropy_count_, 0, std::numeric_limits<std::int64_t>::max(),
                             "squeeze entropy count");
    if (io.loading() && group_ && st.shaped) {
      group_->members[static_cast<std::size_t>(layer_)] = {this, &st};
    }
  }

  void on_reset(LayerState& /*st*/) override {
    budget_ = average_;
    reported_ = false;
    entropy_sum_ = 0;
    entropy_count_ = 0;
    if (group_) {
      group_->reported[static_cast<std::size_t>(layer_)] = 0;
      group_->budgets.clear();
    }
  }

 protected:
  void on_token(HeadCtx& h, std::int64_t row) override {
    H2OPolicy::on_token(h, row);  // leaves the token's attention in weights_[0, last_n_)
    const std::int64_t n = last_n_;
    if (reported_ || n < 2) return;
    double total = 0;
    for (std::int64_t i = 0; i < n; ++i) total += weights_[static_cast<std::size_t>(i)];
    if (!(total > 0)) return;
    double entropy = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const double w = weights_[static_cast<std::size_t>(i)] / total;
      if (w > 0) entropy -= w * std::log(w);
    }
    entropy_sum_ += entropy / std::log(static_cast<double>(n));
    ++entropy_count_;
  }

 private:
  void report() {
    reported_ = true;
    if (!group_) return;
    const std::size_t l = static_cast<std::size_t>(layer_);
    double signal = entropy_count_ > 0 ? entropy_sum_ / static_cast<double>(entropy_count_) : 0;
    if (source_.attention() && group_->external_count[l] > 0) {
      // The paper's signal: a layer whose attention leaves the hidden state nearly unchanged
      // (cosine near 1) matters less.
      signal = 1.0 - group_->external[l] / static_cast<double>(group_->external_count[l]);
    }
    group_->signal[static_cast<std::size_t>(layer_)] = signal;
    group_->reported[static_cast<std::size_t>(layer_)] = 1;
    for (char r : group_->reported) {
      if (!r) return;
    }
    group_->budgets = squeeze_budgets(group_->signal, average_, strength_, fraction_,
                                      n_sink_ + grace_ + 1);
    for (const LayerGroup::Member& m : group_->members) {
      VQ_ASSERT(m.policy != nullptr && m.state != nullptr,
                "squeeze: every layer reported, so every layer has registered");
      m.policy->apply_group_decision(*m.state);
    }
  }

  std::int64_t average_;
  double strength_, fraction_;
  std::int64_t layer_;
  std::shared_ptr<LayerGroup> group_;
  bool reported_ = false;
  bool holding_ = false;  // this step holds every row (budgets not decided yet)
  double entropy_sum_ = 0;
  std::int64_t entropy_count_ = 0;
};

}  // namespace

MethodInfo squeeze_method() {
  return method_card(kCard, &check_recent_family, &make_policy_of<SqueezePolicy>);
}

}  // namespace vq::detail
