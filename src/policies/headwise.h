// Head-wise budgets (AdaKV: Feng et al., "Ada-KV: Optimizing KV Cache Eviction by Adaptive
// Budget Allocation for Efficient LLM Inference", 2024): the rows a layer keeps per batch
// element, n_kv_heads x budget, are shared among its KV heads by their scores instead of split
// evenly, so a head whose attention is spread keeps more rows than one whose attention sits on
// a few. Option `headwise=true` (with `headwise_floor=` alpha) of the attention-scored
// eviction methods that rank each head's rows by attention mass (README "Head-wise budgets").
#pragma once

#include <cstdint>
#include <vector>

#include "veloxquant/config.h"

namespace vq::detail {

struct HeadwiseRule {
  bool on = false;
  double floor = 0.2;  // alpha: each head keeps at least floor(alpha x (budget - protected))
};

// Reads `headwise` and `headwise_floor` (off when the method has no such fields).
HeadwiseRule headwise_rule_from(const CacheConfig& config);

// One layer-wide decision for the heads of one batch element. ranking[h]: [n_h] head h's
// eviction ranking of its live rows (lowest leaves first; +inf marks a protected row: sinks,
// recent window; NaN ranks below every number). When sum n_h > H x budget (H = ranking.size()),
// exactly sum n_h - H x budget rows leave, chosen so that:
//  1. every protected row stays (a head's window is its own, outside the shared pool);
//  2. head h also keeps its f_h = floor(alpha x max(0, budget - p_h)) best candidates (p_h its
//     protected rows; all of them when it has fewer): the floor;
//  3. the rest of the layer's H x budget slots go to the best remaining candidates of all
//     heads together (one ranking across heads: the scores must be comparable).
// Order among candidates: NaN leaves first, then the lowest ranking; ties leave the lowest row
// index first (newer_first: the highest, as snapkv's own selection keeps the earliest of equal
// pooled scores), then the lowest head. Nothing leaves when sum n_h <= H x budget. With
// alpha = 1 every head keeps its own best budget rows: the uniform split, row for row.
// losers[h] receives head h's leaving rows, strictly increasing (resized to H).
// Requires p_h <= budget for every head (the methods' guards give n_sink + window < budget).
void headwise_losers(const std::vector<std::vector<float>>& ranking, std::int64_t budget,
                     double alpha, std::vector<std::vector<std::int64_t>>& losers,
                     bool newer_first = false);

}  // namespace vq::detail
