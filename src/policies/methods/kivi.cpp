// kivi: every token kept, stored KIVI-quantized (2 or 4 bits, really packed); `full` with
// quantize=kivi<bits>.
//
// Paper: Liu et al., "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache",
// ICML 2024.
//
// Storage (src/store/kivi_store.cpp): keys per channel in groups of kivi_group_size tokens,
// values per token in groups of kivi_group_size channels, asymmetric uniform codes packed into
// bytes, fp16 scale and zero per group (as KIVI's kernels; scale floor 2^-14, fp16's smallest
// normal), the newest rows in kv_dtype: values of residual_length rows (each quantized as it
// leaves), keys of residual_length to residual_length + G - 1 rows (quantized a group at a
// time). kept_bytes counts codes + scales + zeros + tail; nothing else is held (no dequantized
// copy: readers dequantize on the fly, see PackedRows in cache.h).
//
// Fields: bit_width_inlier=2 (2 or 4), kivi_group_size=32, residual_length=128, seed,
// kv_dtype (the tail's storage).
// Deviations from the paper: scale and zero are rounded outward to fp16 (down / up) rather
// than to nearest; no outlier handling.
#include "policies/fields.h"
#include "policies/methods.h"
#include "policies/policy.h"

namespace vq::detail {

// The registry entry (methods.h, method_card): what `veloxquant list` and the README table
// show, the field table and the shared field groups.
constexpr std::string_view kCard = R"(
id: kivi
prefix: kivi
summary: KIVI: keeps every token, quantized to 2 (or 4) bits, keys per channel and values per
  token
paper: Liu et al., KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache, ICML 2024
disposition: quantize
score: none
budget: none (all tokens, fewer bits)
deviations: fp16 scale/zero rounded outward; no outlier handling
paper config: `kivi:bit_width_inlier=2,kivi_group_size=32,residual_length=128` (the defaults)
| bit_width_inlier | int | 2 | {2, 4} in [2, 4] | code width: 2 or 4 bits
| kivi_group_size | int | 32 | [1, 4096] | G tokens per key channel group, G channels per value
  group
| residual_length | int | 128 | [0, 16777216] | newest rows kept unquantized (values of residual
  rows, keys of residual to residual + G - 1)
quantizes rows: yes
)";

namespace {

void check(const CacheConfig& c) {
  const std::int64_t b = c.get_int("bit_width_inlier");
  if (b != 2 && b != 4) config_error(c, "bit_width_inlier must be 2 or 4, got " + std::to_string(b));
}

}  // namespace

MethodInfo kivi_method() { return method_card(kCard, &check, &make_keep_all_policy); }

}  // namespace vq::detail
