// criticalkv, criticaladakv: kept rows against references derived outside the code.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "test_util.h"
#include "veloxquant/builder.h"

namespace vq {
namespace {

using Rows = std::vector<std::int32_t>;

Rows positions_of(const LayerCache& c, std::int64_t b, std::int64_t h) {
  const HeadRows r = c.stored(b, h);
  return Rows(r.positions, r.positions + r.n_rows);
}

// tests/criticalkv_reference.py's inputs: u(seed, i) = test::hash_uniform.
double u(std::uint64_t seed, std::uint64_t i) { return test::hash_uniform(seed, i); }

constexpr std::int64_t kH = 2, kT = 32, kD = 4, kDim = 8, kHq = 4;

// key[h][t][c] = f32(3 u(1, (h T + t) D + c)), value the same with 2 u(2, .).
std::vector<float> ref_rows(std::uint64_t seed, double scale) {
  std::vector<float> x(static_cast<std::size_t>(kH * kT * kD));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(scale * u(seed, i));
  return x;
}

// W_o [dim][Hq D] = f32(u(3, r Hq D + j)); its Gram matrices per query head g,
// G_g[a][b] = sum_r W_o[r][g D + a] W_o[r][g D + b] (what the engine hands the cache).
std::vector<float> ref_gram() {
  std::vector<double> wo(static_cast<std::size_t>(kDim * kHq * kD));
  for (std::size_t i = 0; i < wo.size(); ++i) wo[i] = static_cast<float>(u(3, i));
  std::vector<float> g(static_cast<std::size_t>(kHq * kD * kD));
  for (std::int64_t q = 0; q < kHq; ++q) {
    for (std::int64_t a = 0; a < kD; ++a) {
      for (std::int64_t b = 0; b < kD; ++b) {
        double s = 0;
        for (std::int64_t r = 0; r < kDim; ++r) {
          s += wo[static_cast<std::size_t>(r * kHq * kD + q * kD + a)] *
               wo[static_cast<std::size_t>(r * kHq * kD + q * kD + b)];
        }
        g[static_cast<std::size_t>((q * kD + a) * kD + b)] = static_cast<float>(s);
      }
    }
  }
  return g;
}

// Feeds the reference rows in chunks of `chunk` (proxy source: update()), with or without the
// Gram matrices; returns each head's kept positions.
std::vector<Rows> kept(const std::string& spec, std::int64_t chunk, bool gram) {
  const std::vector<float> k = ref_rows(1, 3.0), v = ref_rows(2, 2.0);
  LayerCache c(CacheConfig::parse(spec + ",kv_dtype=f32"), LayerShape{kH, kD, kHq, 0, 1});
  const bool crit = spec.rfind("crit", 0) == 0;
  if (gram) c.set_output_gram(ref_gram().data(), kHq, kD);
  EXPECT_EQ(c.reads_output_gram(), crit);
  EXPECT_EQ(c.has_output_gram(), gram && crit);  // snapkv checks the matrices and ignores them
  for (std::int64_t t = 0; t < kT; t += chunk) {
    const std::int64_t n = std::min(chunk, kT - t);
    std::vector<float> kc, vc;
    for (std::int64_t h = 0; h < kH; ++h) {
      const std::size_t at = static_cast<std::size_t>((h * kT + t) * kD);
      kc.insert(kc.end(), k.begin() + static_cast<std::ptrdiff_t>(at),
                k.begin() + static_cast<std::ptrdiff_t>(at + n * kD));
      vc.insert(vc.end(), v.begin() + static_cast<std::ptrdiff_t>(at),
                v.begin() + static_cast<std::ptrdiff_t>(at + n * kD));
    }
    c.update(TensorRef::f32(kc.data(), 1, kH, n, kD), TensorRef::f32(vc.data(), 1, kH, n, kD));
  }
  EXPECT_STREQ(c.stats().value_norm, !crit ? "none" : gram ? "projected" : "plain");
  return {positions_of(c, 0, 0), positions_of(c, 0, 1)};
}

const std::string kRef = "budget=14,n_sink=2,obs_window=4,kernel=3,pool=max";

TEST(CriticalKV, KeepsTheRowsOfTheNumpyReference) {
  // Expected: /usr/bin/python3 tests/criticalkv_reference.py (NumPy from the paper's formula:
  // ||W_o^g v|| from W_o itself, not the Gram matrices; the smallest nonzero gap between a
  // kept and a dropped score at any stage boundary is >= 1.0e-4, exact ties are max pooling's
  // copies, decided by the index in both).
  const std::string crit = "criticalkv:" + kRef;
  // A: one prefill chunk of 32.
  EXPECT_EQ(kept(crit, 32, true),
            (std::vector<Rows>{{0, 1, 5, 12, 14, 15, 16, 23, 26, 27, 28, 29, 30, 31},
                               {0, 1, 5, 6, 7, 10, 14, 15, 21, 24, 28, 29, 30, 31}}));
  // B: two chunks of 16 (the second scored with the rows the first kept).
  EXPECT_EQ(kept(crit, 16, true),
            (std::vector<Rows>{{0, 1, 6, 8, 14, 15, 16, 23, 26, 27, 28, 29, 30, 31},
                               {0, 1, 5, 6, 7, 10, 14, 15, 21, 24, 28, 29, 30, 31}}));
  // C: no Gram matrices: N_i = ||v_i||_2.
  EXPECT_EQ(kept(crit, 32, false),
            (std::vector<Rows>{{0, 1, 5, 8, 14, 15, 16, 23, 26, 27, 28, 29, 30, 31},
                               {0, 1, 5, 6, 7, 10, 14, 15, 16, 20, 28, 29, 30, 31}}));
  // D: criticaladakv (head-wise, floor 0.2): head 0 gets 9 rows, head 1 19.
  EXPECT_EQ(kept("criticaladakv:" + kRef, 32, true),
            (std::vector<Rows>{{0, 1, 14, 26, 27, 28, 29, 30, 31},
                               {0, 1, 5, 6, 7, 10, 14, 15, 16, 17, 19, 20, 21, 24, 25, 28, 29,
                                30, 31}}));
  EXPECT_EQ(kept("criticalkv:headwise=true," + kRef, 32, true),
            kept("criticaladakv:" + kRef, 32, true));
  // E: first_stage_ratio=0: every chosen row by score x projected norm.
  EXPECT_EQ(kept(crit + ",first_stage_ratio=0", 32, true),
            (std::vector<Rows>{{0, 1, 5, 6, 8, 12, 14, 23, 26, 27, 28, 29, 30, 31},
                               {0, 1, 5, 6, 7, 10, 14, 16, 21, 24, 28, 29, 30, 31}}));
  // first_stage_ratio=1: stage 1 takes every chosen row, which is SnapKV's selection.
  EXPECT_EQ(kept(crit + ",first_stage_ratio=1", 32, true), kept("snapkv:" + kRef, 32, true));
  // Decode steps (one row each) append without eviction.
  EXPECT_EQ(kept(crit, 1, true)[0].size(), static_cast<std::size_t>(kT));
}

// The hand case: one head, D = 2, obs_window 1 and kernel 1 (the score of a row is the last
// query's attention to it), true attention, budget 4, no sinks: the window row 5 stays and
// c = 3 rows are chosen of rows 0..4, whose attention from query 5 is
//   a = 0.30, 0.25, 0.05, 0.20, 0.10 (and 0.10 to row 5 itself).
// Values: v_2 = (0, 1), every other v = (1, 0). W_o = diag(1, 10) (dim 2 = D, one query head),
// so G = W_o^T W_o = diag(1, 100) and N_i = ||W_o v_i|| = 10 for row 2, 1 for the others.
// Stage 1 (ratio 0.5): floor(1.5) = 1 row, the highest attention: row 0.
// Stage 2 over rows 1..4: (a + 1e-4) x N = 0.2501, 0.5010, 0.2001, 0.1001: rows 2 and 1.
// Kept: 0, 1, 2, 5 -- row 2, the lowest attention of all, for its large projected value,
// where SnapKV (and criticalkv without W_o: every N = 1) keeps 0, 1, 3, 5.
Rows hand_case(const std::string& spec, const std::vector<float>* gram) {
  const std::vector<float> k(12, 0.0f);
  const std::vector<float> v = {1, 0, 1, 0, 0, 1, 1, 0, 1, 0, 1, 0};
  LayerCache c(CacheConfig::parse(spec + ",kv_dtype=f32"), LayerShape{1, 2, 1, 0, 1});
  if (gram != nullptr) c.set_output_gram(gram->data(), 1, 2);
  c.begin_step(TensorRef::f32(k.data(), 1, 1, 6, 2), TensorRef::f32(v.data(), 1, 1, 6, 2));
  std::vector<float> att(36, 0.0f);  // [1, 1, S = 6, R = 6]; only query 5 is read
  const float last[6] = {0.30f, 0.25f, 0.05f, 0.20f, 0.10f, 0.10f};
  for (int r = 0; r < 6; ++r) att[static_cast<std::size_t>(5 * 6 + r)] = last[r];
  for (int q = 0; q < 5; ++q) {
    for (int r = 0; r <= q; ++r) att[static_cast<std::size_t>(q * 6 + r)] = 1.0f / static_cast<float>(q + 1);
  }
  const AttentionRef a{att.data(), 1, 1, 6, 6};
  c.end_step(&a);
  return positions_of(c, 0, 0);
}

TEST(CriticalKV, StageTwoKeepsALowAttentionRowWithALargeProjectedValueByHand) {
  const std::string spec = "criticalkv:budget=4,n_sink=0,obs_window=1,kernel=1,source=attention";
  const std::vector<float> gram = {1, 0, 0, 100};
  EXPECT_EQ(hand_case(spec, &gram), (Rows{0, 1, 2, 5}));
  EXPECT_EQ(hand_case(spec, nullptr), (Rows{0, 1, 3, 5}));
  EXPECT_EQ(hand_case("snapkv:budget=4,n_sink=0,obs_window=1,kernel=1,source=attention", &gram),
            (Rows{0, 1, 3, 5}));
  // W_o = diag(1, 2): row 2 weighs 0.05 x 2 = 0.10, below row 3's 0.20: rows 1 and 3 win.
  const std::vector<float> small = {1, 0, 0, 4};
  EXPECT_EQ(hand_case(spec, &small), (Rows{0, 1, 3, 5}));
}

TEST(CriticalKV, GuardsNameTheFields) {
  EXPECT_NO_THROW(CacheConfig::parse("criticalkv"));
  EXPECT_NO_THROW(CacheConfig::parse("criticaladakv:budget=64,first_stage_ratio=0.25"));
  EXPECT_TRUE(CacheConfig::parse("criticaladakv").get_bool("headwise"));
  EXPECT_FALSE(CacheConfig::parse("criticalkv").get_bool("headwise"));
  test::expect_error([] { CacheConfig::parse("criticalkv:budget=4"); },
                     ErrorCode::kInvalidConfig, {"crit_n_sink must be < crit_budget"});
  test::expect_error([] { CacheConfig::parse("criticalkv:budget=30"); },
                     ErrorCode::kInvalidConfig,
                     {"crit_n_sink + crit_obs_window must be < crit_budget (30)"});
  test::expect_error([] { CacheConfig::parse("criticalkv:kernel=4"); },
                     ErrorCode::kInvalidConfig, {"crit_kernel must be odd"});
  test::expect_error([] { CacheConfig::parse("criticalkv:first_stage_ratio=1.5"); },
                     ErrorCode::kInvalidConfig, {"crit_first_stage_ratio"});
  test::expect_error([] { CacheConfig::parse("criticaladakv:epsilon=-1"); },
                     ErrorCode::kInvalidConfig, {"crit_epsilon"});
}

TEST(CriticalKV, OutputGramSetterChecksItsInput) {
  LayerCache c(CacheConfig::parse("criticalkv"), LayerShape{2, 4, 4, 0, 1});
  const std::vector<float> g(4 * 4 * 4, 0.5f);
  test::expect_error([&] { c.set_output_gram(nullptr, 4, 4); }, ErrorCode::kInvalidArgument,
                     {"set_output_gram", "null"});
  test::expect_error([&] { c.set_output_gram(g.data(), 2, 4); }, ErrorCode::kInvalidArgument,
                     {"set_output_gram", "n_query_heads 2"});
  test::expect_error([&] { c.set_output_gram(g.data(), 4, 2); }, ErrorCode::kInvalidArgument,
                     {"set_output_gram", "head_dim 2"});
  test::expect_error([&] { c.set_output_gram(g.data(), 0, 4); }, ErrorCode::kInvalidArgument,
                     {"set_output_gram", "n_query_heads must be in"});
  std::vector<float> nan = g;
  nan[7] = std::nanf("");
  test::expect_error([&] { c.set_output_gram(nan.data(), 4, 4); }, ErrorCode::kInvalidArgument,
                     {"set_output_gram", "entry 7"});
  EXPECT_FALSE(c.has_output_gram());
  EXPECT_STREQ(c.stats().value_norm, "plain");
  c.set_output_gram(g.data(), 4, 4);
  EXPECT_TRUE(c.has_output_gram());
  EXPECT_STREQ(c.stats().value_norm, "projected");
  c.reset();  // the projection is the model's: kept across reset
  EXPECT_TRUE(c.has_output_gram());
  // A cache of unknown shape takes the counts, and its first step must match them.
  LayerCache open(CacheConfig::parse("criticalkv"), LayerShape{});
  open.set_output_gram(g.data(), 4, 4);
  const std::vector<float> kv(2 * 3 * 2, 0.0f);  // [1, 2, 3, 2]: head_dim 2
  test::expect_error(
      [&] { open.begin_step(TensorRef::f32(kv.data(), 1, 2, 3, 2), TensorRef::f32(kv.data(), 1, 2, 3, 2)); },
      ErrorCode::kShapeMismatch, {"set_output_gram"});
  EXPECT_FALSE(open.step_open());
  // A method that reads none checks the matrices and keeps nothing.
  LayerCache snap(CacheConfig::parse("snapkv"), LayerShape{2, 4, 4, 0, 1});
  snap.set_output_gram(g.data(), 4, 4);
  EXPECT_FALSE(snap.reads_output_gram());
  EXPECT_FALSE(snap.has_output_gram());
  EXPECT_STREQ(snap.stats().value_norm, "none");
}

TEST(CriticalKV, ModelCachePassesTheGramToEveryLayer) {
  ModelCache m(CacheConfig::parse("criticaladakv"), ModelShape{3, 2, 4, 4});
  EXPECT_TRUE(m.reads_output_gram());
  EXPECT_FALSE(m.has_output_gram());
  const std::vector<float> g(4 * 4 * 4, 0.25f);
  for (std::int64_t l = 0; l < 2; ++l) m.set_output_gram(l, g.data(), 4, 4);
  EXPECT_FALSE(m.has_output_gram());
  EXPECT_STREQ(m.stats().value_norm, "mixed");
  m.set_output_gram(2, g.data(), 4, 4);
  EXPECT_TRUE(m.has_output_gram());
  EXPECT_STREQ(m.stats().value_norm, "projected");
  test::expect_error([&] { m.set_output_gram(3, g.data(), 4, 4); }, ErrorCode::kInvalidArgument,
                     {"layer must be in [0, 2]"});
  EXPECT_FALSE(ModelCache(CacheConfig::parse("h2o"), ModelShape{1, 2, 4, 4}).reads_output_gram());

}

}  // namespace
}  // namespace vq
