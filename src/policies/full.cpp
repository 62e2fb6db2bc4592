// full: no compression. Every token is kept; the reference row of every comparison.
// Deviations from the paper: none (there is no paper).
#include <numeric>

#include "policies/fields.h"
#include "policies/methods.h"
#include "policies/policy.h"

namespace vq::detail {
namespace {

// Keeps every row; a quantizing store (kivi) still settles its tail.
class FullPolicy final : public Policy {
 public:
  void end_step(LayerState& st, const AttentionRef* /*attention*/) override {
    for (HeadState& hs : st.heads) {
      if (!hs.store->quantizing()) continue;  // plain rows: nothing to do
      live_.resize(static_cast<std::size_t>(hs.store->size()));
      std::iota(live_.begin(), live_.end(), std::int64_t{0});
      hs.store->settle(live_.data(), hs.store->size());
      hs.store->keep(live_.data(), static_cast<std::int64_t>(live_.size()));  // drops dead slots
    }
  }

 private:
  std::vector<std::int64_t> live_;
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
