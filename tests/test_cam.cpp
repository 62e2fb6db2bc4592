// CaM: target selection, the gate, the blend, and its exact reduction to H2O.
#include <gtest/gtest.h>

#include "store/store.h"
#include "policies/policy.h"
#include "test_util.h"

namespace vq {
namespace {

using detail::find_merge_target;
using detail::merge_gate_probability;
using test::KV;

// Rows of keys [n][d] in fp32, as the target search reads them.
struct Rows {
  std::vector<float> k;
  std::vector<std::int32_t> pos;
  std::int64_t d;
  HeadRows ref() const {
    return HeadRows{k.data(), k.data(), pos.data(), DType::kF32,
                    static_cast<std::int64_t>(pos.size()), d};
  }
};

std::int64_t target_of(const Rows& rows, std::int64_t n_sink, std::int64_t loser, float* cos = nullptr,
                       const std::vector<std::uint8_t>& excluded = {}) {
  std::vector<std::int64_t> live(rows.pos.size());
  for (std::size_t i = 0; i < live.size(); ++i) live[i] = static_cast<std::int64_t>(i);
  std::vector<float> scratch(static_cast<std::size_t>(2 * rows.d));
  float c = 0;
  const std::int64_t t = find_merge_target(rows.ref(), live.data(), static_cast<std::int64_t>(live.size()),
                                           n_sink, loser, excluded.empty() ? nullptr : excluded.data(),
                                           rows.d, &c, scratch.data());
  if (cos) *cos = c;
  return t;
}

TEST(CamTarget, MostCosineSimilarNonSinkSurvivor) {
  // Row 0 (a sink) is the most similar to the loser (row 4), but sinks are never targets.
  Rows r{{0.06f, 1.0f, /*1*/ 0.0f, 1.0f, /*2*/ 1.0f, 1.0f, /*3*/ -1.0f, 0.2f, /*4*/ 0.05f, 1.0f},
         {0, 1, 2, 3, 4}, 2};
  float cos = 0;
  EXPECT_EQ(target_of(r, 1, 4, &cos), 1);
  EXPECT_NEAR(cos, 1.0 / std::sqrt(1.0025), 1e-6);
  EXPECT_EQ(target_of(r, 0, 4), 0);  // without sinks row 0 wins
  // Never the loser itself, even though it is most similar to itself.
  EXPECT_NE(target_of(r, 1, 2), 2);
}

TEST(CamTarget, ExcludedRowsAreNeverTargets) {
  // When several rows leave together (chunk or top-k eviction), none is a target of another.
  Rows r{{0.06f, 1.0f, 0.0f, 1.0f, 1.0f, 1.0f, -1.0f, 0.2f, 0.05f, 1.0f}, {0, 1, 2, 3, 4}, 2};
  EXPECT_EQ(target_of(r, 1, 4, nullptr, {0, 1, 0, 0, 1}), 2);
  EXPECT_EQ(target_of(r, 1, 4, nullptr, {0, 1, 1, 1, 1}), -1);
}

TEST(CamTarget, NoneWhenOnlySinksRemain) {
  Rows r{{1, 0, 0, 1, 1, 1}, {0, 1, 2}, 2};
  EXPECT_EQ(target_of(r, 2, 2), -1);
  EXPECT_EQ(target_of(r, 3, 2), -1);
}

TEST(CamTarget, TiesGoToTheLowestIndex) {
  Rows r{{1, 0, 2, 0, 3, 0, 4, 0}, {0, 1, 2, 3}, 2};  // all parallel: cos = 1
  EXPECT_EQ(target_of(r, 1, 3), 1);
}

TEST(CamGate, Probability) {
  EXPECT_EQ(merge_gate_probability(0.0f, 1.0f), 0.0f);
  EXPECT_EQ(merge_gate_probability(1.0f, 1.0f), 1.0f);
  EXPECT_EQ(merge_gate_probability(2.0f, 1.0f), 1.0f);
  EXPECT_EQ(merge_gate_probability(0.5f, 1.0f), 0.5f);
  EXPECT_EQ(merge_gate_probability(0.0f, 0.0f), 0.0f);
  EXPECT_EQ(merge_gate_probability(0.3f, 0.0f), 1.0f);
  EXPECT_EQ(merge_gate_probability(-1.0f, 2.0f), 0.0f);
  EXPECT_EQ(merge_gate_probability(NAN, 1.0f), 0.0f);
}

// A workload where H2O (grace 1 protects the newest row) evicts rows with low but non-zero mass,
// so the gate probability is small and positive.
test::Snapshot run(const std::string& spec, const KV& kv, CacheStats* stats = nullptr) {
  LayerCache c = test::make_cache(spec);
  test::feed(c, kv, 1);
  if (stats) *stats = c.stats();
  return test::snapshot(c, 1, kv.H);
}

TEST(CamGate, BlocksMostLowScoreMergesAcrossThirtySeeds) {
  KV kv(1, 1, 60, 16, 5);
  std::int64_t gated_merges = 0, ungated_merges = 0, evictions = 0;
  for (int seed = 0; seed < 30; ++seed) {
    CacheStats on, off;
    run("h2o:budget=12,n_sink=2,grace=1,decay=1,merge=sim_weighted,merge_gate=true,seed=" +
            std::to_string(seed), kv, &on);
    run("h2o:budget=12,n_sink=2,grace=1,decay=1,merge=sim_weighted,merge_gate=false,seed=" +
            std::to_string(seed), kv, &off);
    gated_merges += on.merges;
    ungated_merges += off.merges;
    evictions += on.evictions;
    EXPECT_EQ(off.merges, off.evictions) << "gate off: every loser with a target is merged";
  }
  EXPECT_EQ(evictions, 30 * 48);
  EXPECT_LT(gated_merges * 2, ungated_merges) << "the gate let most low-score merges through";
  EXPECT_GT(gated_merges, 0) << "the gate never fired: probabilities should be positive";
}

TEST(CamGate, SeedsChangeDrawsButEachSeedIsReproducible) {
  KV kv(1, 2, 60, 16, 6);
  const std::string base = "h2o:budget=12,n_sink=2,grace=1,merge=sim_weighted,seed=";
  EXPECT_TRUE(run(base + "1", kv) == run(base + "1", kv));
  bool any_differs = false;
  for (int s = 2; s < 6; ++s) any_differs = any_differs || !(run(base + "1", kv) == run(base + std::to_string(s), kv));
  EXPECT_TRUE(any_differs);
}

TEST(Cam, DropLeavesSurvivorsUnchanged) {
  KV kv(1, 2, 80, 8, 7);
  LayerCache c = test::make_cache("cam:budget=16,merge=drop");
  test::feed(c, kv, 1);
  for (std::int64_t h = 0; h < 2; ++h) {
    const HeadRows r = c.stored(0, h);
    for (std::int64_t i = 0; i < r.n_rows; ++i) {
      const std::int64_t t = r.positions[i];
      for (std::int64_t d = 0; d < 8; ++d) {
        EXPECT_EQ(r.value(i, d), half_to_float(float_to_half(kv.v[(h * 80 + t) * 8 + d])));
        EXPECT_EQ(r.key(i, d), half_to_float(float_to_half(kv.k[(h * 80 + t) * 8 + d])));
      }
    }
  }
  EXPECT_EQ(c.stats().merges, 0);
}

TEST(Cam, MeanAndSimWeightedBlendHandCase) {
  // fp32, D = 2, budget 4, one sink, gate off. Four tokens fill the cache; the fifth is H2O's
  // loser (score 0) and merges into row 1 (keys (0,1) vs (0.05,1): the most similar non-sink).
  std::vector<float> k = {1, 0, 0, 1, 1, 1, -1, 0.2f, 0.05f, 1};
  std::vector<float> v = {1, 1, 2, 4, 3, 3, 4, 4, 10, 20};
  for (const char* mode : {"mean", "sim_weighted"}) {
    // The reference adaptation (nearest target) on the seed's H2O base (grace 0, decay 1).
    LayerCache c = test::make_cache(
        std::string("cam:budget=4,n_sink=1,grace=0,decay=1,target=nearest,merge_gate=false,"
                    "kv_dtype=f32,merge=") + mode);
    c.update(TensorRef::f32(k.data(), 1, 1, 5, 2), TensorRef::f32(v.data(), 1, 1, 5, 2));
    const HeadRows r = c.stored(0, 0);
    ASSERT_EQ(r.n_rows, 4);
    const float cos = 1.0f / std::sqrt(0.05f * 0.05f + 1.0f);
    const float w = std::string(mode) == "mean" ? 0.5f : cos;
    EXPECT_FLOAT_EQ(r.value(1, 0), (1 - w) * 2 + w * 10) << mode;
    EXPECT_FLOAT_EQ(r.value(1, 1), (1 - w) * 4 + w * 20) << mode;
    EXPECT_EQ(r.key(1, 0), 0.0f) << "keys are not merged by default";
    EXPECT_EQ(r.positions[1], 4) << "the survivor takes the later position";
    for (int i : {0, 2, 3}) EXPECT_EQ(r.value(i, 0), v[2 * i]) << "other rows untouched";
    EXPECT_EQ(c.stats().merges, 1);
  }
  // merge_keys blends keys too.
  LayerCache c = test::make_cache("cam:budget=4,n_sink=1,grace=0,decay=1,target=nearest,"
                                  "merge_gate=false,kv_dtype=f32,merge=mean,merge_keys=true");
  c.update(TensorRef::f32(k.data(), 1, 1, 5, 2), TensorRef::f32(v.data(), 1, 1, 5, 2));
  EXPECT_FLOAT_EQ(c.stored(0, 0).key(1, 0), 0.025f);
  EXPECT_FLOAT_EQ(c.stored(0, 0).key(1, 1), 1.0f);
}

TEST(Cam, WithoutKeyMergingStoredKeysEqualDrops) {
  // On the seed's degenerate base (grace 0, decay 1) the loser is always the newest row at
  // score 0, so a merge adds 0 to the target's score and the eviction sequence, hence the
  // stored keys, are those of dropping. (With a recent window a merge moves mass and later
  // evictions may differ.)
  KV kv(1, 2, 120, 16, 8);
  for (const char* gate : {"true", "false"}) {
    LayerCache merged = test::make_cache(
        std::string("cam:budget=20,grace=0,decay=1,target=nearest,merge=sim_weighted,merge_gate=") +
        gate);
    LayerCache dropped = test::make_cache("cam:budget=20,grace=0,decay=1,merge=drop");
    test::feed(merged, kv, 1);
    test::feed(dropped, kv, 1);
    const auto a = test::snapshot(merged, 1, 2), b = test::snapshot(dropped, 1, 2);
    EXPECT_EQ(a.keys, b.keys) << gate;
    if (std::string(gate) == "false") {
      EXPECT_NE(a.values, b.values) << "merging changed nothing";
    }
  }
}

TEST(Cam, DropEqualsItsH2OBaseBitForBit) {
  // cam:merge=drop is h2o with the same n_sink, grace, recent_ratio and decay: with the seed
  // library's degenerate base written out, and with both methods' defaults (the same derived
  // window, floor(0.5 x (24 - 3)) = 10, and decay 0.98).
  for (std::int64_t chunk : {1, 9}) {
    KV kv(2, 3, 140, 16, 9 + chunk);
    for (const char* fields : {",grace=0,decay=1", ""}) {
      LayerCache cam = test::make_cache(std::string("cam:budget=24,n_sink=3,merge=drop") + fields);
      LayerCache h2o = test::make_cache(std::string("h2o:budget=24,n_sink=3") + fields);
      test::feed(cam, kv, chunk);
      test::feed(h2o, kv, chunk);
      EXPECT_TRUE(test::snapshot(cam, 2, 3) == test::snapshot(h2o, 2, 3)) << fields;
    }
  }
  // A gate with nothing to merge is rejected rather than ignored.
  test::expect_error([] { CacheConfig::parse("cam:merge=drop,merge_gate=false"); },
                     ErrorCode::kInvalidConfig, {"merge_gate has no effect with merge=drop"});
}

TEST(Cam, SimWeightedHoldsTheBudgetAndMergesWithTheGateOff) {
  KV kv(1, 2, 100, 8, 12);
  LayerCache c = test::make_cache("cam:budget=10,n_sink=2,target=nearest,merge=sim_weighted,merge_gate=false");
  test::feed(c, kv, 1);
  EXPECT_EQ(c.tokens_kept(), 10);
  EXPECT_EQ(c.stats().merges, c.stats().evictions);
  EXPECT_EQ(c.stats().evictions, 2 * 90);
}

TEST(MergeComposition, OtherBasesAcceptMerging) {
  KV kv(1, 2, 100, 8, 13);
  for (const char* base : {"tova:budget=16", "streaming_llm:n_sink=4,window_size=12",
                           "morphkv:budget=16,window=4", "h2o:budget=16,grace=4"}) {
    LayerCache drop = test::make_cache(base);
    LayerCache merge = test::make_cache(std::string(base) + ",merge=sim_weighted,merge_gate=false");
    test::feed(drop, kv, 1);
    test::feed(merge, kv, 1);
    EXPECT_EQ(merge.tokens_kept(), 16) << base;
    EXPECT_GT(merge.stats().merges, 0) << base;
    EXPECT_FALSE(test::snapshot(drop, 1, 2) == test::snapshot(merge, 1, 2)) << base;
  }
}

}  // namespace
}  // namespace vq
