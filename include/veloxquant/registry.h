// The method registry: one entry per method id, in a fixed order. The CLI (`veloxquant list`,
// `veloxquant list --ids`), the conformance tests, the sweep scripts, the fuzz dictionary and
// the README table all read this table, so adding a method to the library is: its file under
// src/policies/methods/, one line in src/policies/registry.cpp, its hand-derived test. A
// program can also register a method of its own at run time (register_method below; a complete
// example is examples/custom_method.cpp, and docs/adding-a-method.md says how both ways work).
#pragma once

#include <cstdint>
#include <functional>
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
  // The method's own fields. register_method (and the library's table) appends the shared
  // option groups that apply to the method, a method declaring none of them (FieldSpec::group):
  //   merge (merge, merge_gate, merge_keys, merge_target, merge_m, merge_attention; aliases
  //     <prefix>_merge, ..., target): a method with a token budget (it evicts);
  //   source (source, gqa_reduce): scores_attention;
  //   headwise (headwise, headwise_floor): scores_attention and exact_budget (it evicts row by
  //     row, so one ranking across heads can choose the rows);
  //   demote (demote, demote_budget, demote_group) and quantize (quantize, kivi_group_size,
  //     residual_length): unless quantizes_rows;
  //   schedule (compress_interval): token_loop and a token budget;
  //   common (seed, kv_dtype): every method.
  std::vector<FieldSpec> fields;
  // Whether the method ranks rows by the attention the engine passes (or its proxy): it gets
  // the score source and head-wise groups above.
  bool scores_attention = false;
  // Whether the method stores its rows quantized its own way (kivi): no quantize / demote group.
  bool quantizes_rows = false;
  // Defaults of shared options that differ for this method, as spec items "KEY=VALUE,..."
  // (cam: "merge=mean,merge_target=window,merge_attention=current"); applied by the registry
  // when it adds the groups.
  std::string shared_defaults;

  // Cross-field guards; throws Error(kInvalidConfig). Ranges are checked before this runs.
  void (*check)(const CacheConfig& config) = nullptr;
  // The token budget (rows kept per KV head per layer, sinks included), as data: the int field
  // that holds it ("h2o_budget"), plus, when budget_offset names a field, that field's value
  // (streaming_llm: budget = stream_n_sink + stream_window_size; `budget=B` then sets the
  // window to B - stream_n_sink, after the spec's other keys). Both empty for methods without a
  // token budget (full, kivi). Read and set through token_budget() / with_token_budget().
  std::string budget_field;
  std::string budget_offset;
  // Whether the stored rows are exactly min(tokens seen, budget) after every step. False for
  // methods that evict in groups (chunkkv keeps between budget - chunk_size + 1 and budget).
  bool exact_budget = true;
  // Whether the method evicts only on multi-token steps (prefill; snapkv): single-token steps
  // append without eviction, and a chunk is not equivalent to its tokens fed one at a time.
  bool prefill_only = false;
  // Whether the method types its KV heads (duoattention): some heads keep every row (retrieval
  // heads), the others the token budget; LayerCache::head_types() and CacheStats report them.
  bool head_types = false;
  // Whether the method decides on the shared token loop (the policies of this library that
  // keep TokenPolicy::end_step, and every scored_method): it gets the schedule group,
  // compress_interval (evict every N tokens instead of every token).
  bool token_loop = false;
  // Whether each layer keeps either every row or only a window: the budget_offset field's
  // leading rows and the newest (budget - offset) rows (simlayerkv: lazy layers keep the window,
  // the others every row).
  bool all_or_window = false;
  // Makes the per-layer policy (methods of the library). Called by LayerCache with a config
  // that was validated where it entered (CacheConfig::parse / validate).
  std::unique_ptr<detail::Policy> (*make_policy)(const detail::PolicyContext& context) = nullptr;
  // A method scored row by row on the shared eviction loop (what register_method takes from
  // outside the library): makes one layer's scorer from its config. Null for other methods.
  std::function<std::function<float(const float* key, const float* value, std::int64_t head_dim)>(
      const CacheConfig& config)>
      make_scorer;
};

