// Internal state of one LayerCache: per (batch, kv head) storage plus the policy's per-row
// arrays. Only LayerCache and the policies (src/policies) see this.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/rng.h"
#include "core/store.h"
#include "veloxquant/cache.h"
#include "veloxquant/config.h"

namespace vq::detail {

struct HeadState {
  std::unique_ptr<RowStore> store;  // physical rows
  // During end_step: the physical rows still alive, in order. Empty between steps (then the
  // store's rows are the live rows, in order).
  std::vector<std::int64_t> live;
  // Policy-defined per-row values, parallel to `live` during a step and to the store's rows
  // between steps (e.g. H2O's cumulative mass, Keyformer's frozen noise).
  std::vector<float> score;
  std::vector<float> aux;
  std::uint64_t draws = 0;  // RNG draw counter of this (b, kv head)
  std::int64_t evictions = 0;  // rows removed since reset (merged or dropped)
  std::int64_t merges = 0;     // of those, rows merged into a survivor
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
  std::int64_t step_prev = 0;  // rows per head before the open step's new rows
  std::int64_t step_new = 0;   // S of the open step

  std::int64_t n_heads_total() const noexcept { return static_cast<std::int64_t>(heads.size()); }
  std::int64_t kv_head_of(std::int64_t index) const noexcept { return index % shape.n_kv_heads; }
};

}  // namespace vq::detail
