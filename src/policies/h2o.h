#pragma once

#include "policies/policy.h"

namespace vq::detail {

// H2O's cumulative attention mass under the key-as-query proxy (see h2o.cpp). Shared by cam,
// which is this policy with grace 0, decay 1 and a merge rule.
class H2OPolicy : public TokenPolicy {
 public:
  H2OPolicy(std::int64_t budget, std::int64_t n_sink, std::int64_t grace, float decay,
            MergeRule merge, ScoreSource source = ScoreSource{})
      : TokenPolicy(budget, n_sink, merge, source), grace_(grace), decay_(decay) {}

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
