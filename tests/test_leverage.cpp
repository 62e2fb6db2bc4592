// leverage (issue 30): kept rows against references derived outside the code.
#include <gtest/gtest.h>

#include "test_util.h"

namespace vq {
namespace {

std::vector<std::int32_t> positions_of(const LayerCache& c, std::int64_t b, std::int64_t h) {
  const HeadRows r = c.stored(b, h);
  return std::vector<std::int32_t>(r.positions, r.positions + r.n_rows);
}

// Feeds keys k (T x D, one head) in steps of `chunk` rows; values are irrelevant to the score.
std::vector<std::int32_t> kept(const std::string& spec, const std::vector<float>& k,
                               std::int64_t T, std::int64_t D, std::int64_t chunk) {
  std::vector<float> v(k.size(), 1.0f);
  LayerCache c = test::make_cache(spec + ",kv_dtype=f32", 1, D);
  for (std::int64_t t = 0; t < T; t += chunk) {
    const std::int64_t n = std::min(chunk, T - t);
    c.update(TensorRef::f32(k.data() + t * D, 1, 1, n, D), TensorRef::f32(v.data() + t * D, 1, 1, n, D));
  }
  return positions_of(c, 0, 0);
}

// The inputs of tests/leverage_reference.py:
// key[t][c] = ((3 t^2 + 5 t c + 2 c) mod 17) - 8 + c / 4 + (t mod 3) / 8.
std::vector<float> ref_keys(std::int64_t T, std::int64_t D) {
  std::vector<float> k(static_cast<std::size_t>(T * D));
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t c = 0; c < D; ++c) {
      k[static_cast<std::size_t>(t * D + c)] =
          static_cast<float>((3 * t * t + 5 * t * c + 2 * c) % 17 - 8) +
          0.25f * static_cast<float>(c) + 0.125f * static_cast<float>(t % 3);
    }
  }
  return k;
}

TEST(Leverage, KeepsTheRowsOfTheNumpyReference) {
  // Expected: /usr/bin/python3 tests/leverage_reference.py (np.linalg.solve on the definition;
  // the smallest gap between a kept and a dropped score is printed: >= 7.9e-5).
  const std::vector<float> k24 = ref_keys(24, 4), k40 = ref_keys(40, 8);
  const std::string s24 = "leverage:budget=10,n_sink=2,grace=3";
  const std::string s40 = "leverage:budget=16,n_sink=1,grace=4";
  EXPECT_EQ(kept(s24, k24, 24, 4, 24), (std::vector<std::int32_t>{0, 1, 2, 4, 7, 16, 19, 21, 22, 23}));
  EXPECT_EQ(kept(s24, k24, 24, 4, 8), (std::vector<std::int32_t>{0, 1, 7, 10, 13, 15, 16, 21, 22, 23}));
  EXPECT_EQ(kept(s40, k40, 40, 8, 40),
            (std::vector<std::int32_t>{0, 1, 7, 10, 11, 16, 18, 24, 27, 28, 31, 33, 36, 37, 38, 39}));
  EXPECT_EQ(kept(s40, k40, 40, 8, 8),
            (std::vector<std::int32_t>{0, 7, 10, 11, 16, 23, 27, 29, 31, 32, 33, 34, 36, 37, 38, 39}));
  // Decode steps (one row each) append without eviction: every row stays.
  EXPECT_EQ(kept(s24, k24, 24, 4, 1).size(), 24u);
}

TEST(Leverage, KeepsTheOutlierAndDropsADuplicateByHand) {
  // d = 2, keys (0,0), (1,0), (0,1), (1,0) (row 3 duplicates row 1), (6,6) (the outlier).
  // Mean (1.6, 1.4); centred rows (-1.6,-1.4), (-0.6,-1.4), (-1.6,-0.4), (-0.6,-1.4), (4.4,4.6).
  // X^T X = [[25.2, 24.8], [24.8, 27.2]], det 70.4, so (ridge aside: lambda = 1e-3 x 52.4 / 2
  // = 0.026 moves the scores by ~0.1%) score = (27.2 x^2 - 49.6 x y + 25.2 y^2) / 70.4:
  // rows 0..4 score 0.1125, 0.2489, 0.5955, 0.2489, 0.7943 (sum 2 = d, the hat matrix's trace).
  // Budget 4: row 0 (the lowest) leaves. Budget 3: row 0 and one of the equal duplicates (the
  // newer, row 3: ties keep the lowest index) leave; the outlier row 4 stays.
  const std::vector<float> k = {0, 0, 1, 0, 0, 1, 1, 0, 6, 6};
  EXPECT_EQ(kept("leverage:budget=4,n_sink=0,grace=0", k, 5, 2, 5),
            (std::vector<std::int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(kept("leverage:budget=3,n_sink=0,grace=0", k, 5, 2, 5),
            (std::vector<std::int32_t>{1, 2, 4}));
  // A sink and a grace row are kept whatever their score: n_sink 1 keeps row 0, grace 1 keeps
  // row 4, and of rows 1..3 the one slot goes to row 2 (0.5955).
  EXPECT_EQ(kept("leverage:budget=3,n_sink=1,grace=1", k, 5, 2, 5),
            (std::vector<std::int32_t>{0, 2, 4}));
  // Every key equal (trace 0): every score is 0 and ties keep the oldest rows.
  const std::vector<float> same(10, 2.0f);
  EXPECT_EQ(kept("leverage:budget=3,n_sink=0,grace=0", same, 5, 2, 5),
            (std::vector<std::int32_t>{0, 1, 2}));
}

TEST(Leverage, GuardsNameTheFields) {
  EXPECT_NO_THROW(CacheConfig::parse("leverage"));
  EXPECT_NO_THROW(CacheConfig::parse("leverage:budget=64,ridge=0.5"));
  test::expect_error([] { CacheConfig::parse("leverage:budget=4"); }, ErrorCode::kInvalidConfig,
                     {"leverage_n_sink must be < leverage_budget"});
  test::expect_error([] { CacheConfig::parse("leverage:budget=20"); }, ErrorCode::kInvalidConfig,
                     {"leverage_n_sink + leverage_grace must be < leverage_budget (20)"});
  EXPECT_THROW(CacheConfig::parse("leverage:ridge=0"), Error);
}

}  // namespace
}  // namespace vq
