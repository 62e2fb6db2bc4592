// duoattention: retrieval heads keep every row, streaming heads keep sinks and a recent window.
//
// Paper: Xiao et al., "DuoAttention: Efficient Long-Context LLM Inference with Retrieval and
// Streaming Heads", ICLR 2025 (kvpress: DuoAttentionPress).
//
// Rule: every KV head of a layer is either a retrieval head, which keeps all its rows (full
// attention), or a streaming head, which keeps its first duo_n_sink rows (attention sinks) and
// its duo_window most recent rows: over n_sink + window rows the oldest non-sink row leaves, as
// in streaming_llm. Which heads retrieve is decided once per layer (per batch element) from one
// score per KV head: the round(duo_head_ratio x n_kv_heads) heads of highest score (ties to the
// lower head index; a NaN score ranks lowest) are retrieval heads, the others streaming heads.
// The scores come from
//  - a head pattern (LayerCache::set_head_pattern / ModelCache::set_head_pattern, loaded from a
//    file by load_head_pattern: the official repository's full_attention_heads.tsv, one line per
//    layer, one tab-separated alpha per KV head). The heads are typed from the first step on;
//  - else an on-the-fly estimate from the prompt. Query r (the row at position r, which attends
//    to rows 0..r) would miss, in a streaming head, the rows n_sink .. r - window (older than its
//    window, not sinks). The first duo_obs_queries queries that miss anything are positions
//    r = n_sink + window .. n_sink + window + obs - 1; a head's score is the mean over them of
//    the attention mass its query pays to the rows it would miss (source=attention: the
//    engine's probabilities, folded over the head's query heads by gqa_reduce; proxy: the key
//    at r as the query, softmax(K[0..r] . k_r / sqrt(d))). Each query's mass is taken when its
//    row arrives, and the layer decides after the token at position n_sink + window + obs - 1,
//    so a chunk gives what its tokens give one at a time (with either source). Until then every
//    head keeps every row (at most n_sink + window + obs - 1); at the decision each streaming
//    head drops the obs rows that left its window at once (merge rule applied to each).
//
// Budget: the token budget is the streaming heads' n_sink + window (budget=B sets the window to
// B - n_sink); retrieval heads grow with the context, so the budget is not exact (`exact budget:
// no`). CacheStats reports the heads of each type and their bytes (retrieval_heads,
// retrieval_bytes, streaming_heads, streaming_bytes); LayerCache::head_types() each head's type,
// and row_scores() gives every row of a typed head its head's score (0 before the decision).
//
// Fields: duo_n_sink=4, duo_window=512, duo_head_ratio=0.5, duo_obs_queries=32; shared:
// source (auto/proxy/attention) and gqa_reduce (the estimate only), merge=drop (+gate, keys, the
// streaming heads' losers; the gate compares equal scores, so with the gate on every loser
// merges), quantize/demote, seed, kv_dtype.
// Deviations from the paper: the paper thresholds the optimised alphas over all heads of the
// model (kvpress: a quantile over every layer); here each layer keeps its own share of
// retrieval heads (duo_head_ratio of its KV heads), so a pattern file and the on-the-fly
// estimate follow one rule and each layer decides alone. The on-the-fly estimate is this
// library's (kvpress's calibrates mean queries and keys on a corpus; the paper optimises gates
// on synthetic passkey data). The paper's streaming heads attend to sinks + recent keys during
// prefill too; here the cache gives every head all rows until the decision (with a pattern,
// streaming heads hold sinks + window from the first step, as in the paper). Defaults: 4 sinks
// and a 512-row window (the paper: 64 sinks, 256 recent), so `budget=` matches streaming_llm's.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "policies/fields.h"
#include "policies/methods.h"
#include "policies/policy.h"
#include "veloxquant/errors.h"

