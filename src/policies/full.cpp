// full: no compression. Every token is kept; the reference row of every comparison.
// Deviations from the paper: none (there is no paper).
#include <numeric>

#include "policies/fields.h"
#include "policies/methods.h"
#include "policies/policy.h"

namespace vq::detail {
namespace {

// Keeps every row; a quantizing store (kivi) still settles its tail. The row list is scratch of
// this call (freed on return), so the policy holds nothing that grows with the context.
class FullPolicy final : public Policy {
 public:
  void end_step(LayerState& st, const AttentionRef* /*attention*/) override {
    std::vector<std::int64_t> live;
    for (HeadState& hs : st.heads) {
      if (!hs.store->quantizing()) continue;  // plain rows: nothing to do
      live.resize(static_cast<std::size_t>(hs.store->size()));
      std::iota(live.begin(), live.end(), std::int64_t{0});
      hs.store->settle(live.data(), hs.store->size());
      hs.store->keep(live.data(), static_cast<std::int64_t>(live.size()));  // drops dead slots
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
