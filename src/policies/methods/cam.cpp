// cam: Cache Merging. H2O evicts; the evicted row's value is merged into the rows that stay,
// behind a probabilistic gate.
//
// Paper: Zhang et al., "CaM: Cache Merging for Memory-efficient LLMs Inference", ICML 2024.
//
// Base: H2O (h2o.cpp) with cam_n_sink, cam_grace, cam_recent_ratio and cam_decay, defaults as
// h2o's (recent window = floor(0.5 x (budget - n_sink)), decay 0.98), so the loser is H2O's
// argmin with sinks and the recent window protected.
// Default disposition, the paper's rule (merge_target=window, merge=mean): the loser's value
// is spread as v_e / m over the next m = merge_m (32) kept rows after it, behind the gate
// p = A[e] / mean(A over those rows), NaN -> 0, clamped to [0, 1], with A the current query's
// attention (merge_attention=current, the default) or the cumulative mass (cumulative,
// measured worse on stories260K: perplexity 6.52 against 4.44 at budget 32); merge iff
// u < p, u from the counter RNG (seed, layer, kv head, counter), the counter advancing once per
// evicted row while the gate is on and merge != drop. Keys, scores and positions stay.
// The reference adaptation (merge_target=nearest, merge=sim_weighted|mean): the target is the
// non-sink survivor with the largest cos(k_loser, k_j) (none: drop); gate
// p = clamp(score_loser / score_target, 0, 1) (score_target <= 0: p = 1 if score_loser > 0
// else 0); w = clip(cos, 0, 1) (sim_weighted) or 0.5 (mean); v_t = (1 - w) v_t + w v_e in fp32,
// keys likewise only with merge_keys; score_t += score_e; pos_t = max(pos_t, pos_e).
// merge=drop is bit-for-bit h2o with the same n_sink, grace, recent_ratio and decay. The
// seed library's cam (H2O with grace 0, decay 1, nearest sim_weighted) is
// cam:grace=0,decay=1,target=nearest,merge=sim_weighted; under it the loser is the newest row
// at score 0, so the gate's p is 0 and nothing ever merges (the cache also freezes).
//
// Fields: cam_budget=512, cam_n_sink=4, cam_grace=-1, cam_recent_ratio=0.5, cam_decay=0.98;
// shared, with cam's own defaults (the card's shared defaults): merge=mean, merge_gate=true,
// merge_keys=false, merge_target=window, merge_m=32, merge_attention=current; source=auto,
// gqa_reduce, quantize..., seed, kv_dtype.
// Deviations from the paper: a recent window and 4 sinks protected by the base; with the proxy
// source the incoming key stands in for the query; no position remapping after a merge.
#include "policies/fields.h"
#include "policies/methods/h2o.h"
#include "policies/methods.h"

namespace vq::detail {

// The registry entry (methods.h, method_card): what `veloxquant list` and the README table
// show, the field table and the shared field groups.
constexpr std::string_view kCard = R"(
id: cam
token loop: yes
prefix: cam
summary: CaM: H2O's loser spread over the next kept rows behind a probabilistic gate
  (target=nearest: blended into its most similar survivor)
paper: Zhang et al., CaM: Cache Merging for Memory-efficient LLMs Inference, ICML 2024
disposition: merge (gated)
score: cumulative attention mass
budget: uniform
deviations: 4 sinks, a recent window and decay 0.98 in the H2O base; key-as-query proxy when no
  attention is passed (source=auto); target=nearest is the reference library's cosine blend into
  one survivor
paper config: `cam:n_sink=0,recent_ratio=0.5,decay=1,source=attention` (H2O base as in the paper's
  experiments; the window rule, v_e / m over the next m = 32 kept rows behind p = A_e / mean(A))
defaults: the paper's rule (target=window: v_e / m over the next 32 kept rows behind p = A_e /
  mean(A over them), the current query's attention as A) on H2O's defaults as the base (recent
  window = half the non-sink budget, decay 0.98, 4 sinks)
| cam_budget | int | 512 | [1, 16777216] | rows kept per KV head, sinks included
| cam_n_sink | int | 4 | [0, 16777216] | leading rows never evicted and never merge targets
groups: mass
attention: yes
shared defaults: merge=mean,merge_target=window,merge_attention=current
)";

MethodInfo cam_method() {
  return method_card(kCard, &check_recent_family, &make_policy_of<H2OPolicy>);
}

}  // namespace vq::detail
