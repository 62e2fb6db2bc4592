// The cache's mutable access to a head's store (HeadState gives policies a const one): used by
// the cache (cache.cpp) and its state save/restore (state.cpp), never by a policy.
#pragma once

#include <memory>

#include "policies/layer_state.h"
#include "policies/storage.h"

namespace vq::detail {

struct StoreAccess {
  static RowStore& of(HeadState& hs) noexcept { return *hs.store_; }
  static void set(HeadState& hs, std::unique_ptr<RowStore> store) noexcept {
    hs.store_ = std::move(store);
  }
};

// Gives `st` its per-head storage once its shape is known (the first step with rows, or a loaded
// state): batch x n_kv_heads empty stores of the config's kind with the expected-rows hint, one
// RNG per kv head keyed by (seed, layer, head), and the view rows.
inline void build_heads(LayerState& st, std::int64_t batch, std::int64_t n_kv_heads,
                        std::int64_t head_dim, std::int64_t layer) {
  const auto n = static_cast<std::size_t>(batch * n_kv_heads);
  st.heads.clear();
  st.heads.resize(n);
  for (HeadState& hs : st.heads) {
    StoreAccess::set(hs, make_store(st.config, head_dim));
    StoreAccess::of(hs).expect_rows(st.expected_rows);
  }
  st.rngs.clear();
  const auto seed = static_cast<std::uint64_t>(st.config.seed());
  for (std::int64_t h = 0; h < n_kv_heads; ++h)
    st.rngs.emplace_back(seed, static_cast<std::uint64_t>(layer), static_cast<std::uint64_t>(h));
  st.view_rows.assign(n, HeadRows{});
}

}  // namespace vq::detail
