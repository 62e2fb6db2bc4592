// streaming_llm: attention sinks plus a sliding window of the most recent tokens.
//
// Paper: Xiao et al., "Efficient Streaming Language Models with Attention Sinks", ICLR 2024.
//
// Rule: keep the first stream_n_sink tokens and the last stream_window_size; over budget the
// oldest non-sink row leaves. No scores. With a merge rule and the gate on, the gate compares
// the rows' cumulative proxy attention mass (H2O's rule with decay 1), which is then tracked.
//
// Fields: stream_n_sink=4, stream_window_size=512; shared: merge=drop (+gate, keys), seed,
// kv_dtype. Budget = n_sink + window_size.
// Deviations from the paper: none for the drop disposition (positions are the original ones,
// not re-indexed within the cache; the engine masks by true position).
#include <vector>

#include "policies/fields.h"
#include "policies/methods.h"
#include "policies/policy.h"

namespace vq::detail {

// The registry entry (methods.h, method_card): what `veloxquant list` and the README table
// show, the field table and the shared field groups.
constexpr std::string_view kCard = R"(
id: streaming_llm
token loop: yes
prefix: stream
summary: StreamingLLM: attention sinks plus a sliding window of recent tokens
paper: Xiao et al., Efficient Streaming Language Models with Attention Sinks, ICLR 2024
disposition: drop (merge optional)
score: none (recency)
budget: uniform (n_sink + window)
deviations: none
paper config: `streaming_llm:n_sink=4` (4 sink tokens and a recent window: the defaults)
defaults: the paper's 4 sinks; budget= sets the window to budget - n_sink
budget field: stream_window_size
budget offset: stream_n_sink
| stream_n_sink | int | 4 | [0, 16777216] | leading rows always kept (attention sinks)
| stream_window_size | int | 512 | [1, 16777216] | most recent rows kept
)";

namespace {

class StreamingPolicy final : public TokenPolicy {
 public:
  explicit StreamingPolicy(const PolicyContext& ctx)
      : TokenPolicy(ctx, token_budget(ctx.config)),
        track_mass_(merge_.mode != MergeRule::Mode::kDrop && merge_.gate) {}

 protected:
  void on_token(HeadCtx& h, std::int64_t row) override {
    const std::int64_t n = h.n_live();
    if (track_mass_ && n > 0) {
      weights_.resize(static_cast<std::size_t>(n));
      proxy_weights(h, key_of_row(h, row), n, weights_.data());
      for (std::int64_t i = 0; i < n; ++i) h.hs.score[i] += weights_[i];
    }
    push_row(h.hs, row, track_mass_ && n == 0 ? 1.0f : 0.0f);
  }
  std::int64_t pick_loser(HeadCtx& /*h*/) override { return n_sink_; }
  // compress_interval > 1: the window slides by n - keep rows at once, the oldest non-sink rows
  // leaving (the default cut would rank by the merge gate's mass).
  void cut_head(HeadCtx& h, std::int64_t keep) override {
    const std::int64_t n = h.n_live();
    if (keep < 0 || n <= keep) return;
    losers_.clear();
    for (std::int64_t i = n_sink_; i < n_sink_ + (n - keep); ++i) losers_.push_back(i);
    evict_rows(h, losers_);
  }

 private:
  bool track_mass_;
  std::vector<std::int64_t> losers_;
};

}  // namespace

MethodInfo streaming_llm_method() {
  return method_card(kCard, nullptr, &make_policy_of<StreamingPolicy>);
}

}  // namespace vq::detail
