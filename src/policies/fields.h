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

// The shared option groups. A method declares none of them: add_shared_options gives a method
// the groups that apply to it (MethodInfo::fields says which), each field tagged with its
// group (FieldSpec::group).
//
// Appends to m.fields, in this order, the groups that apply to m: merge, schedule, source, headwise,
// demote and quantize, common; then sets the defaults m.shared_defaults names. Called for every
// method when the registry takes it (the library's table and register_method). Throws
// Error(kInvalidArgument) "register_method('id'): ..." when shared_defaults is malformed, names
// no shared field of m or a value the field does not allow.
void add_shared_options(MethodInfo& m);

// seed and kv_dtype: every method has them.
void add_common_fields(std::vector<FieldSpec>& fields);
// merge (drop), merge_gate, merge_keys, merge_target (nearest), merge_m, merge_attention
// (cumulative): every method that evicts (has a token budget). A non-empty prefix adds the names
// the fields had when each method declared them as aliases (<prefix>_merge, <prefix>_merge_gate,
// <prefix>_merge_keys, <prefix>_target, <prefix>_merge_m, <prefix>_merge_attention), and
// merge_target answers to `target` too.
void add_merge_fields(std::vector<FieldSpec>& fields, const std::string& prefix);

// compress_interval (1: evict every token): methods on the shared token loop with a token
// budget (MethodInfo::token_loop).
void add_schedule_fields(std::vector<FieldSpec>& fields);

// source (proxy | attention) and gqa_reduce (mean | max | sum): attention-scored methods.
void add_source_fields(std::vector<FieldSpec>& fields);
// headwise (off by default) and headwise_floor (AdaKV's alpha, 0.2): head-wise budgets
// (policies/headwise.h), for the attention-scored methods that rank each head's rows.
void add_headwise_fields(std::vector<FieldSpec>& fields);
// quantize, kivi_group_size, residual_length (after the demote fields): every method but kivi
// (which has its own).
void add_quantize_fields(std::vector<FieldSpec>& fields);
// demote (none | kivi2 | kivi4), demote_budget, demote_group: mixed precision (mixed_store.cpp),
// added with the quantize fields.
void add_demote_fields(std::vector<FieldSpec>& fields);
// Guards: demote needs a token budget, excludes quantize= and a merge disposition; with
// demote=none, demote_budget and demote_group have no effect. Called by CacheConfig::validate().
void check_demote(const CacheConfig& config);
// The think group (ThinK's key-channel pruning, every method whose rows are not packed by the
// method itself): think (the share of key channels pruned at prefill) and think_window.
void add_think_fields(std::vector<FieldSpec>& fields);
// think > 0: exclusive with quantize=, demote= and kv_dtype=q8_0|q4_0 (each packs rows its own
// way), think < 1 (a key keeps at least one channel); think_window set with think=0 has no
// effect.
void check_think(const CacheConfig& config);
// Key channels kept of head_dim D at pruning share r: D - floor(r D) (floor taken with a 1e-9
// slack, so 0.29 x 100 prunes 29 channels, not 28).
std::int64_t think_kept_channels(double ratio, std::int64_t head_dim);
// kv_dtype=q8_0|q4_0 packs every row itself: exclusive with kivi, quantize= and demote=.
void check_kv_dtype(const CacheConfig& config);
// The recent window (newest rows protected from eviction): <prefix>_<grace_name>, default -1 =
// derived from the budget, and <prefix>_recent_ratio (its share when derived):
//   window = floor(recent_ratio * (budget - n_sink - reserve + 1))
// where reserve is what else must fit: 1 (the row an eviction needs), or the value of
// reserve_field (chunkkv: chunk_size). A derived window always satisfies
// n_sink + window + reserve <= budget when recent_ratio < 1.
void add_recent_fields(std::vector<FieldSpec>& fields, const std::string& prefix,
                       const std::string& grace_name, double ratio, const std::string& ratio_doc);
// The window in force: the explicit <prefix>_<grace_name> if >= 0, else the derived one. Reads
// <prefix>_budget and <prefix>_n_sink.
std::int64_t recent_window(const CacheConfig& config, const std::string& prefix,
                           const std::string& grace_name = "grace",
                           const std::string& reserve_field = "");
// Guards: an explicit recent_ratio beside an explicit window is an error (no effect), and
// n_sink + window + reserve <= budget, the message naming the derivation when derived.
void check_recent_window(const CacheConfig& config, const std::string& prefix,
                         const std::string& grace_name = "grace",
                         const std::string& reserve_field = "");
// H2O's cumulative-mass fields, shared by every method built on it (h2o, pyramidkv, squeeze,
// chunkkv, cam): <prefix>_grace = -1 with <prefix>_recent_ratio = 0.5 (H2O's equal split of the
// budget between recent rows and heavy hitters) and <prefix>_decay = 0.98 (the reference
// library's; 1 is the paper's, see methods.md and the README).
void add_mass_fields(std::vector<FieldSpec>& fields, const std::string& prefix);

// Nothing silently ignored (README "Method specs"): the merge, score-source and head-wise fields
// of a method, when set explicitly in a combination where they have no effect, are errors naming
// both fields. Called by CacheConfig::validate() for every method after its own guards.
void check_no_effect(const CacheConfig& config);

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
