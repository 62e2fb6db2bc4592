// lagkv and random (issue 30): kept rows against references derived outside the code.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "test_util.h"

namespace vq {
namespace {

std::vector<std::int32_t> positions_of(const LayerCache& c, std::int64_t b, std::int64_t h) {
  const HeadRows r = c.stored(b, h);
  return std::vector<std::int32_t>(r.positions, r.positions + r.n_rows);
}

// The inputs of tests/lagkv_reference.py: key[t][c] = ((7t + 3c) mod 11) - 5 + c / 4,
// value[t][c] = ((5t + 2c) mod 13) / 2 - 3 + ((t c) mod 3) / 8, one head.
void lag_inputs(std::int64_t T, std::int64_t D, std::vector<float>& k, std::vector<float>& v) {
  k.resize(static_cast<std::size_t>(T * D));
  v.resize(static_cast<std::size_t>(T * D));
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t c = 0; c < D; ++c) {
      k[static_cast<std::size_t>(t * D + c)] =
          static_cast<float>((t * 7 + c * 3) % 11 - 5) + 0.25f * static_cast<float>(c);
      v[static_cast<std::size_t>(t * D + c)] = static_cast<float>((t * 5 + c * 2) % 13) * 0.5f -
                                               3.0f + 0.125f * static_cast<float>((t * c) % 3);
    }
  }
}

std::vector<std::int32_t> lag_kept(const std::string& spec, std::int64_t T, std::int64_t D,
                                   std::int64_t chunk) {
  std::vector<float> k, v;
  lag_inputs(T, D, k, v);
  LayerCache c = test::make_cache(spec + ",kv_dtype=f32", 1, D);
  for (std::int64_t t = 0; t < T; t += chunk) {
    const std::int64_t n = std::min(chunk, T - t);
    c.update(TensorRef::f32(k.data() + t * D, 1, 1, n, D), TensorRef::f32(v.data() + t * D, 1, 1, n, D));
  }
  return positions_of(c, 0, 0);
}

TEST(LagKV, KeepsTheRowsOfTheNumpyReference) {
  // Expected: python3 tests/lagkv_reference.py (the paper's formula in NumPy, simulated row by
  // row with the documented budget rule).
  for (std::int64_t chunk : {1, 4, 40}) {
    EXPECT_EQ(lag_kept("lagkv:budget=10,n_sink=2,lag_size=3", 20, 4, chunk),
              (std::vector<std::int32_t>{0, 1, 7, 10, 12, 15, 16, 17, 18, 19}))
        << "chunk " << chunk;
    EXPECT_EQ(lag_kept("lagkv:budget=16,n_sink=1,lag_size=4", 40, 8, chunk),
              (std::vector<std::int32_t>{0, 1, 5, 12, 16, 20, 21, 28, 32, 33, 34, 35, 36, 37, 38, 39}))
        << "chunk " << chunk;
  }
}

TEST(LagKV, ScoresByHandOnOnePartition) {
  // n_sink 0, L = 2, budget 4, D = 2. Rows 0-1 form partition 0, rows 2-3 its reference.
  // Reference keys (0, 0), (2, 4): range (2, 4). Keys of rows 0, 1: (1, 1) -> normalised
  // (0.5, 0.25), std 0.177; (2, 0) -> (1, 0), std 0.707: row 1's key spread is larger.
  // Values: every value is (1, 1) except row 0's (5, -3) against a reference (0, 0), (1, 1):
  // row 0 -> (5, -3), std 5.66; row 1 -> (1, 1), std 0. So s_V favours row 0 by softmax
  // (e^5.66 vs 1: 0.9965 vs 0.0035) and s_K favours row 1 (e^0.707 / (e^0.177 + e^0.707) =
  // 0.63): (0.37 + 0.9965) / 2 = 0.68 > (0.63 + 0.0035) / 2 = 0.32, so row 1 ranks 0 and
  // leaves when row 4 arrives (rows 2, 3 and 4 are unscored and stay).
  std::vector<float> k = {1, 1, 2, 0, 0, 0, 2, 4, 9, 9};
  std::vector<float> v = {5, -3, 1, 1, 0, 0, 1, 1, 1, 1};
  LayerCache c = test::make_cache("lagkv:budget=4,n_sink=0,lag_size=2,kv_dtype=f32", 1, 2);
  c.update(TensorRef::f32(k.data(), 1, 1, 5, 2), TensorRef::f32(v.data(), 1, 1, 5, 2));
  EXPECT_EQ(positions_of(c, 0, 0), (std::vector<std::int32_t>{0, 2, 3, 4}));
  // Without the values' vote the keys decide: row 0 (spread 0.177) leaves instead.
  std::vector<float> v_flat(10, 1.0f);
  LayerCache f = test::make_cache("lagkv:budget=4,n_sink=0,lag_size=2,kv_dtype=f32", 1, 2);
  f.update(TensorRef::f32(k.data(), 1, 1, 5, 2), TensorRef::f32(v_flat.data(), 1, 1, 5, 2));
  EXPECT_EQ(positions_of(f, 0, 0), (std::vector<std::int32_t>{1, 2, 3, 4}));
}

