// tova: Token Omission Via Attention: evict the row the newest token attends to least.
//
// Paper: Oren et al., "Transformers are Multi-State RNNs", EMNLP 2024.
//
// Proxy rule: append the new row first; over budget, w = softmax(K_all . k_new / sqrt(d))
// over all rows including the new one; sinks are protected; evict argmin (the new row itself
// can lose). No state between steps; with a merge rule the gate compares these weights.
//
// Fields: tova_budget=512, tova_n_sink=4, tova_merge=drop (+gate, keys), seed, kv_dtype.
// Deviations from the paper: key-as-query proxy, scored per KV head (the paper averages the
// last query's attention over all heads of a layer and keeps one index set per layer); sinks
// protected.
#include <limits>

#include "policies/fields.h"
#include "policies/methods.h"
#include "policies/policy.h"

namespace vq::detail {
namespace {

class TovaPolicy final : public TokenPolicy {
 public:
  using TokenPolicy::TokenPolicy;

 protected:
  void on_token(HeadCtx& h, std::int64_t row) override { push_row(h.hs, row, 0.0f); }
  void eviction_scores(HeadCtx& h, float* out) override {
    const std::int64_t n = h.n_live();
    proxy_weights(h, key_of(h, n - 1), n, out);
    float* score = h.hs.score.data();
    const float inf = std::numeric_limits<float>::infinity();
    for (std::int64_t i = 0; i < n; ++i) {
      score[i] = out[i];
      if (i < n_sink_) out[i] = inf;
    }
  }
};

std::unique_ptr<Policy> make(const PolicyContext& ctx) {
  const CacheConfig& c = ctx.config;
  return std::make_unique<TovaPolicy>(c.get_int("tova_budget"), c.get_int("tova_n_sink"),
                                      merge_rule_from(c, "tova"));
}

void check(const CacheConfig& c) { require_less(c, "tova_n_sink", "tova_budget"); }

}  // namespace

MethodInfo tova_method() {
  MethodInfo m;
  m.id = "tova";
  m.prefix = "tova";
  m.summary = "TOVA: evict the row the newest token attends to least";
  m.paper = "Oren et al., Transformers are Multi-State RNNs, EMNLP 2024";
  m.disposition = "drop (merge optional)";
  m.score_signal = "current-step attention";
  m.budget_type = "uniform";
  m.deviations = "key-as-query proxy, per KV head (paper: last query averaged over heads, one "
                 "index set per layer); sinks protected";
  m.fields = {
      int_field("tova_budget", 512, 1, kMaxTokens, "rows kept per KV head, sinks included"),
      int_field("tova_n_sink", 4, 0, kMaxTokens, "leading rows never evicted"),
  };
  add_merge_fields(m.fields, "tova", "drop");
  add_quantize_fields(m.fields);
  add_common_fields(m.fields);
  m.check = &check;
  m.get_budget = [](const CacheConfig& c) { return c.get_int("tova_budget"); };
  m.set_budget = [](CacheConfig& c, std::int64_t b) { c.set("tova_budget", b); };
  m.make_policy = &make;
  return m;
}

}  // namespace vq::detail
