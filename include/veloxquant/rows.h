// The value types a cache hands out and takes in: a layer's shape, the rows of a step (plain or
// packed), the attention input, an owning copy of rows, and the cache's statistics. They sit
// below every class that uses them (the stores, the policies, LayerCache and ModelCache), so
// each layer can name them without reaching up (docs/design.md, "Layers").
#pragma once

#include <cstdint>
#include <vector>

#include "veloxquant/types.h"

namespace vq {

class LayerCache;

// The shape a layer cache serves. Zero head counts or head_dim are taken from the first
// non-empty update and fixed from then on.
struct LayerShape {
  std::int64_t n_kv_heads = 0;     // Hkv
  std::int64_t head_dim = 0;       // D
  std::int64_t n_query_heads = 0;  // Hq, for the attention input; 0 means Hkv
  std::int64_t layer = 0;          // this layer's index (RNG key, per-layer budgets)
  std::int64_t n_layers = 1;
};

// Rows held packed (a quantized cache's codes, scales and zeros, plus its unquantized tail),
// read as fp32 by dequantizing on the fly, or attended straight from the codes
// (attend_scores / attend_values). Owned by the cache; valid as long as the HeadRows that points
// to it.
class VQ_API PackedRows {
 public:
  // The row's key / value, dequantized: out [head_dim].
  virtual void load_key(std::int64_t row, float* out) const noexcept = 0;
  virtual void load_value(std::int64_t row, float* out) const noexcept = 0;
  // One element, dequantized.
  virtual float key_at(std::int64_t row, std::int64_t d) const noexcept = 0;
  virtual float value_at(std::int64_t row, std::int64_t d) const noexcept = 0;
  // Rows [r0, r1) at once, dequantized: row r's key to keys + (r - r0) * stride and its value
  // to values + (r - r0) * stride ([r1 - r0][stride], first head_dim used; stride >= head_dim),
  // bit-identical to load_key / load_value of each row (0 <= r0 <= r1 <= the rows held); keys
  // or values may be null, and that half is not read. The default loops over load_key /
  // load_value; a store overrides it with a bulk path (the engine's attention reads a head a
  // block of rows at a time). Declared after the other virtuals, so the vtable only grows at
  // its end.
  virtual void load_rows(std::int64_t r0, std::int64_t r1, std::int64_t stride, float* keys,
                         float* values) const noexcept;

  // Attention read straight from the packed codes (the engine's path: no row is dequantized),
  // over every row held, for n_q queries q_j = q + j * head_dim (fp32):
  //   attend_scores: scores[j * ld + r] = q_j . key_r as the store's fused formula computes it
  //   (the scale and zero folded into the query; docs/quantized-cache.md), -inf where row r's
  //   position is > pos;
  //   attend_values: out[j * head_dim + d] = sum over rows r with position <= pos of
  //   probs[j * ld + r] * value_r[d] (the probability folded into the scale), in a fixed order;
  //   scratch: at least 8 * n_q * head_dim floats, the caller's.
  // Results depend only on the inputs (never on threads or the instruction set in use).
  virtual void attend_scores(const float* q, std::int64_t n_q, std::int64_t pos, float* scores,
                             std::int64_t ld) const noexcept = 0;
  virtual void attend_values(const float* probs, std::int64_t n_q, std::int64_t ld,
                             std::int64_t pos, float* out, float* scratch) const noexcept = 0;

 protected:
  ~PackedRows() = default;
};

// The rows of one (batch, kv head) to attend over, in order. Plain rows: keys and values are
// [n_rows][row_stride] elements of `dtype` (first head_dim used). Packed rows (quantize=,
// kivi): `packed` is set, keys and values are null, row_stride = head_dim; read them with
// key()/value(), packed->load_key/load_value, or dequantized(). positions: [n_rows].
struct VQ_API HeadRows {
  const void* keys = nullptr;
  const void* values = nullptr;
  const std::int32_t* positions = nullptr;
  DType dtype = DType::kF16;
  std::int64_t n_rows = 0;
  std::int64_t row_stride = 0;
  const PackedRows* packed = nullptr;