namespace vq::detail {

constexpr std::string_view kDuoCard = R"(
id: duoattention
prefix: duo
summary: DuoAttention: retrieval heads keep every row, streaming heads keep sinks and a recent
  window; heads typed by a pattern file or estimated from the prompt's attention
paper: Xiao et al., DuoAttention: Efficient Long-Context LLM Inference with Retrieval and
  Streaming Heads, ICLR 2025
disposition: drop (merge optional)
score: per-head retrieval score (pattern file, or attention mass beyond the window)
budget: per head type (retrieval: all rows; streaming: n_sink + window)
deviations: per-layer share of retrieval heads (the paper: a model-wide threshold); on-the-fly
  estimate from the first queries past the window when no pattern is set; all heads keep every
  row until that decision
paper config: `duoattention:n_sink=64,window=256,head_ratio=0.5` with the model's
  full_attention_heads.tsv (`--duo-pattern FILE`)
defaults: the paper's per-model share is 0.25 to 0.5 retrieval heads; 4 sinks and budget= sets
  the window to budget - n_sink, as for streaming_llm
budget field: duo_window
budget offset: duo_n_sink
exact budget: no
head types: yes
| duo_n_sink | int | 4 | [0, 16777216] | leading rows a streaming head keeps (attention sinks)
| duo_window | int | 512 | [1, 16777216] | most recent rows a streaming head keeps
| duo_head_ratio | float | 0.5 | [0, 1] | share of each layer's KV heads that are retrieval heads
  (round(ratio x n_kv_heads), highest scores)
| duo_obs_queries | int | 32 | [1, 16777216] | queries past the window that estimate the scores
  when no pattern is set
attention: yes
)";

namespace {

// Head types (LayerCache::head_types).
constexpr std::int32_t kUndecided = 0, kRetrieval = 1, kStreaming = 2;

class DuoPolicy final : public TokenPolicy {
 public:
  explicit DuoPolicy(const PolicyContext& ctx)
      : TokenPolicy(ctx, token_budget(ctx.config)), window_(ctx.config.get_int("duo_window")),
        ratio_(ctx.config.get_float("duo_head_ratio")),
        obs_(ctx.config.get_int("duo_obs_queries")) {}

  bool takes_head_pattern() const noexcept override { return true; }
  void set_head_pattern(std::vector<float> scores) override { pattern_ = std::move(scores); }
  std::int32_t head_type(std::int64_t index) const noexcept override {
    return index >= 0 && index < static_cast<std::int64_t>(type_.size())
               ? type_[static_cast<std::size_t>(index)]
               : kUndecided;
  }
  void on_reset(LayerState& /*st*/) override {
    type_.clear();
    miss_.clear();
    head_score_.clear();
  }
  // The head pattern is set-up (set_head_pattern): the target's own is kept.
  void state(StateIO& io, LayerState& st) override {
    TokenPolicy::state(io, st);
    const std::uint64_t n = st.heads.size();
    io.vec(type_, n, "duoattention head types");
    io.check(type_.empty() || type_.size() == n,
             "duoattention head types: expected 0 or " + std::to_string(n) + ", found " +
                 std::to_string(type_.size()));
    for (std::int32_t t : type_) {
      io.check(t >= kUndecided && t <= kStreaming,
               "duoattention head types: expected 0, 1 or 2, found " + std::to_string(t));
    }
    io.vec_exact(miss_, type_.size(), "duoattention missed mass");
    io.vec_exact(head_score_, type_.size(), "duoattention head scores");
  }

  void end_step(LayerState& st, const AttentionRef* /*attention*/) override {
    const std::int64_t n_heads = st.n_heads_total();
    if (static_cast<std::int64_t>(type_.size()) != n_heads) {
      type_.assign(static_cast<std::size_t>(n_heads), kUndecided);
      miss_.assign(static_cast<std::size_t>(n_heads), 0.0);
      head_score_.assign(static_cast<std::size_t>(n_heads), 0.0f);
    }
    if (!pattern_.empty() && type_[0] == kUndecided) {
      for (std::int64_t b = 0; b < st.batch; ++b) decide(st, b, pattern_.data());
    }
    open_live(st);
    const std::int64_t decide_at = budget_ + obs_;  // rows held after the last observed query
    for (std::int64_t j = 0; j < st.step_new; ++j) {
      bool ready = false;
      for (std::int64_t i = 0; i < n_heads; ++i) {
        HeadState& hs = st.heads[static_cast<std::size_t>(i)];
        HeadCtx h{st, hs, i, st.shape.head_dim, st.rngs[static_cast<std::size_t>(st.kv_head_of(i))]};
        on_token(h, hs.prev + j);
        if (type_[static_cast<std::size_t>(i)] != kUndecided) continue;
        // Undecided: nothing has left, so live index r is position r.
        const std::int64_t r = h.n_live() - 1;
        if (r >= budget_ && r < decide_at) miss_[static_cast<std::size_t>(i)] += missed_mass(h, j, r);
        ready = r + 1 == decide_at;
      }
      if (ready) {
        for (std::int64_t b = 0; b < st.batch; ++b) {
          const std::int64_t H = st.shape.n_kv_heads;
          scores_.resize(static_cast<std::size_t>(H));
          for (std::int64_t h = 0; h < H; ++h) {
            scores_[static_cast<std::size_t>(h)] = static_cast<float>(
                miss_[static_cast<std::size_t>(b * H + h)] / static_cast<double>(obs_));
          }
          decide(st, b, scores_.data());
        }
      }
      for (std::int64_t i = 0; i < n_heads; ++i) {
        HeadState& hs = st.heads[static_cast<std::size_t>(i)];
        if (type_[static_cast<std::size_t>(i)] == kStreaming) {
          HeadCtx h{st, hs, i, st.shape.head_dim, st.rngs[static_cast<std::size_t>(st.kv_head_of(i))]};
          // Sinks stay; rows older than the window leave (one a token; obs at the decision).
          losers_.clear();
          for (std::int64_t k = n_sink_; k < h.n_live() - window_; ++k) losers_.push_back(k);
          evict_rows(h, losers_);
        }
        settle(st, i);
      }
    }
    commit_live(st);
  }

