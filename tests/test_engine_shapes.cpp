// Named random shapes (engine/shapes.h), their Hugging Face round trip, and the engine's
// thread-count invariance on them: logits bit-identical for 1, 2 and 3 threads.
#include <cstring>

#include "engine/compute/matmul.h"
#include "engine/compute/parallel.h"
#include "engine/model/shapes.h"
#include "engine/model/transformer.h"
#include "engine_test_util.h"
#include "veloxquant/builder.h"

namespace vq {
namespace {
using engine::Model;
using engine::WeightType;

// A 72-token prefill chunk (KV-head-parallel attention over 72 rows; its last token's logits)
// then 3 decode steps, through `method`.
std::vector<float> logits_of(const Model& m, const std::string& method) {
  ModelCache cache(CacheConfig::parse(method), engine::model_shape(m.config()));
  engine::Transformer tf(m, 72, 128);
  std::vector<std::int32_t> toks(72);
  for (std::size_t i = 0; i < toks.size(); ++i)
    toks[i] = static_cast<std::int32_t>((i * 7919 + 13) %
                                        static_cast<std::size_t>(m.config().vocab_size));
  const std::int64_t V = m.config().vocab_size;
  const float* l = tf.forward(toks.data(), 72, cache, engine::Logits::kLast);
  std::vector<float> out(l, l + V);
  for (std::int32_t t : {5, 17, 29}) {
    l = tf.forward(&t, 1, cache);
    out.insert(out.end(), l, l + V);
  }
  return out;
}

TEST(EngineShapes, NamedShapesMatchThePublishedModels) {
  // Shapes from the models' published config.json files.
  const auto& l1b = engine::find_shape("llama-3.2-1b").config;
  EXPECT_EQ(l1b.n_layers, 16);
  EXPECT_EQ(l1b.dim, 2048);
  EXPECT_EQ(l1b.n_heads, 32);
  EXPECT_EQ(l1b.n_kv_heads, 8);
  EXPECT_EQ(l1b.head_dim, 64);
  EXPECT_EQ(l1b.hidden_dim, 8192);
  EXPECT_EQ(l1b.vocab_size, 128256);
  const auto& q = engine::find_shape("qwen2.5-0.5b").config;
  EXPECT_EQ(q.n_layers, 24);
  EXPECT_EQ(q.dim, 896);
  EXPECT_EQ(q.n_heads, 14);
  EXPECT_EQ(q.n_kv_heads, 2);
  EXPECT_EQ(q.hidden_dim, 4864);
  EXPECT_EQ(q.vocab_size, 151936);
  const auto& s = engine::find_shape("llama-110m").config;
  EXPECT_EQ(s.n_layers * 1000 + s.dim, 12 * 1000 + 768);
  EXPECT_EQ(s.hidden_dim, 2048);
  EXPECT_EQ(engine::find_shape("llama-3-8b").config.head_dim, 128);
  EXPECT_LT(engine::find_shape("llama-3-8b").default_layers, 32);
  // Parameter count of Llama 3.2 1B: 1.236 B (tied embedding).
  EXPECT_NEAR(static_cast<double>(l1b.n_params()) / 1e9, 1.236, 0.001);
  try {
    (void)engine::find_shape("llama-7");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("known: llama-110m"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)engine::make_random_model("llama-110m", {1, WeightType::kBF16, 13}), Error);
  test::expect_error(
      [] { (void)engine::make_random_model("llama-110m", {1, WeightType::kBF16, 1, 32001}); },
      ErrorCode::kInvalidArgument,
      {"[shape] vocab_size must be in [0, 32000] for llama-110m (0: the shape's), got 32001"});
}

TEST(EngineShapes, ASmallerVocabularyKeepsTheShapesFirstRows) {
  const Model full = engine::make_random_model("llama-110m", {5, WeightType::kBF16, 1});
  const Model small = engine::make_random_model("llama-110m", {5, WeightType::kBF16, 1, 300});
  EXPECT_EQ(small.config().vocab_size, 300);
  EXPECT_EQ(small.config().bos_id, 1);  // below 300: kept
  EXPECT_EQ(small.weights().token_embedding.rows, 300);
  const auto& a = full.weights().token_embedding;
  EXPECT_EQ(std::memcmp(a.data, small.weights().token_embedding.data,
                        static_cast<std::size_t>(300 * a.row_bytes())),
            0);
  const auto& wq = full.weights().layers[0].wq;
  EXPECT_EQ(std::memcmp(wq.data, small.weights().layers[0].wq.data,
                        static_cast<std::size_t>(wq.bytes())),
            0);
  // Qwen2.5's EOS (151643) is past a 512-token vocabulary: none.
  EXPECT_EQ(engine::make_random_model("qwen2.5-0.5b", {5, WeightType::kBF16, 1, 512}).config().eos_id,
            -1);
}

TEST(EngineShapes, RandomWeightsDoNotDependOnTheThreadCount) {
  const int saved = engine::threads();
  engine::set_threads(1);
  const Model a = engine::make_random_model("llama-110m", {3, WeightType::kBF16, 1});
  engine::set_threads(3);
  const Model b = engine::make_random_model("llama-110m", {3, WeightType::kBF16, 1});
  const Model c = engine::make_random_model("llama-110m", {4, WeightType::kBF16, 1});
  engine::set_threads(saved);
  const auto& wa = a.weights().layers[0].w_down;
  EXPECT_EQ(
      std::memcmp(wa.data, b.weights().layers[0].w_down.data, static_cast<std::size_t>(wa.bytes())),
      0);
  EXPECT_NE(
      std::memcmp(wa.data, c.weights().layers[0].w_down.data, static_cast<std::size_t>(wa.bytes())),
      0)
      << "another seed, other weights";
}

TEST(EngineShapes, LogitsAreBitIdenticalForEveryThreadCount) {
  const int saved = engine::threads();
  for (const WeightType type : {WeightType::kBF16, WeightType::kQ8_0}) {
    const Model m = engine::make_random_model("llama-110m", {1, type, 2});
    // Packed rows too (the fused attention on codes): KIVI with a short fp16 tail (rows are
    // quantized within the 72-token prompt), the demote= tier, ggml's q8_0 / q4_0 blocks.
    for (const std::string method :
         {"full", "h2o:h2o_budget=40", "kivi:residual_length=16", "h2o:h2o_budget=40,demote=kivi2",
          "full:kv_dtype=q8_0", "h2o:h2o_budget=40,kv_dtype=q4_0"}) {
      engine::set_threads(1);
      const std::vector<float> want = logits_of(m, method);
      double mag = 0;
      for (const float v : want) mag = std::max(mag, static_cast<double>(std::fabs(v)));
      EXPECT_GT(mag, 0.1) << "logits are not trivial";
      EXPECT_LT(mag, 100.0) << "activations stay sane";
      for (const int n : {2, 3}) {
        engine::set_threads(n);
        const std::vector<float> got = logits_of(m, method);
        ASSERT_EQ(got.size(), want.size());
        EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0)
            << engine::to_string(type) << " " << method << " at " << n << " threads";
      }
    }
  }
  engine::set_threads(saved);
}

TEST(EngineShapes, Bf16CheckpointRoundTripsAndIsReadInPlace) {
  const Model m = engine::make_random_model("llama-110m", {2, WeightType::kBF16, 2});
  const test::TempDir dir("shape_rt");
  engine::write_hf_checkpoint(m, dir.path.string());
  const Model back = Model::load(dir.path.string());
  EXPECT_EQ(back.config().weights_dtype, "bf16");
  EXPECT_EQ(back.config().n_layers, 2);
  EXPECT_EQ(back.config().n_kv_heads, 12);
  const auto& a = m.weights().layers[1].wq;
  const auto& b = back.weights().layers[1].wq;
  EXPECT_EQ(b.type, WeightType::kBF16);
  EXPECT_EQ(std::memcmp(a.data, b.data, static_cast<std::size_t>(a.bytes())), 0);
  // The file's matrices are used in place: the model owns only its fp32 norm vectors.
  EXPECT_EQ(back.owned_bytes(), (2 * 2 + 1) * 768 * 4);
  EXPECT_EQ(logits_of(m, "full"), logits_of(back, "full"));
  EXPECT_THROW(
      engine::write_hf_checkpoint(
          engine::make_random_model("llama-110m", {2, WeightType::kQ8_0, 1}), dir.path.string()),
      Error);
}

}  // namespace
}  // namespace vq
