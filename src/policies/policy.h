// Policies decide, the cache applies: a policy looks at a step's rows and scores, and sends
// its decisions (which rows to keep, merge, demote or drop: policies/decision.h) to the cache,
// which applies them to the row stores. No policy mutates a store. One policy object per layer.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string_view>
#include <vector>

#include "policies/layer_state.h"
#include "policies/headwise.h"
#include "veloxquant/rows.h"

namespace vq::detail {

class Policy;

// State shared by the layers of one ModelCache (made by the builder), for methods whose
// per-layer budgets depend on every layer (SqueezeAttention). A LayerCache built on its own
// has no group.
struct LayerGroup {
  explicit LayerGroup(std::int64_t layers)
      : n_layers(layers), signal(static_cast<std::size_t>(layers), 0.0),
        reported(static_cast<std::size_t>(layers), 0),
        external(static_cast<std::size_t>(layers), 0.0),
        external_count(static_cast<std::size_t>(layers), 0) {}
  std::int64_t n_layers;
  std::vector<double> signal;     // [n_layers] per-layer importance, as reported by each layer
  std::vector<char> reported;     // [n_layers]
  std::vector<double> external;   // [n_layers] sum of engine-reported signals (see ModelCache)
  std::vector<std::int64_t> external_count;  // [n_layers]
  std::vector<std::int64_t> budgets;          // [n_layers] once decided; empty before
  // Every layer's policy and state, registered by the policy at its first end_step, so the
  // layer that completes a group decision can have each layer apply it to its own rows
  // (SqueezeAttention cuts every layer's prefill once the last layer has reported).
  struct Member {
    Policy* policy = nullptr;
    LayerState* state = nullptr;
  };
  std::vector<Member> members = std::vector<Member>(static_cast<std::size_t>(n_layers));
};

// What a method factory gets.
struct PolicyContext {
  const CacheConfig& config;
  const LayerShape& shape;
  std::shared_ptr<LayerGroup> group;  // null outside a ModelCache
};

class Policy {
 public:
  virtual ~Policy() = default;
  // Rows kept per KV head after each step; -1 when the policy keeps everything.
  virtual std::int64_t budget() const noexcept { return -1; }
  // Decide for the open step: every head's store holds st.step_prev kept rows followed by
  // st.step_new new rows; every decision goes to st.apply() (policies/decision.h), ending with
  // one kKeep (or kKeepAll) per head. `attention` is validated by the cache (shape) and may be
  // null.
  virtual void end_step(LayerState& st, const AttentionRef* attention) = 0;
  // Called by LayerCache::reset() after the stores were cleared.
  virtual void on_reset(LayerState& /*st*/) {}
  // Whether end_step needs the attention probabilities (source=attention, or auto resolved to
  // attention).
  virtual bool needs_attention() const noexcept { return false; }
  // Whether end_step reads the step's pre-RoPE queries (LayerState::queries) when they are
  // passed (expected_attention); the cache resolves LayerState::query_source for such methods.
  virtual bool reads_queries() const noexcept { return false; }
  // Applies a decision of the layer group (LayerGroup::budgets) to this layer's stored rows,
  // outside any step. Called by the layer that completed the decision, on every layer.
  virtual void apply_group_decision(LayerState& /*st*/) {}
  // source=auto: whether it is still unresolved, and resolving it (the cache calls this at the
  // first step with new rows: attention when that step passes probabilities, else proxy).
  virtual bool source_unresolved() const noexcept { return false; }
  virtual void resolve_source(bool /*attention*/) {}
  // Back to unresolved after reset() (the configured source is auto).
  virtual void reset_source() {}
  // Whether the method scores keys with LayerState::key_filters (LayerCache::set_key_filters).
  virtual bool needs_key_filters() const noexcept { return false; }
  // "none" (the method uses no attention), "proxy", "attention" or "auto" (not yet resolved).
  virtual const char* source_name() const noexcept { return "none"; }
  // Head types (DuoAttention): whether the method takes a per-KV-head score pattern
  // (LayerCache::set_head_pattern, size and values checked by the cache), setting it (empty:
  // none), and the type of head `index` (b * n_kv_heads + h): 0 untyped (every other method, or
  // not decided yet), 1 a retrieval head (keeps every row), 2 a streaming head (sinks + window).
  virtual bool takes_head_pattern() const noexcept { return false; }
  virtual void set_head_pattern(std::vector<float> /*scores*/) {}
  virtual std::int32_t head_type(std::int64_t /*index*/) const noexcept { return 0; }
  // Whether the policy reads the question length (LayerState::step_question,
  // LayerCache::set_question_length): finch's observation window.
  virtual bool reads_question() const noexcept { return false; }
  // Whether the policy reads the output projection's Gram matrices (LayerState::output_gram,
  // LayerCache::set_output_gram): criticalkv's projected value norms.
  virtual bool reads_output_gram() const noexcept { return false; }
  // Context reconstruction (kvzip): whether the method scores its rows by the attention of a
  // reconstruction pass (LayerCache::end_reconstruction_step), and the pass's chunk size.
  virtual bool reads_reconstruction() const noexcept { return false; }
  virtual std::int64_t reconstruction_chunk() const noexcept { return 0; }
  // A reconstruction step is open (the step's new rows are reconstruction tokens, the rows
  // before them the cache's stored rows): take `attention` ([B, Hq, S, R], checked by the cache)
  // over the stored rows into the method's scores. Decides nothing; the cache then forgets the
  // step's rows.
  virtual void observe_reconstruction(LayerState& /*st*/, const AttentionRef& /*attention*/) {}
  // LayerCache::compress(): the method's cut of the stored rows by what it observed, outside
  // any step.
  virtual void compress(LayerState& /*st*/) {}
  // Saves (io writing) or restores (io reading) the policy's own mutable state between steps:
  // what later steps read that is neither in `st` nor set up by the engine (decided head types,
  // resolved query source, per-head statistics, counters; src/cache/state.cpp saves `st` and
  // the resolved score source). Reading validates against `st` (already restored) and throws
  // StateCorrupt; the policy is then discarded. Default: nothing (a policy whose members are
  // configuration and per-step scratch).
  virtual void state(StateIO& /*io*/, LayerState& /*st*/) {}
  // Whether a prompt's rows wait for compress() (kvzip with set_reconstruction: a
  // reconstruction pass is under way), when no state can be saved.
  virtual bool awaits_compress(const LayerState& /*st*/) const noexcept { return false; }
};

// Where attention-scored methods get their scores (the `source` and `gqa_reduce` fields).
// kNone: the method scores without attention (no `source` field); kAuto: resolved to kProxy or
// kAttention by the cache's first step (configured stays kAuto so reset() can undo it).
struct ScoreSource {
  enum class Kind { kNone, kAuto, kProxy, kAttention };
  enum class Reduce { kMean, kMax, kSum };
  Kind kind = Kind::kNone;
  Kind configured = Kind::kNone;
  Reduce reduce = Reduce::kMean;
  bool attention() const noexcept { return kind == Kind::kAttention; }
};
// Reads `source` and `gqa_reduce` (kNone / mean when the method has no such fields).
ScoreSource score_source_from(const CacheConfig& config);

// What happens to an evicted row (CaM's disposition, available to every eviction method).
struct MergeRule {
  enum class Mode { kDrop, kMean, kSimWeighted };
  // kNearest: blend into the most cosine-similar non-sink survivor (the reference adaptation).
  // kWindow: add v_e / m to each of the next m kept rows after the loser (the paper's rule).
  enum class Target { kNearest, kWindow };
  // What the gate compares: the method's own score (cumulative mass for H2O and its family),
  // or the current query's attention (true or proxy).
  enum class GateScore { kScore, kCurrent };
  Mode mode = Mode::kDrop;
  bool gate = true;   // Bernoulli gate (see merge_gate_probability / window_gate_probability)
  bool keys = false;  // blend keys too (values are always blended; never with kWindow)
  Target target = Target::kNearest;
  std::int64_t m = 32;  // window size for kWindow
  GateScore gate_score = GateScore::kScore;
};

// Gate probability for merging a loser into a target (CaM, Eq. 14 adapted):
// clamp(score_loser / score_target, 0, 1); when score_target <= 0: 1 if score_loser > 0 else 0.
// NaN inputs give 0.
float merge_gate_probability(float score_loser, float score_target) noexcept;
// The paper's window gate: p = A_e / mean(A over the window), NaN -> 0, clamped to [0, 1].
float window_gate_probability(float a_loser, const float* a_window, std::int64_t m) noexcept;

// CaM's merge target: among live rows [n_sink, n_live) other than `loser` and other than rows
// with excluded[i] != 0 (excluded may be null), the one whose key has the largest
// cos(k_loser, k_j) (ties to the lowest index, NaN never wins). Returns -1 when no such row
// exists (only sinks survive). `live` maps live index -> physical row of `rows`; *cos_out
// receives the winning cosine. scratch: [2 * head_dim] floats.
std::int64_t find_merge_target(const HeadRows& rows, const std::int64_t* live, std::int64_t n_live,
                               std::int64_t n_sink, std::int64_t loser, const std::uint8_t* excluded,
                               std::int64_t head_dim, float* cos_out, float* scratch);

// Per-head context handed to TokenPolicy hooks.
struct HeadCtx {
  LayerState& st;
  HeadState& hs;
  std::int64_t index;  // b * n_kv_heads + h
  std::int64_t head_dim;
  const CounterRng& rng;
  HeadRows rows() const noexcept { return hs.store()->rows(); }
  std::int64_t n_live() const noexcept { return static_cast<std::int64_t>(hs.live.size()); }
};

// The token-level eviction loop shared by the score-based methods (end_step, the one loop: a
// method supplies its scorer, on_token() and eviction_scores(), and at most a few of the hooks
// below). For each new token in order and each head: on_token() appends it (updating scores);
// while the head then holds more than step_budget() rows, pick_loser() chooses one row and the
// merge rule disposes of it; the head settles. At the end each store keeps exactly its live
// rows. Every disposition, settle and keep is a Decision applied by the cache.
// A policy whose decides_chunk_at_once() is true (H2O's family with source=attention) instead
// runs on_token() for every token of a multi-token step (a prefill chunk) and then cuts once
// to the budget (cut()): one decision made with the whole chunk's attention, as the papers
// decide a prompt. Head-wise budgets and methods whose heads share their rows (shares_rows())
// cut with cut() after every token instead of the per-head argmin.
class TokenPolicy : public Policy {
 public:
  TokenPolicy(std::int64_t budget, std::int64_t n_sink, MergeRule merge,
              ScoreSource source = ScoreSource{})
      : budget_(budget), n_sink_(n_sink), merge_(merge), source_(source) {}
  // Read from the config of ctx's method, through its prefix p: budget (default: p_budget),
  // p_n_sink, the merge rule (merge...), the score source (source, gqa_reduce), head-wise
  // budgets (headwise, headwise_floor) and compress_interval, the last three where the method
  // has those fields.
  explicit TokenPolicy(const PolicyContext& ctx);
  TokenPolicy(const PolicyContext& ctx, std::int64_t budget);
  std::int64_t budget() const noexcept override { return budget_; }
  void end_step(LayerState& st, const AttentionRef* attention) override;
  bool needs_attention() const noexcept override { return source_.attention(); }
  bool source_unresolved() const noexcept override {
    return source_.kind == ScoreSource::Kind::kAuto;
  }
  void resolve_source(bool attention) override {
    if (source_.kind == ScoreSource::Kind::kAuto) {
      source_.kind = attention ? ScoreSource::Kind::kAttention : ScoreSource::Kind::kProxy;
    }
  }
  void reset_source() override { source_.kind = source_.configured; }
  const char* source_name() const noexcept override;
  // Reading checks what the eviction loop relies on: each head's per-row arrays parallel to its
  // method rows (scores, aux, history of hist_stride), and equal row counts across a batch
  // element's heads for a method whose heads share their rows.
  void state(StateIO& io, LayerState& st) override;
  // Head-wise budgets (policies/headwise.h): every cut is one decision per batch element over
  // all its KV heads, which keep n_kv_heads x budget rows together. Set by the method's factory
  // (eligible methods only).
  void set_headwise(HeadwiseRule rule) { headwise_ = rule; }

