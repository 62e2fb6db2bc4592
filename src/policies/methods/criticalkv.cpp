// criticalkv, criticaladakv: at prefill, keep the rows that SnapKV's window attention ranks
// first, then the rows whose loss would perturb the attention output most (attention x the
// value's norm through the head's output projection).
//
// Paper: Feng et al., "Identify Critical KV Cache in LLM Inference from an Output Perturbation
// Perspective", 2025 (arXiv 2502.03805); kvpress: CriticalKVPress, CriticalAdaKVPress.
//
// Rule: on a step with S > 1 new rows (a prefill chunk) that leaves more than budget rows, each
// head's live rows are scored by SnapKV's observation window (policies/prefill_only.h,
// WindowScoredPolicy: the last w = min(crit_obs_window, n) rows' attention over the m = n - w
// earlier rows, pooled with crit_kernel / crit_pool). The head keeps its crit_n_sink sinks, its
// w window rows and c = budget - n_sink - w chosen rows of the candidates [n_sink, m):
//  stage 1: the c1 = floor(crit_first_stage_ratio x c) candidates of highest pooled score s_i;
//  stage 2: the c - c1 remaining candidates of highest (s_i + crit_epsilon) x N_i, where N_i is
//   the mean over the KV head's query heads g of ||W_o^g v_i||_2 = sqrt(v_i^T G_g v_i), with
//   G_g = W_o^g^T W_o^g (D x D) the Gram matrix of query head g's slice of the output projection
//   (LayerCache::set_output_gram; the engine passes it from its W_o), v_i the value as stored.
// Ranks: highest first, ties to the lowest index, NaN never wins a keep (in both stages). The
// survivors stay in position order. Single-token steps (decode) append without eviction, so the
// cache grows past the budget during generation, as snapkv's does.
// Without Gram matrices (a LayerCache or C API user who did not call set_output_gram) N_i is
// ||v_i||_2 (every G_g = I), and CacheStats::value_norm says "plain" instead of "projected", so
// the cache still runs everywhere (the conformance suite, the fuzzers, caches without a model).
//
// criticaladakv is the same policy with AdaKV's head-wise budgets (`headwise=true` by default,
// the card's shared defaults; policies/headwise.h): at a prefill chunk the layer's
// n_kv_heads x budget rows are first allocated among the heads by the pooled window score
// (headwise_losers: sinks and windows protected, each head keeping at least its floor of
// headwise_floor x (budget - protected) candidates), as CriticalAdaKVPress allocates with its
// base score; then each head runs the two stages above with c = its allocated rows minus its
// sinks and window. `criticalkv:headwise=true` is the same method.
//
// Fields (both): crit_budget=512, crit_obs_window=32, crit_n_sink=4, crit_kernel=7,
// crit_pool=max, crit_first_stage_ratio=0.5, crit_epsilon=1e-4; shared: source=auto,
// gqa_reduce, headwise (criticalkv false, criticaladakv true), headwise_floor=0.2, merge=drop
// (+gate, keys; the gate compares the unpooled window mass), quantize/demote, seed, kv_dtype.
// Guards: n_sink < budget, n_sink + obs_window < budget, kernel odd.
// Deviations from the paper:
//  - the L2 norm of W_o^g v instead of the paper's L1 norm: the L2 norm is sqrt(v^T G v) with a
//    D x D Gram matrix per query head, so the engine hands the cache Hq x D x D floats once per
//    layer (W_o itself may be quantized and is dim x Hq D) and a row costs D^2 per query head
//    instead of dim x D; the perturbation bound of the paper holds in any norm (it is the
//    triangle inequality over rows), and the two norms differ by at most a factor sqrt(dim);
//  - GQA: the mean of the group's query heads' norms, as kvpress (a sum ranks alike: every KV
//    head of a layer serves the same number of query heads; the mean keeps crit_epsilon's scale
//    that of one head);
//  - stage 1's share is of the rows the method chooses (sinks and the window are kept outside
//    the two stages); kvpress applies the ratio to the whole budget, where SnapKV's window rows
//    take stage-1 places;
//  - the base score is SnapKV's window as snapkv implements it (proxy source: window keys stand
//    in for their queries; sinks protected; later prefill chunks scored with the rows kept
//    earlier);
//  - values as the cache stores them (fp16 by default) and post-projection biases ignored (W_o
//    has none in Llama).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "policies/fields.h"
#include "policies/headwise.h"
#include "policies/methods.h"
#include "policies/prefill_only.h"

