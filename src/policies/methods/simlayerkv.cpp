// simlayerkv: per layer, keep every row, or only the initial and recent rows when the layer is
// "lazy" (its last queries attend almost only to those rows).
//
// Paper: Zhang et al., "SimLayerKV: A Simple Framework for Layer-Level KV Cache Reduction",
// 2024 (arXiv 2410.13846; kvpress: SimLayerKVPress).
//
// Rule: W = sim_n_initial + sim_n_recent. Each layer (one LayerCache) decides once, at the first
// step after which it holds more than W rows (a prompt longer than W is decided at its prefill
// step; a cache fed token by token decides at the step that brings its W+1-th row). With R the
// rows held after that step, the window is rows [0, n_initial) and [R - n_recent, R); the
// layer's mass is the attention its last queries pay to the window, averaged over batch
// elements, heads and queries:
//   source=attention: the last q = min(sim_n_last, S) queries of the step (the only ones whose
//     probabilities the cache is given), every query head: mass = mean over (b, query head,
//     query) of sum over the window rows of p;
//   source=proxy: the last q = min(sim_n_last, R) rows, each row r's key standing in for its
//     query over rows 0..r (causal): softmax_i(k_r . k_i / sqrt(d)), every KV head.
// gqa_reduce does not enter (every query head counts alike): a value other than mean is an
// error (no effect).
// The layer is lazy when mass > sim_threshold (strictly, as kvpress; a mass equal to the
// threshold is not lazy). A lazy layer keeps the first n_initial rows and the n_recent newest
// from that step on (StreamingLLM: over W rows the oldest non-initial row leaves, at the
// deciding step and at every later one); a busy layer keeps every row. The decision holds until
// reset(). Before it (the layer holds at most W rows) nothing is evicted.
// The probabilities are read until the decision only (reads_attention() turns false after it,
// so an engine stops computing them), unless a lazy layer's merge gate compares the current
// query's attention.
// Row scores (LayerCache::row_scores): the attention each row received at the decision (averaged
// like the mass, per batch element), 0 for rows that came later; with a merge rule and the gate
// on, the cumulative proxy attention mass instead (streaming_llm's gate score).
//
// Fields: sim_threshold=0.9 (the paper's LLaMA3 value), sim_n_last=8, sim_n_initial=4,
// sim_n_recent=252 (W = 256: the paper's 1024 would keep every row of this library's 512-1152
// token test contexts); shared: merge=drop (+gate, keys), source=auto, demote/quantize, seed,
// kv_dtype. Token budget = n_initial + n_recent (what a lazy layer keeps); budget=B sets
// n_recent = B - n_initial. No head-wise option (a layer keeps all or its window).
// Deviations from the paper: one decision per layer and cache, made at the first step that
// leaves more than W rows (the paper decides at the end of the prompt, kvpress on a prefill
// that leaves at least W rows; fed token by token, the cache decides when the window covers all
// but one row, so a layer is busy only when its newest query pays more than 1 - threshold to
// that row); the batch elements of a cache share the decision (kvpress averages over the batch
// too); with the proxy source keys stand in for the queries; a lazy layer keeps n_recent recent
// rows (kvpress keeps n_recent - n_last + 1).
#include <algorithm>
#include <cmath>
#include <vector>

#include "base/kernels.h"
#include "policies/fields.h"
#include "policies/methods.h"
#include "policies/policy.h"
#include "veloxquant/errors.h"

namespace vq::detail {

constexpr std::string_view kSimLayerCard = R"(
id: simlayerkv
prefix: sim
summary: SimLayerKV: a layer whose last queries attend almost only to the initial and recent rows
  (lazy) keeps just those; every other layer keeps all its rows
paper: Zhang et al., SimLayerKV: A Simple Framework for Layer-Level KV Cache Reduction, 2024
disposition: drop (merge optional)
score: per layer: attention of the last queries to the initial + recent rows
budget: per layer: all rows, or initial + recent (lazy layers)
deviations: decided once per layer at the first step that leaves more than initial + recent rows
  (token by token: at the W+1-th row); the batch shares the decision; proxy: keys stand in for
  queries
paper config: `simlayerkv:threshold=0.9,n_last=1,n_initial=4,n_recent=1024,source=attention`
  (LLaMA3-8B; the paper uses 0.65 for LLaMA2-7B, 0.8 for Mistral-7B)
defaults: the paper's LLaMA3 threshold 0.9 and 4 initial rows; a window of 256 rows (the
  paper's 1024 would keep every row of the shipped models' contexts) judged by the last 8 queries
exact budget: no
all or window: yes
budget field: sim_n_recent
budget offset: sim_n_initial
| sim_threshold | float | 0.9 | [0, 1] | a layer is lazy when its mass on the initial + recent rows
  exceeds this