 protected:
  // Appends physical row `row` (a new token) to h.hs.live with its initial score.
  virtual void on_token(HeadCtx& h, std::int64_t row) = 0;
  // Fills out[i] for every live row i with the eviction ranking (lowest is evicted; +inf
  // protects). The default protects the first n_sink rows and ranks the rest by score. A row's
  // data score goes through rank_of(), so a score that overflowed to +inf is never read as the
  // protected mark.
  virtual void eviction_scores(HeadCtx& h, float* out);
  // A data score as an eviction rank: +inf (a sum that overflowed, e.g. attention mass summed
  // from probabilities near FLT_MAX handed to the C++ API, or a key norm of huge keys) ranks as
  // the largest finite float: highest, tied with every other overflowed row (ties evict the
  // lowest index first), and never protected. Every other value, NaN included, is unchanged.
  static float rank_of(float score) noexcept {
    return score == std::numeric_limits<float>::infinity() ? std::numeric_limits<float>::max()
                                                           : score;
  }
  // The live index to evict; the default is argmin of eviction_scores().
  virtual std::int64_t pick_loser(HeadCtx& h);
  // Score the merge gate compares (default: the row's score).
  virtual float gate_score(const HeadCtx& h, std::int64_t i) const { return h.hs.score[i]; }
  // Bookkeeping when live row `loser` is merged into `target` (default: score_t += score_e).
  virtual void on_merge(HeadCtx& h, std::int64_t target, std::int64_t loser);

