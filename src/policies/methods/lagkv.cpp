// lagkv: lag-relative scores from the keys and values themselves, no attention.
//
// Paper: Liang et al., "LagKV: Lag-Relative Information of the KV Cache Tells Which Tokens Are
// Important", 2025 (arXiv 2504.04704).
//
// Rule: after the first lagkv_n_sink rows (sinks, always kept) the rows form partitions of
// L = lagkv_lag_size rows in arrival order. A partition is scored once, when the next one is
// complete: for its keys K (L x d) and the next partition's keys R, per channel c
// kn[t][c] = (K[t][c] - min_t R[t][c]) / (max_t R[t][c] - min_t R[t][c]) (0 where the
// reference's range is 0), s_K[t] = softmax over the partition's t of std_c(kn[t]) (the
// sample standard deviation, d - 1 in the denominator), the same for the values, and
// score[t] = (s_K[t] + s_V[t]) / 2. A row's eviction score is its rank within its partition
// divided by L (rank 0 = the lowest score; equal scores rank by arrival), so each partition
// keeps its top rows and the partitions lose rows evenly. The newest complete partition (no
// complete successor yet) and the partial one after it are not scored and never leave (the
// paper's sliding window). Over budget, the row of lowest eviction score leaves (ties: the
// oldest), so every scored partition loses its rank-0 row before any loses rank 1.
//
// Fields: lagkv_budget=512, lagkv_n_sink=4, lagkv_lag_size=0 (0: min(128, budget / 4,
// (budget - n_sink) / 2), at least 1); shared: merge (the gate compares 1 + score), quantize/demote, seed, kv_dtype.
// Guard: n_sink + 2 x lag_size <= budget (the unscored window always fits).
// Deviations from the paper: the paper compresses each partition to a fixed ratio; here the
// budget sets how many rows leave, lowest partition rank first and the oldest partition first
// at equal rank (so partitions scored early can end with fewer rows than later ones). A constant reference channel (max =
// min, 0/0 in the paper's formula) contributes 0. Scores are computed from the rows as stored
// (kv_dtype rounding included).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "policies/fields.h"
#include "policies/methods.h"
#include "policies/policy.h"

namespace vq::detail {

constexpr std::string_view kLagkvCard = R"(
id: lagkv
token loop: yes
prefix: lagkv
summary: LagKV: score each partition of keys and values against the next one (lag-relative
  spread), keep each partition's top rows; no attention needed
paper: Liang et al., LagKV: Lag-Relative Information of the KV Cache Tells Which Tokens Are
  Important, 2025
disposition: drop (merge optional)
score: lag-relative key/value spread, ranked within partitions
budget: uniform
deviations: a budget instead of a per-partition ratio (rows leave lowest partition rank first,
  the oldest partition first at equal rank); a constant reference channel contributes 0
paper config: `lagkv:n_sink=4,lag_size=128` (the reference implementation's defaults; the
  budget replaces the ratio)
defaults: lag_size=0 picks min(128, budget / 4, (budget - n_sink) / 2), so every budget from
  n_sink + 2 has a usable partition size
| lagkv_budget | int | 512 | [1, 16777216] | rows kept per KV head, sinks included
| lagkv_n_sink | int | 4 | [0, 16777216] | leading rows never evicted (attention sinks)
| lagkv_lag_size | int | 0 | [0, 4194304] | rows per partition (0: min(128, budget / 4, (budget - n_sink) / 2))
)";

namespace {

std::int64_t lag_size_of(const CacheConfig& c) {
  const std::int64_t set = c.get_int("lagkv_lag_size");
  if (set > 0) return set;
  const std::int64_t budget = c.get_int("lagkv_budget");
  return std::max<std::int64_t>(
      1, std::min({std::int64_t{128}, budget / 4, (budget - c.get_int("lagkv_n_sink")) / 2}));
}

// aux marks a row's state: kPending (not scored yet: never evicted), kScored, kSink.
constexpr float kPending = 1.0f, kScored = 0.0f, kSink = -1.0f;

class LagKVPolicy final : public TokenPolicy {
 public:
  explicit LagKVPolicy(const PolicyContext& ctx)
      : TokenPolicy(ctx), lag_(lag_size_of(ctx.config)) {}

 protected:
  void on_token(HeadCtx& h, std::int64_t row) override {
    const bool sink = h.n_live() < n_sink_;  // sinks never leave: the first n_sink arrivals
    push_row(h.hs, row, 0.0f, sink ? kSink : kPending);
    if (sink) return;
    const std::int64_t n = h.n_live();
    std::int64_t pending = 0;
    while (pending < n && h.hs.aux[static_cast<std::size_t>(n - 1 - pending)] == kPending) ++pending;
    if (pending == 2 * lag_) score_partition(h, n - 2 * lag_);
  }