| sim_n_last | int | 8 | [1, 16777216] | last queries whose attention decides (a step's last
  queries; proxy: the last rows' keys)
| sim_n_initial | int | 4 | [0, 16777216] | leading rows a lazy layer keeps
| sim_n_recent | int | 252 | [1, 16777216] | newest rows a lazy layer keeps
attention: yes
)";

namespace {

// The mass averages every query head alike: a fold of a KV head's query heads has no effect.
void check(const CacheConfig& c) {
  if (c.get_enum("gqa_reduce") != "mean") {
    config_error(c, "gqa_reduce=" + c.get_enum("gqa_reduce") +
                        " has no effect on simlayerkv (the layer's mass averages every query head)");
  }
}

class SimLayerPolicy final : public TokenPolicy {
 public:
  explicit SimLayerPolicy(const PolicyContext& ctx)
      : TokenPolicy(token_budget(ctx.config), ctx.config.get_int("sim_n_initial"),
                    merge_rule_from(ctx.config), score_source_from(ctx.config)),
        threshold_(ctx.config.get_float("sim_threshold")),
        n_last_(ctx.config.get_int("sim_n_last")),
        n_recent_(ctx.config.get_int("sim_n_recent")),
        track_mass_(merge_.mode != MergeRule::Mode::kDrop && merge_.gate) {}

  // A busy layer keeps every row from its decision on: it appends the step's rows as `full`
  // does (a quantizing store settles them with kKeepAll), without the eviction loop's per-step
  // pass over every row. The deciding step and lazy layers run the loop.
  void end_step(LayerState& st, const AttentionRef* attention) override {
    if (state_ != State::kBusy || track_mass_) {
      TokenPolicy::end_step(st, attention);
      return;
    }
    for (std::size_t i = 0; i < st.heads.size(); ++i) {
      HeadState& hs = st.heads[i];
      const auto n = static_cast<std::size_t>(st.step_new);
      hs.score.resize(hs.score.size() + n, 0.0f);
      hs.aux.resize(hs.aux.size() + n, 0.0f);
      hs.hist.resize(hs.hist.size() + n * static_cast<std::size_t>(hs.hist_stride), 0.0f);
      if (!hs.store()->quantizing()) continue;
      Decision d;
      d.kind = Decision::Kind::kKeepAll;
      d.head = static_cast<std::int64_t>(i);
      st.apply(d);
    }
  }

  // The probabilities are read only for the decision (and, once lazy, by a merge gate that
  // compares the current query's attention): a decided layer asks the engine for none.
  bool needs_attention() const noexcept override {
    return source_.attention() &&
           (state_ == State::kUndecided ||
            (state_ == State::kLazy && merge_.mode != MergeRule::Mode::kDrop && merge_.gate &&
             merge_.gate_score == MergeRule::GateScore::kCurrent));
  }

  void on_reset(LayerState& /*st*/) override {
    state_ = State::kUndecided;
    decided_now_ = false;
  }
  void state(StateIO& io, LayerState& st) override {
    auto s = static_cast<std::uint8_t>(state_);
    io.bounded<std::uint8_t>(s, 0, static_cast<std::uint8_t>(State::kBusy), "simlayerkv layer type");
    state_ = static_cast<State>(s);
    io.bounded<std::int64_t>(rows_, 0, st.tokens_seen, "simlayerkv decision rows");
  }

 protected:
  void begin_step(LayerState& st) override {
    decided_now_ = false;
    if (state_ != State::kUndecided || st.heads.empty()) return;
    // Nothing was evicted before the decision: every head holds the same rows, physical row i
    // being position i.
    const std::int64_t rows = st.heads.front().prev + st.step_new;
    if (rows <= budget_) return;
    decide(st, rows);
  }

  std::int64_t step_budget(const LayerState& /*st*/) const override {
    return state_ == State::kLazy ? budget_ : -1;
  }

  // A lazy layer is StreamingLLM: the oldest row after the initial ones leaves.
  std::int64_t pick_loser(HeadCtx& /*h*/) override { return n_sink_; }

  void on_token(HeadCtx& h, std::int64_t row) override {
    const std::int64_t n = h.n_live();
    if (track_mass_) {
      if (n > 0) {
        weights_.resize(static_cast<std::size_t>(n));
        proxy_weights(h, key_of_row(h, row), n, weights_.data());
        for (std::int64_t i = 0; i < n; ++i) h.hs.score[static_cast<std::size_t>(i)] += weights_[static_cast<std::size_t>(i)];
      }
      push_row(h.hs, row, n == 0 ? 1.0f : 0.0f);
      return;
    }
    const std::int64_t b = h.index / h.st.shape.n_kv_heads;
    push_row(h.hs, row, decided_now_ ? row_att_[static_cast<std::size_t>(b * rows_ + row)] : 0.0f);
  }

