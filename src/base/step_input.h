// A step's keys and values checked before anything reads or copies them: the shape limits of
// types.h (kMaxHeads, kMaxHeadDim, kMaxBatchHeads, and S within int32 positions) and rows that
// do not overlap. LayerCache::begin_step calls it; the C API and the Python module call it
// first too, before their scan for non-finite values, so a tensor that names 2^28 rows of one
// small buffer (zero strides) is refused at once instead of being scanned and copied.
//
// Only well-formed, non-empty tensors are checked (non-negative sizes, stride[3] == 1, data
// set); a malformed one is left to the cache's shape check, which reports it as a mismatch.
#pragma once

#include <cstdint>
#include <string_view>

#include "veloxquant/types.h"

namespace vq::detail {

// Throws Error(kInvalidArgument) "<where>: <name> [B, Hkv, S, D] ..." when the shape is past a
// limit: Hkv > kMaxHeads, D > kMaxHeadDim, B x Hkv > kMaxBatchHeads, S > 2^31 - 1.
void check_step_shape(const TensorRef& t, std::string_view where, std::string_view name);

// Throws Error(kInvalidArgument) when two (b, h, s) rows of `t` share an element: taking the
// dimensions of size > 1 from the smallest |stride| up, each stride must be at least the span
// of the rows inside it (D elements for the innermost). This is sufficient for distinct rows
// and holds for every contiguous and permuted layout ([B, H, S, D], [S][H][D], ...); it refuses
// zero strides (broadcasts) and interleavings a cache has no use for.
void check_rows_distinct(const TensorRef& t, std::string_view where, std::string_view name);

// Both, the shape first.
void check_step_input(const TensorRef& t, std::string_view where, std::string_view name);

// The upper limits of a layer or model shape (types.h): n_layers <= kMaxLayers, n_kv_heads and
// n_query_heads <= kMaxHeads, head_dim <= kMaxHeadDim. Throws Error(kInvalidArgument) "<where>
// n_layers must be at most 4096 (kMaxLayers, include/veloxquant/types.h), got 100000000". Lower
// bounds are the caller's (a LayerCache takes 0 for "from the first step").
void check_shape_limits(std::int64_t n_layers, std::int64_t n_kv_heads, std::int64_t head_dim,
                        std::int64_t n_query_heads, std::string_view where);

}  // namespace vq::detail
