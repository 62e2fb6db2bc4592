// full: no compression. Every token is kept; the reference row of every comparison.
// Deviations from the paper: none (there is no paper).
#include "policies/fields.h"
#include "policies/methods.h"
#include "policies/policy.h"

namespace vq::detail {
namespace {

// Keeps every row; a quantizing store (kivi) still settles its tail (without a row list: the
// policy holds nothing that grows with the context, and a step costs nothing per row held).
class FullPolicy final : public Policy {
 public:
  void end_step(LayerState& st, const AttentionRef* /*attention*/) override {
    for (std::size_t i = 0; i < st.heads.size(); ++i) {
      if (!st.heads[i].store()->quantizing()) continue;  // plain rows: nothing to do
      Decision d;
      d.kind = Decision::Kind::kKeepAll;
      d.head = static_cast<std::int64_t>(i);
      st.apply(d);
    }
  }
};

std::unique_ptr<Policy> make(const PolicyContext& /*ctx*/) { return make_keep_all_policy(); }

}  // namespace

std::unique_ptr<Policy> make_keep_all_policy() { return std::make_unique<FullPolicy>(); }

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
  add_quantize_fields(m.fields);
  add_common_fields(m.fields);
  m.make_policy = &make;
  m.paper_config = "-";
  return m;
}

}  // namespace vq::detail