  // Element access converted to float (tests and tools; not for hot loops).
  float key(std::int64_t row, std::int64_t d) const noexcept;
  float value(std::int64_t row, std::int64_t d) const noexcept;
  // Plain rows: row `row`'s key / value, row_stride elements of dtype (the first head_dim used).
  const void* key_row(std::int64_t row) const noexcept {
    return static_cast<const char*>(keys) +
           row * row_stride * static_cast<std::int64_t>(dtype_size(dtype));
  }
  const void* value_row(std::int64_t row) const noexcept {
    return static_cast<const char*>(values) +
           row * row_stride * static_cast<std::int64_t>(dtype_size(dtype));
  }
  // Row `row`'s key as fp32, plain or packed: out [row_stride] (packed: [head_dim]).
  void load_key(std::int64_t row, float* out) const noexcept;
};

// `rows` as plain rows: packed rows are dequantized into `keys` and `values` (resized to
// [n_rows][row_stride] fp32; the caller's scratch, reusable across heads and layers) and the
// result points there; plain rows are returned as they are (no copy).
VQ_API HeadRows dequantized(const HeadRows& rows, std::vector<float>& keys, std::vector<float>& values);

// What begin_step returns: per (b, kv head) the previously kept rows followed by the step's
// new rows. Valid until end_step(). Heads hold the same number of rows unless the method runs
// with head-wise budgets (headwise=true, README "Head-wise budgets"): then each head's own
// count is head(b, h).n_rows (its last n_new() rows are the step's new ones) and n_rows() is
// the largest over the heads (R, the attention input's row stride).
class StepView {
 public:
  StepView() = default;
  std::int64_t batch() const noexcept { return batch_; }
  std::int64_t n_kv_heads() const noexcept { return heads_; }
  std::int64_t head_dim() const noexcept { return head_dim_; }
  std::int64_t n_rows() const noexcept { return n_rows_; }  // R = max over heads of n_rows
  std::int64_t n_new() const noexcept { return n_new_; }    // S: the last S of the R rows
  const HeadRows& head(std::int64_t b, std::int64_t h) const noexcept {
    return rows_[b * heads_ + h];
  }

 private:
  friend class LayerCache;
  const HeadRows* rows_ = nullptr;  // [B * Hkv], owned by the cache
  std::int64_t batch_ = 0, heads_ = 0, head_dim_ = 0, n_rows_ = 0, n_new_ = 0;
};

// Attention probabilities the engine computed for the rows of the current step:
// [B, Hq, S, R] contiguous fp32, where S = view.n_new() (one query per new token) and
// R = view.n_rows(). Query head q belongs to KV head q / (Hq / Hkv). Entries the causal mask
// hid must be 0. Column r is row r of the query head's KV head; a KV head with fewer rows than R
// (head-wise budgets) has 0 in the columns from its own n_rows on.
// data may be null where the cache does not read them (LayerCache::reads_attention() false):
// the shape fields still describe the step; a consumer must test data before reading.
struct AttentionRef {
  const float* data = nullptr;
  std::int64_t batch = 0, n_query_heads = 0, n_queries = 0, n_rows = 0;
};

// The layer's rotary position embedding, as a cache needs it to move a query to another
// position (LayerCache::set_rope; expected_attention rotates its query statistics to the
// future positions): pair i of a head (i < head_dim / 2) turns by the angle pos x inv_freq[i],
// inv_freq as the engine applies it (theta^(-2i/D) after any scaling: Llama 3's frequency
// factors, linear scaling). `pairing` says which two elements form pair i: (2i, 2i + 1)
// (interleaved: llama2.c, GGUF) or (i, i + D/2) (half-split: Hugging Face, NeoX). Pair i maps
// (a, b) to (a cos - b sin, a sin + b cos). n_pairs = 0 (inv_freq null) says the layer applies
// no rotary embedding. Copied by set_rope.
enum class RopePairing : std::uint8_t { kInterleaved, kHalfSplit };
struct RopeRef {
  const float* inv_freq = nullptr;  // [n_pairs], finite and >= 0
  std::int64_t n_pairs = 0;         // head_dim / 2, or 0: no rotary embedding
  RopePairing pairing = RopePairing::kInterleaved;
};

// An owning fp32 copy of a step's rows: keys/values [B, Hkv, R, D], positions [B, Hkv, R],
// R = the view's n_rows(). A head with fewer rows (head-wise budgets) has zero keys and values
// and position -1 beyond its own rows.
struct KVRows {
  std::int64_t batch = 0, n_kv_heads = 0, n_rows = 0, head_dim = 0;
  std::vector<float> keys, values;
  std::vector<std::int32_t> positions;

