// Row storage for one (batch, kv head): keys, values and true positions, in order.
// Policies decide; only the cache (through this interface) mutates storage. The stores know no
// method: which store a config gets is chosen by the methods layer (policies/storage.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "base/state_io.h"
#include "veloxquant/rows.h"
#include "veloxquant/types.h"

namespace vq::detail {

// The rows of a packing store: read through `packed` (keys and values null, fp32 when read).
inline HeadRows packed_rows(const PackedRows* packed, const std::int32_t* positions,
                            std::int64_t n_rows, std::int64_t head_dim) noexcept {
  return HeadRows{nullptr, nullptr, positions, DType::kF32, n_rows, head_dim, packed};
}

class RowStore {
 public:
  virtual ~RowStore() = default;
  virtual std::int64_t size() const noexcept = 0;
  // A hint: the store is expected to hold at most `n` rows (0: unknown). A store that grows its
  // containers in steps (store/growth.h) never grows them past n rows while its rows fit in n,
  // so fed exactly n rows it holds no slack; more rows still fit (it grows on in its unhinted
  // steps). Stores that ignore it: the default.
  virtual void expect_rows(std::int64_t /*n*/) noexcept {}
  // Appends the S = k.tokens() rows of (b, h), with positions first_pos, first_pos + 1, ...
  virtual void append(const TensorRef& k, const TensorRef& v, std::int64_t b, std::int64_t h,
                      std::int32_t first_pos) = 0;
  // All rows in physical order, readable until the next mutating call (packed rows: through
  // HeadRows::packed, dequantized on the fly).
  virtual HeadRows rows() const noexcept = 0;
  virtual void read_key(std::int64_t i, float* out) const noexcept = 0;
  virtual void read_value(std::int64_t i, float* out) const noexcept = 0;
  virtual void write_key(std::int64_t i, const float* in) noexcept = 0;
  virtual void write_value(std::int64_t i, const float* in) noexcept = 0;
  virtual void set_position(std::int64_t i, std::int32_t pos) noexcept = 0;
  // Keeps rows idx[0..n) (strictly increasing physical indices), in that order.
  virtual void keep(const std::int64_t* idx, std::int64_t n) = 0;
  // Called by the eviction loop after each token's decisions with the rows still alive (in
  // order). Physical indices stay valid. Quantizing stores quantize here (so a chunk of tokens
  // sees the same values as tokens fed one at a time); plain stores do nothing.
  virtual void settle(const std::int64_t* /*live*/, std::int64_t /*n*/) {}
  // Whether settle() does anything (plain stores: no).
  virtual bool quantizing() const noexcept { return false; }

  // Mixed precision (demote=, see mixed_store.cpp). A demoting store holds, between steps, the
  // method's rows followed by n_demoted() low-bit rows (the method's live rows are the first
  // size() - n_demoted() of the stored rows, and a step's new rows follow the demoted ones).
  // demote(i, score) moves fp16 row i to the low-bit tier at the next keep() instead of
  // dropping it (the caller removes it from its live rows as for an eviction); `score` is the
  // method's score for it, which ranks the tier when it overflows its cap.
  virtual bool demotes() const noexcept { return false; }
  virtual void demote(std::int64_t /*i*/, float /*score*/) {}
  virtual std::int64_t n_demoted() const noexcept { return 0; }
  // The score demoted row k (0 = the first demoted row) was demoted with.
  virtual float demoted_score(std::int64_t /*k*/) const noexcept { return 0.0f; }
  // Rows the store dropped on its own since clear() (a demoting store: its tier's overflow).
  virtual std::int64_t dropped() const noexcept { return 0; }
  // Key-channel pruning (think=, ThinK; store/think_store.cpp). A pruning store can hold rows
  // whose keys keep only some channels: prune_keys(channels, n_channels, n_rows) makes rows
  // [0, n_rows) hold only `channels` (strictly increasing channel indices, one set per store,
  // fixed by the first call; a later call gives the same set and extends the pruned rows, which
  // always are the first rows held); a pruned key reads as the key with its other channels
  // zero. Other stores do not prune (prune_keys is never called on them).
  virtual bool prunes_keys() const noexcept { return false; }
  virtual void prune_keys(const std::int32_t* /*channels*/, std::int64_t /*n_channels*/,
                          std::int64_t /*n_rows*/) {}
  // The rows whose keys are pruned (the first ones), and the store's kept channels (empty
  // before any pruning).
  virtual std::int64_t n_pruned_rows() const noexcept { return 0; }
  virtual std::vector<std::int32_t> kept_channels() const { return {}; }
  // settle() then keep() with every row alive (a policy that keeps all rows). The default builds
  // the row list; a store may do it without one, so the step costs nothing per row held.
  virtual void settle_keep_all();
  virtual void clear() noexcept = 0;
  // Saves (io writing) or restores (io reading) every row the store holds, exactly as held
  // (codes, scales, tails, pruned channels, demoted tier), between steps. Reading validates
  // every count against the store's layout and throws StateCorrupt; the store is then
  // discarded by the caller (a fresh one is read into). Positions are checked to lie in
  // [0, `max_pos`) (the tokens the layer has seen). Capacities are not saved: a restored store
  // holds its rows without slack (resident_bytes may be lower; everything else is equal).
  virtual void state(StateIO& io, std::int64_t max_pos) = 0;
  // Payload bytes held now: K + V rows, or codes + scales + zeros + unquantized rows.
  virtual std::int64_t bytes() const noexcept = 0;
  // Bytes reserved for the payload (capacities of its containers, >= bytes()).
  virtual std::int64_t allocated_bytes() const noexcept = 0;
  // Every byte the store keeps between steps, by container capacity: the payload plus the
  // positions and any per-row bookkeeping (>= allocated_bytes()). No store keeps a copy of its
  // rows besides the payload.
  virtual std::int64_t resident_bytes() const noexcept = 0;
};

// Plain rows of `storage` dtype (fp16 or fp32).
std::unique_ptr<RowStore> make_plain_store(DType storage, std::int64_t head_dim);

// KIVI: keys quantized per channel in groups of `group_size` tokens, values per token in
// groups of `group_size` channels, asymmetric `bits`-bit codes (2 or 4) packed into bytes, the
// newest rows kept unquantized in `tail` dtype (see kivi_store.cpp).
std::unique_ptr<RowStore> make_kivi_store(int bits, std::int64_t group_size,
                                          std::int64_t residual_length, DType tail,
                                          std::int64_t head_dim);

// Mixed precision: rows in `fp16_dtype` (kv_dtype) plus a tier of at most `cap` demoted rows
// quantized per token to `bits` (2 or 4) in groups of `group_size` channels (see
// mixed_store.cpp).
std::unique_ptr<RowStore> make_mixed_store(int bits, std::int64_t group_size, std::int64_t cap,
                                           DType fp16_dtype, std::int64_t head_dim);

// ThinK's pruned keys (think=): plain rows of `storage` dtype (fp16 or fp32) whose first rows may
// hold only a set of key channels once pruned (RowStore::prune_keys; see think_store.cpp). Read
// through PackedRows.
std::unique_ptr<RowStore> make_pruned_key_store(DType storage, std::int64_t head_dim);

// ggml's q8_0 / q4_0 KV types (kv_dtype=q8_0|q4_0): every row quantized per token in blocks of
// 32 channels with an fp16 scale (see block_store.cpp). head_dim must be a multiple of 32
// (Error kInvalidConfig otherwise).
std::unique_ptr<RowStore> make_block_store(bool q4_0, std::int64_t head_dim);

}  // namespace vq::detail
