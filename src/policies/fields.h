// Helpers for method definitions: field specs, the common field groups, guard messages.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "veloxquant/config.h"
#include "veloxquant/registry.h"

namespace vq::detail {

// Largest token budget / window a config accepts (2^24 rows per head).
inline constexpr std::int64_t kMaxTokens = 16777216;

FieldSpec int_field(std::string name, std::int64_t def, std::int64_t min, std::int64_t max,
                    std::string doc);
FieldSpec float_field(std::string name, double def, double min, double max, std::string doc);
FieldSpec bool_field(std::string name, bool def, std::string doc);
FieldSpec enum_field(std::string name, std::string def, std::vector<std::string> choices,
                     std::string doc);

// seed and kv_dtype: every method has them.
void add_common_fields(std::vector<FieldSpec>& fields);
// <prefix>_merge, <prefix>_merge_gate, <prefix>_merge_keys: every eviction method has them.
void add_merge_fields(std::vector<FieldSpec>& fields, const std::string& prefix,
                      const std::string& default_mode);

// source (proxy | attention) and gqa_reduce (mean | max | sum): attention-scored methods.
void add_source_fields(std::vector<FieldSpec>& fields);
// quantize, kivi_group_size, residual_length: every method but kivi (which has its own).
void add_quantize_fields(std::vector<FieldSpec>& fields);
// <prefix>_grace (newest rows protected) and <prefix>_decay (score <- score * decay + attention)
// for methods built on H2O's cumulative mass; defaults are the paper's rule (0, 1).
void add_mass_fields(std::vector<FieldSpec>& fields, const std::string& prefix);

// Throws Error(kInvalidConfig) "[method] message".
[[noreturn]] void config_error(const CacheConfig& config, const std::string& message);
// Guard `a < b` (a, b field names): "[h2o] h2o_n_sink must be < h2o_budget (64), got 64".
void require_less(const CacheConfig& config, std::string_view a, std::string_view b);
// Guard `a + b < c`.
void require_sum_less(const CacheConfig& config, std::string_view a, std::string_view b,
                      std::string_view c);
// Guard `a <= b`.
void require_at_most(const CacheConfig& config, std::string_view a, std::string_view b);

}  // namespace vq::detail