 protected:
  // A row's score (row_scores(), diagnostic) is its head's score once the head is typed, 0
  // before.
  void on_token(HeadCtx& h, std::int64_t row) override {
    push_row(h.hs, row, head_score_[static_cast<std::size_t>(h.index)]);
  }
  // The rows of a head are not ranked: the merge gate compares equal scores and always passes.
  float gate_score(const HeadCtx& /*h*/, std::int64_t /*i*/) const override { return 1.0f; }
  void on_merge(HeadCtx& /*h*/, std::int64_t /*target*/, std::int64_t /*loser*/) override {}

 private:
  // The attention mass query r (new token j of the step, live row r) pays to rows
  // [n_sink, r - window], the rows a streaming head would not hold for it.
  double missed_mass(HeadCtx& h, std::int64_t j, std::int64_t r) {
    const std::int64_t lo = n_sink_, hi = r - window_;  // inclusive
    double mass = 0.0;
    if (source_.attention()) {
      const float* a = attention_row(h, j);  // physical rows: the identity before any eviction
      for (std::int64_t k = lo; k <= hi; ++k) mass += a[h.hs.live[static_cast<std::size_t>(k)]];
    } else {
      const float* k_r = key_of(h, r);
      q_.assign(k_r, k_r + h.head_dim);
      weights_.resize(static_cast<std::size_t>(r + 1));
      proxy_weights(h, q_.data(), r + 1, weights_.data());
      for (std::int64_t k = lo; k <= hi; ++k) mass += weights_[static_cast<std::size_t>(k)];
    }
    return mass;
  }

  // Types the KV heads of batch element b from their scores (n_kv_heads of them); each head's
  // rows take its score.
  void decide(LayerState& st, std::int64_t b, const float* scores) {
    const std::int64_t H = st.shape.n_kv_heads;
    const auto n_ret = static_cast<std::int64_t>(std::floor(ratio_ * static_cast<double>(H) + 0.5));
    order_.resize(static_cast<std::size_t>(H));
    std::iota(order_.begin(), order_.end(), std::int64_t{0});
    std::stable_sort(order_.begin(), order_.end(), [&](std::int64_t x, std::int64_t y) {
      const float sx = scores[x], sy = scores[y];
      if (std::isnan(sy)) return !std::isnan(sx);  // NaN ranks lowest
      return sx > sy;
    });
    for (std::int64_t k = 0; k < H; ++k) {
      type_[static_cast<std::size_t>(b * H + order_[static_cast<std::size_t>(k)])] =
          k < n_ret ? kRetrieval : kStreaming;
    }
    for (std::int64_t h = 0; h < H; ++h) {
      const auto i = static_cast<std::size_t>(b * H + h);
      head_score_[i] = scores[h];
      std::fill(st.heads[i].score.begin(), st.heads[i].score.end(), scores[h]);
    }
  }

  std::int64_t window_;
  double ratio_;
  std::int64_t obs_;
  std::vector<float> pattern_;        // [n_kv_heads], empty: estimate on the fly
  std::vector<std::int32_t> type_;    // [B * n_kv_heads]
  std::vector<double> miss_;          // [B * n_kv_heads] summed missed mass of observed queries
  std::vector<float> head_score_;     // [B * n_kv_heads] the score each head was typed with
  std::vector<float> scores_, q_;
  std::vector<std::int64_t> order_, losers_;
};

}  // namespace

MethodInfo duoattention_method() {
  return method_card(kDuoCard, nullptr, &make_policy_of<DuoPolicy>);
}

}  // namespace vq::detail
