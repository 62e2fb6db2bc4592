// finch: at prefill, keep the rows the prompt's question attends to most (the question's
// queries as SnapKV's observation window, their attention normalized for the causal mask).
//
// Paper: Corallo & Papotti, "FINCH: Prompt-guided Key-Value Cache Compression", TACL 2024;
// kvpress: FinchPress.
//
// Rule: on a step with S > 1 new rows (a prefill chunk) that leaves more than budget rows, each
// head's n live rows split into the window (its last w rows) and the m = n - w rows before it.
// The window is the prompt's question: w = min(q, budget - finch_n_sink) for the q question
// tokens the engine declared (LayerCache::set_question_length, consumed by the step), else
// (q = 0: no question given) the fixed w = min(finch_obs_window, n), as snapkv's window.
// Every window row r whose query is new in this step (source=attention: its real queries,
// folded over the KV head's query heads by gqa_reduce; proxy: its key as the query, softmax over
// live rows 0..r) gives weights a_r[j] over the rows before the window; with finch_normalize
// each a_r is multiplied by c_r, the number of rows before the query (its physical row in the
// step's view; the proxy's live index r), which undoes the dilution of a later query's softmax
// over more keys (kvpress multiplies by the query's position k_len - w + i, the count of keys
// before it). The score of row j < m is the mean over those window rows of c_r a_r[j]. The head
// keeps its finch_n_sink sinks, its w window rows and the budget - n_sink - w rows of highest
// score among [n_sink, m) (ties to the lowest index, NaN never wins), in position order. Single-
// token steps (decode) append without eviction, so the cache grows past the budget during
// generation, as snapkv's does.
// Head-wise budgets (headwise=true, policies/headwise.h): the heads are ranked by the same
// score, sinks and windows protected.
//
// Fields: finch_budget=512, finch_obs_window=32 (the window without a question),
// finch_n_sink=4, finch_normalize=true; shared: source=auto, gqa_reduce, headwise,
// headwise_floor, merge=drop (+gate, keys; the gate compares the score), quantize/demote, seed,
// kv_dtype. Guards: n_sink < budget, n_sink + obs_window < budget.
// Deviations from the paper and kvpress:
//  - no key re-rotation: kvpress re-applies RoPE to the kept keys at compacted positions by
//    default (rerotate_keys=True); this library keeps true positions (cache contract 1), so kept
//    keys keep their own rotation and decode continues at the prompt's true positions;
//  - the question comes from set_question_length, not from a delimiter token inserted into the
//    prompt (kvpress adds a special token to the vocabulary and resizes the embeddings);
//  - without a question the window is the fixed finch_obs_window (kvpress fails);
//  - a question longer than budget - n_sink keeps its last budget - n_sink rows as the window,
//    and its earlier rows compete with the context (kvpress takes the top-k of scores where the
//    window's are tied, keeping an unspecified subset);
//  - sinks protected (paper config n_sink=0);
//  - the chunked mode of the paper (the document fed in chunks, each followed by the question
//    and cut to its share of the budget) is not implemented: the engine prefills the whole
//    prompt as one step (docs/methods.md says what it would need).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "policies/fields.h"
#include "policies/methods.h"
#include "policies/prefill_only.h"

namespace vq::detail {

// The registry entry (methods.h, method_card).
constexpr std::string_view kCard = R"(
id: finch
prefix: finch
summary: Finch: at prefill, keep the rows the prompt's question attends to most (attention
  normalized for the causal mask); decode appends
paper: Corallo and Papotti, FINCH: Prompt-guided Key-Value Cache Compression, TACL 2024
disposition: drop (merge optional)
score: the question's attention, normalized by the keys before each query
budget: uniform at prefill (decode grows)
deviations: no key re-rotation (true positions kept); the question from set_question_length,
  else a fixed window of finch_obs_window rows; sinks protected; the paper's chunked prefill not
  implemented
paper config: `finch:n_sink=0,source=attention` (the question as the window, normalized)
prefill only: yes
| finch_budget | int | 512 | [1, 16777216] | rows kept per KV head after a prefill chunk, sinks
  and window included
