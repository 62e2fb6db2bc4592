// One forward pass: the batched step (several sequences, each with its own cache, positions and
// step size) against the single-sequence forward, on every named model shape (engine/model/
// shapes.h: Llama 2 and 3 layouts, GQA ratios 1 to 7, head_dim 64 and 128, Qwen2's q/k/v
// biases), a Llama 3 RoPE-scaled and a linearly scaled variant, and the shipped stories260K
// (interleaved RoPE). Each sequence's logits (each logits mode) and cache statistics after
// every step must be identical bit for bit to the same sequence run alone. Before the two
// entry points shared one layer loop, serve's batched copy dropped Qwen2's biases and this test
// failed on qwen2.5-0.5b's first step (max |logit diff| 2.17).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "engine/model/model_builder.h"
#include "engine/model/shapes.h"
#include "engine/model/transformer.h"
#include "engine_test_util.h"
#include "veloxquant/builder.h"

namespace vq {
namespace {

using engine::Model;
using engine::WeightType;

std::size_t sz(std::int64_t n) { return static_cast<std::size_t>(n); }

// Llama 3's per-frequency RoPE divisors (the published rope_scaling: factor 32, low_freq_factor
// 1, high_freq_factor 4, original context 8192): long wavelengths divided by the factor, short
// ones kept, a smooth blend between.
std::vector<float> llama3_freq_factors(const engine::ModelConfig& c) {
  const double factor = 32, low = 1, high = 4, original = 8192;
  const double pi = std::acos(-1.0);
  std::vector<float> f;
  for (std::int64_t i = 0; i < c.head_dim / 2; ++i) {
    const double freq =
        std::pow(c.rope_theta, -static_cast<double>(2 * i) / static_cast<double>(c.head_dim));
    const double wavelen = 2 * pi / freq;
    double divisor = 1;
    if (wavelen > original / low) {
      divisor = factor;
    } else if (wavelen >= original / high) {
      const double smooth = (original / wavelen - low) / (high - low);
      divisor = 1 / ((1 - smooth) / factor + smooth);
    }
    f.push_back(static_cast<float>(divisor));
  }
  return f;
}

// A model to run: a named shape's layers at a small vocabulary, optionally with its RoPE scaled.
struct Case {
  std::string name;
  Model model;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  auto shape = [](const std::string& name, WeightType type, std::int64_t layers) {
    return engine::make_random_model(name, {7, type, layers, 512});
  };
  auto edited = [](Model m, auto edit) {
    engine::ModelBuilder b;
    b.model = std::move(m);
    edit(b.config());
    return b.finish();
  };
  out.push_back({"stories260K", Model::load(test::data("stories260K.bin"))});
  for (const engine::NamedShape& s : engine::named_shapes()) {
    // Two layers each (one for the 8B's 218M-parameter layer).
    out.push_back({s.name, shape(s.name, WeightType::kBF16, s.config.dim >= 4096 ? 1 : 2)});
  }
  out.push_back({"llama-110m q8_0", shape("llama-110m", WeightType::kQ8_0, 2)});
  out.push_back({"llama-3.2-1b with Llama 3 RoPE scaling",
                 edited(shape("llama-3.2-1b", WeightType::kBF16, 2), [](engine::ModelConfig& c) {
                   c.rope_freq_factors = llama3_freq_factors(c);
                 })});
  out.push_back({"qwen2.5-0.5b with linear RoPE scaling",
                 edited(shape("qwen2.5-0.5b", WeightType::kBF16, 1),
                        [](engine::ModelConfig& c) { c.rope_freq_scale = 0.25; })});
  return out;
}

void expect_same_stats(const CacheStats& a, const CacheStats& b, const std::string& what) {
  EXPECT_EQ(a.tokens_seen, b.tokens_seen) << what;
  EXPECT_EQ(a.tokens_kept_per_head, b.tokens_kept_per_head) << what;
  EXPECT_EQ(a.kept_bytes, b.kept_bytes) << what;
  EXPECT_EQ(a.full_bytes, b.full_bytes) << what;
  EXPECT_EQ(a.resident_bytes, b.resident_bytes) << what;
  EXPECT_EQ(a.evictions, b.evictions) << what;
  EXPECT_EQ(std::string(a.score_source), std::string(b.score_source)) << what;
}

TEST(ForwardBatch, EveryShapeGivesTheSingleSequenceLogitsBitForBit) {
  // The named shapes' q/k/v biases are not zero (else the test would not see a path that
  // ignores them).
  {
    const Model q = engine::make_random_model("qwen2.5-0.5b", {7, WeightType::kBF16, 1, 512});
    ASSERT_NE(q.weights().layers[0].bq, nullptr);
    double mag = 0;
    for (std::int64_t i = 0; i < q.config().kv_dim(); ++i)
      mag = std::max(mag, static_cast<double>(std::fabs(q.weights().layers[0].bk[i])));
    ASSERT_GT(mag, 0.1);
  }
  // Three sequences: plain rows, an evicting method that reads the attention probabilities,
  // packed KIVI rows; each step a different number of tokens per sequence (prefill chunks, then
  // single decode tokens), so the sequences sit at different positions in one batch.
  const std::vector<std::string> specs = {
      "full", "h2o:budget=10,source=attention",
      "kivi:bit_width_inlier=4,group_size=32,residual_length=32"};
  const std::vector<std::vector<std::int64_t>> steps = {
      {7, 3, 12}, {1, 6, 1}, {1, 1, 1}, {4, 1, 2}, {1, 9, 1}};
  for (Case& mc : cases()) {
    const Model& m = mc.model;
    const engine::ModelConfig& c = m.config();
    const ModelShape shape = engine::model_shape(c);
    std::vector<std::vector<std::int32_t>> tokens(3);
    for (std::size_t i = 0; i < 3; ++i) {
      for (std::int32_t t = 0; t < 40; ++t)
        tokens[i].push_back(static_cast<std::int32_t>((t * 37 + 11 * i + 5) % c.vocab_size));
    }
    std::vector<ModelCache> batched, alone;
    for (const auto& s : specs) {
      batched.push_back(KVCacheBuilder::for_model(CacheConfig::parse(s), shape));
      alone.push_back(KVCacheBuilder::for_model(CacheConfig::parse(s), shape));
    }
    engine::Transformer batch(m, 12, 64, 32), single(m, 12, 64);
    std::vector<std::int64_t> at(3, 0);
    for (std::size_t k = 0; k < steps.size(); ++k) {
      // The logits modes rotate over the sequences from step to step.
      const engine::Logits modes[] = {engine::Logits::kLast, engine::Logits::kAll,
                                      engine::Logits::kNone};
      std::vector<engine::BatchItem> items;
      for (std::size_t i = 0; i < 3; ++i) {
        items.push_back({tokens[i].data() + at[i], steps[k][i], &batched[i], modes[(i + k) % 3]});
      }
      batch.forward(items);
      for (std::size_t i = 0; i < 3; ++i) {
        const std::string what = mc.name + ", " + specs[i] + ", tokens " +
                                 std::to_string(at[i]) + ".." +
                                 std::to_string(at[i] + steps[k][i] - 1);
        const engine::Logits mode = items[i].logits;
        const float* want = single.forward(tokens[i].data() + at[i], steps[k][i], alone[i], mode);
        if (mode == engine::Logits::kNone) {
          EXPECT_EQ(want, nullptr);
          EXPECT_THROW((void)batch.logits(i), Error);
        } else {
          const std::int64_t n = (mode == engine::Logits::kAll ? steps[k][i] : 1) * c.vocab_size;
          const std::vector<float> a(want, want + n);
          const std::vector<float> b(batch.logits(i), batch.logits(i) + n);
          ASSERT_EQ(std::memcmp(a.data(), b.data(), sz(n) * sizeof(float)), 0)
              << what << ": max |diff| " << test::max_abs_diff(a, b);
        }
        expect_same_stats(batched[i].stats(), alone[i].stats(), what);
        at[i] += steps[k][i];
      }
    }
  }
}

TEST(ForwardBatch, RefusesBadStepsBeforeAnyCacheBegins) {
  const Model m = Model::load(test::data("stories260K.bin"));
  const ModelShape shape = engine::model_shape(m.config());
  engine::Transformer tf(m, 4, 64, 8);
  ModelCache a = KVCacheBuilder::for_model(CacheConfig("full"), shape);
  ModelCache b = KVCacheBuilder::for_model(CacheConfig::parse("h2o:budget=8"), shape);
  const std::int32_t toks[5] = {1, 2, 3, 4, 5}, bad = 512;
  using Items = std::vector<engine::BatchItem>;
  auto refused = [&](const Items& items, const std::vector<std::string>& fragments) {
    test::expect_error([&] { tf.forward(items); }, ErrorCode::kInvalidArgument, fragments);
    EXPECT_EQ(a.layer(0).tokens_seen(), 0);
    EXPECT_EQ(b.layer(0).tokens_seen(), 0);
    EXPECT_EQ(a.stats().tokens_seen + b.stats().tokens_seen, 0);
  };
  refused({}, {"at least one sequence"});
  refused({{toks, 5, &a}}, {"1 to 4 tokens, got 5"});
  refused({{toks, 1, &a}, {toks, 5, &b}}, {"sequence 1 of the step: ", "1 to 4 tokens, got 5"});
  refused({{toks, 4, &a}, {toks, 1, &a}}, {"sequences 0 and 1 of the step have the same cache"});
  refused({{toks, 4, &a}, {toks, 4, &b}, {toks, 1, nullptr}}, {"sequence 2", "no tokens or cache"});
  // The last sequence's bad token is found before the first sequence's cache begins.
  refused({{toks, 4, &a}, {&bad, 1, &b}}, {"sequence 1", "token id 512", "[0, 512)"});
  ModelCache wide = KVCacheBuilder::for_model(CacheConfig("full"), ModelShape{5, 4, 16, 8});
  refused({{toks, 1, &a}, {toks, 1, &wide}}, {"sequence 1", "cache is shaped for 5 layers"});
  // 4 + 4 + 1 tokens: one more than max_tokens.
  ModelCache c = KVCacheBuilder::for_model(CacheConfig("full"), shape);
  refused({{toks, 4, &a}, {toks, 4, &b}, {toks, 1, &c}}, {"at most 8 tokens", "got 9"});
  test::expect_error([&] { engine::Transformer t(m, 4, 64, 3); }, ErrorCode::kInvalidArgument,
                     {"max_tokens must be 0 (max_chunk) or at least max_chunk (4), got 3"});
  // Positions past max_rows.
  engine::Transformer small(m, 4, 6, 8);
  small.forward(toks, 4, a, engine::Logits::kNone);
  test::expect_error([&] { small.forward(toks, 3, a); }, ErrorCode::kInvalidArgument,
                     {"position 6 is past this transformer's max_rows (6)"});
  EXPECT_EQ(a.layer(0).tokens_seen(), 4);
  // A good step after the refusals runs; asking for logits a sequence did not ask for throws.
  const Items ok = {{toks, 2, &b, engine::Logits::kNone}, {toks, 3, &c, engine::Logits::kAll}};
  tf.forward(ok);
  EXPECT_EQ(b.layer(0).tokens_seen(), 2);
  EXPECT_THROW((void)tf.logits(0), Error);
  EXPECT_THROW((void)tf.logits(2), Error);
  EXPECT_NE(tf.logits(1), nullptr);
}

}  // namespace
}  // namespace vq