  // Whether a multi-token step is one decision (see the class comment); default: no.
  virtual bool decides_chunk_at_once() const noexcept { return false; }
  // The budget of the open step (default: budget_; -1 evicts nothing).
  virtual std::int64_t step_budget(const LayerState& /*st*/) const { return budget_; }
  // Before open_live() and after the step's kKeep decisions (per-step state of a method).
  virtual void begin_step(LayerState& /*st*/) {}
  virtual void finish_step(LayerState& /*st*/) {}
  // Whether every head of a batch element loses the same rows, chosen by layer_losers()
  // (chunkkv's chunks, tova's layer-wide attention); default: no, each head ranks its own.
  virtual bool shares_rows() const noexcept { return false; }
  // The next live indices (strictly increasing) that every head of batch element b loses, to
  // bring it to `keep` rows; empty when nothing (more) leaves. Called until it is empty or the
  // heads hold at most `keep` rows.
  virtual void layer_losers(LayerState& /*st*/, std::int64_t /*b*/, std::int64_t /*keep*/,
                            std::vector<std::int64_t>& /*losers*/) {}
  // A per-head cut of a step decided at once (default: cut_to).
  virtual void cut_head(HeadCtx& h, std::int64_t keep) { cut_to(h, keep); }
  // Head-wise cuts: whether equal rankings lose the newer row first (snapkv's selection keeps
  // the earliest of equal pooled scores); default: the older row, as cut_to().
  virtual bool ties_evict_newer() const noexcept { return false; }