| finch_obs_window | int | 32 | [1, 16777216] | the window's rows when no question length was
  set (set_question_length)
| finch_n_sink | int | 4 | [0, 16777216] | leading rows never evicted
| finch_normalize | bool | true | - | multiply each window query's attention by the number of
  rows before it (the causal mask's dilution)
attention: yes
)";

namespace {

void check(const CacheConfig& c) {
  require_less(c, "finch_n_sink", "finch_budget");
  require_sum_less(c, "finch_n_sink", "finch_obs_window", "finch_budget");
}

class FinchPolicy final : public PrefillOnlyPolicy {
 public:
  explicit FinchPolicy(const PolicyContext& ctx)
      : PrefillOnlyPolicy(ctx),
        window_(ctx.config.get_int("finch_obs_window")),
        normalize_(ctx.config.get_bool("finch_normalize")) {}

  bool reads_question() const noexcept override { return true; }

 protected:
  void select(HeadCtx& h, std::int64_t keep) override {
    const std::int64_t n = h.n_live();
    const std::int64_t m = score(h);
    const std::int64_t w = n - m;
    keep_top(h, score_.data(), n_sink_, m, keep - n_sink_ - w);
  }

  void eviction_scores(HeadCtx& h, float* out) override {
    const std::int64_t n = h.n_live();
    const std::int64_t m = score(h);
    const float inf = std::numeric_limits<float>::infinity();
    for (std::int64_t j = 0; j < n; ++j) {
      out[j] = (j < n_sink_ || j >= m) ? inf : rank_of(score_[static_cast<std::size_t>(j)]);
    }
  }

 private:
  // The window's rows of head h in the open step.
  std::int64_t window_rows(const HeadCtx& h) const {
    const std::int64_t n = h.n_live();
    const std::int64_t q = h.st.step_question;
    if (q > 0) return std::min({q, budget_ - n_sink_, n});
    return std::min(window_, n);
  }

  // Scores the rows before the window into score_ (and hs.score, for the merge gate); returns
  // m, the number of rows before the window.
  std::int64_t score(HeadCtx& h) {
    const std::int64_t n = h.n_live();
    const std::int64_t m = n - window_rows(h);
    sum_.assign(static_cast<std::size_t>(m), 0.0);
    std::int64_t queries = 0;
    if (source_.attention()) {
      for (std::int64_t r = m; r < n; ++r) {
        const std::int64_t row = h.hs.live[static_cast<std::size_t>(r)];
        const std::int64_t query = row - h.hs.prev;
        if (query < 0) continue;  // a row kept from an earlier step has no query here
        const float* a = attention_row(h, query);
        const double c = normalize_ ? static_cast<double>(row) : 1.0;
        for (std::int64_t j = 0; j < m; ++j) {
          sum_[static_cast<std::size_t>(j)] +=
              c * static_cast<double>(a[h.hs.live[static_cast<std::size_t>(j)]]);
        }
        ++queries;
      }
    } else {
      weights_.resize(static_cast<std::size_t>(n));
      for (std::int64_t r = m; r < n; ++r) {
        proxy_weights(h, key_of(h, r), r + 1, weights_.data());
        const double c = normalize_ ? static_cast<double>(r) : 1.0;
        for (std::int64_t j = 0; j < m; ++j) {
          sum_[static_cast<std::size_t>(j)] +=
              c * static_cast<double>(weights_[static_cast<std::size_t>(j)]);
        }
        ++queries;
      }
    }
    score_.resize(static_cast<std::size_t>(m));
    const double inv = queries > 0 ? 1.0 / static_cast<double>(queries) : 0.0;
    for (std::int64_t j = 0; j < m; ++j) {
      const auto s = static_cast<float>(sum_[static_cast<std::size_t>(j)] * inv);
      score_[static_cast<std::size_t>(j)] = s;
      h.hs.score[static_cast<std::size_t>(j)] = s;
    }
    return m;
  }

  std::int64_t window_;
  bool normalize_;
  std::vector<double> sum_;
  std::vector<float> score_;
};

}  // namespace

MethodInfo finch_method() { return method_card(kCard, &check, &make_policy_of<FinchPolicy>); }

}  // namespace vq::detail
