#pragma once

#include "policies/policy.h"

namespace vq::detail {

// H2O's cumulative attention mass (see h2o.cpp): the base of the H2O family (h2o, cam,
// pyramidkv, squeeze, chunkkv, keyformer), each reading its fields through its prefix.
class H2OPolicy : public TokenPolicy {
 public:
  // The member of the family ctx's method names, as its field table says: <prefix>_budget,
  // <prefix>_n_sink, the recent window (<prefix>_grace, or <prefix>_recent where the method
  // names it so, with <prefix>_recent_ratio; <prefix>_chunk_size rows reserved where the method
  // has chunks), <prefix>_decay (1 without such a field), the merge rule, the score source and
  // head-wise budgets (where the method has them). h2o and cam are exactly this.
  explicit H2OPolicy(const PolicyContext& ctx);
  // The same at another budget (pyramidkv's per-layer budget).
  H2OPolicy(const PolicyContext& ctx, std::int64_t budget);

 protected:
  void on_token(HeadCtx& h, std::int64_t row) override;
  void eviction_scores(HeadCtx& h, float* out) override;
  // With true attention a prefill chunk is one decision: every query's attention is summed,
  // then one cut to the budget (the paper's prompt rule).
  bool decides_chunk_at_once() const noexcept override { return source_.attention(); }

  std::int64_t grace_;
  float decay_;
  // After on_token: weights_[0, last_n_) holds the attention the new token paid (proxy: over the
  // older rows; attention source: over every live row, itself included).
  std::int64_t last_n_ = 0;
};

}  // namespace vq::detail
