// What method files share besides the field helpers (policies/fields.h): the policies and
// guards that several methods (or a whole family) use, parameterised by the method's registry
// entry (its prefix), so a method file holds no factory or guard of its own when it needs none.
// The list of methods is src/policies/registry.cpp (one line per method).
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "veloxquant/registry.h"

namespace vq::detail {

class Policy;
struct PolicyContext;
// A method's registry entry from its card, the declarative text in the method's file, one
// `key: value` a line (a line starting with a space continues the one above):
//   id, prefix ("-": none), summary, paper, disposition, score, budget (the budget column),
//   deviations, paper config, defaults: the strings `veloxquant list` and the README show;
//   budget field / budget offset: the token budget (MethodInfo::budget_field, budget_offset;
//     budget field defaults to <prefix>_budget when the method has that int field);
//   exact budget: no / prefill only: yes (MethodInfo::exact_budget, prefill_only);
//   head types: yes (MethodInfo::head_types: retrieval heads keep every row, duoattention);
//   token loop: yes (MethodInfo::token_loop: the policy keeps TokenPolicy::end_step, so the
//     registry adds the schedule group, compress_interval);
//   attention: yes (MethodInfo::scores_attention) / quantizes rows: yes (quantizes_rows): what
//     decides, with the budget, which shared option groups the registry adds;
//   shared defaults: KEY=VALUE,... (MethodInfo::shared_defaults: cam's merge rule);
//   | name | type | default | range | doc   one row a field of the method's own, in order:
//     type int, float, bool or enum; range [min, max] (int, float), {a, b, ...} (enum), "-"
//     (bool), or {2, 4} in [2, 4] for an int that takes only the values listed;
//   groups: mass: H2O's recent window and decay (fields.h, add_mass_fields), after the rows.
// A card declares no shared option (merge, source, headwise, demote, quantize, seed, kv_dtype):
// the registry adds the groups that apply (fields.h, add_shared_options).
// `check` (may be null) and `make_policy` complete the entry. Throws Error(kInvalidArgument) on
// a malformed card (the registry's test parses every card of the library).
MethodInfo method_card(std::string_view card, void (*check)(const CacheConfig& config),
                       std::unique_ptr<Policy> (*make_policy)(const PolicyContext& context));

// The policy of `full` (and `kivi`): keeps every row.
std::unique_ptr<Policy> make_keep_all_policy(const PolicyContext& context);
// The policy of a method made by scored_method() (MethodInfo::make_scorer).
std::unique_ptr<Policy> make_scored_policy(const PolicyContext& context);
// make_policy of a policy class constructed from the PolicyContext (a family member reads its
// fields through context.config.info().prefix).
template <class P>
std::unique_ptr<Policy> make_policy_of(const PolicyContext& context) {
  return std::make_unique<P>(context);
}

// Sets the token budget's fields (MethodInfo::budget_field, budget_offset) without validating.
void set_budget_fields(CacheConfig& config, std::int64_t budget);
// Guard <prefix>_n_sink < <prefix>_budget.
void check_sink_below_budget(const CacheConfig& config);
// The H2O family's guards: n_sink < budget and the recent window's (check_recent_window, with
// the window field and the reserve H2OPolicy reads: <prefix>_recent where the method names it
// so, else <prefix>_grace; <prefix>_chunk_size rows reserved where the method has chunks).
void check_recent_family(const CacheConfig& config);

}  // namespace vq::detail
