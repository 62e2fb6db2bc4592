#include <gtest/gtest.h>

#include "test_util.h"

namespace vq {
namespace {

TEST(Builder, OneCachePerLayerWithLayerSeeds) {
  const CacheConfig config = CacheConfig::parse("cam:budget=16,seed=100");
  ModelCache model = KVCacheBuilder::for_model(config, ModelShape{5, 4, 8, 8});
  ASSERT_EQ(model.n_layers(), 5);
  for (std::int64_t i = 0; i < 5; ++i) {
    EXPECT_EQ(model.layer(i).config().seed(), 100 + i);
    EXPECT_EQ(model.layer(i).shape().layer, i);
    EXPECT_EQ(model.layer(i).shape().n_layers, 5);
    EXPECT_EQ(model.layer(i).shape().n_query_heads, 8);
    EXPECT_EQ(model.layer(i).budget(), 16);
  }
  test::expect_error([&] { model.layer(5); }, ErrorCode::kInvalidArgument, {"layer must be in [0, 4], got 5"});
}

TEST(Builder, StatsSumOverLayers) {
  ModelCache model(CacheConfig::parse("h2o:budget=10,n_sink=2,grace=2"), ModelShape{3, 2, 8, 0});
  test::KV kv(1, 2, 40, 8, 1);
  for (std::int64_t l = 0; l < 3; ++l) test::feed(model.layer(l), kv, 1);
  const CacheStats s = model.stats();
  EXPECT_EQ(s.tokens_seen, 40);
  EXPECT_EQ(s.kept_bytes, 3 * model.layer(0).kept_bytes());
  EXPECT_EQ(s.full_bytes, 3 * 40 * 2 * 8 * 2 * 2);
  EXPECT_DOUBLE_EQ(s.compression_ratio, 4.0);
  model.reset();
  EXPECT_EQ(model.stats().kept_bytes, 0);
}

TEST(Builder, RejectsBadShapes) {
  const CacheConfig c("full");
  test::expect_error([&] { ModelCache m(c, ModelShape{0, 2, 8, 0}); }, ErrorCode::kInvalidArgument, {"n_layers must be >= 1, got 0"});
  test::expect_error([&] { ModelCache m(c, ModelShape{2, 0, 8, 0}); }, ErrorCode::kInvalidArgument, {"n_kv_heads must be >= 1"});
  test::expect_error([&] { ModelCache m(c, ModelShape{2, 2, 0, 0}); }, ErrorCode::kInvalidArgument, {"head_dim must be >= 1"});
  test::expect_error([&] { ModelCache m(c, ModelShape{2, 4, 8, 6}); }, ErrorCode::kInvalidArgument, {"multiple of n_kv_heads (4), got 6"});
}

}  // namespace
}  // namespace vq
