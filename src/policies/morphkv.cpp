// morphkv: keep the rows a window of recent tokens attends to.
//
// Paper: Ghadia et al., "Dialogue Without Limits: Constant-Sized KV Caches for Extended
// Responses in LLMs", ICML 2025.
//
// Proxy rule: append the new row first; over budget, R = the last w = min(window, rows) rows
// (the new one included); relevance_j = fusion over r in R of softmax(K_all . k_r / sqrt(d))_j
// (mean: sum / w; sum; max); sinks and the last w rows are protected; evict argmin.
// Recomputed from the live rows every step (no accumulator), no randomness. window = 1 ranks
// like tova but protects the newest row.
//
// Fields: morphkv_budget=512, morphkv_n_sink=4, morphkv_window=8, morphkv_fusion=mean,
// morphkv_merge=drop (+gate, keys), seed, kv_dtype.
// Deviations from the paper: key-as-query proxy (the paper keeps the logits of the last W
// queries and renormalises over the non-recent columns); reference default fusion is mean
// (paper code: sum or max by task).
#include <algorithm>
#include <limits>

#include "policies/fields.h"
#include "policies/methods.h"
#include "policies/policy.h"

namespace vq::detail {
namespace {

enum class Fusion { kMean, kSum, kMax };

class MorphKVPolicy final : public TokenPolicy {
 public:
  MorphKVPolicy(std::int64_t budget, std::int64_t n_sink, std::int64_t window, Fusion fusion,
                MergeRule merge)
      : TokenPolicy(budget, n_sink, merge), window_(window), fusion_(fusion) {}

 protected:
  void on_token(HeadCtx& h, std::int64_t row) override { push_row(h.hs, row, 0.0f); }

  void eviction_scores(HeadCtx& h, float* out) override {
    const std::int64_t n = h.n_live();
    const std::int64_t w = std::min(window_, n);
    weights_.resize(static_cast<std::size_t>(n));
    for (std::int64_t r = n - w; r < n; ++r) {
      proxy_weights(h, key_of(h, r), n, weights_.data());
      const bool first = r == n - w;
      for (std::int64_t j = 0; j < n; ++j) {
        const float x = weights_[static_cast<std::size_t>(j)];
        if (first) {
          out[j] = x;
        } else if (fusion_ == Fusion::kMax) {
          out[j] = std::max(out[j], x);
        } else {
          out[j] += x;
        }
      }
    }
    if (fusion_ == Fusion::kMean) {
      const float fw = static_cast<float>(w);
      for (std::int64_t j = 0; j < n; ++j) out[j] /= fw;
    }
    float* score = h.hs.score.data();
    const float inf = std::numeric_limits<float>::infinity();
    for (std::int64_t j = 0; j < n; ++j) {
      score[j] = out[j];
      if (j < n_sink_ || j >= n - w) out[j] = inf;
    }
  }

 private:
  std::int64_t window_;
  Fusion fusion_;
};

std::unique_ptr<Policy> make(const PolicyContext& ctx) {
  const CacheConfig& c = ctx.config;
  const std::string& f = c.get_enum("morphkv_fusion");
  const Fusion fusion = f == "sum" ? Fusion::kSum : f == "max" ? Fusion::kMax : Fusion::kMean;
  return std::make_unique<MorphKVPolicy>(c.get_int("morphkv_budget"), c.get_int("morphkv_n_sink"),
                                         c.get_int("morphkv_window"), fusion,
                                         merge_rule_from(c, "morphkv"));
}

void check(const CacheConfig& c) {
  require_less(c, "morphkv_n_sink", "morphkv_budget");
  require_at_most(c, "morphkv_window", "morphkv_budget");
  require_sum_less(c, "morphkv_n_sink", "morphkv_window", "morphkv_budget");
}

}  // namespace

MethodInfo morphkv_method() {
  MethodInfo m;
  m.id = "morphkv";
  m.prefix = "morphkv";
  m.summary = "MorphKV: keep the rows a window of recent tokens attends to (recomputed each "
              "step)";
  m.paper = "Ghadia et al., Dialogue Without Limits: Constant-Sized KV Caches for Extended "
            "Responses in LLMs, ICML 2025";
  m.disposition = "drop (merge optional)";
  m.score_signal = "recent-window attention";
  m.budget_type = "uniform";
  m.deviations = "key-as-query proxy; softmax over all rows rather than the non-recent "
                 "columns; mean fusion by default";
  m.fields = {
      int_field("morphkv_budget", 512, 1, kMaxTokens, "rows kept per KV head, sinks included"),
      int_field("morphkv_n_sink", 4, 0, kMaxTokens, "leading rows never evicted"),
      int_field("morphkv_window", 8, 1, kMaxTokens,
                "recent rows whose attention ranks the others (protected themselves)"),
      enum_field("morphkv_fusion", "mean", {"mean", "sum", "max"},
                 "how the window's attention rows are combined"),
  };
  add_merge_fields(m.fields, "morphkv", "drop");
  add_quantize_fields(m.fields);
  add_common_fields(m.fields);
  m.check = &check;
  m.get_budget = [](const CacheConfig& c) { return c.get_int("morphkv_budget"); };
  m.set_budget = [](CacheConfig& c, std::int64_t b) { c.set("morphkv_budget", b); };
  m.make_policy = &make;
  return m;
}

}  // namespace vq::detail
