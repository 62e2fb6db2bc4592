// Head-wise budgets (headwise=true, AdaKV's rule): a hand-derived case, the floor, validation,
// and per-layer budgets shared among heads in a ModelCache.
#include <gtest/gtest.h>

#include <numeric>

#include "attention_util.h"
#include "test_util.h"
#include "veloxquant/registry.h"

namespace vq {
namespace {

using test::KV;

// Runs one step of `n` tokens on a 2-KV-head, 2-query-head cache with the given attention:
// probs[h][j] is query j's distribution over head h's own rows (shorter than R when that head
// holds fewer rows); columns past a head's rows are 0, as AttentionRef requires.
void step(LayerCache& c, const KV& kv, std::int64_t t, std::int64_t n,
          const std::vector<std::vector<std::vector<float>>>& probs) {
  const StepView view = c.begin_step(kv.keys(t, n), kv.values(t, n));
  const std::int64_t R = view.n_rows();
  std::vector<float> a(static_cast<std::size_t>(2 * n * R), 0.0f);
  for (std::int64_t h = 0; h < 2; ++h) {
    ASSERT_EQ(static_cast<std::int64_t>(probs[h].size()), n);
    for (std::int64_t j = 0; j < n; ++j) {
      const auto& row = probs[h][j];
      ASSERT_LE(static_cast<std::int64_t>(row.size()), view.head(0, h).n_rows);
      for (std::size_t r = 0; r < row.size(); ++r) a[(h * n + j) * R + r] = row[r];
    }
  }
  const AttentionRef ref{a.data(), 1, 2, n, R};
  c.end_step(&ref);
}

std::vector<std::int32_t> positions(const LayerCache& c, std::int64_t h) {
  const HeadRows r = c.stored(0, h);
  return std::vector<std::int32_t>(r.positions, r.positions + r.n_rows);
}

LayerCache h2o_cache(const std::string& extra) {
  // Cumulative mass without decay, no sinks, no recent window: the scores are the column sums
  // of the attention, so the allocation can be derived by hand.
  return LayerCache(
      CacheConfig::parse("h2o:budget=3,n_sink=0,grace=0,decay=1,source=attention" + extra),
      LayerShape{2, 4, 2, 0, 1});
}

// Head 0 is concentrated (row 0 takes 0.9 of every query), head 1 is spread.
const std::vector<std::vector<std::vector<float>>> kFour = {
    {{1.0f}, {0.9f, 0.1f}, {0.9f, 0.05f, 0.05f}, {0.9f, 0.04f, 0.03f, 0.03f}},
    {{1.0f}, {0.5f, 0.5f}, {0.3f, 0.3f, 0.4f}, {0.25f, 0.25f, 0.25f, 0.25f}}};

TEST(Headwise, HandDerivedAllocationAndDecodeStep) {
  // 2 KV heads, budget 3 (the layer keeps 6 rows), floor alpha = 0.5: each head keeps at least
  // floor(0.5 x (3 - 0 protected)) = 1 row.
  KV kv(1, 2, 5, 4, 41);
  LayerCache c = h2o_cache(",headwise=true,headwise_floor=0.5");
  // Prefill of 4 tokens (one decision). Column sums:
  //   head 0: r0 1 + .9 + .9 + .9 = 3.7, r1 .1 + .05 + .04 = .19, r2 .05 + .03 = .08, r3 .03
  //   head 1: r0 1 + .5 + .3 + .25 = 2.05, r1 .5 + .3 + .25 = 1.05, r2 .4 + .25 = .65, r3 .25
  // 8 rows, 6 kept, 2 leave. Floor: head 0 keeps r0, head 1 keeps r0. The other 6 candidates
  // compete for the 4 remaining slots; the two lowest, head 0's r3 (.03) and r2 (.08), leave.
  // Head 0 keeps {0, 1}, head 1 keeps {0, 1, 2, 3} (uniform budgets: {0, 1, 2} each).
  step(c, kv, 0, 4, kFour);
  EXPECT_EQ(positions(c, 0), (std::vector<std::int32_t>{0, 1}));
  EXPECT_EQ(positions(c, 1), (std::vector<std::int32_t>{0, 1, 2, 3}));
  // Decode token 4: head 0's view has 3 rows {0, 1, 4}, head 1's 5 rows; R = 5.
  {
    const StepView view = c.begin_step(kv.keys(4, 1), kv.values(4, 1));
    EXPECT_EQ(view.n_rows(), 5);
    EXPECT_EQ(view.head(0, 0).n_rows, 3);
    EXPECT_EQ(view.head(0, 1).n_rows, 5);
    EXPECT_EQ(view.head(0, 0).positions[2], 4);
    EXPECT_EQ(view.head(0, 1).positions[4], 4);
    // head 0: [.2, .1, .7] over {0, 1, 4}, then zeros; head 1: [.1, .1, .1, .1, .6].
    std::vector<float> a = {0.2f, 0.1f, 0.7f, 0.0f, 0.0f, 0.1f, 0.1f, 0.1f, 0.1f, 0.6f};
    const AttentionRef ref{a.data(), 1, 2, 1, 5};
    c.end_step(&ref);
  }
  // Masses: head 0: r0 3.9, r1 .29, r4 .7; head 1: r0 2.15, r1 1.15, r2 .75, r3 .35, r4 .6.
  // 8 rows, 6 kept. Floor: r0 of each head. Pool: {.29 h0r1, .7 h0r4, 1.15, .75, .35 h1r3,
  // .6 h1r4}: the two lowest, head 0's r1 (.29) and head 1's r3 (.35), leave.
  EXPECT_EQ(positions(c, 0), (std::vector<std::int32_t>{0, 4}));
  EXPECT_EQ(positions(c, 1), (std::vector<std::int32_t>{0, 1, 2, 4}));
  const std::vector<float> s0 = c.row_scores(0, 0);
  ASSERT_EQ(s0.size(), 2u);
  EXPECT_NEAR(s0[0], 3.9f, 1e-5f);
  EXPECT_NEAR(s0[1], 0.7f, 1e-5f);
  EXPECT_EQ(c.budget(), 3);
}

// Five prompt tokens; head 0 concentrated, head 1 spread. Column sums:
//   head 0: r0 1 + .9 x 4 = 4.6, r1 .1 + .05 + .04 + .01 = .2, r2 .05 + .03 + .02 = .1,
//           r3 .03 + .03 = .06, r4 .04
//   head 1: r0 1 + .5 + .3 + .25 + .2 = 2.25, r1 .5 + .3 + .25 + .2 = 1.25, r2 .4 + .25 + .2 = .85,
//           r3 .25 + .1 = .35, r4 .3
const std::vector<std::vector<std::vector<float>>> kFive = {{{1.0f},
                                                             {0.9f, 0.1f},
                                                             {0.9f, 0.05f, 0.05f},
                                                             {0.9f, 0.04f, 0.03f, 0.03f},
                                                             {0.9f, 0.01f, 0.02f, 0.03f, 0.04f}},
                                                            {{1.0f},
                                                             {0.5f, 0.5f},
                                                             {0.3f, 0.3f, 0.4f},
                                                             {0.25f, 0.25f, 0.25f, 0.25f},
                                                             {0.2f, 0.2f, 0.2f, 0.1f, 0.3f}}};

TEST(Headwise, TheFloorBindsAConcentratedHead) {
  KV kv(1, 2, 5, 4, 42);
  // 10 rows, 6 kept, 4 leave.
  // No floor (alpha 0): one ranking of all 10; the 4 lowest are all head 0's (.04, .06, .1, .2):
  // head 0 keeps only {0}, head 1 all 5.
  LayerCache none = h2o_cache(",headwise=true,headwise_floor=0");
  step(none, kv, 0, 5, kFive);
  EXPECT_EQ(positions(none, 0), (std::vector<std::int32_t>{0}));
  EXPECT_EQ(positions(none, 1), (std::vector<std::int32_t>{0, 1, 2, 3, 4}));
  // alpha 0.67: floor(0.67 x 3) = 2 rows per head: head 0 keeps r0, r1 and head 1 r0, r1 first;
  // 2 slots remain for {h0: .1, .06, .04; h1: .85, .35, .3}: .85 and .35 stay.
  LayerCache floor2 = h2o_cache(",headwise=true,headwise_floor=0.67");
  step(floor2, kv, 0, 5, kFive);
  EXPECT_EQ(positions(floor2, 0), (std::vector<std::int32_t>{0, 1}));
  EXPECT_EQ(positions(floor2, 1), (std::vector<std::int32_t>{0, 1, 2, 3}));
  // alpha 1: every head keeps floor(3) = 3, the uniform split, as headwise=false does.
  LayerCache even = h2o_cache(",headwise=true,headwise_floor=1");
  LayerCache uniform = h2o_cache("");
  step(even, kv, 0, 5, kFive);
  step(uniform, kv, 0, 5, kFive);
  for (std::int64_t h = 0; h < 2; ++h) {
    EXPECT_EQ(positions(even, h), (std::vector<std::int32_t>{0, 1, 2}));
    EXPECT_EQ(positions(uniform, h), (std::vector<std::int32_t>{0, 1, 2}));
  }
}

TEST(Headwise, SinksAndRecentWindowStayInEveryHead) {
  // h2o with 1 sink and a recent window of 1: each head keeps row 0 and its newest row whatever
  // the scores; the floor (alpha 0) adds nothing. Budget 3 per head, 6 for the layer: the
  // 2 x 2 protected rows stay and the 2 remaining slots go to the best other rows of both
  // heads: head 1's r1 (1.25) and r2 (.85); every other candidate of head 0 leaves.
  KV kv(1, 2, 5, 4, 43);
  LayerCache c(CacheConfig::parse("h2o:budget=3,n_sink=1,grace=1,decay=1,source=attention,"
                                  "headwise=true,headwise_floor=0"),
               LayerShape{2, 4, 2, 0, 1});
  step(c, kv, 0, 5, kFive);
  EXPECT_EQ(positions(c, 0), (std::vector<std::int32_t>{0, 4}));
  EXPECT_EQ(positions(c, 1), (std::vector<std::int32_t>{0, 1, 2, 4}));
}

TEST(Headwise, Validation) {
  auto message = [](const std::string& spec) {
    try {
      CacheConfig::parse(spec).validate();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(
      message("h2o:headwise_floor=0.3").find("headwise_floor has no effect with headwise=false"),
      std::string::npos);
  EXPECT_NE(message("h2o:headwise=true,headwise_floor=1.5").find("headwise_floor"),
            std::string::npos);
  // Methods without per-head attention rankings have no such option; those with it have it off
  // by default, with the paper's floor (which methods have it: each method's own test).
  for (const std::string& id : method_ids()) {
    if (!CacheConfig(id).has("headwise")) {
      EXPECT_NE(message(id + ":headwise=true"), "no error") << id;
      continue;
    }
    // Off by default, but where the method is head-wise by definition (criticaladakv: its
    // card's shared default).
    const bool on = find_method(id).shared_defaults.find("headwise=true") != std::string::npos;
    EXPECT_EQ(CacheConfig(id).get_bool("headwise"), on) << id << ": off by default";
    // AdaKV's alpha 0.2, but where the method's card names its own (kvzip: 0, no safeguard).
    const std::string& shared = find_method(id).shared_defaults;
    const std::size_t at = shared.find("headwise_floor=");
    const double floor = at == std::string::npos ? 0.2 : std::stod(shared.substr(at + 15));
    EXPECT_EQ(CacheConfig(id).get_float("headwise_floor"), floor) << id << ": the paper's alpha";
  }
}

TEST(Headwise, PerLayerBudgetsAreSharedAmongEachLayersHeads) {
  // pyramidkv / squeeze in a ModelCache: each layer's heads hold Hkv x that layer's budget.
  constexpr std::int64_t L = 4, H = 2, Hq = 4, D = 8, C = 16, total = 70;
  for (const std::string spec : {"pyramidkv:budget=16,source=attention,headwise=true",
                                 "squeeze:budget=16,source=attention,headwise=true"}) {
    ModelCache m(CacheConfig::parse(spec), ModelShape{L, H, D, Hq});
    std::vector<KV> kv;
    std::vector<std::vector<float>> q;
    for (std::int64_t l = 0; l < L; ++l) {
      kv.emplace_back(1, H, total, D, 600 + static_cast<std::uint64_t>(l));
      for (auto& x : kv.back().k) x *= 0.4f * static_cast<float>(l + 1);
      q.push_back(test::randn(static_cast<std::size_t>(Hq * total * D),
                              700 + static_cast<std::uint64_t>(l)));
    }
    bool unequal = false;
    for (std::int64_t t = 0; t < total;) {
      const std::int64_t n = t == 0 ? 40 : 1;
      for (std::int64_t l = 0; l < L; ++l) {
        m.observe_layer_similarity(l, l == L - 1 ? 0.99 : 0.5);
        test::feed_attention(m.layer(l), kv[static_cast<std::size_t>(l)],
                             q[static_cast<std::size_t>(l)], Hq, n, t, t + n);
      }
      t += n;
      const std::vector<std::int64_t> b = m.layer_budgets();
      EXPECT_EQ(std::accumulate(b.begin(), b.end(), std::int64_t{0}), L * C) << spec;
      for (std::int64_t l = 0; l < L; ++l) {
        const std::vector<std::int64_t> kept = m.layer(l).stats().tokens_kept_per_head;
        const std::int64_t sum = std::accumulate(kept.begin(), kept.end(), std::int64_t{0});
        EXPECT_EQ(sum, H * std::min(t, b[static_cast<std::size_t>(l)]))
            << spec << " layer " << l << " t " << t;
        unequal = unequal || kept[0] != kept[1];
      }
    }
    EXPECT_TRUE(unequal) << spec;
  }
}

}  // namespace
}  // namespace vq
