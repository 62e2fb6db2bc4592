// pyramidkv: H2O's cumulative mass with a per-layer budget taper (more rows in lower layers).
//
// Paper: Cai et al., "PyramidKV: Dynamic KV Cache Compression based on Pyramidal Information
// Funneling", 2024.
//
// Budgets: with average C, window w = pyramid_grace and L layers, min = (C - w) / beta,
// max = 2 (C - w) - min, b_l = max - l (max - min) / (L - 1) + w, as integers with the
// rounding distributed over the layers so the mean is exactly C; a layer below the floor
// n_sink + grace + 1 is raised to it and the rows come off the largest budgets (the check's
// n_sink + grace < budget makes this always possible; see pyramid_budgets).
// Within a layer: H2O with h2o's defaults (pyramid_grace=-1: floor(pyramid_recent_ratio 0.5 x
// (budget - n_sink)) of the mean budget; pyramid_decay=0.98). beta = 1 gives a flat schedule:
// exactly h2o with the same n_sink, grace and decay.
//
// Fields: pyramid_budget=512 (average over layers), pyramid_n_sink=4, pyramid_beta=20,
// pyramid_grace=-1, pyramid_recent_ratio=0.5, pyramid_decay=0.98, pyramid_merge=drop (+gate,
// keys), source=auto, quantize..., seed, kv_dtype.
// Deviations from the paper: the paper selects prompt tokens once with SnapKV's observation
// window; here H2O's cumulative mass (key-as-query proxy) ranks tokens at every step, and the
// window is H2O's grace.
#include "policies/fields.h"
#include "policies/h2o.h"
#include "policies/methods.h"
#include "policies/schedules.h"

namespace vq::detail {
namespace {

std::int64_t layer_budget(const CacheConfig& c, const LayerShape& shape) {
  const std::int64_t n_sink = c.get_int("pyramid_n_sink"), grace = recent_window(c, "pyramid");
  const auto budgets = pyramid_budgets(c.get_int("pyramid_budget"), shape.n_layers,
                                       c.get_float("pyramid_beta"), grace, n_sink + grace + 1);
  return budgets[static_cast<std::size_t>(shape.layer)];
}

std::unique_ptr<Policy> make(const PolicyContext& ctx) {
  const CacheConfig& c = ctx.config;
  auto policy = std::make_unique<H2OPolicy>(layer_budget(c, ctx.shape), c.get_int("pyramid_n_sink"),
                                            recent_window(c, "pyramid"),
                                            static_cast<float>(c.get_float("pyramid_decay")),
                                            merge_rule_from(c, "pyramid"), score_source_from(c));
  policy->set_headwise(headwise_rule_from(ctx.config));
  return policy;
}

void check(const CacheConfig& c) {
  require_less(c, "pyramid_n_sink", "pyramid_budget");
  check_recent_window(c, "pyramid");
}

}  // namespace

MethodInfo pyramidkv_method() {
  MethodInfo m;
  m.id = "pyramidkv";
  m.prefix = "pyramid";
  m.summary = "PyramidKV: H2O with per-layer budgets tapering linearly from bottom to top";
  m.paper = "Cai et al., PyramidKV: Dynamic KV Cache Compression based on Pyramidal "
            "Information Funneling, 2024";
  m.disposition = "drop (merge optional)";
  m.score_signal = "cumulative attention mass";
  m.budget_type = "per-layer pyramid (mean = budget)";
  m.deviations = "H2O mass at every step instead of a one-off SnapKV selection at prefill; "
                 "key-as-query proxy when no attention is passed (source=auto)";
  m.fields = {
      int_field("pyramid_budget", 512, 1, kMaxTokens,
                "average rows kept per KV head over the layers, sinks included"),
      int_field("pyramid_n_sink", 4, 0, kMaxTokens, "leading rows never evicted"),
      float_field("pyramid_beta", 20.0, 1.0, 1e6,
                  "taper: the top layer gets (budget - grace) / beta (+ grace); 1 is flat"),
  };
  add_mass_fields(m.fields, "pyramid");
  add_merge_fields(m.fields, "pyramid", "drop");
  add_source_fields(m.fields);
  add_headwise_fields(m.fields);
  add_quantize_fields(m.fields);
  add_common_fields(m.fields);
  m.check = &check;
  m.get_budget = [](const CacheConfig& c) { return c.get_int("pyramid_budget"); };
  m.set_budget = [](CacheConfig& c, std::int64_t b) { c.set("pyramid_budget", b); };
  m.make_policy = &make;
  m.paper_config = "`pyramidkv:beta=20,n_sink=0,decay=1,source=attention` (beta 20; the paper "
      "selects rows once at prefill with SnapKV's window, replaced here by H2O's mass "
      "at every step)";
  m.defaults_note = "H2O's defaults within each layer (recent window = half the layer-mean non-sink "
      "budget, decay 0.98, 4 sinks) under the paper's taper beta 20";
  return m;
}

}  // namespace vq::detail
