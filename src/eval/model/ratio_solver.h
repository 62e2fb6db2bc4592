// Equal-memory settings for `veloxquant eval --ratio`: the budget (and, for methods without one,
// the bit width) at which a method's cache reaches a compression ratio in bytes.
//
// The ratio is full_bytes / kept_bytes at the end of the text: after the last step, when the
// cache holds what the last scored prediction read. The teacher-forced driver feeds tokens
// 0 .. T-2 (the last of T tokens is only a target), so full_bytes is the fp16 K+V cost of T - 1
// rows in every layer and KV head, with or without a prefill (a prefill of P tokens is one
// step; the rows decoded after it count the same). kept_bytes is the payload (kv_dtype rows, or
// KIVI codes + fp16 scales and zeros + the unquantized tail); resident_bytes is reported beside
// it but is not what the ratio is solved for.
//
// The solver predicts kept_bytes from the byte cost of the rows a store holds (store_bytes) and
// the rows the method keeps at the end (min(budget, rows seen) per layer and head), then the
// evaluation checks the prediction by running the method and corrects it (solve_budget's
// `offset`: measured minus predicted bytes), because some methods hold more or fewer rows than
// their budget at the end (snapkv keeps every decoded row after its prefill cut, chunkkv keeps
// whole chunks, a KIVI store that evicted rows keeps sparse key groups).
// demote= (a low-bit tier for the rows the method evicts) is in predicted_kept_bytes; headwise=
// keeps each layer's total at budget x heads, so the prediction holds for it unchanged.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "veloxquant/config.h"

namespace vq::eval {

struct KvShape {
  std::int64_t n_layers = 0, n_kv_heads = 0, head_dim = 0;
  // Rows fed as one prefill step before decoding (eval --prefill; 0 or 1: none): think= prunes
  // the keys of the rows a cache holds after it.
  std::int64_t prefill_rows = 0;
};

// The fp16 cost of `rows` rows of K and V in every layer and KV head (LayerCache::full_bytes).
std::int64_t full_cache_bytes(const KvShape& shape, std::int64_t rows);

// The payload of one (layer, KV head) store holding `rows` rows appended in order with none
// evicted: rows x 2 x head_dim x sizeof(kv_dtype); or, for KIVI storage (method kivi, or
// quantize=kivi2|kivi4 on an eviction method), with G = kivi_group_size, R = residual_length,
// b = bits, D = head_dim, s = sizeof(kv_dtype): keys leave the unquantized tail a group at a
// time, values a token at a time, so qk = G * floor(max(0, rows - R) / G) keys and
// qv = max(0, rows - R) values are quantized; bytes = qk ceil(D b / 8) + (qk / G) D 4 (a key
// group's fp16 scale and zero per channel) + (rows - qk) D s (the key tail) + qv ceil(D b / 8)
// + qv ceil(D / G) 4 (a value row's fp16 scale and zero per group) + (rows - qv) D s.
// With think > 0 (ThinK, plain rows only), `pruned_rows` of the rows keep only the
// D - floor(think D) kept channels of their key, and the store holds its channel set (2 bytes a
// channel) once it pruned any: bytes = pruned (kept + D) s + (rows - pruned) 2 D s + 2 kept.
std::int64_t store_bytes(const CacheConfig& config, std::int64_t head_dim, std::int64_t rows,
                         std::int64_t pruned_rows = 0);

// The payload of one row in the low-bit tier of demote=kivi2|kivi4 (mixed_store.cpp): with
// b = bits, D = head_dim, G = min(demote_group, D): K and V codes 2 ceil(D b / 8) plus an fp16
// scale and zero per G channels of K and of V, 8 ceil(D / G). 0 without demote.
std::int64_t demoted_row_bytes(const CacheConfig& config, std::int64_t head_dim);

// Predicted kept_bytes at the end of a text whose cache has seen `rows_seen` rows: every layer
// and KV head holds min(budget, rows_seen) rows (every row for a method without a budget), of
// which min(those, shape.prefill_rows) have pruned keys with think > 0 (shape.prefill_rows >= 2),
// and
// with demote= also min(demote cap, rows_seen - those) demoted rows (the cap is demote_budget,
// or the budget when that is -1).
std::int64_t predicted_kept_bytes(const CacheConfig& config, const KvShape& shape,
                                  std::int64_t rows_seen);

// The largest budget b in [1, rows_seen] whose predicted kept_bytes + offset is at most
// full_cache_bytes(rows_seen) / ratio, skipping budgets the method's guards reject, and below
// `below` when given (the budgets a previous check already refused). Returns nullopt when no
// budget qualifies; `why` then says why (the last guard message, or the smallest reachable
// bytes). `config` must have a token budget.
struct BudgetChoice {
  CacheConfig config;  // `config` with the chosen budget
  std::int64_t budget = 0;
  std::int64_t predicted_bytes = 0;  // without the offset
};
std::optional<BudgetChoice> solve_budget(const CacheConfig& config, const KvShape& shape,
                                         std::int64_t rows_seen, double ratio, std::int64_t offset,
                                         std::int64_t below, std::string* why);

// For a method without a budget: its variants by bit width (kivi: bit_width_inlier 2 and 4; a
// method with a `quantize` field: none, kivi2, kivi4) or, for one with think > 0 (the `think`
// method), by its pruning share (think 0.25, 0.5, 0.75: ThinK prunes the prompt's keys only, so
// its ratio is at most 2), each with its predicted ratio. Empty when the method has neither
// (nothing to solve).
struct WidthChoice {
  CacheConfig config;
  double predicted_ratio = 1;
};
std::vector<WidthChoice> width_variants(const CacheConfig& config, const KvShape& shape,
                                        std::int64_t rows_seen);
// The variant whose predicted ratio is nearest `ratio` on a log scale (the first on a tie).
// `variants` must not be empty.
const WidthChoice& nearest_width(const std::vector<WidthChoice>& variants, double ratio);

}  // namespace vq::eval
