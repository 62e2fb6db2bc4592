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
// Fields: morphkv_budget=512, morphkv_n_sink=4, morphkv_window=8, morphkv_fusion=mean;
// shared: merge=drop (+gate, keys), seed, kv_dtype.
// Attention source (the paper's rule): each row keeps the attention the last W queries paid it;
// at eviction each query's attention over the candidate columns (not sinks, not the W newest
// rows) is renormalised to sum to 1 (the softmax of its logits over those columns) and fused
// (sum, max or mean).
// Deviations from the paper: with the proxy source the keys stand in for the queries and the
// softmax runs over all rows; the reference default fusion is mean (paper code: sum or max).
#include <algorithm>
#include <limits>
#include <vector>

#include "policies/fields.h"
#include "policies/methods.h"
#include "policies/policy.h"

namespace vq::detail {

// The registry entry (methods.h, method_card): what `veloxquant list` and the README table
// show, the field table and the shared field groups.
constexpr std::string_view kCard = R"(
id: morphkv
token loop: yes
prefix: morphkv
summary: MorphKV: keep the rows a window of recent tokens attends to (recomputed each step)
paper: Ghadia et al., Dialogue Without Limits: Constant-Sized KV Caches for Extended Responses in
  LLMs, ICML 2025
disposition: drop (merge optional)
score: recent-window attention
budget: uniform
deviations: proxy source: keys as queries, softmax over all rows (source=attention: the paper's
  last-W-query attention renormalised over candidate columns); mean fusion by default
paper config: `morphkv:fusion=sum,source=attention` (or fusion=max, by task)
| morphkv_budget | int | 512 | [1, 16777216] | rows kept per KV head, sinks included
| morphkv_n_sink | int | 4 | [0, 16777216] | leading rows never evicted
| morphkv_window | int | 8 | [1, 16777216] | recent rows whose attention ranks the others
  (protected themselves)
| morphkv_fusion | enum | mean | {mean, sum, max} | how the window's attention rows are combined
attention: yes
)";

namespace {
void check(const CacheConfig& c) {
  require_less(c, "morphkv_n_sink", "morphkv_budget");
  require_at_most(c, "morphkv_window", "morphkv_budget");
  require_sum_less(c, "morphkv_n_sink", "morphkv_window", "morphkv_budget");
  if (c.get_int("morphkv_window") == 1 && c.is_set("morphkv_fusion")) {
    config_error(c, "morphkv_fusion has no effect with morphkv_window=1 (one query, nothing to "
                    "fuse)");
  }
}

enum class Fusion { kMean, kSum, kMax };

Fusion fusion_of(const std::string& f) {
  return f == "sum" ? Fusion::kSum : f == "max" ? Fusion::kMax : Fusion::kMean;
}

class MorphKVPolicy final : public TokenPolicy {
 public:
  explicit MorphKVPolicy(const PolicyContext& ctx)
      : TokenPolicy(ctx), window_(ctx.config.get_int("morphkv_window")),
        fusion_(fusion_of(ctx.config.get_enum("morphkv_fusion"))) {}

 protected:
  // The attention source keeps each row's attention of the last `window` queries (hist).
  void state(StateIO& io, LayerState& st) override {
    TokenPolicy::state(io, st);
    if (!io.loading()) return;
    for (const HeadState& hs : st.heads) {
      const bool rows = hs.store()->size() > 0;
      io.check(hs.hist_stride == (source_.attention() && rows ? window_ : hs.hist_stride) &&
                   (hs.hist_stride == 0 || hs.hist_stride == window_),
               "morphkv history: expected " + std::to_string(window_) + " values a row, found " +
                   std::to_string(hs.hist_stride));
    }
  }
  void begin_step(LayerState& st) override {
    if (source_.attention()) {
      for (HeadState& hs : st.heads) {
        if (hs.hist_stride == 0 && hs.live.empty() && hs.score.empty()) hs.hist_stride = window_;
      }
    }
  }

  void on_token(HeadCtx& h, std::int64_t row) override {
    push_row(h.hs, row, 0.0f);
    if (!source_.attention()) return;
    // Keep the attention of the last `window` queries: query t writes column t mod window of
    // every live row's history (a new row starts with zeros for the queries before it).
    const std::int64_t n = h.n_live(), W = window_;
    const std::int64_t col = h.rows().positions[row] % W;
    const float* a = attention_row(h, row - h.hs.prev);
    for (std::int64_t i = 0; i < n; ++i) {
      h.hs.hist[static_cast<std::size_t>(i * W + col)] = a[h.hs.live[static_cast<std::size_t>(i)]];
    }
  }

  void eviction_scores(HeadCtx& h, float* out) override {
    if (source_.attention()) {
      paper_scores(h, out);
      return;
    }
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
      out[j] = (j < n_sink_ || j >= n - w) ? inf : rank_of(out[j]);
    }
  }

 private:
  // The paper's rule: for each of the last W queries, its attention over the candidate rows
  // (neither sinks nor the W newest) renormalised to sum to 1 (a softmax of its logits over
  // those columns), fused over the queries.
  void paper_scores(HeadCtx& h, float* out) {
    const std::int64_t n = h.n_live(), W = window_;
    const std::int64_t w = std::min(W, n);
    const float inf = std::numeric_limits<float>::infinity();
    for (std::int64_t j = 0; j < n; ++j) out[j] = 0.0f;
    std::int64_t used = 0;
    for (std::int64_t col = 0; col < W; ++col) {
      float total = 0.0f;
      for (std::int64_t j = n_sink_; j < n - w; ++j) total += h.hs.hist[static_cast<std::size_t>(j * W + col)];
      if (!(total > 0.0f)) continue;  // a query slot not yet written, or no candidate mass
      for (std::int64_t j = n_sink_; j < n - w; ++j) {
        const float x = h.hs.hist[static_cast<std::size_t>(j * W + col)] / total;
        out[j] = (fusion_ == Fusion::kMax) ? std::max(out[j], x) : out[j] + x;
      }
      ++used;
    }
    float* score = h.hs.score.data();
    for (std::int64_t j = 0; j < n; ++j) {
      if (fusion_ == Fusion::kMean && used > 0) out[j] /= static_cast<float>(used);
      score[j] = out[j];
      out[j] = (j < n_sink_ || j >= n - w) ? inf : rank_of(out[j]);
    }
  }

  std::int64_t window_;
  Fusion fusion_;
};

}  // namespace

MethodInfo morphkv_method() { return method_card(kCard, &check, &make_policy_of<MorphKVPolicy>); }

}  // namespace vq::detail
