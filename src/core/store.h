// Row storage for one (batch, kv head): keys, values and true positions, in order.
// Policies decide; only the cache (through this interface) mutates storage.
#pragma once

#include <cstdint>
#include <memory>

#include "veloxquant/config.h"
#include "veloxquant/types.h"

namespace vq::detail {

// Direct read access to the rows: keys/values are [n_rows][stride] elements of dtype.
struct RowsRef {
  const void* keys = nullptr;
  const void* values = nullptr;
  const std::int32_t* positions = nullptr;
  DType dtype = DType::kF16;
  std::int64_t n_rows = 0;
  std::int64_t stride = 0;

  const void* key(std::int64_t i) const noexcept {
    return static_cast<const char*>(keys) + i * stride * static_cast<std::int64_t>(dtype_size(dtype));
  }
  const void* value(std::int64_t i) const noexcept {
    return static_cast<const char*>(values) +
           i * stride * static_cast<std::int64_t>(dtype_size(dtype));
  }
};

class RowStore {
 public:
  virtual ~RowStore() = default;
  virtual std::int64_t size() const noexcept = 0;
  // Appends the S = k.tokens() rows of (b, h), with positions first_pos, first_pos + 1, ...
  virtual void append(const TensorRef& k, const TensorRef& v, std::int64_t b, std::int64_t h,
                      std::int32_t first_pos) = 0;
  // All rows in physical order, readable until the next mutating call.
  virtual RowsRef rows() const noexcept = 0;
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
  virtual void clear() noexcept = 0;
  // Payload bytes held now (K + V, plus quantization metadata where there is some).
  virtual std::int64_t bytes() const noexcept = 0;
  // Bytes reserved for the payload (>= bytes()).
  virtual std::int64_t allocated_bytes() const noexcept = 0;
  // Scratch held besides the payload (a quantizing store's dequantized fp32 rows for the
  // attention view); 0 for plain stores, whose rows are read in place.
  virtual std::int64_t workspace_bytes() const noexcept { return 0; }
};

// Plain rows of `storage` dtype (fp16 or fp32).
std::unique_ptr<RowStore> make_plain_store(DType storage, std::int64_t head_dim);

// KIVI: keys quantized per channel in groups of `group_size` tokens, values per token in
// groups of `group_size` channels, asymmetric `bits`-bit codes (2 or 4) packed into bytes, the
// newest rows kept unquantized in `tail` dtype (see kivi_store.cpp).
std::unique_ptr<RowStore> make_kivi_store(int bits, std::int64_t group_size,
                                          std::int64_t residual_length, DType tail,
                                          std::int64_t head_dim);

// The store a config asks for: KIVI when the method is kivi or quantize != none, plain rows
// of kv_dtype otherwise.
std::unique_ptr<RowStore> make_store(const CacheConfig& config, std::int64_t head_dim);

}  // namespace vq::detail