  // Helpers for hooks.
  // Evicts, in one decision, the n_live - keep live rows ranked lowest by eviction_scores()
  // (NaN first, then increasing score, ties to the lowest index; +inf rows are protected) and
  // disposes of them by the merge rule. Nothing when n_live <= keep or keep < 0.
  void cut_to(HeadCtx& h, std::int64_t keep);
  // Cuts every head of a closed step's state to `keep` rows with cut() (a pseudo-step with
  // no new rows: live = the stored rows), then the stores keep the survivors. Head-wise: the
  // heads of each batch element keep n_kv_heads x keep rows together (headwise_cut).
  void cut_stored(LayerState& st, std::int64_t keep);
  // One cut of the open step's live rows to `keep`, then every head settles: head-wise
  // (headwise_cut), shared by the heads (layer_losers), or per head (cut_head).
  void cut(LayerState& st, std::int64_t keep);
  // Decision kSettle for head `head` with its live rows.
  static void settle(const LayerState& st, std::int64_t head);
  // Head-wise cut of the open step's live rows: for each batch element, every head's
  // eviction_scores() ranking goes to headwise_losers() with `keep` as the per-head budget, the
  // losers leave by the merge rule, and each store settles (only that when keep < 0).
  // Virtual: a method whose head-wise cut is more than one ranking (criticaladakv's two stages
  // on the budgets this allocation gives) replaces it.
  virtual void headwise_cut(LayerState& st, std::int64_t keep);
  static void push_row(HeadState& hs, std::int64_t row, float score, float aux = 0.0f);
  // The attention of new token j (query j of the step) of head h's KV head over the step's R
  // physical rows, folded over its query heads by gqa_reduce. Valid until the next call.
  const float* attention_row(const HeadCtx& h, std::int64_t j);
  // The same, averaged over every query head of the layer (for layer-level decisions).
  const float* attention_row_all_heads(const LayerState& st, std::int64_t b, std::int64_t j);
  // out[i] for every live row: the newest token's attention to row i (true attention with
  // source=attention, else its proxy weights over the live rows).
  void current_attention(HeadCtx& h, float* out);
  // Removes the live rows `losers` (strictly increasing live indices), applying the merge rule
  // to each in turn (targets are never among the losers), then compacts the live arrays.
  void evict_rows(HeadCtx& h, const std::vector<std::int64_t>& losers);
  // Starts a step: live = the kept rows (identity), checks the per-row arrays.
  static void open_live(LayerState& st);
  // Ends a step: each store keeps exactly its live rows (a kKeep decision per head).
  static void commit_live(LayerState& st);
  // out[i] = softmax_i(K[live[i]] . q / sqrt(d)) over live rows [0, n).
  void proxy_weights(const HeadCtx& h, const float* q, std::int64_t n, float* out);
  // Key of live row i as fp32, into a scratch buffer owned by the policy (valid until the next
  // call of key_of).
  const float* key_of(const HeadCtx& h, std::int64_t i);
  // Key of physical row `row` as fp32 (same scratch as key_of).
  const float* key_of_row(const HeadCtx& h, std::int64_t row);

