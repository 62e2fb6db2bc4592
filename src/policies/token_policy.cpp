#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/kernels.h"
#include "policies/policy.h"
#include "veloxquant/errors.h"

namespace vq::detail {

float merge_gate_probability(float score_loser, float score_target) noexcept {
  if (std::isnan(score_loser) || std::isnan(score_target)) return 0.0f;
  if (score_target <= 0.0f) return score_loser > 0.0f ? 1.0f : 0.0f;
  const float p = score_loser / score_target;
  return p < 0.0f ? 0.0f : (p > 1.0f ? 1.0f : p);
}

MergeRule merge_rule_from(const CacheConfig& config, std::string_view prefix) {
  const std::string p(prefix);
  MergeRule rule;
  const std::string& mode = config.get_enum(p + "_merge");
  rule.mode = mode == "drop"   ? MergeRule::Mode::kDrop
              : mode == "mean" ? MergeRule::Mode::kMean
                               : MergeRule::Mode::kSimWeighted;
  rule.gate = config.get_bool(p + "_merge_gate");
  rule.keys = config.get_bool(p + "_merge_keys");
  return rule;
}

void TokenPolicy::push_row(HeadState& hs, std::int64_t row, float score, float aux) {
  hs.live.push_back(row);
  hs.score.push_back(score);
  hs.aux.push_back(aux);
}

void TokenPolicy::remove_row(HeadState& hs, std::int64_t i) {
  hs.live.erase(hs.live.begin() + i);
  hs.score.erase(hs.score.begin() + i);
  hs.aux.erase(hs.aux.begin() + i);
}

const float* TokenPolicy::key_of(const HeadCtx& h, std::int64_t i) {
  return key_of_row(h, h.hs.live[static_cast<std::size_t>(i)]);
}

const float* TokenPolicy::key_of_row(const HeadCtx& h, std::int64_t row) {
  query_.resize(static_cast<std::size_t>(h.head_dim));
  h.hs.store->read_key(row, query_.data());
  return query_.data();
}

void TokenPolicy::proxy_weights(const HeadCtx& h, const float* q, std::int64_t n, float* out) {
  const RowsRef rows = h.rows();
  const float sqrt_d = std::sqrt(static_cast<float>(h.head_dim));
  for (std::int64_t i = 0; i < n; ++i) {
    out[i] = kernels::dot_row(rows.key(h.hs.live[static_cast<std::size_t>(i)]), rows.dtype, q,
                              h.head_dim) /
             sqrt_d;
  }
  kernels::softmax(out, n);
}

void TokenPolicy::eviction_scores(HeadCtx& h, float* out) {
  const std::int64_t n = h.n_live();
  const float inf = std::numeric_limits<float>::infinity();
  for (std::int64_t i = 0; i < n; ++i) out[i] = i < n_sink_ ? inf : h.hs.score[i];
}

std::int64_t TokenPolicy::pick_loser(HeadCtx& h) {
  const std::int64_t n = h.n_live();
  ranking_.resize(static_cast<std::size_t>(n));
  eviction_scores(h, ranking_.data());
  const std::int64_t loser = kernels::argmin_evict(ranking_.data(), n);
  VQ_ASSERT(loser >= 0 && !(ranking_[static_cast<std::size_t>(loser)] ==
                            std::numeric_limits<float>::infinity()),
            "eviction with every row protected (construction guards should prevent this)");
  return loser;
}

void TokenPolicy::on_merge(HeadCtx& h, std::int64_t target, std::int64_t loser) {
  h.hs.score[static_cast<std::size_t>(target)] += h.hs.score[static_cast<std::size_t>(loser)];
}

std::int64_t find_merge_target(const RowsRef& rows, const std::int64_t* live, std::int64_t n_live,
                               std::int64_t n_sink, std::int64_t loser, const std::uint8_t* excluded,
                               std::int64_t head_dim, float* cos_out, float* scratch) {
  float* a = scratch;
  float* b = scratch + head_dim;
  kernels::load_row(rows.key(live[loser]), rows.dtype, a, head_dim);
  std::int64_t best = -1;
  float best_cos = 0.0f;
  for (std::int64_t i = n_sink; i < n_live; ++i) {
    if (i == loser || (excluded != nullptr && excluded[i] != 0)) continue;
    kernels::load_row(rows.key(live[i]), rows.dtype, b, head_dim);
    const float c = kernels::cosine(a, b, head_dim);
    if (std::isnan(c)) continue;
    if (best < 0 || c > best_cos) {
      best = i;
      best_cos = c;
    }
  }
  *cos_out = best_cos;
  return best;
}

void TokenPolicy::merge_rows(HeadCtx& h, std::int64_t target, std::int64_t loser, float cos) {
  const float w = merge_.mode == MergeRule::Mode::kMean ? 0.5f
                  : cos > 0.0f                          ? std::min(cos, 1.0f)
                                                        : 0.0f;
  const std::int64_t pt = h.hs.live[static_cast<std::size_t>(target)];
  const std::int64_t pe = h.hs.live[static_cast<std::size_t>(loser)];
  const std::int64_t d = h.head_dim;
  a_.resize(static_cast<std::size_t>(d));
  b_.resize(static_cast<std::size_t>(d));
  RowStore& store = *h.hs.store;
  store.read_value(pt, a_.data());
  store.read_value(pe, b_.data());
  for (std::int64_t i = 0; i < d; ++i) a_[i] = (1.0f - w) * a_[i] + w * b_[i];
  store.write_value(pt, a_.data());
  if (merge_.keys) {
    store.read_key(pt, a_.data());
    store.read_key(pe, b_.data());
    for (std::int64_t i = 0; i < d; ++i) a_[i] = (1.0f - w) * a_[i] + w * b_[i];
    store.write_key(pt, a_.data());
  }
  on_merge(h, target, loser);
  const RowsRef rows = store.rows();
  store.set_position(pt, std::max(rows.positions[pt], rows.positions[pe]));
}

void TokenPolicy::dispose(HeadCtx& h, std::int64_t loser, const std::uint8_t* excluded) {
  ++h.hs.evictions;
  if (merge_.mode == MergeRule::Mode::kDrop) return;
  // The gate draws once per evicted row, whether or not a target exists.
  const double u = merge_.gate ? h.rng.uniform(h.hs.draws++) : 0.0;
  float cos = 0.0f;
  a_.resize(static_cast<std::size_t>(2 * h.head_dim));
  const std::int64_t target = find_merge_target(h.rows(), h.hs.live.data(), h.n_live(), n_sink_,
                                                loser, excluded, h.head_dim, &cos, a_.data());
  if (target < 0) return;
  if (merge_.gate) {
    const float p = merge_gate_probability(gate_score(h, loser), gate_score(h, target));
    if (!(u < static_cast<double>(p))) return;
  }
  merge_rows(h, target, loser, cos);
  ++h.hs.merges;
}

void TokenPolicy::evict_rows(HeadCtx& h, const std::vector<std::int64_t>& losers) {
  if (losers.empty()) return;
  const std::int64_t n = h.n_live();
  if (losers.size() == 1) {
    dispose(h, losers[0], nullptr);
    remove_row(h.hs, losers[0]);
    return;
  }
  mask_.assign(static_cast<std::size_t>(n), 0);
  for (std::int64_t i : losers) mask_[static_cast<std::size_t>(i)] = 1;
  for (std::int64_t i : losers) dispose(h, i, mask_.data());
  std::size_t out = 0;
  for (std::size_t i = 0; i < static_cast<std::size_t>(n); ++i) {
    if (mask_[i]) continue;
    h.hs.live[out] = h.hs.live[i];
    h.hs.score[out] = h.hs.score[i];
    h.hs.aux[out] = h.hs.aux[i];
    ++out;
  }
  h.hs.live.resize(out);
  h.hs.score.resize(out);
  h.hs.aux.resize(out);
}

void TokenPolicy::open_live(LayerState& st) {
  const std::int64_t prev = st.step_prev;
  for (HeadState& hs : st.heads) {
    VQ_ASSERT(static_cast<std::int64_t>(hs.score.size()) == prev &&
                  static_cast<std::int64_t>(hs.aux.size()) == prev,
              "per-row score arrays out of step with the store");
    hs.live.resize(static_cast<std::size_t>(prev));
    std::iota(hs.live.begin(), hs.live.end(), std::int64_t{0});
  }
}

void TokenPolicy::commit_live(LayerState& st) {
  for (HeadState& hs : st.heads) {
    hs.store->keep(hs.live.data(), static_cast<std::int64_t>(hs.live.size()));
    hs.live.clear();
  }
}

void TokenPolicy::end_step(LayerState& st, const AttentionRef* /*attention*/) {
  const std::int64_t prev = st.step_prev;
  const std::int64_t head_dim = st.shape.head_dim;
  open_live(st);
  for (std::int64_t j = 0; j < st.step_new; ++j) {
    for (std::int64_t i = 0; i < st.n_heads_total(); ++i) {
      HeadState& hs = st.heads[static_cast<std::size_t>(i)];
      HeadCtx h{st, hs, i, head_dim, st.rngs[static_cast<std::size_t>(st.kv_head_of(i))]};
      on_token(h, prev + j);
      while (budget_ >= 0 && h.n_live() > budget_) {
        const std::int64_t loser = pick_loser(h);
        dispose(h, loser, nullptr);
        remove_row(hs, loser);
      }
      hs.store->settle(hs.live.data(), h.n_live());
    }
  }
  commit_live(st);
}

}  // namespace vq::detail