  const float* key(std::int64_t b, std::int64_t h, std::int64_t r) const noexcept {
    return keys.data() + ((b * n_kv_heads + h) * n_rows + r) * head_dim;
  }
  const float* value(std::int64_t b, std::int64_t h, std::int64_t r) const noexcept {
    return values.data() + ((b * n_kv_heads + h) * n_rows + r) * head_dim;
  }
  std::int32_t position(std::int64_t b, std::int64_t h, std::int64_t r) const noexcept {
    return positions[(b * n_kv_heads + h) * n_rows + r];
  }
};

struct CacheStats {
  std::int64_t tokens_seen = 0;  // token positions passed in so far (per sequence)
  std::int64_t tokens_kept = 0;  // rows stored for (b=0, h=0), as the reference library reports
  std::vector<std::int64_t> tokens_kept_per_head;  // [B * Hkv]
  std::int64_t kept_bytes = 0;       // payload held now: K/V rows, or codes + scales + zeros +
                                     // unquantized rows
  std::int64_t full_bytes = 0;       // fp16 K+V cost of every token seen, all heads
  double compression_ratio = 1.0;    // full_bytes / kept_bytes (1 when both are 0)
  std::int64_t allocated_bytes = 0;  // capacity reserved for the payload (>= kept_bytes)
  // Every byte kept between steps, by container capacity: the payload's capacity, positions,
  // per-row bookkeeping (quantized slots, key groups), per-row policy state (scores, noise,
  // attention history) and the per-head tables (head states, RNGs, the step view's rows).
  // The stores' and policy's fixed-size objects and the policy's step scratch are not counted.
  std::int64_t resident_bytes = 0;
  std::int64_t evictions = 0;        // rows removed since reset, all heads (merged or dropped)
  std::int64_t merges = 0;           // of those, rows merged into a survivor
  // Rows held now in the low-bit tier of demote= (mixed precision), all heads; they are among
  // the rows counted by tokens_kept and their codes, scales and zeros are in kept_bytes.
  std::int64_t demoted_rows = 0;
  // The score source that ran: "none" (the method uses no attention), "proxy", "attention",
  // "auto" (source=auto, no step yet); a ModelCache whose layers differ: "mixed".
  const char* score_source = "none";
  // Head types (duoattention; 0 for other methods and before a layer has typed its heads): the
  // (b, kv head) stores that keep every row (retrieval heads) and those that keep sinks + a
  // window (streaming heads), with their payload (parts of kept_bytes). Summed over layers.
  std::int64_t retrieval_heads = 0;
  std::int64_t retrieval_bytes = 0;
  std::int64_t streaming_heads = 0;
  std::int64_t streaming_bytes = 0;
  // The value norm of a method that weighs values by the output projection (criticalkv):
  // "projected" (||W_o^g v||_2 from LayerCache::set_output_gram), "plain" (||v||_2: no Gram
  // matrices were given), "none" (the method reads none); a ModelCache whose layers differ:
  // "mixed".
  const char* value_norm = "none";
};

}  // namespace vq
