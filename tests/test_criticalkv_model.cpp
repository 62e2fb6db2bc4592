// criticalkv on a real model: the engine hands every layer its output projection's Gram
// matrices (Transformer::provide_output_gram), equal in effect to the ones this test computes
// from W_o itself, and they change what is kept.
#include <gtest/gtest.h>

#include <vector>

#include "engine/compute/weights.h"
#include "engine/model/model.h"
#include "engine/model/transformer.h"
#include "engine/run/evaluate.h"
#include "engine/tokenizers/tokenizer.h"
#include "engine_test_util.h"
#include "veloxquant/builder.h"

namespace vq {
namespace {

using engine::Model;

using test::stories;

std::vector<std::vector<std::int32_t>> kept_rows(const ModelCache& c) {
  std::vector<std::vector<std::int32_t>> out;
  for (std::int64_t l = 0; l < c.n_layers(); ++l) {
    for (std::int64_t h = 0; h < c.shape().n_kv_heads; ++h) {
      const HeadRows r = c.layer(l).stored(0, h);
      out.emplace_back(r.positions, r.positions + r.n_rows);
    }
  }
  return out;
}

TEST(CriticalKVModel, TheEngineHandsEveryLayerItsOutputProjection) {
  const Model& m = stories();
  const engine::ModelConfig& mc = m.config();
  const std::vector<std::int32_t> ids = test::excerpt_ids(40);
  ASSERT_EQ(ids.size(), 40u);
  const CacheConfig config =
      CacheConfig::parse("criticalkv:budget=16,obs_window=4,source=attention");
  const ModelShape shape = engine::model_shape(mc);
  const std::int64_t D = mc.head_dim, Hq = mc.n_heads, qd = mc.q_dim();

  // The engine's matrices.
  ModelCache by_engine(config, shape);
  EXPECT_TRUE(by_engine.reads_output_gram());
  EXPECT_STREQ(by_engine.stats().value_norm, "plain");
  engine::Transformer tf(m, 40);
  tf.forward(ids.data(), 40, by_engine, engine::Logits::kNone);
  EXPECT_TRUE(by_engine.has_output_gram());
  EXPECT_STREQ(by_engine.stats().value_norm, "projected");

  // This test's: G_g[a][b] = sum_r W_o[r][g D + a] W_o[r][g D + b] over the dim rows of W_o.
  ModelCache by_test(config, shape);
  std::vector<float> row(static_cast<std::size_t>(qd));
  for (std::int64_t l = 0; l < mc.n_layers; ++l) {
    std::vector<double> g(static_cast<std::size_t>(Hq * D * D), 0.0);
    for (std::int64_t r = 0; r < mc.dim; ++r) {
      engine::dequantize_row(m.weights().layers[static_cast<std::size_t>(l)].wo, r, row.data());
      for (std::int64_t h = 0; h < Hq; ++h) {
        for (std::int64_t a = 0; a < D; ++a) {
          for (std::int64_t b = 0; b < D; ++b) {
            g[static_cast<std::size_t>((h * D + a) * D + b)] +=
                static_cast<double>(row[static_cast<std::size_t>(h * D + a)]) *
                row[static_cast<std::size_t>(h * D + b)];
          }
        }
      }
    }
    const std::vector<float> gf(g.begin(), g.end());
    by_test.set_output_gram(l, gf.data(), Hq, D);
  }
  engine::Transformer tf2(m, 40);
  tf2.forward(ids.data(), 40, by_test, engine::Logits::kNone);
  EXPECT_EQ(kept_rows(by_engine), kept_rows(by_test));
  for (const auto& rows : kept_rows(by_engine)) EXPECT_EQ(rows.size(), 16u);

  // G = I (||v||_2) keeps other rows somewhere: the projection matters on this model.
  ModelCache plain(config, shape);
  const std::vector<float> eye = [&] {
    std::vector<float> e(static_cast<std::size_t>(Hq * D * D), 0.0f);
    for (std::int64_t h = 0; h < Hq; ++h) {
      for (std::int64_t a = 0; a < D; ++a) e[static_cast<std::size_t>((h * D + a) * D + a)] = 1;
    }
    return e;
  }();
  for (std::int64_t l = 0; l < mc.n_layers; ++l) plain.set_output_gram(l, eye.data(), Hq, D);
  engine::Transformer tf3(m, 40);
  tf3.forward(ids.data(), 40, plain, engine::Logits::kNone);
  EXPECT_NE(kept_rows(plain), kept_rows(by_engine));
}

}  // namespace
}  // namespace vq
