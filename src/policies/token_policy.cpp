#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <numeric>

#include "base/kernels.h"
#include "policies/policy.h"
#include "veloxquant/errors.h"
#include "veloxquant/registry.h"

namespace vq::detail {

float merge_gate_probability(float score_loser, float score_target) noexcept {
  if (std::isnan(score_loser) || std::isnan(score_target)) return 0.0f;
  if (score_target <= 0.0f) return score_loser > 0.0f ? 1.0f : 0.0f;
  const float p = score_loser / score_target;
  return p < 0.0f ? 0.0f : (p > 1.0f ? 1.0f : p);
}

float window_gate_probability(float a_loser, const float* a_window, std::int64_t m) noexcept {
  if (m <= 0) return 0.0f;
  float sum = 0.0f;
  for (std::int64_t i = 0; i < m; ++i) sum += a_window[i];
  const float p = a_loser / (sum / static_cast<float>(m));
  if (std::isnan(p)) return 0.0f;
  return p < 0.0f ? 0.0f : (p > 1.0f ? 1.0f : p);
}

MergeRule merge_rule_from(const CacheConfig& config) {
  MergeRule rule;
  const std::string& mode = config.get_enum("merge");
  rule.mode = mode == "drop"   ? MergeRule::Mode::kDrop
              : mode == "mean" ? MergeRule::Mode::kMean
                               : MergeRule::Mode::kSimWeighted;
  rule.gate = config.get_bool("merge_gate");
  rule.keys = config.get_bool("merge_keys");
  rule.target = config.get_enum("merge_target") == "window" ? MergeRule::Target::kWindow
                                                             : MergeRule::Target::kNearest;
  rule.m = config.get_int("merge_m");
  rule.gate_score = config.get_enum("merge_attention") == "current"
                        ? MergeRule::GateScore::kCurrent
                        : MergeRule::GateScore::kScore;
  return rule;
}

ScoreSource score_source_from(const CacheConfig& config) {
  ScoreSource s;
  if (config.has("source")) {
    const std::string& k = config.get_enum("source");
    s.kind = k == "attention" ? ScoreSource::Kind::kAttention
             : k == "proxy"   ? ScoreSource::Kind::kProxy
                              : ScoreSource::Kind::kAuto;
  }
  s.configured = s.kind;
  if (config.has("gqa_reduce")) {
    const std::string& r = config.get_enum("gqa_reduce");
    s.reduce = r == "max" ? ScoreSource::Reduce::kMax
               : r == "sum" ? ScoreSource::Reduce::kSum
                            : ScoreSource::Reduce::kMean;
  }
  return s;
}

TokenPolicy::TokenPolicy(const PolicyContext& ctx)
    : TokenPolicy(ctx, ctx.config.get_int(ctx.config.info().prefix + "_budget")) {}

TokenPolicy::TokenPolicy(const PolicyContext& ctx, std::int64_t budget)
    : TokenPolicy(budget, ctx.config.get_int(ctx.config.info().prefix + "_n_sink"),
                  merge_rule_from(ctx.config),
                  score_source_from(ctx.config)) {
  set_headwise(headwise_rule_from(ctx.config));
  if (ctx.config.has("compress_interval")) interval_ = ctx.config.get_int("compress_interval");
}

const char* TokenPolicy::source_name() const noexcept {
  switch (source_.kind) {
    case ScoreSource::Kind::kNone: return "none";
    case ScoreSource::Kind::kAuto: return "auto";
    case ScoreSource::Kind::kProxy: return "proxy";
    case ScoreSource::Kind::kAttention: return "attention";
  }
  return "none";
}

void TokenPolicy::push_row(HeadState& hs, std::int64_t row, float score, float aux) {
  hs.live.push_back(row);
  hs.score.push_back(score);
  hs.aux.push_back(aux);
  hs.hist.resize(hs.hist.size() + static_cast<std::size_t>(hs.hist_stride), 0.0f);
}

void TokenPolicy::remove_row(HeadState& hs, std::int64_t i) {
  hs.live.erase(hs.live.begin() + i);
  hs.score.erase(hs.score.begin() + i);
  hs.aux.erase(hs.aux.begin() + i);
  if (hs.hist_stride > 0) {
    hs.hist.erase(hs.hist.begin() + i * hs.hist_stride, hs.hist.begin() + (i + 1) * hs.hist_stride);
  }
}

const float* TokenPolicy::attention_row(const HeadCtx& h, std::int64_t j) {
  const LayerState& st = h.st;
  const AttentionRef& a = *st.attention;
  // Read only with source=attention, whose cache never takes probabilities without data
  // (LayerCache::end_step hands the policy none then).
  assert(a.data != nullptr);
  const std::int64_t H = st.shape.n_kv_heads, Hq = a.n_query_heads, R = a.n_rows, S = a.n_queries;
  const std::int64_t g = Hq / H, b = h.index / H, kv = h.index % H;
  att_.resize(static_cast<std::size_t>(R));
  float* __restrict out = att_.data();
  const bool max = source_.reduce == ScoreSource::Reduce::kMax;
  // The first query head's row as it is (0 + x = x exactly, also for the sum), then the others
  // folded in, by max or by sum in increasing q.
  const float* first = a.data + ((b * Hq + kv * g) * S + j) * R;
  std::copy(first, first + R, out);
  for (std::int64_t q = kv * g + 1; q < (kv + 1) * g; ++q) {
    const float* __restrict row = a.data + ((b * Hq + q) * S + j) * R;
    if (max) {
      for (std::int64_t r = 0; r < R; ++r) out[r] = std::max(out[r], row[r]);
    } else {
      for (std::int64_t r = 0; r < R; ++r) out[r] = out[r] + row[r];
    }
  }
  if (source_.reduce == ScoreSource::Reduce::kMean) {
    const float gf = static_cast<float>(g);
    for (std::int64_t r = 0; r < R; ++r) out[r] = out[r] / gf;
  }
  return att_.data();
}

const float* TokenPolicy::attention_row_all_heads(const LayerState& st, std::int64_t b,
                                                  std::int64_t j) {
  const AttentionRef& a = *st.attention;
  // Read only with source=attention, whose cache never takes probabilities without data
  // (LayerCache::end_step hands the policy none then).
  assert(a.data != nullptr);
  const std::int64_t Hq = a.n_query_heads, R = a.n_rows, S = a.n_queries;
  att_.assign(static_cast<std::size_t>(R), 0.0f);
  for (std::int64_t q = 0; q < Hq; ++q) {
    const float* row = a.data + ((b * Hq + q) * S + j) * R;
    for (std::int64_t r = 0; r < R; ++r) att_[static_cast<std::size_t>(r)] += row[r];
  }
  for (auto& x : att_) x /= static_cast<float>(Hq);
  return att_.data();
}

void TokenPolicy::current_attention(HeadCtx& h, float* out) {
  const std::int64_t n = h.n_live();
  // Outside a step (a group decision applied later, see LayerGroup::members) the step's
  // attention is gone: the proxy stands in.
  if (source_.attention() && h.st.attention != nullptr) {
    const std::int64_t newest = h.hs.live.back() - h.hs.prev;
    const float* a = attention_row(h, newest < 0 ? 0 : newest);
    for (std::int64_t i = 0; i < n; ++i) out[i] = a[h.hs.live[static_cast<std::size_t>(i)]];
  } else {
    proxy_weights(h, key_of(h, n - 1), n, out);
  }
}

const float* TokenPolicy::key_of(const HeadCtx& h, std::int64_t i) {
  return key_of_row(h, h.hs.live[static_cast<std::size_t>(i)]);
}

const float* TokenPolicy::key_of_row(const HeadCtx& h, std::int64_t row) {
  query_.resize(static_cast<std::size_t>(h.head_dim));
  h.hs.store()->read_key(row, query_.data());
  return query_.data();
}

void TokenPolicy::proxy_weights(const HeadCtx& h, const float* q, std::int64_t n, float* out) {
  const HeadRows rows = h.rows();
  const float sqrt_d = std::sqrt(static_cast<float>(h.head_dim));
  if (rows.packed == nullptr && n > 0 && h.hs.live[static_cast<std::size_t>(n - 1)] == n - 1) {
    // live is the identity (strictly increasing from 0): rows 0 .. n-1 in one batched call.
    kernels::dot_rows(rows.keys, rows.dtype, rows.row_stride, q, h.head_dim, n, out);
    for (std::int64_t i = 0; i < n; ++i) out[i] = out[i] / sqrt_d;
    kernels::softmax(out, n);
    return;
  }
  std::vector<float> key(rows.packed != nullptr ? static_cast<std::size_t>(h.head_dim) : 0);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t r = h.hs.live[static_cast<std::size_t>(i)];
    if (rows.packed != nullptr) rows.packed->load_key(r, key.data());
    out[i] = (rows.packed != nullptr
                  ? kernels::dot(key.data(), q, h.head_dim)
                  : kernels::dot_row(rows.key_row(r), rows.dtype, q, h.head_dim)) /
             sqrt_d;
  }
  kernels::softmax(out, n);
}