  std::int64_t budget_;
  std::int64_t n_sink_;
  MergeRule merge_;
  ScoreSource source_;
  HeadwiseRule headwise_;
  // compress_interval (the schedule group; 1 for a method without it): a head holds up to
  // budget_ + interval_ - 1 rows between cuts (end_step).
  std::int64_t interval_ = 1;
  std::vector<float> ranking_;  // [n_live] eviction_scores output
  std::vector<float> weights_;  // [n_live] softmax scratch
  std::vector<float> query_;    // [d]
  std::vector<std::int64_t> order_;  // cut_to scratch

 private:
  // Applies the merge rule to live row `loser` (the row stays in `live`).
  void dispose(HeadCtx& h, std::int64_t loser, const std::uint8_t* excluded);
  void merge_rows(HeadCtx& h, std::int64_t target, std::int64_t loser, float cos);
  void merge_window(HeadCtx& h, std::int64_t loser, const std::uint8_t* excluded, double u);
  float gate_value(HeadCtx& h, std::int64_t i);
  static void remove_row(HeadState& hs, std::int64_t i);
  std::vector<float> a_, b_;        // [d] row scratch
  std::vector<std::uint8_t> mask_;  // [n_live] losers of evict_rows
  std::vector<float> att_;          // [R] attention_row output
  std::vector<float> current_;      // [n_live] current_attention cache for the gate
  std::vector<std::int64_t> window_;  // kWindow targets
  std::vector<std::vector<float>> head_rankings_;       // [Hkv][n_live of the head]
  std::vector<std::vector<std::int64_t>> head_losers_;  // [Hkv] headwise_cut scratch
  std::vector<std::int64_t> shared_;                    // layer_losers output
};

// Reads the shared merge fields (merge, merge_gate, merge_keys, merge_target, merge_m,
// merge_attention) from the config.
MergeRule merge_rule_from(const CacheConfig& config);

}  // namespace vq::detail
