// ThinK's key-channel pruning, composable with every method (think=, think_window=).
//
// Paper: Xu et al., "ThinK: Thinner Key Cache by Query-Driven Pruning", ICLR 2025
// (arXiv 2407.21018).
//
// Rule. At the first step with S > 1 new rows (a prefill, or its first chunk), per (batch, KV
// head): Q_w = the step's last w = min(think_window, S) queries of every query head of the KV
// head's group, rotated to their positions (post-RoPE, as the keys are), stacked into a
// (w g) x D matrix; K = the rows the head holds after the method's own decision of that step
// (kvpress's ComposedPress order: eviction first, then ThinK). Channel c scores
//   s_c = ||Q_w[:, c]||_2 x ||K[:, c]||_2,
// the Frobenius norm of channel c's rank-1 share Q_w[:, c] K[:, c]^T of Q_w K^T. The head keeps
// the D - floor(think x D) highest-scoring channels (ties to the lower channel, NaN never kept;
// floor as kvpress's int(), so think=0.5 of D=64 keeps 32) and every row it holds keeps only
// those (RowStore::prune_keys): attention over a pruned row is q . k over the kept channels,
// i.e. q . k with the pruned channels zero. The set is fixed from then on (until reset()):
// every later step with S > 1 (a later prefill chunk) prunes the rows held then with the same
// set; a decode step's row (S = 1) keeps its whole key, as the paper and kvpress prune the
// prompt's keys only.
// Queries: the step's pre-RoPE queries passed to end_step(&probs, &queries) (the engine passes
// them while reads_queries() is true, i.e. until the set is chosen), rotated by set_rope's
// frequencies. Without queries (update(), the C API without them) the window rows' keys stand
// in for their queries (already rotated), as the proxy source of the other methods.
#include "policies/think.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "policies/fields.h"
#include "veloxquant/errors.h"

namespace vq::detail {

namespace {

class KeyPruningPolicy final : public Policy {
 public:
  KeyPruningPolicy(const PolicyContext& ctx, std::unique_ptr<Policy> inner)
      : inner_(std::move(inner)),
        ratio_(ctx.config.get_float("think")),
        window_(ctx.config.get_int("think_window")) {}

  std::int64_t budget() const noexcept override { return inner_->budget(); }

  void end_step(LayerState& st, const AttentionRef* attention) override {
    const bool prefill = st.step_new > 1;
    // The window's query statistics before the method cuts (the proxy reads the window rows'
    // keys, which an eviction may remove).
    if (prefill && !chosen_) query_norms(st);
    inner_->end_step(st, attention);
    if (!prefill) return;
    if (!chosen_) choose(st);
    for (std::size_t i = 0; i < st.heads.size(); ++i) {
      Decision d;
      d.kind = Decision::Kind::kPruneKeys;
      d.head = static_cast<std::int64_t>(i);
      d.target = st.heads[i].store()->size();
      d.channels = channels_[i].data();
      d.n_rows = static_cast<std::int64_t>(channels_[i].size());
      st.apply(d);
    }
  }

  void on_reset(LayerState& st) override {
    chosen_ = false;
    channels_.clear();
    inner_->on_reset(st);
  }
  bool awaits_compress(const LayerState& st) const noexcept override {
    return inner_->awaits_compress(st);
  }
  void state(StateIO& io, LayerState& st) override {
    inner_->state(io, st);
    io.value(chosen_, "think chosen");
    const std::int64_t D = st.shape.head_dim;
    io.vec2(channels_, st.heads.size(), static_cast<std::uint64_t>(D), "think key channels");
    if (!io.loading()) return;
    io.check(channels_.size() == (chosen_ ? st.heads.size() : 0),
             "think key channels: expected " + std::to_string(chosen_ ? st.heads.size() : 0) +
                 " heads, found " + std::to_string(channels_.size()));
    const std::int64_t kept = D > 0 ? think_kept_channels(ratio_, D) : 0;
    for (const auto& ch : channels_) {
      io.check(static_cast<std::int64_t>(ch.size()) == kept,
               "think key channels: expected " + std::to_string(kept) + " per head, found " +
                   std::to_string(ch.size()));
      for (std::size_t c = 0; c < ch.size(); ++c) {
        io.check(ch[c] >= 0 && ch[c] < D && (c == 0 || ch[c] > ch[c - 1]),
                 "think key channels: expected increasing channels below " + std::to_string(D));
      }
    }
  }
  bool needs_attention() const noexcept override { return inner_->needs_attention(); }
  bool reads_queries() const noexcept override { return inner_->reads_queries() || !chosen_; }
  void apply_group_decision(LayerState& st) override { inner_->apply_group_decision(st); }
  bool source_unresolved() const noexcept override { return inner_->source_unresolved(); }
  void resolve_source(bool attention) override { inner_->resolve_source(attention); }
  void reset_source() override { inner_->reset_source(); }
  bool needs_key_filters() const noexcept override { return inner_->needs_key_filters(); }
  const char* source_name() const noexcept override { return inner_->source_name(); }
  bool takes_head_pattern() const noexcept override { return inner_->takes_head_pattern(); }
  void set_head_pattern(std::vector<float> scores) override {
    inner_->set_head_pattern(std::move(scores));
  }
  std::int32_t head_type(std::int64_t index) const noexcept override {
    return inner_->head_type(index);
  }
  bool reads_output_gram() const noexcept override { return inner_->reads_output_gram(); }