  void eviction_scores(HeadCtx& h, float* out) override {
    const float inf = std::numeric_limits<float>::infinity();
    for (std::int64_t i = 0; i < h.n_live(); ++i) {
      out[i] = h.hs.aux[static_cast<std::size_t>(i)] == kScored
                   ? rank_of(h.hs.score[static_cast<std::size_t>(i)])
                   : inf;
    }
  }

  float gate_score(const HeadCtx& h, std::int64_t i) const override {
    return 1.0f + h.hs.score[static_cast<std::size_t>(i)];
  }
  // A rank is not additive: the survivor of a merge keeps its own.
  void on_merge(HeadCtx& /*h*/, std::int64_t /*target*/, std::int64_t /*loser*/) override {}

 private:
  // Scores the partition of live rows [first, first + L) against [first + L, first + 2L).
  void score_partition(HeadCtx& h, std::int64_t first) {
    const std::int64_t L = lag_, d = h.head_dim;
    const auto Ls = static_cast<std::size_t>(L);
    const auto ds = static_cast<std::size_t>(d);
    combined_.assign(Ls, 0.0);
    for (int which = 0; which < 2; ++which) {  // keys, then values
      rows_.resize(2 * Ls * ds);
      for (std::int64_t t = 0; t < 2 * L; ++t) {
        const std::int64_t row = h.hs.live[static_cast<std::size_t>(first + t)];
        float* out = rows_.data() + static_cast<std::size_t>(t) * ds;
        if (which == 0) {
          h.hs.store()->read_key(row, out);
        } else {
          h.hs.store()->read_value(row, out);
        }
      }
      const float* ref = rows_.data() + Ls * ds;
      lo_.assign(ds, std::numeric_limits<float>::infinity());
      hi_.assign(ds, -std::numeric_limits<float>::infinity());
      for (std::size_t t = 0; t < Ls; ++t) {
        for (std::size_t c = 0; c < ds; ++c) {
          lo_[c] = std::min(lo_[c], ref[t * ds + c]);
          hi_[c] = std::max(hi_[c], ref[t * ds + c]);
        }
      }
      spread_.resize(Ls);
      for (std::size_t t = 0; t < Ls; ++t) {
        double sum = 0.0, sum2 = 0.0;
        for (std::size_t c = 0; c < ds; ++c) {
          const double range = static_cast<double>(hi_[c]) - lo_[c];
          const double x = range > 0.0 && std::isfinite(range)
                               ? (static_cast<double>(rows_[t * ds + c]) - lo_[c]) / range
                               : 0.0;
          sum += x;
          sum2 += x * x;
        }
        const double mean = sum / static_cast<double>(d);
        const double var = d > 1 ? std::max(0.0, (sum2 - sum * mean) / static_cast<double>(d - 1))
                                 : 0.0;
        spread_[t] = std::sqrt(var);
      }
      // Softmax over the partition (max subtracted; a non-finite spread counts as 0).
      double top = 0.0;
      for (double& s : spread_) {
        if (!std::isfinite(s)) s = 0.0;
        top = std::max(top, s);
      }
      double z = 0.0;
      for (const double s : spread_) z += std::exp(s - top);
      for (std::size_t t = 0; t < Ls; ++t) combined_[t] += 0.5 * std::exp(spread_[t] - top) / z;
    }
    // Rank within the partition: 0 for the lowest score, equal scores by arrival.
    order_idx_.resize(Ls);
    std::iota(order_idx_.begin(), order_idx_.end(), std::size_t{0});
    std::stable_sort(order_idx_.begin(), order_idx_.end(),
                     [&](std::size_t a, std::size_t b) { return combined_[a] < combined_[b]; });
    for (std::size_t r = 0; r < Ls; ++r) {
      const std::size_t i = static_cast<std::size_t>(first) + order_idx_[r];
      h.hs.score[i] = static_cast<float>(static_cast<double>(r) / static_cast<double>(L));
      h.hs.aux[i] = kScored;
    }
  }

  std::int64_t lag_;
  std::vector<float> rows_, lo_, hi_;
  std::vector<double> spread_, combined_;
  std::vector<std::size_t> order_idx_;
};

// n_sink + 2 x lag_size <= budget: the sinks and the unscored window (at most 2L - 1 rows)
// always leave a scored row to evict.
void check(const CacheConfig& c) {
  require_less(c, "lagkv_n_sink", "lagkv_budget");
  const std::int64_t lag = lag_size_of(c);
  const std::int64_t need = c.get_int("lagkv_n_sink") + 2 * lag;
  if (need > c.get_int("lagkv_budget")) {
    config_error(c, "lagkv_n_sink + 2 x lagkv_lag_size (" + std::to_string(need) +
                        (c.get_int("lagkv_lag_size") == 0 ? ", lag_size 0 picks " +
                                                                std::to_string(lag)
                                                          : std::string()) +
                        ") must be <= lagkv_budget (" + std::to_string(c.get_int("lagkv_budget")) +
                        ")");
  }
}

}  // namespace

MethodInfo lagkv_method() {
  return method_card(kLagkvCard, &check, &make_policy_of<LagKVPolicy>);
}

}  // namespace vq::detail