// Scores a row when it arrives at a head (key and value as stored, in fp32, [head_dim] each);
// over budget, the row with the lowest score leaves (ties to the oldest), the first
// <prefix>_n_sink rows never do. The score is kept: it is the row's score for good.
// A step scores all of its new rows (every head, in order) before it decides anything, so a
// scorer that throws leaves the cache as it was before the step's begin_step: end_step throws
// Error(kInvalidArgument) "[ID] the scorer threw: <its what()>" (std::bad_alloc stays itself),
// the step's rows are forgotten, and the next step runs as if it had never been given.
// make_scorer may throw too (the cache's constructor then throws, wrapped the same way) and
// must not return an empty RowScorer (Error(kInvalidArgument) at construction).
using RowScorer = std::function<float(const float* key, const float* value, std::int64_t head_dim)>;

// The entry of a method scored row by row on the shared eviction loop, ready to register: id,
// prefix (non-empty; spec keys may drop it), one-line summary, and make_scorer, called once per
// layer cache with the validated config (read your own fields there). It comes with the fields
// <prefix>_budget (default_budget) and <prefix>_n_sink (4) and the guard n_sink < budget;
// register_method adds the shared options (the merge rule, quantize / demote, seed, kv_dtype:
// MethodInfo::fields). Add fields of your own to `fields` and a `check` for their cross-field
// guards; fill the descriptive strings for `veloxquant list`.
VQ_API MethodInfo scored_method(std::string id, std::string prefix, std::string summary,
                                std::function<RowScorer(const CacheConfig& config)> make_scorer,
                                std::int64_t default_budget = 512);

// Adds `info` to the registry, after the methods already there, with the shared option groups
// that apply to it (MethodInfo::fields), and returns the stored entry. Everything is checked
// here, so a method that registers is one every cache can run; throws Error(kInvalidArgument)
// "register_method('ID'): ..." (nothing registered) when
//  - the id is empty, not [a-z0-9_], or already registered;
//  - the prefix is not a lower-case letter followed by [a-z0-9_] (or ends in '_'), or is empty
//    for a method with a token budget or a scorer;
//  - neither make_policy nor make_scorer is set, or the method runs on the scored policy
//    (scored_method, make_policy null) without a make_scorer;
//  - a field's name or alias is not a key (a lower-case letter, then [a-z0-9_]), a field of the
//    method's own sets `group`, an int/float range is NaN or has min > max, an enum has no
//    choices, a choice twice or one the spec cannot carry (empty, spaces, ',' or '='), a
//    default is outside what the field allows, or a summary or doc is not one printable line;
//  - two fields share a name or alias (a field of the method's own named like a shared option),
//    or a field <prefix>_x has a short key x that already names another field;
//  - shared_defaults names no shared field or a value it does not allow, or budget_field /
//    budget_offset names no int field.
// Register at start-up, before any other thread reads the registry (registry() references are
// invalidated by a registration; CacheConfig objects and find_method() references stay valid).
VQ_API const MethodInfo& register_method(MethodInfo info);

// All registered methods, in registry order.
VQ_API const std::vector<MethodInfo>& registry();
// Throws Error(kUnknownMethod) "unknown method 'x'; known methods: full, streaming_llm, ...".
VQ_API const MethodInfo& find_method(std::string_view id);
VQ_API std::vector<std::string> method_ids();

// Token budget helpers over MethodInfo::budget_field / budget_offset.
VQ_API bool has_token_budget(const CacheConfig& config);
VQ_API std::int64_t token_budget(const CacheConfig& config);  // throws if the method has none
// Returns a copy with the budget set and validated; throws Error(kInvalidConfig) if the
// method has no budget or the result is inconsistent (e.g. budget <= n_sink).
VQ_API CacheConfig with_token_budget(const CacheConfig& config, std::int64_t budget);

// The README's method table (markdown), generated from the registry.
VQ_API std::string method_table_markdown();

}  // namespace vq
