// The policy of a method made by scored_method() (include/veloxquant/registry.h): a row's score
// is the method's scorer applied to its key and value as stored, once, when the row arrives; the
// shared eviction loop (TokenPolicy) evicts the lowest, the first <prefix>_n_sink rows
// protected, and the merge rule <prefix>_merge... disposes of the loser. This is how a method
// registered from outside the library runs (examples/custom_method.cpp).
#include <vector>

#include "policies/methods.h"
#include "policies/policy.h"

namespace vq::detail {
namespace {

class ScoredPolicy final : public TokenPolicy {
 public:
  explicit ScoredPolicy(const PolicyContext& ctx)
      : TokenPolicy(ctx), scorer_(ctx.config.info().make_scorer(ctx.config)) {}

 protected:
  void on_token(HeadCtx& h, std::int64_t row) override {
    key_.resize(static_cast<std::size_t>(h.head_dim));
    value_.resize(static_cast<std::size_t>(h.head_dim));
    h.hs.store()->read_key(row, key_.data());
    h.hs.store()->read_value(row, value_.data());
    push_row(h.hs, row, scorer_(key_.data(), value_.data(), h.head_dim));
  }

 private:
  RowScorer scorer_;
  std::vector<float> key_, value_;
};

}  // namespace

std::unique_ptr<Policy> make_scored_policy(const PolicyContext& context) {
  return std::make_unique<ScoredPolicy>(context);
}

}  // namespace vq::detail