 private:
  // qn_[i][c] = sum over the window's (query row, query head of the group) of q_c^2, post-RoPE.
  void query_norms(const LayerState& st) {
    const std::int64_t D = st.shape.head_dim, H = st.shape.n_kv_heads, S = st.step_new;
    const std::int64_t w = std::min(window_, S);
    qn_.assign(st.heads.size(), std::vector<double>(static_cast<std::size_t>(D), 0.0));
    row_.resize(static_cast<std::size_t>(D));
    if (st.queries == nullptr) {
      // Proxy: the window rows' keys, as stored (rotated by the engine before the cache saw them).
      for (std::size_t i = 0; i < st.heads.size(); ++i) {
        const HeadState& hs = st.heads[i];
        for (std::int64_t j = S - w; j < S; ++j) {
          hs.store()->read_key(hs.prev + j, row_.data());
          add_squares(qn_[i], row_.data(), D);
        }
      }
      return;
    }
    const TensorRef& q = *st.queries;
    const std::int64_t G = st.shape.n_query_heads / H;
    const std::int64_t first_pos = st.tokens_seen - S;
    for (std::int64_t b = 0; b < st.batch; ++b) {
      for (std::int64_t qh = 0; qh < st.shape.n_query_heads; ++qh) {
        auto& acc = qn_[static_cast<std::size_t>(b * H + qh / G)];
        for (std::int64_t j = S - w; j < S; ++j) {
          const std::int64_t off = b * q.stride[0] + qh * q.stride[1] + j * q.stride[2];
          for (std::int64_t c = 0; c < D; ++c) {
            row_[static_cast<std::size_t>(c)] =
                q.dtype == DType::kF32 ? static_cast<const float*>(q.data)[off + c]
                                       : half_to_float(static_cast<const std::uint16_t*>(q.data)[off + c]);
          }
          rotate(st, first_pos + j, D);
          add_squares(acc, row_.data(), D);
        }
      }
    }
  }

  // row_ turned to position `pos` by the layer's rotary embedding (LayerCache::set_rope); as it
  // is when the layer has none.
  void rotate(const LayerState& st, std::int64_t pos, std::int64_t D) {
    const auto n_pairs = static_cast<std::int64_t>(st.rope_inv_freq.size());
    if (n_pairs * 2 != D) return;
    for (std::int64_t p = 0; p < n_pairs; ++p) {
      const std::int64_t a = st.rope_interleaved ? 2 * p : p;
      const std::int64_t b = st.rope_interleaved ? 2 * p + 1 : p + D / 2;
      const double angle = static_cast<double>(pos) * st.rope_inv_freq[static_cast<std::size_t>(p)];
      const double cs = std::cos(angle), sn = std::sin(angle);
      const double x = row_[static_cast<std::size_t>(a)], y = row_[static_cast<std::size_t>(b)];
      row_[static_cast<std::size_t>(a)] = static_cast<float>(x * cs - y * sn);
      row_[static_cast<std::size_t>(b)] = static_cast<float>(x * sn + y * cs);
    }
  }

  static void add_squares(std::vector<double>& acc, const float* x, std::int64_t D) {
    for (std::int64_t c = 0; c < D; ++c) {
      acc[static_cast<std::size_t>(c)] += static_cast<double>(x[c]) * static_cast<double>(x[c]);
    }
  }

  // Scores the channels of every head over the rows it holds now, keeps the best.
  void choose(const LayerState& st) {
    const std::int64_t D = st.shape.head_dim;
    const std::int64_t kept = think_kept_channels(ratio_, D);
    channels_.assign(st.heads.size(), {});
    std::vector<double> kn(static_cast<std::size_t>(D)), score(static_cast<std::size_t>(D));
    std::vector<std::int32_t> order(static_cast<std::size_t>(D));
    row_.resize(static_cast<std::size_t>(D));
    for (std::size_t i = 0; i < st.heads.size(); ++i) {
      const RowStore& store = *st.heads[i].store();
      std::fill(kn.begin(), kn.end(), 0.0);
      for (std::int64_t r = 0; r < store.size(); ++r) {
        store.read_key(r, row_.data());
        add_squares(kn, row_.data(), D);
      }
      for (std::int64_t c = 0; c < D; ++c) {
        const auto k = static_cast<std::size_t>(c);
        score[k] = std::sqrt(qn_[i][k]) * std::sqrt(kn[k]);
      }
      std::iota(order.begin(), order.end(), 0);
      // Highest first, ties to the lower channel, NaN last.
      std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
        const double sa = score[static_cast<std::size_t>(a)], sb = score[static_cast<std::size_t>(b)];
        if (std::isnan(sb)) return !std::isnan(sa);
        if (std::isnan(sa)) return false;
        return sa > sb;
      });
      std::vector<std::int32_t>& ch = channels_[i];
      ch.assign(order.begin(), order.begin() + kept);
      std::sort(ch.begin(), ch.end());
    }
    qn_.clear();
    chosen_ = true;
  }

  std::unique_ptr<Policy> inner_;
  double ratio_;
  std::int64_t window_;
  bool chosen_ = false;
  std::vector<std::vector<std::int32_t>> channels_;  // [B * Hkv][kept] once chosen
  std::vector<std::vector<double>> qn_;              // [B * Hkv][D] during a choosing step
  std::vector<float> row_;                           // [D] scratch
};

}  // namespace

std::unique_ptr<Policy> with_key_pruning(const PolicyContext& context,
                                         std::unique_ptr<Policy> inner) {
  if (!context.config.has("think") || context.config.get_float("think") == 0.0) return inner;
  return std::make_unique<KeyPruningPolicy>(context, std::move(inner));
}

}  // namespace vq::detail