TEST(LagKV, DefaultLagSizeFitsEveryBudgetAndTheGuardNamesTheFields) {
  for (const char* spec : {"lagkv", "lagkv:budget=64", "lagkv:budget=8", "lagkv:budget=6"}) {
    EXPECT_NO_THROW(CacheConfig::parse(spec)) << spec;
  }
  test::expect_error([] { CacheConfig::parse("lagkv:budget=64,lag_size=32"); },
                     ErrorCode::kInvalidConfig,
                     {"lagkv_n_sink + 2 x lagkv_lag_size (68) must be <= lagkv_budget (64)"});
  test::expect_error([] { CacheConfig::parse("lagkv:budget=4"); }, ErrorCode::kInvalidConfig,
                     {"lagkv_n_sink must be < lagkv_budget"});
}

TEST(Random, KeepsEachRowWithProbabilityBudgetOverSeen) {
  // 12 rows, budget 4, no sinks: a uniformly random 4-subset keeps each position with
  // probability 1/3. Over 3000 seeds each count is Binomial(3000, 1/3): 1000 +- 25.8 (sd); a
  // method that favoured recent or early rows would sit at 0 or 3000 for some position.
  // Every pair is kept together with probability (4 x 3) / (12 x 11) = 1/11: 272.7 +- 15.8.
  std::vector<int> count(12, 0), pair01(1, 0);
  test::KV kv(1, 1, 12, 4, 5);
  for (int seed = 1; seed <= 3000; ++seed) {
    LayerCache c = test::make_cache("random:budget=4,n_sink=0,grace=0,seed=" + std::to_string(seed), 1, 4);
    test::feed(c, kv, 1);
    const auto kept = positions_of(c, 0, 0);
    ASSERT_EQ(kept.size(), 4u);
    for (const auto p : kept) ++count[static_cast<std::size_t>(p)];
    const std::set<std::int32_t> s(kept.begin(), kept.end());
    if (s.count(0) && s.count(11)) ++pair01[0];
  }
  for (int p = 0; p < 12; ++p) {
    EXPECT_NEAR(count[static_cast<std::size_t>(p)], 1000, 5 * 25.8) << "position " << p;
  }
  EXPECT_NEAR(pair01[0], 272.7, 5 * 15.8);
}

TEST(Random, SameSeedSameRowsOnAnyChunkingAndProtectedRowsStay) {
  test::KV kv(2, 3, 60, 8, 9);
  auto run = [&](const std::string& spec, std::int64_t chunk) {
    LayerCache c = test::make_cache(spec, 3, 8);
    test::feed(c, kv, chunk);
    return test::snapshot(c, 2, 3);
  };
  const auto a = run("random:budget=10,n_sink=2,grace=3,seed=3", 1);
  EXPECT_TRUE(a == run("random:budget=10,n_sink=2,grace=3,seed=3", 7));
  EXPECT_TRUE(a == run("random:budget=10,n_sink=2,grace=3,seed=3", 60));
  EXPECT_FALSE(a == run("random:budget=10,n_sink=2,grace=3,seed=4", 1));
  for (std::size_t i = 0; i < a.positions.size(); ++i) {
    ASSERT_EQ(a.positions[i].size(), 10u);
    EXPECT_EQ(a.positions[i][0], 0);  // the sinks
    EXPECT_EQ(a.positions[i][1], 1);
    EXPECT_EQ(a.positions[i][7], 57);  // the newest three
    EXPECT_EQ(a.positions[i][9], 59);
  }
  // Heads and batch rows draw apart: not every head keeps the same positions.
  bool differ = false;
  for (std::size_t i = 1; i < a.positions.size(); ++i) differ |= a.positions[i] != a.positions[0];
  EXPECT_TRUE(differ);
}

}  // namespace
}  // namespace vq
