// Head-wise budgets end to end on stories260K (8 query heads, 4 KV heads): the engine attends
// over heads that hold different numbers of rows, every layer keeps exactly Hkv x budget rows,
// a covering budget equals the full cache, and compressed runs are deterministic.
#include <numeric>

#include "engine/run/evaluate.h"
#include "engine/model/model.h"
#include "engine/tokenizers/tokenizer.h"
#include "engine/model/transformer.h"
#include "engine_test_util.h"
#include "veloxquant/builder.h"
#include "veloxquant/registry.h"

namespace vq {
namespace {
using engine::Model;

using test::stories;

std::vector<std::int32_t> tokens(std::int64_t n) { return test::excerpt_ids(n); }

const std::vector<std::string> kHeadwise = {
    "h2o:source=attention,headwise=true",     "tova:source=attention,headwise=true",
    "snapkv:source=attention,headwise=true",  "pyramidkv:source=attention,headwise=true",
    "squeeze:source=attention,headwise=true", "keyformer:source=attention,headwise=true",
    "morphkv:source=attention,headwise=true", "cam:source=attention,headwise=true",
    "h2o:source=proxy,headwise=true"};

TEST(Stories260KHeadwise, EveryLayerKeepsItsTotalAndHeadsDiffer) {
  const auto ids = tokens(140);
  const auto shape = engine::model_shape(stories().config());
  for (const std::string& spec : kHeadwise) {
    const CacheConfig config = with_token_budget(CacheConfig::parse(spec), 40);
    ModelCache cache = KVCacheBuilder::for_model(config, shape);
    engine::Transformer tf(stories(), 64);
    const bool prefill_only = config.info().prefill_only;
    tf.forward(ids.data(), 64, cache);
    bool unequal = false;
    for (std::size_t t = 64; t <= ids.size(); ++t) {
      for (std::int64_t l = 0; l < shape.n_layers; ++l) {
        const std::vector<std::int64_t> kept = cache.layer(l).stats().tokens_kept_per_head;
        const std::int64_t sum = std::accumulate(kept.begin(), kept.end(), std::int64_t{0});
        const std::int64_t budget = cache.layer(l).budget();
        const std::int64_t seen = static_cast<std::int64_t>(t);
        // snapkv cuts the prefill to the budget, then decode appends one row per head.
        const std::int64_t expected = prefill_only ? shape.n_kv_heads * (budget + seen - 64)
                                                   : shape.n_kv_heads * std::min(seen, budget);
        ASSERT_EQ(sum, expected) << spec << " layer " << l << " t " << t;
        for (std::int64_t k : kept) unequal = unequal || k != kept[0];
      }
      if (t < ids.size()) tf.forward(&ids[t], 1, cache);
    }
    EXPECT_TRUE(unequal) << spec << ": every head of every layer kept the same count";
  }
}

TEST(Stories260KHeadwise, CoveringBudgetEqualsFullAndRunsAreDeterministic) {
  const auto ids = tokens(96);
  const auto full = engine::run_forced(stories(), ids, CacheConfig("full"));
  for (const std::string& spec : kHeadwise) {
    const CacheConfig base = CacheConfig::parse(spec);
    engine::ForcedOptions o;
    o.prefill = 64;
    const auto covering = engine::run_forced(stories(), ids, with_token_budget(base, 512), o);
    EXPECT_EQ(covering.nll, full.nll) << spec;
    const auto a = engine::run_forced(stories(), ids, with_token_budget(base, 40), o);
    const auto b = engine::run_forced(stories(), ids, with_token_budget(base, 40), o);
    EXPECT_EQ(a.nll, b.nll) << spec;
    EXPECT_NE(a.nll, full.nll) << spec << ": nothing was evicted at budget 40";
    // The same method with uniform budgets keeps other rows.
    CacheConfig uniform = with_token_budget(base, 40);
    uniform.set("headwise", false);
    const auto u = engine::run_forced(stories(), ids, uniform, o);
    EXPECT_NE(a.nll, u.nll) << spec << ": head-wise equals uniform";
  }
}

}  // namespace
}  // namespace vq
