// Prefill decisions as the papers make them (issue 9, item 10): with true attention a prompt
// chunk is one decision made with the whole chunk's attention. Each case is a small prompt
// whose kept set is derived by hand from the paper's rule (and the official code's selection:
// H2O's H2OKVCache_LayerWise, TOVA's TOVACache.reduce, SnapKV's SnapKVCluster, StreamingLLM's
// StartRecentKVCache), on attention matrices chosen so that token-by-token eviction would keep
// a different set.
#include <gtest/gtest.h>

#include <algorithm>

#include "attention_util.h"
#include "test_util.h"

namespace vq {
namespace {

using test::KV;

// Attention rows of one query head for a prompt of n tokens, [n][n], causal (row s has s + 1
// entries; the rest are 0).
std::vector<float> square(const std::vector<std::vector<float>>& rows) {
  const std::size_t n = rows.size();
  std::vector<float> out(n * n, 0.0f);
  for (std::size_t s = 0; s < n; ++s) {
    for (std::size_t r = 0; r < rows[s].size(); ++r) out[s * n + r] = rows[s][r];
  }
  return out;
}

// [Hq][S][R] from one [S][R] block per query head.
std::vector<float> heads(const std::vector<std::vector<float>>& blocks) {
  std::vector<float> out;
  for (const auto& b : blocks) out.insert(out.end(), b.begin(), b.end());
  return out;
}

std::vector<std::int32_t> kept(const LayerCache& c, std::int64_t h = 0) {
  const HeadRows r = c.stored(0, h);
  return std::vector<std::int32_t>(r.positions, r.positions + r.n_rows);
}

// One prefill step of n tokens with probabilities [Hq][n][n].
void prefill(LayerCache& c, const KV& kv, std::int64_t Hq, const std::vector<float>& probs) {
  const StepView view = c.begin_step(kv.keys(0, kv.S), kv.values(0, kv.S));
  const AttentionRef ref{probs.data(), 1, Hq, kv.S, view.n_rows()};
  c.end_step(&ref);
}

// The same prompt fed one token per step: step s gets row s of each head's block.
void token_by_token(LayerCache& c, const KV& kv, std::int64_t Hq, const std::vector<float>& probs) {
  const std::int64_t n = kv.S;
  for (std::int64_t s = 0; s < n; ++s) {
    const StepView view = c.begin_step(kv.keys(s, 1), kv.values(s, 1));
    const std::int64_t R = view.n_rows();
    std::vector<float> step(static_cast<std::size_t>(Hq * R), 0.0f);
    // The stored rows are in position order; map each to its column of the prompt matrix.
    const HeadRows rows = view.head(0, 0);
    for (std::int64_t q = 0; q < Hq; ++q) {
      for (std::int64_t r = 0; r < R; ++r) {
        step[static_cast<std::size_t>(q * R + r)] =
            probs[static_cast<std::size_t>((q * n + s) * n + rows.positions[r])];
      }
    }
    const AttentionRef ref{step.data(), 1, Hq, 1, R};
    c.end_step(&ref);
  }
}

// H2O (Zhang et al., Alg. 1 on a prompt; official H2OKVCache_LayerWise): the attention of every
// prompt query is summed per key (query heads aggregated to their KV head), then the recent
// window is kept and the heavy hitters are the top of the rest.
//
// Prompt of 6, two query heads over one KV head (mean), budget 4 = 2 heavy + 2 recent, no sinks.
// Head-mean rows:
//   q0 [1]
//   q1 [.5 .5]
//   q2 [.2 .6 .2]
//   q3 [.1 .5 .1 .3]
//   q4 [.05 .05 .8 .05 .05]     (head 0: [.1 0 .8 .1 0], head 1: [0 .1 .8 0 .1])
//   q5 [.1 0 .8 0 .05 .05]
// Column sums over rows 0..3 (the candidates; 4 and 5 are the recent window):
//   row 0: 1 + .5 + .2 + .1 + .05 + .1 = 1.95; row 1: .5 + .6 + .5 + .05 = 1.65;
//   row 2: .2 + .1 + .8 + .8 = 1.9; row 3: .3 + .05 = .35.
// Heavy hitters: rows 0 and 2. Kept: {0, 2, 4, 5}.
// Token by token the cache would evict row 2 at token 4 (partial sums 1.85, 1.65, 1.1 over the
// unprotected rows 0..2) and keep {0, 1, 4, 5}.
TEST(PrefillRules, H2OSumsEveryPromptQueryThenCutsOnce) {
  const std::vector<std::vector<float>> common = {
      {1}, {.5f, .5f}, {.2f, .6f, .2f}, {.1f, .5f, .1f, .3f}};
  auto block = [&](std::vector<float> q4) {
    auto rows = common;
    rows.push_back(q4);
    rows.push_back({.1f, 0, .8f, 0, .05f, .05f});
    return square(rows);
  };
  const std::vector<float> probs =
      heads({block({.1f, 0, .8f, .1f, 0}), block({0, .1f, .8f, 0, .1f})});
  KV kv(1, 1, 6, 4, 3);
  const std::string spec =
      "h2o:source=attention,budget=4,n_sink=0,grace=2,decay=1,gqa_reduce=mean,kv_dtype=f32";
  LayerCache once(CacheConfig::parse(spec), LayerShape{1, 4, 2, 0, 1});
  prefill(once, kv, 2, probs);
  EXPECT_EQ(kept(once), (std::vector<std::int32_t>{0, 2, 4, 5}));
  const std::vector<float> scores = once.row_scores(0, 0);
  const std::vector<float> want = {1.95f, 1.9f, .1f, .05f};
  ASSERT_EQ(scores.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_NEAR(scores[i], want[i], 1e-6) << i;

  LayerCache single(CacheConfig::parse(spec), LayerShape{1, 4, 2, 0, 1});
  token_by_token(single, kv, 2, probs);
  EXPECT_EQ(kept(single), (std::vector<std::int32_t>{0, 1, 4, 5}))
      << "decode steps still decide one token at a time";
}

// TOVA (Oren et al.; official TOVACache.reduce): the last prompt query's attention, averaged
// over every query head of the layer, ranks all rows; the top `budget` stay, one index set for
// the layer.
//
// Prompt of 5, two KV heads with one query head each, budget 3, no sinks. Last query:
//   head 0 [.1 .4 .2 0 .3], head 1 [.5 0 .1 .1 .3], mean [.3 .2 .15 .05 .3]
// Top 3: rows 0, 4 (.3) and 1 (.2). Kept {0, 1, 4} by both KV heads (head 0 alone would keep
// {1, 2, 4}). Token by token, query 3 ([.3 0 .3 .4] in both heads) would already have evicted
// row 1, leaving {0, 2, 4} after query 4.
TEST(PrefillRules, TovaRanksByTheLastPromptQueryOverAllHeadsAndCutsOnce) {
  const std::vector<std::vector<float>> common = {
      {1}, {.5f, .5f}, {.3f, .3f, .4f}, {.3f, 0, .3f, .4f}};
  auto block = [&](std::vector<float> last) {
    auto rows = common;
    rows.push_back(last);
    return square(rows);
  };
  const std::vector<float> probs =
      heads({block({.1f, .4f, .2f, 0, .3f}), block({.5f, 0, .1f, .1f, .3f})});
  KV kv(1, 2, 5, 4, 4);
  const std::string spec = "tova:source=attention,budget=3,n_sink=0";
  LayerCache once(CacheConfig::parse(spec), LayerShape{2, 4, 2, 0, 1});
  prefill(once, kv, 2, probs);
  EXPECT_EQ(kept(once, 0), (std::vector<std::int32_t>{0, 1, 4}));
  EXPECT_EQ(kept(once, 1), (std::vector<std::int32_t>{0, 1, 4}));

  // Token by token (each step one query per head, both heads given their own rows).
  LayerCache single(CacheConfig::parse(spec), LayerShape{2, 4, 2, 0, 1});
  for (std::int64_t s = 0; s < 5; ++s) {
    const StepView view = single.begin_step(kv.keys(s, 1), kv.values(s, 1));
    const std::int64_t R = view.n_rows();
    std::vector<float> step(static_cast<std::size_t>(2 * R), 0.0f);
    for (std::int64_t q = 0; q < 2; ++q) {
      const HeadRows rows = view.head(0, q);
      for (std::int64_t r = 0; r < R; ++r) {
        step[static_cast<std::size_t>(q * R + r)] =
            probs[static_cast<std::size_t>((q * 5 + s) * 5 + rows.positions[r])];
      }
    }
    const AttentionRef ref{step.data(), 1, 2, 1, R};
    single.end_step(&ref);
  }
  EXPECT_EQ(kept(single, 0), (std::vector<std::int32_t>{0, 2, 4}));
}

// SnapKV (Li et al.; official SnapKVCluster.update_kv): the last w prompt queries (the
// observation window) sum their attention over the earlier rows, max-pooled along the sequence
// (kernel k, stride 1, padding k / 2), the top budget - w of them stay with the window.
//
// Prompt of 7, window 2 (queries 5 and 6), budget 4, no sinks.
//   q5 [.1 .3 0 .05 .05 .5], q6 [.1 0 .05 0 .35 .2 .3]
// Window mass over rows 0..4: [.2 .3 .05 .05 .4].
// Kernel 1: top 2 are rows 4 and 1: kept {1, 4, 5, 6}.
// Kernel 3: pooled [max(.2,.3) max(.2,.3,.05) max(.3,.05,.05) max(.05,.05,.4) max(.05,.4)]
//         = [.3 .3 .3 .4 .4]: rows 3 and 4 are the top 2: kept {3, 4, 5, 6}.
TEST(PrefillRules, SnapKVPoolsTheObservationWindowAndCutsOnce) {
  std::vector<std::vector<float>> rows = {
      {1}, {.5f, .5f}, {.3f, .3f, .4f}, {.25f, .25f, .25f, .25f}, {.2f, .2f, .2f, .2f, .2f}};
  rows.push_back({.1f, .3f, 0, .05f, .05f, .5f});
  rows.push_back({.1f, 0, .05f, 0, .35f, .2f, .3f});
  const std::vector<float> probs = square(rows);
  KV kv(1, 1, 7, 4, 5);
  for (const auto& [kernel, want] : std::vector<std::pair<int, std::vector<std::int32_t>>>{
           {1, {1, 4, 5, 6}}, {3, {3, 4, 5, 6}}}) {
    LayerCache c(CacheConfig::parse(
                     "snapkv:source=attention,budget=4,obs_window=2,n_sink=0,pool=max,kernel=" +
                     std::to_string(kernel)),
                 LayerShape{1, 4, 1, 0, 1});
    prefill(c, kv, 1, probs);
    EXPECT_EQ(kept(c), want) << "kernel " << kernel;
  }
}

// StreamingLLM (Xiao et al.; official StartRecentKVCache): the first start_size and the last
// recent_size rows of the prompt stay. Prompt of 10, 2 sinks, window 3: {0, 1, 7, 8, 9}, whether
// the prompt comes as one chunk or token by token.
TEST(PrefillRules, StreamingLLMKeepsTheSinksAndTheRecentWindow) {
  KV kv(1, 2, 10, 4, 6);
  for (std::int64_t chunk : {10, 1}) {
    LayerCache c(CacheConfig::parse("streaming_llm:n_sink=2,window_size=3"),
                 LayerShape{2, 4, 0, 0, 1});
    test::feed(c, kv, chunk);
    EXPECT_EQ(kept(c, 0), (std::vector<std::int32_t>{0, 1, 7, 8, 9})) << "chunk " << chunk;
    EXPECT_EQ(kept(c, 1), (std::vector<std::int32_t>{0, 1, 7, 8, 9})) << "chunk " << chunk;
  }
}

// SqueezeAttention (Wang et al.): the per-layer budgets are decided from the prefill's signal
// before the prefill is cut, so each layer keeps its own budget of prompt rows. Two layers, a
// 12-token prompt, average budget C = 6, 1 sink, a recent window of 1, strength 1, fraction 0.5.
// Layer 1 barely turns its hidden state (cosine .99 against .5): it is the less important
// cluster and gets C - (C - C * 0.5) = 3 rows; layer 0 gets the 3 it gives up: 9. Each layer
// then keeps its sink, its newest row and the top (budget - 2) of rows 1..10 by the prompt's
// summed attention (H2O's ranking within the layer).
TEST(PrefillRules, SqueezeHoldsThePromptUntilEveryLayerReportsThenCutsEachToItsBudget) {
  constexpr std::int64_t L = 2, n = 12, D = 4;
  ModelCache m(CacheConfig::parse("squeeze:source=attention,budget=6,n_sink=1,grace=1,decay=1,"
                                  "strength=1,fraction=0.5,kv_dtype=f32"),
               ModelShape{L, 1, D, 1});
  std::vector<std::vector<float>> column_mass(L, std::vector<float>(n, 0.0f));
  for (std::int64_t l = 0; l < L; ++l) {
    const KV kv(1, 1, n, D, 50 + static_cast<std::uint64_t>(l));
    const std::vector<float> q =
        test::randn(static_cast<std::size_t>(n * D), 60 + static_cast<std::uint64_t>(l), 2.0f);
    const StepView view = m.layer(l).begin_step(kv.keys(0, n), kv.values(0, n));
    const std::vector<float> probs = test::attend(view, q, 1, 0);
    for (std::int64_t s = 0; s < n; ++s) {
      for (std::int64_t r = 0; r < n; ++r)
        column_mass[static_cast<std::size_t>(l)][static_cast<std::size_t>(r)] +=
            probs[static_cast<std::size_t>(s * n + r)];
    }
    m.observe_layer_similarity(l, l == 1 ? 0.99 : 0.5);
    const AttentionRef ref{probs.data(), 1, 1, n, n};
    m.layer(l).end_step(&ref);
    if (l == 0) {
      EXPECT_EQ(m.layer(0).tokens_kept(), n) << "layer 0 holds the prompt until layer 1 reports";
    }
  }
  EXPECT_EQ(m.layer_budgets(), (std::vector<std::int64_t>{9, 3}));
  for (std::int64_t l = 0; l < L; ++l) {
    const std::int64_t budget = l == 0 ? 9 : 3;
    const auto& mass = column_mass[static_cast<std::size_t>(l)];
    std::vector<std::int32_t> candidates;
    for (std::int32_t r = 1; r < n - 1; ++r) candidates.push_back(r);
    std::sort(candidates.begin(), candidates.end(), [&](std::int32_t a, std::int32_t b) {
      return mass[static_cast<std::size_t>(a)] > mass[static_cast<std::size_t>(b)];
    });
    std::vector<std::int32_t> want = {0, static_cast<std::int32_t>(n - 1)};
    want.insert(want.end(), candidates.begin(), candidates.begin() + (budget - 2));
    std::sort(want.begin(), want.end());
    EXPECT_EQ(kept(m.layer(l)), want) << "layer " << l;
  }
}

// Every method with a score source, fed a prompt as one chunk with true attention and then
// decoded token by token: after each step every head holds min(tokens seen, budget) rows (the
// method's own rule for snapkv, which grows while decoding, and chunkkv, which evicts whole
// chunks), sinks first, in position order (for dropping methods); the same inputs give the same
// state.
TEST(PrefillRules, EveryAttentionMethodHoldsItsBudgetAfterAPrefillDecision) {
  KV kv(1, 2, 90, 8, 70);
  const std::vector<float> q = test::randn(static_cast<std::size_t>(4 * 90 * 8), 71);
  for (const std::string& id : method_ids()) {
    const CacheConfig probe(id);
    if (!probe.has("source") || !has_token_budget(probe)) continue;
    if (probe.has("score") && probe.get_enum("score") == "key_norm") continue;
    // Uniform budgets (criticaladakv's head-wise default off: test_conformance's head-wise
    // contracts cover it).
    const std::string uniform = probe.has("headwise") ? ",headwise=false" : "";
    const CacheConfig config =
        with_token_budget(CacheConfig::parse(id + ":source=attention" + uniform), 40);
    const MethodInfo& m = find_method(id);
    LayerCache a(config, LayerShape{2, 8, 4, 0, 1}), b(config, LayerShape{2, 8, 4, 0, 1});
    test::feed_attention(a, kv, q, 4, 60, 0, 60);
    test::feed_attention(b, kv, q, 4, 60, 0, 60);
    for (std::int64_t t = 60; t < 90; ++t) {
      test::feed_attention(a, kv, q, 4, 1, t, t + 1);
      test::feed_attention(b, kv, q, 4, 1, t, t + 1);
      const std::int64_t want = m.prefill_only ? 40 + (t + 1 - 60) : 40;
      for (std::int64_t h = 0; h < 2; ++h) {
        const HeadRows r = a.stored(0, h);
        if (m.head_types) {  // a streaming head (2) holds the budget, any other every row
          EXPECT_EQ(r.n_rows, a.head_types()[static_cast<std::size_t>(h)] == 2 ? 40 : t + 1)
              << id << " t " << t;
        } else if (m.all_or_window) {  // every row (a busy layer), or the window
          EXPECT_TRUE(r.n_rows == 40 || r.n_rows == t + 1) << id << " t " << t << ": " << r.n_rows;
        } else if (m.exact_budget) {
          EXPECT_EQ(r.n_rows, want) << id << " t " << t;
        } else {
          EXPECT_LE(r.n_rows, 40) << id << " t " << t;
        }
        // A merge moves the survivor to the newer position, so only dropping methods keep
        // their rows' positions increasing.
        const bool merges = config.has("merge") && config.get_enum("merge") != "drop";
        for (std::int64_t i = 1; i < r.n_rows && !merges; ++i) {
          ASSERT_LT(r.positions[i - 1], r.positions[i]) << id;
        }
        for (std::int64_t i = 0; i < r.n_rows; ++i) ASSERT_LE(r.positions[i], t) << id;
        if (config.has("n_sink")) {
          for (std::int64_t i = 0; i < config.get_int("n_sink"); ++i)
            EXPECT_EQ(r.positions[i], i) << id;
        }
      }
    }
    EXPECT_TRUE(test::snapshot(a, 1, 2) == test::snapshot(b, 1, 2)) << id << ": not deterministic";
  }
}

}  // namespace
}  // namespace vq
