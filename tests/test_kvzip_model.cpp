// kvzip on a real model (stories260K): the engine's reconstruction pass (Transformer::
// reconstruct) runs over the prompt's cache, forgets its own rows, leaves the kept rows' K/V
// bit-identical to the prompt's, and changes what is kept against the fallback without it.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "engine/model/model.h"
#include "engine/model/transformer.h"
#include "engine/run/evaluate.h"
#include "engine/run/generate.h"
#include "engine/tokenizers/tokenizer.h"
#include "engine_test_util.h"
#include "veloxquant/builder.h"

namespace vq {
namespace {

using engine::Model;

using test::stories;

std::vector<std::int32_t> prompt_ids(std::size_t n) {
  return test::excerpt_ids(static_cast<std::int64_t>(n));
}

// Per (layer, head): position -> the stored key and value bytes (fp16 rows).
struct Rows {
  std::vector<std::vector<std::int32_t>> pos;
  std::vector<std::vector<std::vector<char>>> kv;
};
Rows rows_of(const ModelCache& c) {
  Rows out;
  const std::int64_t D = c.shape().head_dim;
  for (std::int64_t l = 0; l < c.n_layers(); ++l) {
    for (std::int64_t h = 0; h < c.shape().n_kv_heads; ++h) {
      const HeadRows r = c.layer(l).stored(0, h);
      out.pos.emplace_back(r.positions, r.positions + r.n_rows);
      std::vector<std::vector<char>> kv;
      const auto bytes = static_cast<std::size_t>(D) * dtype_size(r.dtype);
      for (std::int64_t i = 0; i < r.n_rows; ++i) {
        std::vector<char> row(2 * bytes);
        std::memcpy(row.data(), r.key_row(i), bytes);
        std::memcpy(row.data() + bytes, r.value_row(i), bytes);
        kv.push_back(std::move(row));
      }
      out.kv.push_back(std::move(kv));
    }
  }
  return out;
}

TEST(KvzipModel, ThePassKeepsThePromptsRowsBitIdentical) {
  const Model& m = stories();
  const auto tok = engine::load_tokenizer("", m);
  const std::vector<std::int32_t> ids = prompt_ids(48);
  ASSERT_EQ(ids.size(), 48u);
  const engine::RepeatPrompt repeat = engine::repeat_prompt(*tok);
  ASSERT_FALSE(repeat.first.empty());
  // chunk=20: three reconstruction steps over the 48 prompt tokens.
  ModelCache cache(CacheConfig::parse("kvzip:budget=16,chunk=20"), engine::model_shape(m.config()));
  cache.set_reconstruction(true);
  engine::Transformer tf(m, 48 + 40, 0);
  tf.forward(ids.data(), 48, cache, engine::Logits::kLast);
  const Rows before = rows_of(cache);
  for (const auto& p : before.pos) ASSERT_EQ(p.size(), 48u) << "the prompt waits with every row";
  const double seconds = tf.reconstruct(ids.data(), 48, cache, repeat);
  EXPECT_GT(seconds, 0.0);
  const Rows after = rows_of(cache);
  const std::int64_t H = m.config().n_kv_heads;
  for (std::int64_t l = 0; l < m.config().n_layers; ++l) {
    std::size_t total = 0;
    for (std::int64_t h = 0; h < H; ++h) {
      const std::size_t i = static_cast<std::size_t>(l * H + h);
      total += after.pos[i].size();
      for (std::int32_t s = 0; s < 4; ++s) EXPECT_EQ(after.pos[i][static_cast<std::size_t>(s)], s);
      for (std::size_t r = 0; r < after.pos[i].size(); ++r) {
        const auto p = static_cast<std::size_t>(after.pos[i][r]);
        ASSERT_LT(p, 48u) << "a reconstruction row stayed";
        EXPECT_EQ(after.kv[i][r], before.kv[i][p]) << "layer " << l << " head " << h << " pos " << p;
      }
    }
    EXPECT_EQ(total, static_cast<std::size_t>(16 * H)) << "layer " << l;
  }
  EXPECT_EQ(cache.layer(0).tokens_seen(), 48);

  // Without the pass (the fallback: the prompt's own attention) other rows are kept somewhere.
  ModelCache fallback(CacheConfig::parse("kvzip:budget=16,chunk=20"),
                      engine::model_shape(m.config()));
  engine::Transformer tf2(m, 48, 0);
  tf2.forward(ids.data(), 48, fallback, engine::Logits::kNone);
  EXPECT_NE(rows_of(fallback).pos, after.pos);
}

TEST(KvzipModel, EvalRunsThePassAndAFullBudgetEqualsFull) {
  const Model& m = stories();
  const auto tok = engine::load_tokenizer("", m);
  const std::vector<std::int32_t> ids = prompt_ids(96);
  const engine::RepeatPrompt repeat = engine::repeat_prompt(*tok);
  engine::ForcedOptions o;
  o.prefill = 64;
  o.repeat = &repeat;
  const engine::ForcedRun full = engine::run_forced(m, ids, CacheConfig("full"), o);
  // A budget above the prompt keeps every row: the pass must leave the cache as it was, so
  // every logit (hence NLL) equals the full cache's, bit for bit.
  const engine::ForcedRun all = engine::run_forced(m, ids, CacheConfig::parse("kvzip:budget=512"), o);
  EXPECT_GT(all.reconstruction_seconds, 0.0);
  EXPECT_EQ(all.nll, full.nll);
  EXPECT_EQ(full.reconstruction_seconds, 0.0);
  // A real cut: the prompt's 64 rows down to 16 per head on average, then decode appends.
  const engine::ForcedRun cut = engine::run_forced(m, ids, CacheConfig::parse("kvzip:budget=16"), o);
  EXPECT_GT(cut.reconstruction_seconds, 0.0);
  EXPECT_EQ(cut.cache.tokens_seen, 95);
  EXPECT_LT(cut.cache.kept_bytes, full.cache.kept_bytes);
  EXPECT_NE(cut.nll, full.nll);
}

}  // namespace
}  // namespace vq
