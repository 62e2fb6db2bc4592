// Internal state of one LayerCache: per (batch, kv head) storage plus the policy's per-row
// arrays. Only LayerCache and the policies (src/policies) see this. Policies read the stores
// (HeadState::store() is const) and send what they decide to LayerState::sink
// (policies/decision.h); only the cache mutates a store.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "base/rng.h"
#include "policies/decision.h"
#include "store/store.h"
#include "veloxquant/rows.h"
#include "veloxquant/config.h"

namespace vq::detail {

// Mutable access to a head's store: defined by the cache (src/cache), never by a policy.
struct StoreAccess;

struct HeadState {
  // The physical rows, read-only for policies.
  const RowStore* store() const noexcept { return store_.get(); }
  // During end_step: the physical rows still alive, in order. Empty between steps (then the
  // store's rows are the live rows, in order).
  std::vector<std::int64_t> live;
  // Policy-defined per-row values, parallel to `live` during a step and to the store's rows
  // between steps (e.g. H2O's cumulative mass, Keyformer's frozen noise).
  std::vector<float> score;
  std::vector<float> aux;
  // Optional per-row history of `hist_stride` floats (MorphKV's attention of the last W
  // queries), parallel to score/aux; empty when hist_stride is 0.
  std::vector<float> hist;
  std::int64_t hist_stride = 0;
  // Rows this head kept before the open step: its view rows are these followed by the step's
  // new rows, so the step's new token j is physical row prev + j. Heads differ with head-wise
  // budgets (headwise=true); otherwise every head has st.step_prev.
  std::int64_t prev = 0;
  std::uint64_t draws = 0;  // RNG draw counter of this (b, kv head)
  std::int64_t evictions = 0;  // rows removed since reset (merged or dropped)
  std::int64_t merges = 0;     // of those, rows merged into a survivor

 private:
  friend struct StoreAccess;
  std::unique_ptr<RowStore> store_;
};

struct LayerState {
  CacheConfig config;
  LayerShape shape;
  std::int64_t batch = 0;
  bool shaped = false;  // batch, heads and head_dim fixed
  std::int64_t tokens_seen = 0;
  std::vector<HeadState> heads;    // [batch * n_kv_heads]
  std::vector<CounterRng> rngs;    // [n_kv_heads], keyed by (seed, layer, kv head)
  std::vector<HeadRows> view_rows;  // [batch * n_kv_heads], what begin_step hands out
  bool step_open = false;
  // The most rows any head kept before the open step's new rows (R - S; each head's own count
  // is HeadState::prev, equal for every head unless budgets are head-wise).
  std::int64_t step_prev = 0;
  std::int64_t step_new = 0;   // S of the open step
  // The attention probabilities handed to end_step ([B, Hq, S, R], R = step_prev + step_new),
  // null when none were; valid only during end_step.
  const AttentionRef* attention = nullptr;
  // The step's pre-RoPE queries handed to end_step ([B, Hq, S, D]), null when none were; valid
  // only during end_step. query_source: for a method that reads queries, -1 until the first
  // step with new rows, then 1 (that step passed queries) or 0 (it passed none: the method's
  // fallback); reset() makes it -1 again.
  const TensorRef* queries = nullptr;
  int query_source = -1;
  // The layer's rotary embedding (LayerCache::set_rope): per pair inverse frequencies, empty
  // when the layer has none; rope_set says whether set_rope was called.
  std::vector<double> rope_inv_freq;
  bool rope_interleaved = true;
  bool rope_set = false;
  // source=auto was resolved by a step of this cache (reset() clears it).
  bool source_resolved = false;
  // LayerCache::expect_positions: the most rows a head is expected to hold (0: unknown), handed
  // to every store as a growth ceiling (RowStore::expect_rows).
  std::int64_t expected_rows = 0;
  // LayerCache::set_key_filters: [n_kv_heads][head_dim] (qfilters); empty when none were set.
  std::vector<float> key_filters;
  // LayerCache::set_output_gram: per query head g the Gram matrix G_g = W_o^g^T W_o^g of the
  // layer's output projection slice ([output_gram_heads][D][D], row-major), kept only for a
  // policy that reads it (Policy::reads_output_gram); empty when none was given. Kept across
  // reset().
  std::vector<float> output_gram;
  std::int64_t output_gram_heads = 0;
  std::int64_t output_gram_dim = 0;
  // LayerCache::set_question_length: the question length waiting for the next step with new
  // rows (0: none), and the open step's (taken from `question` by begin_step; valid during
  // end_step; 0 when the step has no question).
  std::int64_t question = 0;
  std::int64_t step_question = 0;
  // LayerCache::set_reconstruction: the engine runs a reconstruction pass after each prompt
  // (kvzip), so prompt steps keep every row until LayerCache::compress(). Kept across reset().
  bool reconstruction = false;
  // Where the policy's decisions go (the cache's applier, bound to this state for its life).
  std::unique_ptr<DecisionSink> sink;
  void apply(const Decision& d) const { sink->apply(d); }

  std::int64_t n_heads_total() const noexcept { return static_cast<std::int64_t>(heads.size()); }
  std::int64_t kv_head_of(std::int64_t index) const noexcept { return index % shape.n_kv_heads; }
};

}  // namespace vq::detail
