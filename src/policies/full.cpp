// full: no compression. Every token is kept; the reference row of every comparison.
// Deviations from the paper: none (there is no paper).
#include "policies/fields.h"
#include "policies/methods.h"
#include "policies/policy.h"

namespace vq::detail {
namespace {

class FullPolicy final : public Policy {
 public:
  void end_step(LayerState& /*st*/, const AttentionRef* /*attention*/) override {}
};

std::unique_ptr<Policy> make(const CacheConfig& /*config*/, const LayerShape& /*shape*/) {
  return std::make_unique<FullPolicy>();
}

}  // namespace

MethodInfo full_method() {
  MethodInfo m;
  m.id = "full";
  m.prefix = "";
  m.summary = "no compression: keeps every token (the reference row)";
  m.paper = "-";
  m.disposition = "none";
  m.score_signal = "none";
  m.budget_type = "none (keeps all)";
  m.deviations = "-";
  add_common_fields(m.fields);
  m.make_policy = &make;
  return m;
}

}  // namespace vq::detail
