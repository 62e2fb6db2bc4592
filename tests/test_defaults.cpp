// Usable defaults (issue 9): recent windows derived from the budget, one budget key, the
// `auto` score source, keyformer's decode-step annealing, and no field that silently does
// nothing. Expected values are derived by hand in the comments, not read from the code.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "test_util.h"
#include "veloxquant/builder.h"

namespace vq {
namespace {

using test::expect_error;
using test::KV;

// Feeds kv token by token through begin_step/end_step, passing uniform attention
// probabilities (1 / R over the R view rows) for every query head when `with_probs`.
void feed_steps(LayerCache& c, const KV& kv, std::int64_t t0, std::int64_t t1, bool with_probs,
                std::int64_t chunk = 1) {
  for (std::int64_t t = t0; t < t1; t += chunk) {
    const std::int64_t n = std::min(chunk, t1 - t);
    const StepView view = c.begin_step(kv.keys(t, n), kv.values(t, n));
    const std::int64_t R = view.n_rows(), Hq = c.shape().n_kv_heads;
    std::vector<float> probs(static_cast<std::size_t>(kv.B * Hq * n * R),
                             1.0f / static_cast<float>(R));
    AttentionRef a{probs.data(), kv.B, Hq, n, R};
    if (with_probs) {
      c.end_step(&a);
    } else {
      c.end_step();
    }
  }
}

// --- recent windows derived from the budget --------------------------------------------------

struct WindowCase {
  std::string derived;    // default window
  std::string explicit_;  // the same window written out, computed by hand
};

class DerivedWindow : public ::testing::TestWithParam<WindowCase> {};

TEST_P(DerivedWindow, EqualsTheHandComputedExplicitWindow) {
  const WindowCase& w = GetParam();
  KV kv(1, 2, 150, 8, 21);
  LayerCache a = test::make_cache(w.derived), b = test::make_cache(w.explicit_);
  test::feed(a, kv, 1);
  test::feed(b, kv, 1);
  EXPECT_TRUE(test::snapshot(a, 1, 2) == test::snapshot(b, 1, 2)) << w.derived;
}

INSTANTIATE_TEST_SUITE_P(
    Methods, DerivedWindow,
    ::testing::Values(
        // floor(0.5 * (64 - 4)) = 30
        WindowCase{"h2o:budget=64", "h2o:budget=64,grace=30"},
        WindowCase{"cam:budget=64", "cam:budget=64,grace=30"},
        WindowCase{"squeeze:budget=64", "squeeze:budget=64,grace=30"},
        // floor(0.5 * (33 - 2)) = 15
        WindowCase{"h2o:budget=33,n_sink=2", "h2o:budget=33,n_sink=2,grace=15"},
        // floor(0.25 * (40 - 0)) = 10
        WindowCase{"h2o:budget=40,n_sink=0,recent_ratio=0.25", "h2o:budget=40,n_sink=0,grace=10"},
        // keyformer: floor(0.3 * (64 - 4)) = 18
        WindowCase{"keyformer:budget=64", "keyformer:budget=64,recent=18"},
        // chunkkv leaves room for one chunk: floor(0.5 * (64 - 4 - 8 + 1)) = 26
        WindowCase{"chunkkv:budget=64", "chunkkv:budget=64,grace=26"}));

TEST(DerivedWindowGuard, ARatioOfOneNamesTheDerivation) {
  // floor(1 * (10 - 4)) = 6 and 4 + 6 is not < 10.
  expect_error([] { CacheConfig::parse("h2o:budget=10,recent_ratio=1"); },
               ErrorCode::kInvalidConfig,
               {"h2o_n_sink + h2o_grace must be < h2o_budget (10), got 4 + 6 = 10",
                "h2o_grace = -1: floor(h2o_recent_ratio 1 x (h2o_budget - h2o_n_sink)) = 6"});
  // Every default keeps a valid window down to the smallest budget its sinks allow.
  for (const char* id : {"h2o", "cam", "pyramidkv", "squeeze", "keyformer"}) {
    EXPECT_NO_THROW(with_token_budget(CacheConfig(id), 5)) << id;
  }
}

TEST(DerivedWindow, TheWindowProtectsTheNewestRows) {
  // budget 12, no sinks: floor(0.5 * 12) = 6 newest rows are always kept.
  KV kv(1, 1, 60, 8, 5);
  LayerCache c = test::make_cache("h2o:budget=12,n_sink=0");
  for (std::int64_t t = 0; t < 60; ++t) {
    c.update(kv.keys(t, 1), kv.values(t, 1));
    const HeadRows r = c.stored(0, 0);
    std::int64_t recent = 0;
    for (std::int64_t i = 0; i < r.n_rows; ++i) recent += r.positions[i] > t - 6 ? 1 : 0;
    EXPECT_EQ(recent, std::min<std::int64_t>(t + 1, 6)) << "after token " << t;
  }
}

// The family's exact reductions hold on the defaults too: both sides derive the same window
// (by hand: floor(0.5 x (24 - 4)) = 10; chunkkv with chunk_size 1: floor(0.5 x (24 - 4 - 1 + 1))
// = 10; keyformer: floor(0.3 x (24 - 4)) = 6) and use the same decay.
TEST(DefaultReductions, FamilyMembersReduceToH2OWithTheSameDefaults) {
  KV kv(1, 1, 150, 16, 41);
  auto same = [&](const std::string& a, const std::string& b) {
    LayerCache x = test::make_cache(a), y = test::make_cache(b);
    test::feed(x, kv, 1);
    test::feed(y, kv, 1);
    EXPECT_TRUE(test::snapshot(x, 1, 1) == test::snapshot(y, 1, 1)) << a << " vs " << b;
  };
  same("chunkkv:budget=24,chunk_size=1", "h2o:budget=24");
  same("keyformer:budget=24,tau_init=0,tau_end=0", "h2o:budget=24,grace=6,decay=1");
  same("cam:budget=24,merge=drop", "h2o:budget=24");
  ModelCache p(CacheConfig::parse("pyramidkv:budget=24,beta=1"), ModelShape{3, 1, 16, 0});
  ModelCache s(CacheConfig::parse("squeeze:budget=24,strength=0"), ModelShape{3, 1, 16, 0});
  ModelCache h(CacheConfig::parse("h2o:budget=24"), ModelShape{3, 1, 16, 0});
  // Driven as an engine does: each token goes through every layer in turn (squeeze holds its
  // rows until every layer has reported, then cuts each layer once).
  for (std::int64_t t = 0; t < 150; ++t) {
    for (std::int64_t l = 0; l < 3; ++l) {
      test::feed(p.layer(l), kv, 1, t, t + 1);
      test::feed(s.layer(l), kv, 1, t, t + 1);
      test::feed(h.layer(l), kv, 1, t, t + 1);
    }
  }
  for (std::int64_t l = 0; l < 3; ++l) {
    EXPECT_TRUE(test::snapshot(p.layer(l), 1, 1) == test::snapshot(h.layer(l), 1, 1)) << l;
    EXPECT_TRUE(test::snapshot(s.layer(l), 1, 1) == test::snapshot(h.layer(l), 1, 1)) << l;
  }
}

// --- one budget key -----------------------------------------------------------------------

TEST(BudgetKey, EveryMethodWithABudgetTakesBudget) {
  for (const auto& m : registry()) {
    const std::string spec = m.id + ":budget=64";
    if (m.budget_field.empty()) {
      expect_error([&] { CacheConfig::parse(spec); }, ErrorCode::kInvalidSpec,
                   {"unknown key 'budget'"});
      continue;
    }
    EXPECT_EQ(token_budget(CacheConfig::parse(spec)), 64) << spec;
  }
}

TEST(BudgetKey, StreamingLLMBudgetIsSinksPlusWindow) {
  EXPECT_EQ(CacheConfig::parse("streaming_llm:budget=64").get_int("stream_window_size"), 60);
  // Applied after the other keys, whatever their order: 64 - 2 = 62.
  EXPECT_EQ(CacheConfig::parse("streaming_llm:budget=64,n_sink=2").get_int("stream_window_size"),
            62);
  EXPECT_EQ(CacheConfig::parse("streaming_llm:n_sink=2,budget=64").get_int("stream_window_size"),
            62);
  expect_error([] { CacheConfig::parse("streaming_llm:budget=64,window_size=60"); },
               ErrorCode::kInvalidSpec, {"budget and stream_window_size both set the budget"});
  expect_error([] { CacheConfig::parse("streaming_llm:budget=4"); }, ErrorCode::kInvalidConfig,
               {"must be > stream_n_sink (4)"});
  expect_error([] { CacheConfig::parse("streaming_llm:budget=x"); }, ErrorCode::kInvalidSpec,
               {"budget must be an integer, got 'x'"});
  CacheConfig c("streaming_llm");
  c.set("budget", std::int64_t{20});
  EXPECT_EQ(c.get_int("stream_window_size"), 16);
}

// --- nothing silently ignored --------------------------------------------------------------

TEST(NoEffect, CombinationsThatDoNothingNameTheirFields) {
  struct Case {
    const char* spec;
    const char* fragment;
  };
  for (const Case& k : std::vector<Case>{
           {"cam:target=window,merge=sim_weighted",
            "merge=sim_weighted has no effect with merge_target=window"},
           {"cam:merge_keys=true", "merge_keys=true has no effect with merge_target=window"},
           {"cam:merge=drop,merge_gate=false", "merge_gate has no effect with merge=drop"},
           {"h2o:target=window", "merge_target has no effect with merge=drop"},
           {"h2o:merge_m=8", "merge_m has no effect with merge=drop"},
           {"h2o:merge=mean,merge_m=8", "merge_m has no effect with merge_target=nearest"},
           {"tova:merge=mean,merge_gate=false,merge_attention=current",
            "merge_attention has no effect with merge_gate=false"},
           {"h2o:source=proxy,gqa_reduce=max", "gqa_reduce has no effect with source=proxy"},
           {"h2o:grace=8,recent_ratio=0.3", "h2o_recent_ratio has no effect with h2o_grace=8"},
           {"keyformer:tau_end=2", "keyformer_tau_end has no effect with keyformer_anneal_steps=0"},
           {"keyformer:anneal_steps=50", "keyformer_anneal_steps has no effect"},
           {"chunkkv:score=key_norm,decay=0.5",
            "chunkkv_decay has no effect with chunkkv_score=key_norm"},
           {"morphkv:window=1,fusion=max", "morphkv_fusion has no effect with morphkv_window=1"},
           {"chunkkv:score=key_norm,source=proxy",
            "source has no effect with chunkkv_score=key_norm"},
       }) {
    expect_error([&] { CacheConfig::parse(k.spec); }, ErrorCode::kInvalidConfig, {k.fragment});
  }
  // The same fields in combinations where they act are accepted, and a field at its default
  // is never an error (so every config's full spec parses back).
  for (const char* ok : {"cam", "cam:merge=drop", "cam:target=nearest,merge=sim_weighted",
                         "cam:target=nearest,merge_keys=true", "h2o:merge=mean,target=window",
                         "h2o:merge=mean,target=window,merge_m=8", "h2o:gqa_reduce=max",
                         "h2o:source=attention,gqa_reduce=sum", "h2o:grace=8",
                         "h2o:recent_ratio=0.3", "keyformer:tau_init=2,tau_end=2",
                         "keyformer:tau_end=2,anneal_steps=50", "chunkkv:score=key_norm"}) {
    EXPECT_NO_THROW(CacheConfig::parse(ok)) << ok;
    const CacheConfig c = CacheConfig::parse(ok);
    EXPECT_EQ(CacheConfig::parse(c.spec(true)), c) << ok;
  }
}

TEST(PaperConfigs, EverySpecInTheColumnParses) {
  for (const auto& m : registry()) {
    ASSERT_FALSE(m.paper_config.empty()) << m.id;
    if (m.paper_config[0] != '`') continue;  // "-": not expressible, with the reason
    const std::string spec = m.paper_config.substr(1, m.paper_config.find('`', 1) - 1);
    EXPECT_EQ(spec.rfind(m.id, 0), 0u) << spec;
    EXPECT_NO_THROW(CacheConfig::parse(spec)) << spec;
  }
}

// --- score source auto -------------------------------------------------------------------

TEST(SourceAuto, ResolvesAtTheFirstStepAndMatchesTheExplicitSource) {
  KV kv(1, 2, 40, 8, 31);
  // No probabilities: the proxy, exactly as source=proxy.
  LayerCache a = test::make_cache("h2o:budget=12"),
             p = test::make_cache("h2o:budget=12,source=proxy");
  EXPECT_STREQ(a.score_source(), "auto");
  test::feed(a, kv, 1);
  test::feed(p, kv, 1);
  EXPECT_STREQ(a.score_source(), "proxy");
  EXPECT_STREQ(a.stats().score_source, "proxy");
  EXPECT_TRUE(test::snapshot(a, 1, 2) == test::snapshot(p, 1, 2));
  // Probabilities at the first step: true attention, exactly as source=attention.
  LayerCache b = test::make_cache("h2o:budget=12"),
             t = test::make_cache("h2o:budget=12,source=attention");
  feed_steps(b, kv, 0, 40, true);
  feed_steps(t, kv, 0, 40, true);
  EXPECT_STREQ(b.score_source(), "attention");
  EXPECT_TRUE(test::snapshot(b, 1, 2) == test::snapshot(t, 1, 2));
  // Uniform attention and the proxy rank rows differently here, so the two runs differ.
  EXPECT_FALSE(test::snapshot(a, 1, 2) == test::snapshot(b, 1, 2));
  // Methods that use no attention say so.
  EXPECT_STREQ(test::make_cache("streaming_llm").score_source(), "none");
  EXPECT_STREQ(test::make_cache("chunkkv:score=key_norm").score_source(), "none");
}

TEST(SourceAuto, EveryMethodWithoutProbabilitiesRunsTheProxy) {
  KV kv(1, 2, 70, 8, 35);
  for (const auto& m : registry()) {
    const CacheConfig probe(m.id);
    if (!probe.has("source") || !has_token_budget(probe)) continue;
    LayerCache a(with_token_budget(probe, 40), LayerShape{2, 8, 2, 0, 1});
    CacheConfig explicit_proxy = with_token_budget(probe, 40);
    explicit_proxy.set("source", std::string("proxy"));
    LayerCache b(explicit_proxy, LayerShape{2, 8, 2, 0, 1});
    test::feed(a, kv, 5);
    test::feed(b, kv, 5);
    EXPECT_STREQ(a.stats().score_source, "proxy") << m.id;
    EXPECT_TRUE(test::snapshot(a, 1, 2) == test::snapshot(b, 1, 2)) << m.id;
  }
}

TEST(SourceAuto, ASwitchLaterIsAnErrorNamingTheSourceAndResetUnresolves) {
  KV kv(1, 2, 12, 8, 32);
  LayerCache c = test::make_cache("h2o:budget=8");
  feed_steps(c, kv, 0, 4, true);
  c.begin_step(kv.keys(4, 1), kv.values(4, 1));
  expect_error([&] { c.end_step(); }, ErrorCode::kInvalidArgument,
               {"[h2o] source=auto resolved to attention", "source=proxy", "step stays open"});
  EXPECT_TRUE(c.step_open());
  c.reset();
  EXPECT_STREQ(c.score_source(), "auto");
  test::feed(c, kv, 1, 0, 4);  // update(): proxy now
  EXPECT_STREQ(c.score_source(), "proxy");
  const StepView v = c.begin_step(kv.keys(4, 1), kv.values(4, 1));
  std::vector<float> probs(static_cast<std::size_t>(2 * v.n_rows()), 0.2f);
  AttentionRef a{probs.data(), 1, 2, 1, v.n_rows()};
  expect_error([&] { c.end_step(&a); }, ErrorCode::kInvalidArgument,
               {"[h2o] source=auto resolved to proxy", "source=attention"});
  EXPECT_TRUE(c.step_open());
}

// --- keyformer anneals over decode steps -------------------------------------------------

TEST(KeyformerAnneal, APromptChunkUsesTauInitAndDecodeStepsRaiseIt) {
  // tau_init = 0 and a steep rise: the prompt (one chunk, no decode step yet) and the first
  // decode step (0 earlier decode steps) both run at tau = 0, so they match the noiseless
  // tau = 0 cache exactly; with tau following absolute positions (30 and more here) the noise
  // would already be large.
  KV kv(1, 2, 31, 8, 33);
  const std::string base = "keyformer:budget=12,n_sink=1,recent=2,kv_dtype=f32,";
  LayerCache annealed = test::make_cache(base + "tau_init=0,tau_end=50,anneal_steps=4");
  LayerCache flat = test::make_cache(base + "tau_init=0,tau_end=0");
  test::feed(annealed, kv, 30, 0, 30);
  test::feed(flat, kv, 30, 0, 30);
  EXPECT_TRUE(test::snapshot(annealed, 1, 2) == test::snapshot(flat, 1, 2));
  test::feed(annealed, kv, 1, 30, 31);
  test::feed(flat, kv, 1, 30, 31);
  EXPECT_TRUE(test::snapshot(annealed, 1, 2) == test::snapshot(flat, 1, 2));
  // Later decode steps run at tau = 50 * k / 4: the noise now decides, so the sets part.
  KV more(1, 2, 80, 8, 34);
  bool differs = false;
  for (std::int64_t t = 0; t < 80 && !differs; ++t) {
    annealed.update(more.keys(t, 1), more.values(t, 1));
    flat.update(more.keys(t, 1), more.values(t, 1));
    differs = !(test::snapshot(annealed, 1, 2) == test::snapshot(flat, 1, 2));
  }
  EXPECT_TRUE(differs);
  // reset() restarts the schedule.
  annealed.reset();
  flat.reset();
  test::feed(annealed, kv, 30, 0, 30);
  test::feed(flat, kv, 30, 0, 30);
  EXPECT_TRUE(test::snapshot(annealed, 1, 2) == test::snapshot(flat, 1, 2));
}

}  // namespace
}  // namespace vq
