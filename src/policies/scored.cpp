// The policy of a method made by scored_method() (include/veloxquant/registry.h): a row's score
// is the method's scorer applied to its key and value as stored, once, when the row arrives; the
// shared eviction loop (TokenPolicy) evicts the lowest, the first <prefix>_n_sink rows
// protected, and the merge rule <prefix>_merge... disposes of the loser. This is how a method
// registered from outside the library runs (examples/custom_method.cpp).
//
// The scorer is code from outside the library, so it runs before anything is decided: every
// new row of the step (all heads) is scored first, and only then does the eviction loop run on
// the stored scores. A scorer that throws has then changed nothing, and the cache rolls the
// step back (LayerCache::end_step). A row's key and value are read before the loop, but no
// decision touches a row of the step before the loop reaches it (merges go into rows already
// live), so the scores are the ones the loop would have computed row by row.
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "policies/methods.h"
#include "policies/policy.h"
#include "veloxquant/errors.h"

namespace vq::detail {
namespace {

// Runs user code (make_scorer, a scorer) with its exceptions as Error(kInvalidArgument) naming
// the method; std::bad_alloc stays itself.
template <typename F>
auto user_call(const std::string& method, const char* what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kInvalidArgument, "[" + method + "] " + what + " threw: " + e.what());
  } catch (...) {
    throw Error(ErrorCode::kInvalidArgument,
                "[" + method + "] " + what + " threw an exception that is no std::exception");
  }
}

RowScorer made_scorer(const PolicyContext& ctx) {
  const MethodInfo& m = ctx.config.info();
  RowScorer scorer = user_call(m.id, "make_scorer", [&] { return m.make_scorer(ctx.config); });
  if (!scorer) {
    throw Error(ErrorCode::kInvalidArgument,
                "[" + m.id + "] make_scorer returned an empty RowScorer; it must return a "
                             "function that scores a row");
  }
  return scorer;
}

class ScoredPolicy final : public TokenPolicy {
 public:
  explicit ScoredPolicy(const PolicyContext& ctx)
      : TokenPolicy(ctx), method_(ctx.config.info().id), scorer_(made_scorer(ctx)) {}

 protected:
  // Before the loop: scores_[i * S + j] for head i's new row j (physical row prev + j).
  void begin_step(LayerState& st) override {
    const std::int64_t S = st.step_new, D = st.shape.head_dim;
    scores_.assign(static_cast<std::size_t>(st.n_heads_total() * S), 0.0f);
    key_.resize(static_cast<std::size_t>(D));
    value_.resize(static_cast<std::size_t>(D));
    for (std::int64_t i = 0; i < st.n_heads_total(); ++i) {
      const HeadState& hs = st.heads[static_cast<std::size_t>(i)];
      for (std::int64_t j = 0; j < S; ++j) {
        hs.store()->read_key(hs.prev + j, key_.data());
        hs.store()->read_value(hs.prev + j, value_.data());
        scores_[static_cast<std::size_t>(i * S + j)] =
            user_call(method_, "the scorer", [&] { return scorer_(key_.data(), value_.data(), D); });
      }
    }
  }

  void on_token(HeadCtx& h, std::int64_t row) override {
    const std::int64_t j = row - h.hs.prev;
    push_row(h.hs, row, scores_[static_cast<std::size_t>(h.index * h.st.step_new + j)]);
  }

 private:
  std::string method_;
  RowScorer scorer_;
  std::vector<float> key_, value_;  // [head_dim] scratch
  std::vector<float> scores_;       // [n_heads_total * S] the open step's new rows
};

}  // namespace

std::unique_ptr<Policy> make_scored_policy(const PolicyContext& context) {
  return std::make_unique<ScoredPolicy>(context);
}

}  // namespace vq::detail