void TokenPolicy::eviction_scores(HeadCtx& h, float* out) {
  const std::int64_t n = h.n_live();
  const float inf = std::numeric_limits<float>::infinity();
  for (std::int64_t i = 0; i < n; ++i) out[i] = i < n_sink_ ? inf : rank_of(h.hs.score[i]);
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

std::int64_t find_merge_target(const HeadRows& rows, const std::int64_t* live, std::int64_t n_live,
                               std::int64_t n_sink, std::int64_t loser, const std::uint8_t* excluded,
                               std::int64_t head_dim, float* cos_out, float* scratch) {
  float* a = scratch;
  float* b = scratch + head_dim;
  rows.load_key(live[loser], a);
  std::int64_t best = -1;
  float best_cos = 0.0f;
  for (std::int64_t i = n_sink; i < n_live; ++i) {
    if (i == loser || (excluded != nullptr && excluded[i] != 0)) continue;
    rows.load_key(live[i], b);
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
  Decision d;
  d.kind = Decision::Kind::kBlend;
  d.head = h.index;
  d.target = h.hs.live[static_cast<std::size_t>(target)];
  d.loser = h.hs.live[static_cast<std::size_t>(loser)];
  d.weight = w;
  d.keys = merge_.keys;
  h.st.apply(d);
  on_merge(h, target, loser);
}

float TokenPolicy::gate_value(HeadCtx& h, std::int64_t i) {
  if (merge_.gate_score == MergeRule::GateScore::kScore) return gate_score(h, i);
  return current_[static_cast<std::size_t>(i)];
}

void TokenPolicy::dispose(HeadCtx& h, std::int64_t loser, const std::uint8_t* excluded) {
  if (h.hs.store()->demotes()) {  // demote=: kept at low precision, not evicted (no merge)
    Decision d;
    d.kind = Decision::Kind::kDemote;
    d.head = h.index;
    d.target = h.hs.live[static_cast<std::size_t>(loser)];
    d.score = h.hs.score[static_cast<std::size_t>(loser)];
    h.st.apply(d);
    return;
  }
  ++h.hs.evictions;
  if (merge_.mode == MergeRule::Mode::kDrop) return;
  // The gate draws once per evicted row, whether or not a target exists.
  const double u = merge_.gate ? h.rng.uniform(h.hs.draws++) : 0.0;
  if (merge_.gate && merge_.gate_score == MergeRule::GateScore::kCurrent) {
    current_.resize(static_cast<std::size_t>(h.n_live()));
    current_attention(h, current_.data());
  }
  if (merge_.target == MergeRule::Target::kWindow) {
    merge_window(h, loser, excluded, u);
    return;
  }
  float cos = 0.0f;
  a_.resize(static_cast<std::size_t>(2 * h.head_dim));
  const std::int64_t target = find_merge_target(h.rows(), h.hs.live.data(), h.n_live(), n_sink_,
                                                loser, excluded, h.head_dim, &cos, a_.data());
  if (target < 0) return;
  if (merge_.gate) {
    const float p = merge_gate_probability(gate_value(h, loser), gate_value(h, target));
    if (!(u < static_cast<double>(p))) return;
  }
  merge_rows(h, target, loser, cos);
  ++h.hs.merges;
}

void TokenPolicy::merge_window(HeadCtx& h, std::int64_t loser, const std::uint8_t* excluded,
                               double u) {
  const std::int64_t n = h.n_live();
  window_.clear();
  for (std::int64_t i = loser + 1; i < n && static_cast<std::int64_t>(window_.size()) < merge_.m; ++i) {
    if (excluded == nullptr || excluded[i] == 0) window_.push_back(i);
  }
  const std::int64_t m = static_cast<std::int64_t>(window_.size());
  if (m == 0) return;
  if (merge_.gate) {
    b_.resize(static_cast<std::size_t>(m));
    for (std::int64_t k = 0; k < m; ++k) b_[static_cast<std::size_t>(k)] = gate_value(h, window_[static_cast<std::size_t>(k)]);
    const float p = window_gate_probability(gate_value(h, loser), b_.data(), m);
    if (!(u < static_cast<double>(p))) return;
  }
  // The window as physical rows.
  for (std::int64_t& t : window_) t = h.hs.live[static_cast<std::size_t>(t)];
  Decision d;
  d.kind = Decision::Kind::kSpread;
  d.head = h.index;
  d.loser = h.hs.live[static_cast<std::size_t>(loser)];
  d.rows = window_.data();
  d.n_rows = m;
  h.st.apply(d);
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
  const std::size_t stride = static_cast<std::size_t>(h.hs.hist_stride);
  for (std::size_t i = 0; i < static_cast<std::size_t>(n); ++i) {
    if (mask_[i]) continue;
    h.hs.live[out] = h.hs.live[i];
    h.hs.score[out] = h.hs.score[i];
    h.hs.aux[out] = h.hs.aux[i];
    for (std::size_t c = 0; c < stride; ++c) h.hs.hist[out * stride + c] = h.hs.hist[i * stride + c];
    ++out;
  }
  h.hs.live.resize(out);
  h.hs.score.resize(out);
  h.hs.aux.resize(out);
  h.hs.hist.resize(out * stride);
}

void TokenPolicy::state(StateIO& io, LayerState& st) {
  if (!io.loading()) return;
  for (const HeadState& hs : st.heads) {
    const std::int64_t rows = hs.store()->size() - hs.store()->n_demoted();
    io.check(static_cast<std::int64_t>(hs.score.size()) == rows &&
                 static_cast<std::int64_t>(hs.aux.size()) == rows &&
                 static_cast<std::int64_t>(hs.hist.size()) == rows * hs.hist_stride,
             "per-row values: expected " + std::to_string(rows) + " scores, aux values and " +
                 std::to_string(rows * hs.hist_stride) + " history values, found " +
                 std::to_string(hs.score.size()) + ", " + std::to_string(hs.aux.size()) + " and " +
                 std::to_string(hs.hist.size()));
  }
  if (!shares_rows() || headwise_.on) return;
  const std::int64_t H = st.shape.n_kv_heads;
  for (std::size_t i = 0; i < st.heads.size(); ++i) {
    const std::size_t first = i - i % static_cast<std::size_t>(H);
    io.check(st.heads[i].store()->size() == st.heads[first].store()->size(),
             "rows: the heads of a batch element share their rows, found " +
                 std::to_string(st.heads[i].store()->size()) + " and " +
                 std::to_string(st.heads[first].store()->size()));
  }
}

void TokenPolicy::open_live(LayerState& st) {
  for (HeadState& hs : st.heads) {
    // The method's rows: the stored rows before any demoted ones (demote=, see RowStore).
    const std::int64_t prev = hs.prev - hs.store()->n_demoted();
    VQ_ASSERT(static_cast<std::int64_t>(hs.score.size()) == prev &&
                  static_cast<std::int64_t>(hs.aux.size()) == prev &&
                  static_cast<std::int64_t>(hs.hist.size()) == prev * hs.hist_stride,
              "per-row score arrays out of step with the store");
    hs.live.resize(static_cast<std::size_t>(prev));
    std::iota(hs.live.begin(), hs.live.end(), std::int64_t{0});
  }
}

void TokenPolicy::commit_live(LayerState& st) {
  for (std::size_t i = 0; i < st.heads.size(); ++i) {
    HeadState& hs = st.heads[i];
    Decision d;
    d.kind = Decision::Kind::kKeep;
    d.head = static_cast<std::int64_t>(i);
    d.rows = hs.live.data();
    d.n_rows = static_cast<std::int64_t>(hs.live.size());
    st.apply(d);
    hs.live.clear();
  }
}

void TokenPolicy::settle(const LayerState& st, std::int64_t head) {
  const HeadState& hs = st.heads[static_cast<std::size_t>(head)];
  Decision d;
  d.kind = Decision::Kind::kSettle;
  d.head = head;
  d.rows = hs.live.data();
  d.n_rows = static_cast<std::int64_t>(hs.live.size());
  st.apply(d);
}

void TokenPolicy::cut_to(HeadCtx& h, std::int64_t keep) {
  const std::int64_t n = h.n_live();
  if (keep < 0 || n <= keep) return;
  ranking_.resize(static_cast<std::size_t>(n));
  eviction_scores(h, ranking_.data());
  const float inf = std::numeric_limits<float>::infinity();
  order_.clear();
  for (std::int64_t i = 0; i < n; ++i) {
    if (!(ranking_[static_cast<std::size_t>(i)] == inf)) order_.push_back(i);
  }
  VQ_ASSERT(static_cast<std::int64_t>(order_.size()) >= n - keep,
            "cut with too few unprotected rows (construction guards should prevent this)");
  // The n - keep lowest: NaN ranks below everything, then by score, ties to the lowest index.
  std::stable_sort(order_.begin(), order_.end(), [&](std::int64_t a, std::int64_t b) {
    const float x = ranking_[static_cast<std::size_t>(a)], y = ranking_[static_cast<std::size_t>(b)];
    if (std::isnan(x) || std::isnan(y)) return std::isnan(x) && !std::isnan(y);
    return x < y;
  });
  order_.resize(static_cast<std::size_t>(n - keep));
  std::sort(order_.begin(), order_.end());
  const std::vector<std::int64_t> losers(order_);
  evict_rows(h, losers);
}

void TokenPolicy::headwise_cut(LayerState& st, std::int64_t keep) {
  if (keep < 0) {
    for (std::int64_t i = 0; i < st.n_heads_total(); ++i) settle(st, i);
    return;
  }
  const std::int64_t H = st.shape.n_kv_heads;
  head_rankings_.resize(static_cast<std::size_t>(H));
  for (std::int64_t b = 0; b < st.batch; ++b) {
    for (std::int64_t kv = 0; kv < H; ++kv) {
      const std::int64_t i = b * H + kv;
      HeadState& hs = st.heads[static_cast<std::size_t>(i)];
      HeadCtx h{st, hs, i, st.shape.head_dim, st.rngs[static_cast<std::size_t>(kv)]};
      std::vector<float>& rank = head_rankings_[static_cast<std::size_t>(kv)];
      rank.resize(static_cast<std::size_t>(h.n_live()));
      eviction_scores(h, rank.data());
    }
    headwise_losers(head_rankings_, keep, headwise_.floor, head_losers_, ties_evict_newer());
    for (std::int64_t kv = 0; kv < H; ++kv) {
      const std::int64_t i = b * H + kv;
      HeadState& hs = st.heads[static_cast<std::size_t>(i)];
      HeadCtx h{st, hs, i, st.shape.head_dim, st.rngs[static_cast<std::size_t>(kv)]};
      evict_rows(h, head_losers_[static_cast<std::size_t>(kv)]);
      settle(st, i);
    }
  }
}

void TokenPolicy::cut_stored(LayerState& st, std::int64_t keep) {
  st.step_prev = 0;
  for (HeadState& hs : st.heads) {
    hs.prev = hs.store()->size();
    st.step_prev = std::max(st.step_prev, hs.prev);
  }
  st.step_new = 0;
  open_live(st);
  cut(st, keep);
  commit_live(st);
}

void TokenPolicy::cut(LayerState& st, std::int64_t keep) {
  if (headwise_.on) {
    headwise_cut(st, keep);
    return;
  }
  if (shares_rows()) {
    // One set of losers per batch element, evicted from every head of it.
    const std::int64_t H = st.shape.n_kv_heads;
    for (std::int64_t b = 0; b < st.batch; ++b) {
      do {
        shared_.clear();
        layer_losers(st, b, keep, shared_);
        if (shared_.empty()) break;
        for (std::int64_t kv = 0; kv < H; ++kv) {
          const std::int64_t i = b * H + kv;
          HeadCtx h{st, st.heads[static_cast<std::size_t>(i)], i, st.shape.head_dim,
                    st.rngs[static_cast<std::size_t>(kv)]};
          evict_rows(h, shared_);
        }
      } while (static_cast<std::int64_t>(st.heads[static_cast<std::size_t>(b * H)].live.size()) >
               keep);
    }
    for (std::int64_t i = 0; i < st.n_heads_total(); ++i) settle(st, i);
    return;
  }
  for (std::int64_t i = 0; i < st.n_heads_total(); ++i) {
    HeadState& hs = st.heads[static_cast<std::size_t>(i)];
    HeadCtx h{st, hs, i, st.shape.head_dim, st.rngs[static_cast<std::size_t>(st.kv_head_of(i))]};
    cut_head(h, keep);
    settle(st, i);
  }
}

void TokenPolicy::end_step(LayerState& st, const AttentionRef* /*attention*/) {
  begin_step(st);
  const std::int64_t head_dim = st.shape.head_dim;
  const std::int64_t keep = step_budget(st);
  // compress_interval N > 1: a head may hold keep + N - 1 rows; the token that brings it to
  // keep + N cuts it back to keep in one decision. N = 1 is the per-token rule below.
  const std::int64_t slack = interval_ - 1;
  // A multi-token step decided at once: every token is scored first, then one cut.
  const bool at_once = st.step_new > 1 && decides_chunk_at_once();
  // Otherwise each token is a decision: per head (argmin until the budget holds), or per layer
  // (head-wise budgets, rows shared by the heads) once every head has seen the token.
  const bool per_head = !at_once && !headwise_.on && !shares_rows();
  // Whether the open step's live rows exceed keep + slack: any head, or with head-wise budgets
  // any batch element's heads together (they share n_kv_heads x keep rows).
  const auto over = [&]() {
    if (keep < 0) return false;
    const std::int64_t H = st.shape.n_kv_heads;
    for (std::int64_t b = 0; b < st.batch; ++b) {
      std::int64_t total = 0;
      for (std::int64_t kv = 0; kv < H; ++kv) {
        const std::int64_t n =
            static_cast<std::int64_t>(st.heads[static_cast<std::size_t>(b * H + kv)].live.size());
        if (!headwise_.on && n > keep + slack) return true;
        total += n;
      }
      if (headwise_.on && total > H * (keep + slack)) return true;
    }
    return false;
  };
  // With an interval, a cut is made only when over(); else every head settles as it stands.
  const auto cut_or_settle = [&]() {
    if (slack == 0 || over()) {
      cut(st, keep);
    } else {
      for (std::int64_t i = 0; i < st.n_heads_total(); ++i) settle(st, i);
    }
  };
  open_live(st);
  for (std::int64_t j = 0; j < st.step_new; ++j) {
    for (std::int64_t i = 0; i < st.n_heads_total(); ++i) {
      HeadState& hs = st.heads[static_cast<std::size_t>(i)];
      HeadCtx h{st, hs, i, head_dim, st.rngs[static_cast<std::size_t>(st.kv_head_of(i))]};
      on_token(h, hs.prev + j);
      if (!per_head) continue;
      if (slack == 0) {
        while (keep >= 0 && h.n_live() > keep) {
          const std::int64_t loser = pick_loser(h);
          dispose(h, loser, nullptr);
          remove_row(hs, loser);
        }
      } else if (keep >= 0 && h.n_live() > keep + slack) {
        cut_head(h, keep);
      }
      settle(st, i);
    }
    if (!per_head && !at_once) cut_or_settle();
  }
  if (at_once) cut_or_settle();
  commit_live(st);
  finish_step(st);
}

}  // namespace vq::detail
