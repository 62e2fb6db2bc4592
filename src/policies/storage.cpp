#include "policies/storage.h"

#include <string>

#include "veloxquant/registry.h"

namespace vq::detail {

std::int64_t demote_cap(const CacheConfig& config) {
  const std::int64_t cap = config.get_int("demote_budget");
  return cap >= 0 ? cap : token_budget(config);
}

std::unique_ptr<RowStore> make_store(const CacheConfig& config, std::int64_t head_dim) {
  int bits = 0;
  if (config.method() == "kivi") {
    bits = static_cast<int>(config.get_int("bit_width_inlier"));
  } else if (config.has("quantize")) {
    const std::string& q = config.get_enum("quantize");
    bits = q == "kivi2" ? 2 : q == "kivi4" ? 4 : 0;
  }
  if (bits == 0 && config.has("demote") && config.get_enum("demote") != "none") {
    return make_mixed_store(config.get_enum("demote") == "kivi2" ? 2 : 4,
                            config.get_int("demote_group"), demote_cap(config), config.kv_dtype(),
                            head_dim);
  }
  if (bits == 0 && config.has("think") && config.get_float("think") > 0.0) {
    // think= is exclusive with the other packings (check_think): plain rows of kv_dtype.
    return make_pruned_key_store(config.kv_dtype(), head_dim);
  }
  if (bits == 0) {
    const std::string& t = config.get_enum("kv_dtype");
    if (t == "q8_0" || t == "q4_0") return make_block_store(t == "q4_0", head_dim);
    return make_plain_store(config.kv_dtype(), head_dim);
  }
  return make_kivi_store(bits, config.get_int("kivi_group_size"), config.get_int("residual_length"),
                         config.kv_dtype(), head_dim);
}

}  // namespace vq::detail
