// Per-method behaviour: hand-computed cases, the reference implementations, exact reductions.
#include <gtest/gtest.h>

#include "reference_policies.h"
#include "test_util.h"

namespace vq {
namespace {

using test::KV;

// Head h of batch 0 as reference tokens, rounded like fp16 storage.
std::vector<ref::Token> tokens(const KV& kv, std::int64_t h) {
  std::vector<ref::Token> out;
  for (std::int64_t t = 0; t < kv.S; ++t) {
    ref::Token tok;
    for (std::int64_t d = 0; d < kv.D; ++d) {
      tok.k.push_back(half_to_float(float_to_half(kv.k[(h * kv.S + t) * kv.D + d])));
      tok.v.push_back(half_to_float(float_to_half(kv.v[(h * kv.S + t) * kv.D + d])));
    }
    out.push_back(tok);
  }
  return out;
}

std::vector<std::int32_t> positions_of(const std::vector<ref::Row>& rows) {
  std::vector<std::int32_t> p;
  for (const auto& r : rows) p.push_back(r.pos);
  return p;
}

std::vector<std::int32_t> positions_of(const LayerCache& c, std::int64_t h) {
  const HeadRows r = c.stored(0, h);
  return std::vector<std::int32_t>(r.positions, r.positions + r.n_rows);
}

// Keys scaled so proxy attention is peaked, as on real models.
KV peaked_kv(std::int64_t H, std::int64_t S, std::int64_t D, std::uint64_t seed, float scale) {
  KV kv(1, H, S, D, seed);
  for (auto& x : kv.k) x *= scale;
  return kv;
}

TEST(H2O, HandComputedCase) {
  // D = 1, fp32: logits are k_i * k_t. Keys 0, 1, 0, then 2.
  // t1: a = [1] -> scores [2, 0]; t2: a = [.5, .5] -> [2.5, .5, 0];
  // t3: logits [0, 2, 0] -> a = [.1065, .7870, .1065] -> [2.61, 1.29, .11, 0] over budget 3.
  std::vector<float> k = {0, 1, 0, 2}, v = {10, 11, 12, 13};
  auto run = [&](const std::string& spec) {
    LayerCache c = test::make_cache(spec);
    c.update(TensorRef::f32(k.data(), 1, 1, 4, 1), TensorRef::f32(v.data(), 1, 1, 4, 1));
    return positions_of(c, 0);
  };
  // grace 0: the new token (score 0) loses.
  EXPECT_EQ(run("h2o:budget=3,n_sink=0,grace=0,decay=1,kv_dtype=f32"),
            (std::vector<std::int32_t>{0, 1, 2}));
  // grace 1 protects it: position 2 (score .11) loses.
  EXPECT_EQ(run("h2o:budget=3,n_sink=0,grace=1,decay=1,kv_dtype=f32"),
            (std::vector<std::int32_t>{0, 1, 3}));
  // A sink on position 0 does not change that; two sinks protect 0 and 1.
  EXPECT_EQ(run("h2o:budget=3,n_sink=2,grace=0,decay=1,kv_dtype=f32"),
            (std::vector<std::int32_t>{0, 1, 2}));
}

TEST(H2O, MatchesTheReferenceRule) {
  for (const auto& [budget, n_sink, grace, decay] :
       std::vector<std::tuple<int, int, int, float>>{{16, 4, 0, 1.0f}, {16, 4, 4, 0.98f},
                                                    {24, 0, 8, 0.5f}, {10, 2, 0, 0.0f}}) {
    KV kv = peaked_kv(2, 120, 16, 40 + budget + grace, 2.0f);
    LayerCache c = test::make_cache("h2o:budget=" + std::to_string(budget) + ",n_sink=" +
                                    std::to_string(n_sink) + ",grace=" + std::to_string(grace) +
                                    ",decay=" + std::to_string(decay));
    test::feed(c, kv, 1);
    for (std::int64_t h = 0; h < 2; ++h) {
      EXPECT_EQ(positions_of(c, h),
                positions_of(ref::h2o(tokens(kv, h), budget, n_sink, grace, decay)))
          << "budget " << budget << " grace " << grace << " decay " << decay << " head " << h;
    }
  }
}

TEST(H2O, GraceZeroDecayOneFreezesOnTheFirstTokens) {
  // The paper's rule under the proxy: the newest token has score 0 and always loses, so the
  // cache keeps the first `budget` tokens. This is what issue 5 measures on a real model.
  KV kv(1, 1, 100, 16, 3);
  LayerCache c = test::make_cache("h2o:budget=10,n_sink=4,grace=0,decay=1");
  test::feed(c, kv, 1);
  EXPECT_EQ(positions_of(c, 0), (std::vector<std::int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
}

TEST(Tova, MatchesTheReferenceRuleAndCanEvictTheNewToken) {
  KV kv = peaked_kv(2, 100, 8, 5, 1.5f);
  LayerCache c = test::make_cache("tova:budget=12,n_sink=2");
  test::feed(c, kv, 1);
  for (std::int64_t h = 0; h < 2; ++h) {
    EXPECT_EQ(positions_of(c, h), positions_of(ref::tova(tokens(kv, h), 12, 2)));
  }
  // A short new key gets less weight from itself than the long keys it aligns with, so it is
  // dropped at once: logits k_new . k_i are 0.5 for the old rows and 0.01 for itself.
  std::vector<float> k = {5, 0, 5, 0, 5, 0, 0.1f, 0}, v(8, 1.0f);
  LayerCache t = test::make_cache("tova:budget=3,n_sink=0,kv_dtype=f32");
  t.update(TensorRef::f32(k.data(), 1, 1, 4, 2), TensorRef::f32(v.data(), 1, 1, 4, 2));
  EXPECT_EQ(positions_of(t, 0), (std::vector<std::int32_t>{0, 1, 2}));
}

TEST(Streaming, KeepsSinksAndTheLastWindow) {
  KV kv(1, 2, 50, 8, 6);
  LayerCache c = test::make_cache("streaming_llm:n_sink=3,window_size=5");
  test::feed(c, kv, 4);
  EXPECT_EQ(positions_of(c, 1), (std::vector<std::int32_t>{0, 1, 2, 45, 46, 47, 48, 49}));
  EXPECT_EQ(positions_of(c, 0), positions_of(ref::streaming(tokens(kv, 0), 3, 5)));
  EXPECT_EQ(c.budget(), 8);
}

TEST(MorphKV, MatchesTheReferenceRuleForEveryFusion) {
  const char* names[] = {"mean", "sum", "max"};
  for (int fusion = 0; fusion < 3; ++fusion) {
    for (int window : {1, 3, 8}) {
      // One query has nothing to fuse: a fusion other than the default is rejected then.
      if (window == 1 && fusion != 0) continue;
      KV kv = peaked_kv(2, 90, 16, 60 + window, 2.0f);
      LayerCache c = test::make_cache("morphkv:budget=16,n_sink=2,window=" +
                                      std::to_string(window) + ",fusion=" + names[fusion]);
      test::feed(c, kv, 1);
      for (std::int64_t h = 0; h < 2; ++h) {
        EXPECT_EQ(positions_of(c, h),
                  positions_of(ref::morphkv(tokens(kv, h), 16, 2, static_cast<std::size_t>(window), fusion)))
            << names[fusion] << " window " << window;
      }
    }
  }
}

TEST(MorphKV, FusionHandCase) {
  // D = 2, fp32, budget 3, no sinks, window 2. Keys (2,1), (0,2), (-1,2), (1,1): the window is
  // rows 2 and 3; rows 0 and 1 are the candidates. Sum/mean and max disagree on the loser.
  std::vector<float> k = {2, 1, 0, 2, -1, 2, 1, 1}, v(8, 0.0f);
  auto evicted = [&](const char* fusion) {
    LayerCache c = test::make_cache(
        std::string("morphkv:budget=3,n_sink=0,window=2,kv_dtype=f32,fusion=") + fusion);
    c.update(TensorRef::f32(k.data(), 1, 1, 4, 2), TensorRef::f32(v.data(), 1, 1, 4, 2));
    const auto p = positions_of(c, 0);
    for (std::int32_t i = 0; i < 4; ++i) {
      if (std::find(p.begin(), p.end(), i) == p.end()) return i;
    }
    return -1;
  };
  auto softmax_row = [&](int q) {
    std::vector<double> w(4);
    double z = 0;
    for (int j = 0; j < 4; ++j) {
      w[j] = std::exp((k[2 * j] * k[2 * q] + k[2 * j + 1] * k[2 * q + 1]) / std::sqrt(2.0));
      z += w[j];
    }
    for (auto& x : w) x /= z;
    return w;
  };
  const auto a = softmax_row(2), b = softmax_row(3);
  const int by_sum = (a[0] + b[0]) < (a[1] + b[1]) ? 0 : 1;
  const int by_max = std::max(a[0], b[0]) < std::max(a[1], b[1]) ? 0 : 1;
  ASSERT_NE(by_sum, by_max);  // the case discriminates
  EXPECT_EQ(evicted("sum"), by_sum);
  EXPECT_EQ(evicted("mean"), by_sum);
  EXPECT_EQ(evicted("max"), by_max);
}

TEST(MorphKV, WindowOneKeepsExactlyTovasRows) {
  for (std::uint64_t seed : {1, 2, 3}) {
    KV kv(2, 2, 150, 32, seed);
    LayerCache m = test::make_cache("morphkv:budget=20,n_sink=4,window=1");
    LayerCache t = test::make_cache("tova:budget=20,n_sink=4");
    for (std::int64_t chunk : {1, 6}) {
      m.reset();
      t.reset();
      test::feed(m, kv, chunk);
      test::feed(t, kv, chunk);
      EXPECT_TRUE(test::snapshot(m, 2, 2) == test::snapshot(t, 2, 2)) << "seed " << seed;
    }
  }
}

TEST(MorphKV, WindowOneDiffersFromTovaOnlyWhenTheNewestRowIsTheArgmin) {
  // The documented edge: tova may evict the newest row, morphkv always protects its window
  // (the three old rows tie, the lowest index loses).
  std::vector<float> k = {5, 0, 5, 0, 5, 0, 0.1f, 0}, v(8, 1.0f);
  LayerCache m = test::make_cache("morphkv:budget=3,n_sink=0,window=1,kv_dtype=f32");
  m.update(TensorRef::f32(k.data(), 1, 1, 4, 2), TensorRef::f32(v.data(), 1, 1, 4, 2));
  EXPECT_EQ(positions_of(m, 0), (std::vector<std::int32_t>{1, 2, 3}));
}

}  // namespace
}  // namespace vq
