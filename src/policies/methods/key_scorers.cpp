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

// The registry entries (methods.h, method_card): what `veloxquant list` and the README table
// show, the field tables and the shared field groups.
constexpr std::string_view kKnormCard = R"(
id: knorm
token loop: yes
prefix: knorm
summary: KNorm: evict the key with the largest L2 norm; no attention needed
paper: Devoto et al., A Simple and Effective L2 Norm-Based Strategy for KV Cache Compression,
  EMNLP 2024
disposition: drop (merge optional)
score: key norm (low is kept)
budget: uniform
deviations: token-by-token eviction as the cache fills (paper: one pass over the prompt); recent
  window protected
paper config: - (the paper prunes the prompt once by key norm; a token-by-token spec cannot
  express it)
| knorm_budget | int | 512 | [1, 16777216] | rows kept per KV head, sinks included
| knorm_n_sink | int | 4 | [0, 16777216] | leading rows never evicted
| knorm_grace | int | 16 | [0, 16777216] | newest rows protected from eviction
)";

constexpr std::string_view kKeydiffCard = R"(
id: keydiff
token loop: yes
prefix: keydiff
summary: KeyDiff: evict the key most similar to the mean normalised key (keep distinctive keys);
  no attention needed
paper: Park et al., KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context LLM Inference
  in Resource-Constrained Environments, 2025
disposition: drop (merge optional)
score: key diversity (-cos to the mean key)
budget: uniform
deviations: token-by-token eviction as the cache fills (paper: one pass over the prompt); recent
  window protected
paper config: - (the paper prunes the prompt once; a token-by-token spec cannot express it)
| keydiff_budget | int | 512 | [1, 16777216] | rows kept per KV head, sinks included
| keydiff_n_sink | int | 4 | [0, 16777216] | leading rows never evicted
| keydiff_grace | int | 16 | [0, 16777216] | newest rows protected from eviction
)";

namespace {

// knorm (Diff = false) and keydiff (Diff = true), each reading its fields through its prefix.
template <bool Diff>
class KeyScorerPolicy final : public TokenPolicy {
 public:
  explicit KeyScorerPolicy(const PolicyContext& ctx)
      : TokenPolicy(ctx), grace_(ctx.config.get_int(ctx.config.info().prefix + "_grace")) {}

 protected:
  void on_token(HeadCtx& h, std::int64_t row) override {
    const float* k = key_of_row(h, row);
    push_row(h.hs, row, Diff ? 0.0f : -std::sqrt(kernels::dot(k, k, h.head_dim)));
  }

  void eviction_scores(HeadCtx& h, float* out) override {
    const std::int64_t n = h.n_live(), d = h.head_dim;
    float* score = h.hs.score.data();
    if (Diff) {
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
    for (std::int64_t i = 0; i < n; ++i) {
      out[i] = (i < n_sink_ || i >= n - grace_) ? inf : rank_of(score[i]);
    }
  }

  float gate_score(const HeadCtx& h, std::int64_t i) const override {
    return std::exp(h.hs.score[static_cast<std::size_t>(i)]);
  }

 private:
  std::int64_t grace_;
  std::vector<float> anchor_;
};

// Guards: n_sink < budget and n_sink + grace < budget.
void check(const CacheConfig& c) {
  const std::string& p = c.info().prefix;
  require_less(c, p + "_n_sink", p + "_budget");
  require_sum_less(c, p + "_n_sink", p + "_grace", p + "_budget");
}

}  // namespace

MethodInfo knorm_method() {
  return method_card(kKnormCard, &check, &make_policy_of<KeyScorerPolicy<false>>);
}
MethodInfo keydiff_method() {
  return method_card(kKeydiffCard, &check, &make_policy_of<KeyScorerPolicy<true>>);
}

}  // namespace vq::detail
