// The cache's mutable access to a head's store (HeadState gives policies a const one): used by
// the cache (cache.cpp) and its state save/restore (state.cpp), never by a policy.
#pragma once

#include <memory>

#include "policies/layer_state.h"

namespace vq::detail {

struct StoreAccess {
  static RowStore& of(HeadState& hs) noexcept { return *hs.store_; }
  static void set(HeadState& hs, std::unique_ptr<RowStore> store) noexcept {
    hs.store_ = std::move(store);
  }
};

}  // namespace vq::detail
