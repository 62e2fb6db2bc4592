// knorm and keydiff: key-only scorers, no attention at all (they fit engines with fused
// attention kernels that never materialise probabilities).
//
// knorm — Devoto et al., "A Simple and Effective L2 Norm-Based Strategy for KV Cache
// Compression", EMNLP 2024. Keys with a low L2 norm draw high attention, so the row with the
// largest key norm is evicted (score = -|k|).
// keydiff — Park et al., "KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context LLM
// Inference in Resource-Constrained Environments", 2025. Keys unlike the rest are kept: the
// anchor is the mean of the live rows' normalised keys and the row most similar to it is
// evicted (score = -cos(k, anchor), recomputed each eviction).
// Both protect the first n_sink rows and the newest `grace` rows. With a merge rule the gate
// compares exp(score), a positive monotone transform of the scores.
//
// Fields (PREFIX = knorm | keydiff): PREFIX_budget=512, PREFIX_n_sink=4, PREFIX_grace=16,
// PREFIX_merge=drop (+gate, keys), quantize..., seed, kv_dtype.
// Deviations from the papers: eviction is token by token as the cache fills (the papers score
// a prompt once); a recent window is protected.
#include <cmath>
#include <limits>

#include "base/kernels.h"
#include "policies/fields.h"
#include "policies/methods.h"
#include "policies/policy.h"

namespace vq::detail {
namespace {

class KeyScorerPolicy final : public TokenPolicy {
 public:
  KeyScorerPolicy(const CacheConfig& c, const std::string& p, bool diff)
      : TokenPolicy(c.get_int(p + "_budget"), c.get_int(p + "_n_sink"), merge_rule_from(c, p)),
        grace_(c.get_int(p + "_grace")), diff_(diff) {}

 protected:
  void on_token(HeadCtx& h, std::int64_t row) override {
    const float* k = key_of_row(h, row);
    push_row(h.hs, row, diff_ ? 0.0f : -std::sqrt(kernels::dot(k, k, h.head_dim)));
  }

  void eviction_scores(HeadCtx& h, float* out) override {
    const std::int64_t n = h.n_live(), d = h.head_dim;
    float* score = h.hs.score.data();
    if (diff_) {
      anchor_.assign(static_cast<std::size_t>(d), 0.0f);
      for (std::int64_t i = 0; i < n; ++i) {
        const float* k = key_of(h, i);
        const float norm = std::sqrt(kernels::dot(k, k, d));
        if (!(norm > 0.0f)) continue;
        for (std::int64_t c = 0; c < d; ++c) anchor_[static_cast<std::size_t>(c)] += k[c] / norm;
      }
      for (auto& a : anchor_) a /= static_cast<float>(n);
      for (std::int64_t i = 0; i < n; ++i) score[i] = -kernels::cosine(key_of(h, i), anchor_.data(), d);
    }
    const float inf = std::numeric_limits<float>::infinity();
    for (std::int64_t i = 0; i < n; ++i) out[i] = (i < n_sink_ || i >= n - grace_) ? inf : score[i];
  }

  float gate_score(const HeadCtx& h, std::int64_t i) const override {
    return std::exp(h.hs.score[static_cast<std::size_t>(i)]);
  }

 private:
  std::int64_t grace_;
  bool diff_;
  std::vector<float> anchor_;
};

MethodInfo key_method(const std::string& id, bool diff) {
  MethodInfo m;
  m.id = id;
  m.prefix = id;
  if (diff) {
    m.summary = "KeyDiff: evict the key most similar to the mean normalised key (keep "
                "distinctive keys); no attention needed";
    m.paper = "Park et al., KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context LLM "
              "Inference in Resource-Constrained Environments, 2025";
    m.score_signal = "key diversity (-cos to the mean key)";
  } else {
    m.summary = "KNorm: evict the key with the largest L2 norm; no attention needed";
    m.paper = "Devoto et al., A Simple and Effective L2 Norm-Based Strategy for KV Cache "
              "Compression, EMNLP 2024";
    m.score_signal = "key norm (low is kept)";
  }
  m.disposition = "drop (merge optional)";
  m.budget_type = "uniform";
  m.deviations = "token-by-token eviction as the cache fills (paper: one pass over the "
                 "prompt); recent window protected";
  m.fields = {
      int_field(id + "_budget", 512, 1, kMaxTokens, "rows kept per KV head, sinks included"),
      int_field(id + "_n_sink", 4, 0, kMaxTokens, "leading rows never evicted"),
      int_field(id + "_grace", 16, 0, kMaxTokens, "newest rows protected from eviction"),
  };
  add_merge_fields(m.fields, id, "drop");
  add_quantize_fields(m.fields);
  add_common_fields(m.fields);
  m.paper_config = diff ? "- (the paper prunes the prompt once; a token-by-token spec cannot "
                         "express it)"
                       : "- (the paper prunes the prompt once by key norm; a token-by-token spec "
                         "cannot express it)";
  m.make_policy = diff ? +[](const PolicyContext& ctx) -> std::unique_ptr<Policy> {
    return std::make_unique<KeyScorerPolicy>(ctx.config, "keydiff", true);
  } : +[](const PolicyContext& ctx) -> std::unique_ptr<Policy> {
    return std::make_unique<KeyScorerPolicy>(ctx.config, "knorm", false);
  };
  m.check = diff ? +[](const CacheConfig& c) {
    require_less(c, "keydiff_n_sink", "keydiff_budget");
    require_sum_less(c, "keydiff_n_sink", "keydiff_grace", "keydiff_budget");
  } : +[](const CacheConfig& c) {
    require_less(c, "knorm_n_sink", "knorm_budget");
    require_sum_less(c, "knorm_n_sink", "knorm_grace", "knorm_budget");
  };
  m.get_budget = diff ? +[](const CacheConfig& c) { return c.get_int("keydiff_budget"); }
                      : +[](const CacheConfig& c) { return c.get_int("knorm_budget"); };
  m.set_budget = diff ? +[](CacheConfig& c, std::int64_t b) { c.set("keydiff_budget", b); }
                      : +[](CacheConfig& c, std::int64_t b) { c.set("knorm_budget", b); };
  return m;
}

}  // namespace

MethodInfo knorm_method() { return key_method("knorm", false); }
MethodInfo keydiff_method() { return key_method("keydiff", true); }

}  // namespace vq::detail
