// h2o: Heavy-Hitter Oracle, cumulative attention mass.
//
// Paper: Zhang et al., "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of Large
// Language Models", NeurIPS 2023.
//
// Proxy rule (reference library): the first token starts at score 1.0. For each later token
// t, a = softmax(K_stored . k_t / sqrt(d)) over the stored rows (t excluded);
// score <- score * decay + a; t is appended with score 0. Over budget: the first n_sink rows
// and the newest grace rows are protected, the argmin is evicted (ties to the lowest index).
//
// Fields: h2o_budget=512, h2o_n_sink=4, h2o_grace=-1 (derived: floor(h2o_recent_ratio x
// (budget - n_sink))), h2o_recent_ratio=0.5, h2o_decay=0.98; shared: merge=drop (+gate, keys),
// source=auto, seed, kv_dtype. The recent window is H2O's: the paper keeps the newest rows and
// the heavy hitters in equal shares; the decay is the reference library's (the paper's is 1).
// grace=0 with decay=1 is a degenerate setting, reachable explicitly (h2o:grace=0,decay=1):
// the newest row, at score 0, always loses and the cache freezes on the first tokens.
// Attention source (source=attention): the new token is appended first and every live row,
// itself included, adds the attention the token's query heads paid it (folded by gqa_reduce):
// score <- score * decay + a. A prefill chunk (a step of S > 1 tokens) is one decision, as in
// the paper's prompt phase: every query of the chunk adds its attention (one after another),
// then the rows ranked lowest leave in one cut, the sinks and the newest grace rows kept.
// Deviations from the paper (defaults): 4 attention sinks protected, decay 0.98; with the proxy
// source the incoming key stands in for the query.
#include "policies/methods/h2o.h"

#include <limits>

#include "policies/fields.h"
#include "policies/methods.h"

namespace vq::detail {

// The registry entry (methods.h, method_card): what `veloxquant list` and the README table
// show, the field table and the shared field groups.
constexpr std::string_view kCard = R"(
id: h2o
token loop: yes
prefix: h2o
summary: H2O: evict the lowest cumulative attention mass (decayed), sinks and a grace window
  protected
paper: Zhang et al., H2O: Heavy-Hitter Oracle, NeurIPS 2023
disposition: drop (merge optional)
score: cumulative attention mass
budget: uniform
deviations: decay 0.98 and 4 sinks by default (the paper: 1, none); with the proxy source
  (source=auto without probabilities) the incoming key stands in for the query
paper config: `h2o:n_sink=0,recent_ratio=0.5,decay=1,source=attention` (recent rows and heavy
  hitters in equal shares, no decay, true attention)
defaults: H2O's equal split (recent window = half the non-sink budget, so it scales with budget=)
  with 4 sinks and the reference library's decay 0.98, measured better than 1 with true attention
  on stories260K
| h2o_budget | int | 512 | [1, 16777216] | rows kept per KV head, sinks included
| h2o_n_sink | int | 4 | [0, 16777216] | leading rows never evicted (attention sinks)
groups: mass
attention: yes
)";

namespace {

std::int64_t family_window(const CacheConfig& c) {
  const std::string& p = c.info().prefix;
  return recent_window(c, p, c.has(p + "_recent") ? "recent" : "grace",
                       c.has(p + "_chunk_size") ? p + "_chunk_size" : "");
}

float family_decay(const CacheConfig& c) {
  const std::string& p = c.info().prefix;
  return c.has(p + "_decay") ? static_cast<float>(c.get_float(p + "_decay")) : 1.0f;
}

}  // namespace

H2OPolicy::H2OPolicy(const PolicyContext& ctx, std::int64_t budget)
    : TokenPolicy(ctx, budget), grace_(family_window(ctx.config)),
      decay_(family_decay(ctx.config)) {}

H2OPolicy::H2OPolicy(const PolicyContext& ctx)
    : H2OPolicy(ctx, ctx.config.get_int(ctx.config.info().prefix + "_budget")) {}

void H2OPolicy::on_token(HeadCtx& h, std::int64_t row) {
  if (source_.attention()) {
    // score <- score * decay + the attention the new token's queries paid to each live row
    // (itself included; a chunk's queries are added one after another).
    push_row(h.hs, row, 0.0f);
    const std::int64_t n = h.n_live();
    const float* a = attention_row(h, row - h.hs.prev);
    weights_.resize(static_cast<std::size_t>(n));
    float* __restrict score = h.hs.score.data();
    float* __restrict w = weights_.data();
    const std::int64_t* live = h.hs.live.data();
    const float decay = decay_;
    if (live[n - 1] == n - 1) {
      // live is strictly increasing from 0, so it is the identity (no row left yet this step):
      // the same sums without the gather, in a loop the compiler vectorizes.
      for (std::int64_t i = 0; i < n; ++i) {
        w[i] = a[i];
        score[i] = score[i] * decay + w[i];
      }
    } else {
      for (std::int64_t i = 0; i < n; ++i) {
        w[i] = a[live[i]];
        score[i] = score[i] * decay + w[i];
      }
    }
    last_n_ = n;
    return;
  }
  const std::int64_t n = h.n_live();
  last_n_ = n;
  if (n == 0) {
    push_row(h.hs, row, 1.0f);
    return;
  }
  weights_.resize(static_cast<std::size_t>(n));
  proxy_weights(h, key_of_row(h, row), n, weights_.data());
  float* score = h.hs.score.data();
  for (std::int64_t i = 0; i < n; ++i) score[i] = score[i] * decay_ + weights_[i];
  push_row(h.hs, row, 0.0f);
}

void H2OPolicy::eviction_scores(HeadCtx& h, float* out) {
  const std::int64_t n = h.n_live();
  const float inf = std::numeric_limits<float>::infinity();
  const float* score = h.hs.score.data();
  for (std::int64_t i = 0; i < n; ++i) {
    out[i] = (i < n_sink_ || i >= n - grace_) ? inf : rank_of(score[i]);
  }
}

MethodInfo h2o_method() {
  return method_card(kCard, &check_recent_family, &make_policy_of<H2OPolicy>);
}

}  // namespace vq::detail
