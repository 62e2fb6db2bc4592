// The method registry: one entry per method id, in a fixed order. The CLI (`veloxquant list`),
// the conformance tests, the benchmarks and the README table all read this table, so adding a
// method is: its policy file, one line in src/policies/registry.cpp, its test file.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "veloxquant/config.h"

namespace vq {

struct LayerShape;
namespace detail {
class Policy;
struct PolicyContext;
}

struct MethodInfo {
  std::string id;       // public, stable, lower-case (a contract: never renamed)
  std::string prefix;   // field-name prefix ("cam" for cam_budget); may be empty
  std::string summary;  // one line for `veloxquant list`
  std::string paper;    // the paper it implements or adapts
  // README table columns.
  std::string disposition;   // drop / merge / quantize
  std::string score_signal;  // what ranks tokens
  std::string budget_type;   // uniform / none / ...
  std::string deviations;    // plain statement of where it departs from the paper
  // The paper's own configuration as a spec string (README column "paper configuration"),
  // followed by a short note where the spec cannot express all of it; "-" when not applicable.
  std::string paper_config;
  // Why the defaults are what they are (one or two sentences; `veloxquant list ID`).
  std::string defaults_note;
  std::vector<FieldSpec> fields;

  // Cross-field guards; throws Error(kInvalidConfig). Ranges are checked before this runs.
  void (*check)(const CacheConfig& config) = nullptr;
  // Token budget (rows kept per KV head per layer, sinks included): get, and set (used by
  // sweeps such as `eval --budget`). Both null for methods without a token budget (full).
  std::int64_t (*get_budget)(const CacheConfig& config) = nullptr;
  void (*set_budget)(CacheConfig& config, std::int64_t budget) = nullptr;
  // For a method whose budget is not a `<prefix>_budget` field (streaming_llm): the field
  // `budget=` sets through set_budget ("stream_window_size") and the rule ("budget =
  // stream_n_sink + stream_window_size", shown by `veloxquant list`). Empty otherwise.
  std::string budget_field;
  std::string budget_rule;
  // Whether the stored rows are exactly min(tokens seen, budget) after every step. False for
  // methods that evict in groups (chunkkv keeps between budget - chunk_size + 1 and budget).
  bool exact_budget = true;
  // Whether the method evicts only on multi-token steps (prefill; snapkv): single-token steps
  // append without eviction, and a chunk is not equivalent to its tokens fed one at a time.
  bool prefill_only = false;
  // Makes the per-layer policy. Called by LayerCache after validate().
  std::unique_ptr<detail::Policy> (*make_policy)(const detail::PolicyContext& context) = nullptr;
};

// All registered methods, in registry order.
VQ_API const std::vector<MethodInfo>& registry();
// Throws Error(kUnknownMethod) "unknown method 'x'; known methods: full, streaming_llm, ...".
VQ_API const MethodInfo& find_method(std::string_view id);
VQ_API std::vector<std::string> method_ids();

// Token budget helpers over MethodInfo::get_budget / set_budget.
VQ_API bool has_token_budget(const CacheConfig& config);
VQ_API std::int64_t token_budget(const CacheConfig& config);  // throws if the method has none
// Returns a copy with the budget set and validated; throws Error(kInvalidConfig) if the
// method has no budget or the result is inconsistent (e.g. budget <= n_sink).
VQ_API CacheConfig with_token_budget(const CacheConfig& config, std::int64_t budget);

// The README's method table (markdown), generated from the registry.
VQ_API std::string method_table_markdown();

}  // namespace vq
