// The attention score source (issue 6): hand-computed cases for each method's paper variant.
#include <gtest/gtest.h>

#include <map>

#include "attention_util.h"
#include "policies/policy.h"
#include "base/rng.h"
#include "test_util.h"

namespace vq {
namespace {

using test::KV;

// Steps one batch row / one KV head / Hq query heads through `probs_per_step`: step i feeds
// tokens [t, t + S_i) with S_i = probs.size() / (Hq * R_i) rows given as [Hq][S_i][R_i].
struct Step {
  std::int64_t S;
  std::vector<float> probs;  // [Hq][S][R]
};

void run_steps(LayerCache& c, const KV& kv, std::int64_t Hq, const std::vector<Step>& steps) {
  std::int64_t t = 0;
  for (const Step& s : steps) {
    const StepView view = c.begin_step(kv.keys(t, s.S), kv.values(t, s.S));
    ASSERT_EQ(static_cast<std::int64_t>(s.probs.size()), kv.B * Hq * s.S * view.n_rows());
    const AttentionRef ref{s.probs.data(), kv.B, Hq, s.S, view.n_rows()};
    c.end_step(&ref);
    t += s.S;
  }
}

std::vector<std::int32_t> positions_of(const LayerCache& c, std::int64_t h = 0) {
  const HeadRows r = c.stored(0, h);
  return std::vector<std::int32_t>(r.positions, r.positions + r.n_rows);
}

LayerCache make(const std::string& spec, std::int64_t H, std::int64_t Hq, std::int64_t D) {
  return LayerCache(CacheConfig::parse(spec), LayerShape{H, D, Hq, 0, 1});
}

TEST(AttentionSource, H2OAccumulatesExactlyTheGivenProbabilities) {
  KV kv(1, 1, 4, 2, 1);
  for (float decay : {1.0f, 0.5f}) {
    LayerCache c = make("h2o:source=attention,budget=10,n_sink=0,grace=0,kv_dtype=f32,decay=" +
                            std::to_string(decay), 1, 1, 2);
    run_steps(c, kv, 1,
              {{1, {1.0f}},
               {1, {0.3f, 0.7f}},
               {2, {0.2f, 0.3f, 0.5f, 0.0f, /* token 3: */ 0.1f, 0.1f, 0.4f, 0.4f}}});
    std::vector<float> want = {1.0f};
    auto add = [&](std::vector<float> a) {
      want.push_back(0.0f);
      for (std::size_t i = 0; i < want.size(); ++i) want[i] = want[i] * decay + a[i];
    };
    want = {1.0f};
    add({0.3f, 0.7f});
    add({0.2f, 0.3f, 0.5f});
    add({0.1f, 0.1f, 0.4f, 0.4f});
    EXPECT_EQ(c.row_scores(0, 0), want) << "decay " << decay;
  }
}

TEST(AttentionSource, EachGqaReduceRule) {
  // Hq = 4 over Hkv = 2: KV head 0 folds query heads 0 and 1, KV head 1 heads 2 and 3.
  KV kv(1, 2, 2, 4, 2);
  const std::vector<float> first(4, 1.0f);  // token 0: every head attends to itself
  const std::vector<float> second = {0.2f, 0.8f, 0.6f, 0.4f, 0.5f, 0.5f, 0.9f, 0.1f};
  const std::map<std::string, std::vector<std::vector<float>>> want = {
      {"mean", {{1.0f + 0.4f, 0.6f}, {1.0f + 0.7f, 0.3f}}},
      {"max", {{1.0f + 0.6f, 0.8f}, {1.0f + 0.9f, 0.5f}}},
      {"sum", {{2.0f + 0.8f, 1.2f}, {2.0f + 1.4f, 0.6f}}},
  };
  for (const auto& [rule, expected] : want) {
    LayerCache c = make("h2o:source=attention,budget=10,n_sink=0,grace=0,decay=1,gqa_reduce=" + rule, 2, 4, 4);
    run_steps(c, kv, 4, {{1, first}, {1, second}});
    for (std::int64_t h = 0; h < 2; ++h) {
      const auto got = c.row_scores(0, h);
      ASSERT_EQ(got.size(), 2u);
      EXPECT_FLOAT_EQ(got[0], expected[static_cast<std::size_t>(h)][0]) << rule << " head " << h;
      EXPECT_FLOAT_EQ(got[1], expected[static_cast<std::size_t>(h)][1]) << rule << " head " << h;
    }
  }
}

// Tokens 0..4, one at a time. Cumulative attention: row 0: 2.45, 1: 1.45, 2: 0.2, 3: 0.5,
// 4: 0.4. Budget 4 with one sink: at token 4 row 2 leaves.
const std::vector<Step> kCamSteps = {{1, {1.0f}},
                                     {1, {0.5f, 0.5f}},
                                     {1, {0.45f, 0.45f, 0.1f}},
                                     {1, {0.3f, 0.3f, 0.1f, 0.3f}},
                                     {1, {0.2f, 0.2f, 0.0f, 0.2f, 0.4f}}};

TEST(CamWindow, ValuesGainVeOverMAndKeysStay) {
  KV kv(1, 1, 5, 4, 3);
  // The seed's H2O base (grace 0, decay 1), so the loser is the hand-derived row 2.
  LayerCache c = make("cam:source=attention,target=window,merge_m=2,merge_gate=false,budget=4,"
                      "n_sink=1,kv_dtype=f32,grace=0,decay=1", 1, 1, 4);
  run_steps(c, kv, 1, kCamSteps);
  EXPECT_EQ(positions_of(c), (std::vector<std::int32_t>{0, 1, 3, 4}));
  const HeadRows r = c.stored(0, 0);
  for (std::int64_t d = 0; d < 4; ++d) {
    const float ve = kv.v[2 * 4 + d];
    EXPECT_EQ(r.value(2, d), kv.v[3 * 4 + d] + ve / 2.0f) << "row 3 gains v_e / m";
    EXPECT_EQ(r.value(3, d), kv.v[4 * 4 + d] + ve / 2.0f) << "row 4 gains v_e / m";
    EXPECT_EQ(r.value(1, d), kv.v[1 * 4 + d]) << "rows before the loser are untouched";
    for (std::int64_t i = 0; i < 4; ++i) {
      EXPECT_EQ(r.key(i, d), kv.k[positions_of(c)[static_cast<std::size_t>(i)] * 4 + d])
          << "keys are never merged (merge_keys=true with target=window is rejected)";
    }
  }
  EXPECT_EQ(c.stats().merges, 1);
}

TEST(CamWindow, GateDrawsFromTheCounterRng) {
  // p = A_e / mean(A over the window) = 0.2 / ((0.5 + 0.4) / 2); the first draw of stream
  // (seed, layer 0, kv head 0) decides.
  KV kv(1, 1, 5, 4, 3);
  const float p = 0.2f / ((0.5f + 0.4f) / 2.0f);
  int merged = 0;
  for (int seed = 0; seed < 20; ++seed) {
    LayerCache c = make("cam:source=attention,target=window,merge_m=2,budget=4,n_sink=1,"
                        "kv_dtype=f32,grace=0,decay=1,merge_attention=cumulative,seed=" + std::to_string(seed), 1, 1, 4);
    run_steps(c, kv, 1, kCamSteps);
    const bool expect = CounterRng(static_cast<std::uint64_t>(seed), 0, 0).uniform(0) < p;
    EXPECT_EQ(c.stats().merges, expect ? 1 : 0) << "seed " << seed;
    merged += expect;
    const float ve = kv.v[2 * 4];
    EXPECT_EQ(c.stored(0, 0).value(2, 0), kv.v[3 * 4] + (expect ? ve / 2.0f : 0.0f));
  }
  EXPECT_GT(merged, 0);
  EXPECT_LT(merged, 20);
  // With the current query's attention the loser got 0: p = 0, never merged.
  LayerCache c = make("cam:source=attention,target=window,merge_m=2,budget=4,n_sink=1,"
                      "merge_attention=current,kv_dtype=f32,grace=0,decay=1", 1, 1, 4);
  run_steps(c, kv, 1, kCamSteps);
  EXPECT_EQ(c.stats().merges, 0);
}

TEST(CamWindow, WindowGateProbabilityFormula) {
  const float w[] = {0.5f, 0.4f};
  EXPECT_FLOAT_EQ(detail::window_gate_probability(0.2f, w, 2), 0.2f / 0.45f);
  EXPECT_EQ(detail::window_gate_probability(0.9f, w, 2), 1.0f);
  const float z[] = {0.0f, 0.0f};
  EXPECT_EQ(detail::window_gate_probability(0.0f, z, 2), 0.0f);  // NaN -> 0
  EXPECT_EQ(detail::window_gate_probability(0.3f, z, 2), 1.0f);  // inf -> clamped
}

TEST(MorphKVPaper, RenormalisesEachQueryOverTheCandidateColumns) {
  // Budget 3, window 2, no sinks: at token 3 the candidates are rows 0 and 1. Query 2 paid
  // [0.01, 0.04] to them (0.95 to itself), query 3 [0.3, 0.1]. Renormalised: [0.2, 0.8] and
  // [0.75, 0.25]: row 0 sums to 0.95, row 1 to 1.05, so row 0 leaves (raw sums would have
  // evicted row 1).
  KV kv(1, 1, 4, 2, 4);
  for (const char* fusion : {"sum", "mean", "max"}) {
    LayerCache c = make(std::string("morphkv:source=attention,budget=3,n_sink=0,window=2,kv_dtype=f32,fusion=") + fusion, 1, 1, 2);
    run_steps(c, kv, 1,
              {{1, {1.0f}}, {1, {0.5f, 0.5f}}, {1, {0.01f, 0.04f, 0.95f}}, {1, {0.3f, 0.1f, 0.3f, 0.3f}}});
    // max: row 0: max(0.2, 0.75) = 0.75, row 1: max(0.8, 0.25) = 0.8: row 0 leaves too.
    EXPECT_EQ(positions_of(c), (std::vector<std::int32_t>{1, 2, 3})) << fusion;
  }
}

TEST(SnapKVPaper, UsesTheWindowsRealQueryRows) {
  // A prefill chunk of 6 tokens, window 2 (queries 4 and 5), budget 4: two of rows 0..3 stay.
  // Window mass = [0.5, 0.05, 0.1, 0.6]: kernel 1 keeps rows 0 and 3; kernel 3 (max) pools
  // to [0.5, 0.5, 0.6, 0.6] and keeps rows 2 and 3.
  KV kv(1, 1, 6, 2, 5);
  std::vector<float> probs(6 * 6, 0.0f);
  for (int s = 0; s < 4; ++s) {
    for (int r = 0; r <= s; ++r) probs[s * 6 + r] = 1.0f / static_cast<float>(s + 1);
  }
  const float q4[] = {0.3f, 0.05f, 0.05f, 0.2f, 0.4f, 0.0f};
  const float q5[] = {0.2f, 0.0f, 0.05f, 0.4f, 0.2f, 0.15f};
  for (int r = 0; r < 6; ++r) probs[4 * 6 + r] = q4[r], probs[5 * 6 + r] = q5[r];
  for (const auto& [kernel, want] : std::vector<std::pair<int, std::vector<std::int32_t>>>{
           {1, {0, 3, 4, 5}}, {3, {2, 3, 4, 5}}}) {
    LayerCache c = make("snapkv:source=attention,budget=4,obs_window=2,n_sink=0,kv_dtype=f32,kernel=" +
                            std::to_string(kernel), 1, 1, 2);
    run_steps(c, kv, 1, {{6, probs}});
    EXPECT_EQ(positions_of(c), want) << "kernel " << kernel;
  }
}

TEST(TovaPaper, OneIndexSetPerLayerFromAllQueryHeads) {
  // Budget 2, no sinks, Hkv = 2, Hq = 4. At token 2 the query heads' rows average to
  // [0.2, 0.35, 0.45]: row 0 leaves from both KV heads, though KV head 1 alone (q2, q3:
  // [0.4, 0.1, 0.5]) would have dropped row 1.
  KV kv(1, 2, 3, 2, 6);
  const std::vector<float> t2 = {0.0f, 0.6f, 0.4f, 0.0f, 0.6f, 0.4f, 0.4f, 0.1f, 0.5f, 0.4f, 0.1f, 0.5f};
  const std::vector<float> t1 = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f};
  LayerCache c = make("tova:source=attention,budget=2,n_sink=0", 2, 4, 2);
  run_steps(c, kv, 4, {{1, std::vector<float>(4, 1.0f)}, {1, t1}, {1, t2}});
  EXPECT_EQ(positions_of(c, 0), (std::vector<std::int32_t>{1, 2}));
  EXPECT_EQ(positions_of(c, 1), (std::vector<std::int32_t>{1, 2}));
}

TEST(KeyformerPaper, AccumulatesNoisySoftmaxOfLogits) {
  // One token after another with a given attention row: the accumulated score of row i gains
  // softmax((ln a + g) / tau)_i, g the row's frozen Gumbel draw.
  KV kv(1, 1, 3, 2, 7);
  LayerCache c = make("keyformer:source=attention,budget=10,n_sink=0,tau_init=2,tau_end=2,kv_dtype=f32", 1, 1, 2);
  run_steps(c, kv, 1, {{1, {1.0f}}, {1, {0.25f, 0.75f}}, {1, {0.5f, 0.2f, 0.3f}}});
  const CounterRng rng(42, 0, 0);
  std::vector<double> g;
  for (int i = 0; i < 3; ++i) g.push_back(-std::log(-std::log(rng.uniform_open(static_cast<std::uint64_t>(i)))));
  auto soft = [&](std::vector<double> a) {
    std::vector<double> x(a.size());
    double m = -INFINITY, z = 0;
    for (std::size_t i = 0; i < a.size(); ++i) x[i] = (std::log(a[i]) + g[i]) / 2.0, m = std::max(m, x[i]);
    for (auto& v : x) v = std::exp(v - m), z += v;
    for (auto& v : x) v /= z;
    return x;
  };
  const auto s1 = soft({0.25, 0.75}), s2 = soft({0.5, 0.2, 0.3});
  const std::vector<double> want = {1.0 + s1[0] + s2[0], s1[1] + s2[1], s2[2]};
  const auto got = c.row_scores(0, 0);
  ASSERT_EQ(got.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(got[static_cast<std::size_t>(i)], want[static_cast<std::size_t>(i)], 1e-5) << i;
}

TEST(SqueezePaper, EngineSimilarityDecidesTheBudgets) {
  // Layer 2 barely changes its hidden state (cosine 0.99): it is the least important and
  // gives budget to layers 0 and 1 (cosine 0.5).
  ModelCache m(CacheConfig::parse("squeeze:source=attention,budget=16,grace=2"), ModelShape{3, 1, 8, 1});
  KV kv(1, 1, 40, 8, 8);
  const std::vector<float> q = test::randn(40 * 8, 9);
  for (std::int64_t t = 0; t < 40; ++t) {
    for (std::int64_t l = 0; l < 3; ++l) {
      m.observe_layer_similarity(l, l == 2 ? 0.99 : 0.5);
      test::feed_attention(m.layer(l), kv, q, 1, 1, t, t + 1);
    }
  }
  const auto b = m.layer_budgets();
  EXPECT_EQ(b[0] + b[1] + b[2], 48);
  EXPECT_LT(b[2], 16);
  EXPECT_LE(std::abs(b[0] - b[1]), 1);
  test::expect_error([&] { m.observe_layer_similarity(3, 0.5); }, ErrorCode::kInvalidArgument,
                     {"layer must be in [0, 2], got 3"});
  test::expect_error([&] { m.observe_layer_similarity(0, NAN); }, ErrorCode::kInvalidArgument,
                     {"finite"});
}

const std::vector<std::string> kAttentionMethods = {
    "h2o:source=attention",          "tova:source=attention",
    "snapkv:source=attention",       "pyramidkv:source=attention",
    "squeeze:source=attention",      "chunkkv:source=attention",
    "keyformer:source=attention",    "morphkv:source=attention",
    "cam:source=attention",          "cam:source=attention,target=window",
    "h2o:source=attention,gqa_reduce=max,merge=sim_weighted"};

TEST(AttentionSource, MissingProbabilitiesAreAClearErrorAndTheStepStaysOpen) {
  KV kv(1, 2, 4, 8, 10);
  LayerCache c = make("h2o:source=attention,budget=64", 2, 2, 8);
  test::expect_error([&] { c.update(kv.keys(0, 2), kv.values(0, 2)); }, ErrorCode::kInvalidArgument,
                     {"[h2o] source=attention needs the attention probabilities"});
  EXPECT_EQ(c.tokens_seen(), 0) << "update() must fail before touching the cache";
  const StepView view = c.begin_step(kv.keys(0, 2), kv.values(0, 2));
  test::expect_error([&] { c.end_step(); }, ErrorCode::kInvalidArgument, {"end_step(&probs)"});
  EXPECT_TRUE(c.step_open());
  const std::vector<float> q = test::randn(2 * 2 * 8, 11);
  const auto probs = test::attend(view, q, 2, 0);
  const AttentionRef ref{probs.data(), 1, 2, 2, 2};
  EXPECT_NO_THROW(c.end_step(&ref));
}

TEST(AttentionSource, EveryMethodEqualsFullWhenItsBudgetCoversAllTokensAndIsDeterministic) {
  KV kv(1, 2, 60, 16, 12);
  const std::vector<float> q = test::randn(4 * 60 * 16, 13);
  for (const auto& spec : kAttentionMethods) {
    for (std::int64_t chunk : {1, 20}) {
      CacheConfig config = with_token_budget(CacheConfig::parse(spec), 64);
      LayerCache a(config, LayerShape{2, 16, 4, 0, 1}), b(config, LayerShape{2, 16, 4, 0, 1});
      LayerCache full = make("full", 2, 4, 16);
      test::feed_attention(a, kv, q, 4, chunk);
      test::feed_attention(b, kv, q, 4, chunk);
      test::feed_attention(full, kv, q, 4, chunk);
      EXPECT_TRUE(test::snapshot(a, 1, 2) == test::snapshot(full, 1, 2)) << spec;
      // Over budget: the budget holds and two runs agree bit for bit.
      CacheConfig small = with_token_budget(CacheConfig::parse(spec), 40);
      LayerCache c(small, LayerShape{2, 16, 4, 0, 1}), d(small, LayerShape{2, 16, 4, 0, 1});
      test::feed_attention(c, kv, q, 4, chunk);
      test::feed_attention(d, kv, q, 4, chunk);
      EXPECT_TRUE(test::snapshot(c, 1, 2) == test::snapshot(d, 1, 2)) << spec;
      if (find_method(small.method()).exact_budget && !(find_method(small.method()).prefill_only && chunk == 1)) {
        EXPECT_EQ(c.tokens_kept(), 40) << spec << " chunk " << chunk;
      }
    }
  }
}

TEST(AttentionSource, KeyNormChunksRejectTheAttentionSource) {
  test::expect_error([] { CacheConfig::parse("chunkkv:score=key_norm,source=attention"); },
                     ErrorCode::kInvalidConfig, {"source=attention applies to chunkkv_score=attn_mass"});
}

}  // namespace
}  // namespace vq
