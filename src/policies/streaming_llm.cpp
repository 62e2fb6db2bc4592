// streaming_llm: attention sinks plus a sliding window of the most recent tokens.
//
// Paper: Xiao et al., "Efficient Streaming Language Models with Attention Sinks", ICLR 2024.
//
// Rule: keep the first stream_n_sink tokens and the last stream_window_size; over budget the
// oldest non-sink row leaves. No scores. With a merge rule and the gate on, the gate compares
// the rows' cumulative proxy attention mass (H2O's rule with decay 1), which is then tracked.
//
// Fields: stream_n_sink=4, stream_window_size=512, stream_merge=drop (+gate, keys), seed,
// kv_dtype. Budget = n_sink + window_size.
// Deviations from the paper: none for the drop disposition (positions are the original ones,
// not re-indexed within the cache; the engine masks by true position).
#include "policies/fields.h"
#include "policies/methods.h"
#include "policies/policy.h"

namespace vq::detail {
namespace {

class StreamingPolicy final : public TokenPolicy {
 public:
  StreamingPolicy(std::int64_t budget, std::int64_t n_sink, MergeRule merge)
      : TokenPolicy(budget, n_sink, merge),
        track_mass_(merge.mode != MergeRule::Mode::kDrop && merge.gate) {}

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

 private:
  bool track_mass_;
};

std::unique_ptr<Policy> make(const PolicyContext& ctx) {
  const CacheConfig& c = ctx.config;
  const std::int64_t n_sink = c.get_int("stream_n_sink");
  return std::make_unique<StreamingPolicy>(n_sink + c.get_int("stream_window_size"), n_sink,
                                           merge_rule_from(c, "stream"));
}

void set_budget(CacheConfig& c, std::int64_t budget) {
  const std::int64_t n_sink = c.get_int("stream_n_sink");
  if (budget <= n_sink) {
    config_error(c, "budget " + std::to_string(budget) +
                        " leaves no room for the window: it must be > stream_n_sink (" +
                        std::to_string(n_sink) + ")");
  }
  c.set("stream_window_size", budget - n_sink);
}

}  // namespace

MethodInfo streaming_llm_method() {
  MethodInfo m;
  m.id = "streaming_llm";
  m.prefix = "stream";
  m.summary = "StreamingLLM: attention sinks plus a sliding window of recent tokens";
  m.paper = "Xiao et al., Efficient Streaming Language Models with Attention Sinks, ICLR 2024";
  m.disposition = "drop (merge optional)";
  m.score_signal = "none (recency)";
  m.budget_type = "uniform (n_sink + window)";
  m.deviations = "none";
  m.fields = {
      int_field("stream_n_sink", 4, 0, kMaxTokens, "leading rows always kept (attention sinks)"),
      int_field("stream_window_size", 512, 1, kMaxTokens, "most recent rows kept"),
  };
  add_merge_fields(m.fields, "stream", "drop");
  add_quantize_fields(m.fields);
  add_common_fields(m.fields);
  m.get_budget = [](const CacheConfig& c) {
    return c.get_int("stream_n_sink") + c.get_int("stream_window_size");
  };
  m.set_budget = &set_budget;
  m.budget_field = "stream_window_size";
  m.budget_rule = "budget = stream_n_sink + stream_window_size";
  m.make_policy = &make;
  m.paper_config = "`streaming_llm:n_sink=4` (4 sink tokens and a recent window: the defaults)";
  m.defaults_note = "the paper's 4 sinks; budget= sets the window to budget - n_sink";
  return m;
}

}  // namespace vq::detail
