// full: no compression. Every token is kept; the reference row of every comparison.
// Deviations from the paper: none (there is no paper).
#include "policies/fields.h"
#include "policies/methods.h"
#include "policies/policy.h"

namespace vq::detail {

// The registry entry (methods.h, method_card): what `veloxquant list` and the README table
// show, the field table and the shared field groups.
constexpr std::string_view kCard = R"(
id: full
prefix: -
summary: no compression: keeps every token (the reference row)
paper: -
disposition: none
score: none
budget: none (keeps all)
deviations: -
paper config: -
)";

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

}  // namespace

std::unique_ptr<Policy> make_keep_all_policy(const PolicyContext& /*ctx*/) {
  return std::make_unique<FullPolicy>();
}

MethodInfo full_method() { return method_card(kCard, nullptr, &make_keep_all_policy); }

}  // namespace vq::detail
