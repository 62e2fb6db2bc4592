// Which row store a config asks for. The stores (src/store) know no method; the methods layer,
// which reads configs, chooses among them here.
#pragma once

#include <cstdint>
#include <memory>

#include "store/store.h"
#include "veloxquant/config.h"

namespace vq::detail {

// The demoted tier's cap of a config with demote != none: demote_budget, or the method's token
// budget when demote_budget is -1 (the default).
std::int64_t demote_cap(const CacheConfig& config);

// KIVI when the method is kivi or quantize != none, mixed precision when demote != none, ggml's
// blocks with kv_dtype=q8_0|q4_0, rows whose keys can be pruned when think > 0 (ThinK), plain
// rows of kv_dtype otherwise.
std::unique_ptr<RowStore> make_store(const CacheConfig& config, std::int64_t head_dim);

}  // namespace vq::detail
