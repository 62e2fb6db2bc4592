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
// pyramid_grace=-1, pyramid_recent_ratio=0.5, pyramid_decay=0.98; shared: merge=drop (+gate,
// keys), source=auto, quantize..., seed, kv_dtype.
// Deviations from the paper: the paper selects prompt tokens once with SnapKV's observation
// window; here H2O's cumulative mass (key-as-query proxy) ranks tokens at every step, and the
// window is H2O's grace.
#include "policies/fields.h"
#include "policies/methods/h2o.h"
#include "policies/methods.h"
#include "policies/schedules.h"

namespace vq::detail {

// The registry entry (methods.h, method_card): what `veloxquant list` and the README table
// show, the field table and the shared field groups.
constexpr std::string_view kCard = R"(
id: pyramidkv
token loop: yes
prefix: pyramid
summary: PyramidKV: H2O with per-layer budgets tapering linearly from bottom to top
paper: Cai et al., PyramidKV: Dynamic KV Cache Compression based on Pyramidal Information
  Funneling, 2024
disposition: drop (merge optional)
score: cumulative attention mass
budget: per-layer pyramid (mean = budget)
deviations: H2O mass at every step instead of a one-off SnapKV selection at prefill; key-as-query
  proxy when no attention is passed (source=auto)
paper config: `pyramidkv:beta=20,n_sink=0,decay=1,source=attention` (beta 20; the paper selects
  rows once at prefill with SnapKV's window, replaced here by H2O's mass at every step)
defaults: H2O's defaults within each layer (recent window = half the layer-mean non-sink budget,
  decay 0.98, 4 sinks) under the paper's taper beta 20
| pyramid_budget | int | 512 | [1, 16777216] | average rows kept per KV head over the layers,
  sinks included
| pyramid_n_sink | int | 4 | [0, 16777216] | leading rows never evicted
| pyramid_beta | float | 2e+01 | [1, 1e+06] | taper: the top layer gets (budget - grace) / beta (+
  grace); 1 is flat
groups: mass
attention: yes
)";

namespace {

std::int64_t layer_budget(const CacheConfig& c, const LayerShape& shape) {
  const std::int64_t n_sink = c.get_int("pyramid_n_sink"), grace = recent_window(c, "pyramid");
  const auto budgets = pyramid_budgets(c.get_int("pyramid_budget"), shape.n_layers,
                                       c.get_float("pyramid_beta"), grace, n_sink + grace + 1);
  return budgets[static_cast<std::size_t>(shape.layer)];
}

// H2O at this layer's share of the pyramid.
class PyramidPolicy final : public H2OPolicy {
 public:
  explicit PyramidPolicy(const PolicyContext& ctx)
      : H2OPolicy(ctx, layer_budget(ctx.config, ctx.shape)) {}
};

}  // namespace

MethodInfo pyramidkv_method() {
  return method_card(kCard, &check_recent_family, &make_policy_of<PyramidPolicy>);
}

}  // namespace vq::detail