namespace vq::detail {

// The registry entries (methods.h, method_card): criticalkv, and criticaladakv, which differs
// only by its shared default headwise=true.
// The two cards' heads (each with its `id:` line), then the field table they share.
constexpr std::string_view kCriticalCard = R"(
id: criticalkv
prefix: crit
summary: CriticalKV: at prefill, keep half the chosen rows by SnapKV's window attention, the
  rest by attention x the norm of W_o v (output perturbation); decode appends
paper: Feng et al., Identify Critical KV Cache in LLM Inference from an Output Perturbation
  Perspective, 2025
disposition: drop (merge optional)
score: window attention, then attention x projected value norm
budget: uniform at prefill (decode grows)
deviations: L2 norm of W_o v from W_o's Gram matrices (paper: L1); the norm of v without them;
  the stage-1 ratio splits the rows after sinks and window; SnapKV's proxy without attention
paper config: `criticalkv:n_sink=0,source=attention` (SnapKV window 32, max pooling, stage
  ratio 0.5, epsilon 1e-4)
prefill only: yes
)";

constexpr std::string_view kCriticalAdaCard = R"(
id: criticaladakv
prefix: crit
summary: CriticalAdaKV: criticalkv with AdaKV's head-wise budgets (headwise=true): the
  layer's rows shared among heads by window attention, then the two stages per head
paper: Feng et al., Identify Critical KV Cache in LLM Inference from an Output Perturbation
  Perspective, 2025
disposition: drop (merge optional)
score: window attention, then attention x projected value norm
budget: head-wise at prefill (decode grows)
deviations: as criticalkv; the head budgets come from the library's head-wise allocation
  (floor headwise_floor = 0.2, AdaKV's safeguard)
paper config: `criticaladakv:n_sink=0,source=attention` (headwise_floor 0.2)
prefill only: yes
shared defaults: headwise=true
)";

constexpr std::string_view kCriticalFields = R"(
| crit_budget | int | 512 | [1, 16777216] | rows kept per KV head after a prefill chunk, sinks
  and window included
| crit_obs_window | int | 32 | [1, 16777216] | last rows of the chunk used as queries
| crit_n_sink | int | 4 | [0, 16777216] | leading rows never evicted
| crit_kernel | int | 7 | [1, 1023] | pooling kernel along the sequence (odd)
| crit_pool | enum | max | {max, avg} | pooling of the window attention mass
| crit_first_stage_ratio | float | 0.5 | [0, 1] | share of the chosen rows (budget - sinks -
  window) kept by the window score alone; the rest by score x projected value norm
| crit_epsilon | float | 0.0001 | [0, 1e+06] | stage 2 ranks (score + epsilon) x the L2 norm of W_o v
attention: yes
)";

namespace {

void check(const CacheConfig& c) {
  require_less(c, "crit_n_sink", "crit_budget");
  require_sum_less(c, "crit_n_sink", "crit_obs_window", "crit_budget");
  if (c.get_int("crit_kernel") % 2 == 0) {
    config_error(c, "crit_kernel must be odd (pooling is centred), got " +
                        std::to_string(c.get_int("crit_kernel")));
  }
}

class CriticalPolicy final : public WindowScoredPolicy {
 public:
  explicit CriticalPolicy(const PolicyContext& ctx)
      : WindowScoredPolicy(ctx), ratio_(ctx.config.get_float("crit_first_stage_ratio")),
        epsilon_(ctx.config.get_float("crit_epsilon")) {}

  bool reads_output_gram() const noexcept override { return true; }

 protected:
  void select(HeadCtx& h, std::int64_t keep) override {
    const std::int64_t n = h.n_live();
    const std::int64_t m = pool(h);
    two_stages(h, pooled_.data(), m, keep - n_sink_ - (n - m));
  }

  // AdaKV's allocation by the pooled window score (the base ranking, eviction_scores), then
  // the two stages in each head at its allocated budget.
  void headwise_cut(LayerState& st, std::int64_t keep) override {
    if (keep < 0) {
      TokenPolicy::headwise_cut(st, keep);
      return;
    }
    const std::int64_t H = st.shape.n_kv_heads;
    rankings_.resize(static_cast<std::size_t>(H));
    for (std::int64_t b = 0; b < st.batch; ++b) {
      for (std::int64_t kv = 0; kv < H; ++kv) {
        HeadCtx h = ctx(st, b * H + kv);
        std::vector<float>& rank = rankings_[static_cast<std::size_t>(kv)];
        rank.resize(static_cast<std::size_t>(h.n_live()));
        eviction_scores(h, rank.data());
      }
      headwise_losers(rankings_, keep, headwise_.floor, allocation_, /*newer_first=*/true);
      for (std::int64_t kv = 0; kv < H; ++kv) {
        const std::int64_t i = b * H + kv;
        HeadCtx h = ctx(st, i);
        const std::int64_t n = h.n_live();
        const std::int64_t head_keep =
            n - static_cast<std::int64_t>(allocation_[static_cast<std::size_t>(kv)].size());
        const std::int64_t m = n - std::min(window_, n);
        // The candidates' ranks are their pooled scores (rank_of: an overflowed +inf as the
        // largest float); sinks and window rows are outside [n_sink, m).
        if (head_keep < n) {
          two_stages(h, rankings_[static_cast<std::size_t>(kv)].data(), m,
                     head_keep - n_sink_ - (n - m));
        }
        settle(st, i);
      }
    }
  }