 private:
  enum class State { kUndecided, kLazy, kBusy };

  bool in_window(std::int64_t i) const noexcept { return i < n_sink_ || i >= rows_ - n_recent_; }

  // The layer's mass on the window of `rows` rows, and each row's share (row_att_).
  void decide(LayerState& st, std::int64_t rows) {
    rows_ = rows;
    const std::int64_t B = st.batch, H = st.shape.n_kv_heads, d = st.shape.head_dim;
    const auto R = static_cast<std::size_t>(rows);
    att_sum_.assign(static_cast<std::size_t>(B) * R, 0.0);
    double total = 0.0;
    std::int64_t count = 0;  // (batch, head, query) triples averaged
    std::int64_t per_b = 0;
    if (source_.attention() && st.attention != nullptr) {
      const AttentionRef& a = *st.attention;
      const std::int64_t Hq = a.n_query_heads, S = a.n_queries, nr = a.n_rows;
      const std::int64_t q = std::min(n_last_, S);
      VQ_ASSERT(nr >= rows, "attention over fewer rows than the layer holds");
      per_b = Hq * q;
      for (std::int64_t b = 0; b < B; ++b) {
        double* acc = att_sum_.data() + static_cast<std::size_t>(b) * R;
        for (std::int64_t h = 0; h < Hq; ++h) {
          for (std::int64_t j = S - q; j < S; ++j) {
            const float* p = a.data + ((b * Hq + h) * S + j) * nr;
            for (std::int64_t i = 0; i < rows; ++i) {
              acc[i] += static_cast<double>(p[i]);
              if (in_window(i)) total += static_cast<double>(p[i]);
            }
          }
        }
      }
      count = B * per_b;
    } else {
      const std::int64_t q = std::min(n_last_, rows);
      const float sqrt_d = std::sqrt(static_cast<float>(d));
      per_b = H * q;
      keys_.resize(R * static_cast<std::size_t>(d));
      logits_.resize(R);
      for (std::int64_t b = 0; b < B; ++b) {
        double* acc = att_sum_.data() + static_cast<std::size_t>(b) * R;
        for (std::int64_t h = 0; h < H; ++h) {
          const RowStore* store = st.heads[static_cast<std::size_t>(b * H + h)].store();
          for (std::int64_t i = 0; i < rows; ++i) store->read_key(i, keys_.data() + i * d);
          for (std::int64_t r = rows - q; r < rows; ++r) {
            const float* kr = keys_.data() + r * d;
            for (std::int64_t i = 0; i <= r; ++i) {
              logits_[static_cast<std::size_t>(i)] = kernels::dot(kr, keys_.data() + i * d, d) / sqrt_d;
            }
            kernels::softmax(logits_.data(), r + 1);
            for (std::int64_t i = 0; i <= r; ++i) {
              const double p = static_cast<double>(logits_[static_cast<std::size_t>(i)]);
              acc[i] += p;
              if (in_window(i)) total += p;
            }
          }
        }
      }
      count = B * per_b;
    }
    const double mass = count > 0 ? total / static_cast<double>(count) : 0.0;
    state_ = mass > threshold_ ? State::kLazy : State::kBusy;
    // Each row's attention at the decision, per batch element, as its row score.
    row_att_.resize(att_sum_.size());
    for (std::size_t k = 0; k < att_sum_.size(); ++k) {
      row_att_[k] = static_cast<float>(att_sum_[k] / static_cast<double>(per_b > 0 ? per_b : 1));
    }
    decided_now_ = true;
    if (track_mass_) return;
    for (std::int64_t b = 0; b < B; ++b) {
      for (std::int64_t h = 0; h < H; ++h) {
        HeadState& hs = st.heads[static_cast<std::size_t>(b * H + h)];
        for (std::size_t i = 0; i < hs.score.size(); ++i) {
          hs.score[i] = row_att_[static_cast<std::size_t>(b) * R + i];
        }
      }
    }
  }

  double threshold_;
  std::int64_t n_last_, n_recent_;
  bool track_mass_;
  State state_ = State::kUndecided;
  bool decided_now_ = false;
  std::int64_t rows_ = 0;  // rows held at the decision
  std::vector<double> att_sum_;
  std::vector<float> row_att_, keys_, logits_;
};

}  // namespace

MethodInfo simlayerkv_method() {
  return method_card(kSimLayerCard, &check, &make_policy_of<SimLayerPolicy>);
}

}  // namespace vq::detail
