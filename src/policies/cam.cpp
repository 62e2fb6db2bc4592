// cam: Cache Merging. Evicts H2O's loser (grace 0, decay 1) and, behind a probabilistic gate,
// blends its value (and optionally key) into the most similar surviving row.
//
// Paper: Zhang et al., "CaM: Cache Merging for Memory-efficient LLMs Inference", ICML 2024.
//
// Rule (reference adaptation, proxy source): loser = H2O argmin with sinks protected.
// Target = the non-sink survivor with the largest cos(k_loser, k_j) (none: drop). Gate:
// p = clamp(score_loser / score_target, 0, 1) (score_target <= 0: p = 1 if score_loser > 0
// else 0); merge iff u < p, u drawn from the counter RNG (seed, layer, kv head, counter),
// the counter advancing once per over-budget step while the gate is on and merge != drop.
// Merge: w = clip(cos, 0, 1) (sim_weighted) or 0.5 (mean); v_t = (1 - w) v_t + w v_e in fp32,
// keys likewise only with merge_keys; score_t += score_e; pos_t = max(pos_t, pos_e).
// cam_merge=drop is bit-for-bit h2o with grace 0, decay 1.
//
// Fields: cam_budget=512, cam_n_sink=4, cam_merge=sim_weighted, cam_merge_gate=true,
// cam_merge_keys=false, seed, kv_dtype.
// Paper-faithful variant: cam_target=window (with source=attention for true attention):
// p = A[e] / mean(A over the next cam_merge_m kept rows), NaN -> 0, clamped to [0, 1], with A
// the cumulative mass (cam_merge_attention=cumulative) or the current query's attention
// (current); on a Bernoulli success from the counter RNG each of those m rows gains v_e / m.
// Keys are never merged; scores and positions are left as they are.
// Deviations from the paper (default, reference adaptation): cosine blend weight instead of
// attention prominence; a single nearest survivor instead of a window of m local tokens (the
// gate's target score stands in for the window mean); key-as-query proxy scores; no position
// remapping after a merge.
#include "policies/fields.h"
#include "policies/h2o.h"
#include "policies/methods.h"

namespace vq::detail {
namespace {

std::unique_ptr<Policy> make(const PolicyContext& ctx) {
  const CacheConfig& c = ctx.config;
  return std::make_unique<H2OPolicy>(c.get_int("cam_budget"), c.get_int("cam_n_sink"), 0, 1.0f,
                                     merge_rule_from(c, "cam"), score_source_from(c));
}

void check(const CacheConfig& c) { require_less(c, "cam_n_sink", "cam_budget"); }

}  // namespace

MethodInfo cam_method() {
  MethodInfo m;
  m.id = "cam";
  m.prefix = "cam";
  m.summary = "CaM: H2O's loser merged into its most similar survivor behind a "
              "probabilistic gate";
  m.paper = "Zhang et al., CaM: Cache Merging for Memory-efficient LLMs Inference, ICML 2024";
  m.disposition = "merge (gated)";
  m.score_signal = "cumulative attention mass";
  m.budget_type = "uniform";
  m.deviations = "cosine blend into the single nearest survivor (target=window: the "
                 "paper's window of m rows); proxy source by default";
  m.fields = {
      int_field("cam_budget", 512, 1, kMaxTokens, "rows kept per KV head, sinks included"),
      int_field("cam_n_sink", 4, 0, kMaxTokens,
                "leading rows never evicted and never merge targets"),
  };
  add_merge_fields(m.fields, "cam", "sim_weighted");
  add_source_fields(m.fields);
  add_quantize_fields(m.fields);
  add_common_fields(m.fields);
  m.check = &check;
  m.get_budget = [](const CacheConfig& c) { return c.get_int("cam_budget"); };
  m.set_budget = [](CacheConfig& c, std::int64_t b) { c.set("cam_budget", b); };
  m.make_policy = &make;
  return m;
}

}  // namespace vq::detail
