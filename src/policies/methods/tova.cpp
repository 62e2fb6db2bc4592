// tova: Token Omission Via Attention: evict the row the newest token attends to least.
//
// Paper: Oren et al., "Transformers are Multi-State RNNs", EMNLP 2024.
//
// Proxy rule: append the new row first; over budget, w = softmax(K_all . k_new / sqrt(d))
// over all rows including the new one; sinks are protected; evict argmin (the new row itself
// can lose). No state between steps; with a merge rule the gate compares these weights.
//
// Fields: tova_budget=512, tova_n_sink=4; shared: merge=drop (+gate, keys), seed, kv_dtype.
// Attention source (the paper's rule): the newest query's attention averaged over every query
// head of the layer ranks the rows, and the whole layer keeps one index set (gqa_reduce does
// not apply). A prefill chunk is one decision: its last query ranks every row and the lowest
// leave in one cut, as the paper does a prompt.
// Head-wise budgets (headwise=true, policies/headwise.h): each KV head ranks its own rows by
// the newest query's attention folded over its query heads (gqa_reduce), or by its proxy
// weights, and the layer's rows are shared by one ranking of those probabilities; a prefill
// chunk is still one decision by its last query.
// Deviations from the paper: with the proxy source the key stands in for the query and each KV
// head ranks its own rows; sinks are protected.
#include <algorithm>
#include <cmath>
#include <limits>

#include "base/kernels.h"
#include "policies/fields.h"
#include "policies/methods.h"
#include "policies/policy.h"
#include "veloxquant/errors.h"

namespace vq::detail {

// The registry entry (methods.h, method_card): what `veloxquant list` and the README table
// show, the field table and the shared field groups.
constexpr std::string_view kCard = R"(
id: tova
token loop: yes
prefix: tova
summary: TOVA: evict the row the newest token attends to least
paper: Oren et al., Transformers are Multi-State RNNs, EMNLP 2024
disposition: drop (merge optional)
score: current-step attention
budget: uniform
deviations: proxy source: key-as-query per KV head (attention source: the paper's last query
  averaged over all heads, one index set per layer); sinks protected
paper config: `tova:n_sink=0,source=attention` (the last query's attention averaged over every
  head, one index set per layer)
| tova_budget | int | 512 | [1, 16777216] | rows kept per KV head, sinks included
| tova_n_sink | int | 4 | [0, 16777216] | leading rows never evicted
attention: yes
)";

namespace {

class TovaPolicy final : public TokenPolicy {
 public:
  using TokenPolicy::TokenPolicy;

 protected:
  // The paper's rule (source=attention, not head-wise): the step's last query's attention
  // averaged over every query head of the layer ranks the rows, and one index set is kept for
  // the whole layer. A step is one decision: a prefill chunk is cut once with its last query, as
  // the paper does a prompt.
  bool shares_rows() const noexcept override { return source_.attention() && !headwise_.on; }
  void layer_losers(LayerState& st, std::int64_t b, std::int64_t keep,
                    std::vector<std::int64_t>& losers) override {
    const std::int64_t H = st.shape.n_kv_heads;
    HeadState& first = st.heads[static_cast<std::size_t>(b * H)];
    const std::int64_t n = static_cast<std::int64_t>(first.live.size());
    const float* a = attention_row_all_heads(st, b, st.step_new - 1);
    for (std::int64_t h = 0; h < H; ++h) {
      HeadState& hs = st.heads[static_cast<std::size_t>(b * H + h)];
      VQ_ASSERT(hs.live == first.live, "tova (attention) keeps one index set per layer");
      for (std::int64_t r = 0; r < n; ++r) {
        hs.score[static_cast<std::size_t>(r)] = a[hs.live[static_cast<std::size_t>(r)]];
      }
    }
    if (n <= keep) return;
    // The n - keep lowest (sinks protected; NaN first, ties to the lowest index): a strict
    // order on (NaN first, score, index), so selecting them needs no sort of all rows (a
    // decode step drops one row: one pass).
    const float* score = first.score.data();
    auto before = [score](std::int64_t x, std::int64_t y) {
      const float ax = score[x], ay = score[y];
      const bool nx = std::isnan(ax), ny = std::isnan(ay);
      if (nx || ny) return nx != ny ? nx : x < y;
      return ax < ay || (ax == ay && x < y);
    };
    const std::int64_t k = n - keep;
    order_.clear();
    if (k == 1) {
      std::int64_t best = n_sink_;
      for (std::int64_t i = n_sink_ + 1; i < n; ++i) {
        if (before(i, best)) best = i;
      }
      order_.push_back(best);
    } else {
      for (std::int64_t i = n_sink_; i < n; ++i) order_.push_back(i);
      std::nth_element(order_.begin(), order_.begin() + (k - 1), order_.end(), before);
      order_.resize(static_cast<std::size_t>(k));
      std::sort(order_.begin(), order_.end());
    }
    losers.assign(order_.begin(), order_.end());
  }

  void on_token(HeadCtx& h, std::int64_t row) override { push_row(h.hs, row, 0.0f); }
  // Head-wise with the attention source: a step is one decision, ranked by its last query.
  bool decides_chunk_at_once() const noexcept override { return source_.attention(); }
  void eviction_scores(HeadCtx& h, float* out) override {
    const std::int64_t n = h.n_live();
    if (source_.attention() && h.st.attention != nullptr) {
      // Head-wise (the only way here with attention): the newest query's attention, folded over
      // this KV head's query heads by gqa_reduce, ranks the head's own rows.
      const float* a = attention_row(h, h.hs.live.back() - h.hs.prev);
      for (std::int64_t i = 0; i < n; ++i) out[i] = a[h.hs.live[static_cast<std::size_t>(i)]];
    } else {
      proxy_weights(h, key_of(h, n - 1), n, out);
    }
    float* score = h.hs.score.data();
    const float inf = std::numeric_limits<float>::infinity();
    for (std::int64_t i = 0; i < n; ++i) {
      score[i] = out[i];
      out[i] = i < n_sink_ ? inf : rank_of(out[i]);
    }
  }
};

}  // namespace

MethodInfo tova_method() {
  return method_card(kCard, &check_sink_below_budget, &make_policy_of<TovaPolicy>);
}

}  // namespace vq::detail