 private:
  HeadCtx ctx(LayerState& st, std::int64_t i) {
    return HeadCtx{st, st.heads[static_cast<std::size_t>(i)], i, st.shape.head_dim,
                   st.rngs[static_cast<std::size_t>(st.kv_head_of(i))]};
  }

  // Keeps `chosen` of the candidates [n_sink, m) of head h (base scores s, by live index):
  // stage 1 the floor(ratio x chosen) of highest s, stage 2 the rest by (s + epsilon) x N_i
  // among the others; evicts every other candidate.
  void two_stages(HeadCtx& h, const float* s, std::int64_t m, std::int64_t chosen) {
    const std::int64_t lo = n_sink_;
    if (m - lo <= std::max<std::int64_t>(0, chosen)) return;  // every candidate stays
    chosen = std::max<std::int64_t>(0, chosen);
    const auto first = static_cast<std::int64_t>(std::floor(ratio_ * static_cast<double>(chosen)));
    rank_desc(s, lo, m, stage1_);
    // Stage 2 among the candidates stage 1 left: (s + epsilon) x projected value norm.
    weighted_.assign(static_cast<std::size_t>(h.n_live()), 0.0f);
    for (std::size_t k = static_cast<std::size_t>(first); k < stage1_.size(); ++k) {
      const std::int64_t i = stage1_[k];
      weighted_[static_cast<std::size_t>(i)] = static_cast<float>(
          (static_cast<double>(s[i]) + epsilon_) * projected_norm(h, i));
    }
    rest_.assign(stage1_.begin() + static_cast<std::ptrdiff_t>(first), stage1_.end());
    std::sort(rest_.begin(), rest_.end());
    std::stable_sort(rest_.begin(), rest_.end(), [&](std::int64_t a, std::int64_t b) {
      const float pa = weighted_[static_cast<std::size_t>(a)];
      const float pb = weighted_[static_cast<std::size_t>(b)];
      if (std::isnan(pb)) return !std::isnan(pa);  // NaN never wins a keep
      return pa > pb;
    });
    const auto second = static_cast<std::size_t>(chosen - first);
    losers_.assign(rest_.begin() + static_cast<std::ptrdiff_t>(std::min(second, rest_.size())),
                   rest_.end());
    std::sort(losers_.begin(), losers_.end());
    evict_rows(h, losers_);
  }

  // N_i: the mean over the KV head's query heads g of sqrt(v^T G_g v) (||v||_2 without Gram
  // matrices), in double precision.
  double projected_norm(HeadCtx& h, std::int64_t i) {
    const std::int64_t d = h.head_dim;
    const auto ds = static_cast<std::size_t>(d);
    value_.resize(ds);
    h.hs.store()->read_value(h.hs.live[static_cast<std::size_t>(i)], value_.data());
    const LayerState& st = h.st;
    if (st.output_gram.empty()) {
      double sum = 0.0;
      for (std::size_t c = 0; c < ds; ++c) sum += static_cast<double>(value_[c]) * value_[c];
      return std::sqrt(sum);
    }
    const std::int64_t H = st.shape.n_kv_heads;
    const std::int64_t group = st.output_gram_heads / H;
    const std::int64_t kv = h.index % H;
    double total = 0.0;
    for (std::int64_t g = kv * group; g < (kv + 1) * group; ++g) {
      const float* G = st.output_gram.data() + static_cast<std::size_t>(g * d * d);
      double q = 0.0;
      for (std::size_t a = 0; a < ds; ++a) {
        const float* row = G + a * ds;
        double acc = 0.0;
        for (std::size_t c = 0; c < ds; ++c) acc += static_cast<double>(row[c]) * value_[c];
        q += static_cast<double>(value_[a]) * acc;
      }
      total += std::sqrt(q < 0.0 ? 0.0 : q);  // G is positive semi-definite: q < 0 is rounding
                                              // (NaN stays NaN: never a keep)
    }
    return total / static_cast<double>(group);
  }

  double ratio_, epsilon_;
  std::vector<std::vector<float>> rankings_;             // [Hkv] head-wise base rankings
  std::vector<std::vector<std::int64_t>> allocation_;  // [Hkv] head-wise losers by base score
  std::vector<std::int64_t> stage1_, rest_, losers_;
  std::vector<float> weighted_, value_;
};

}  // namespace

MethodInfo criticalkv_method() {
  return method_card(std::string(kCriticalCard) + std::string(kCriticalFields), &check,
                     &make_policy_of<CriticalPolicy>);
}
MethodInfo criticaladakv_method() {
  return method_card(std::string(kCriticalAdaCard) + std::string(kCriticalFields), &check,
                     &make_policy_of<CriticalPolicy>);
}

}  // namespace vq::detail
