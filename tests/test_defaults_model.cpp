// Every method's defaults are usable on a real model (issue 9): the shipped stories260K reads
// the first 512 tokens of the TinyStories excerpt teacher-forced at budget 64 (the main job's
// setting), and no default may collapse. The bar is independent of the methods under test:
// streaming_llm, which keeps the 4 sinks and the newest 60 rows and scores nothing, is the
// floor a budgeted method must stay near (within 15% of its perplexity), and cam's default,
// the CaM paper's window rule on a usable H2O base, must actually merge.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "engine_test_util.h"
#include "eval/model/model_eval.h"
#include "veloxquant/registry.h"

namespace vq {
namespace {

const eval::ModelEvalResult& defaults_at_64() {
  static const eval::ModelEvalResult r = [] {
    eval::ModelEvalOptions o;
    o.model = test::data("stories260K.bin");
    o.text = test::data("tinystories_validation_excerpt.txt");
    o.tokens = 512;
    o.budgets = {64};
    return eval::run_model_eval(o, nullptr);  // every registered method, default fields
  }();
  return r;
}

TEST(DefaultsModel, EveryBudgetedDefaultIsWithin15PercentOfStreamingLLM) {
  const auto& r = defaults_at_64();
  EXPECT_TRUE(r.skipped.empty()) << "a default rejected budget 64: " << r.skipped.front().reason;
  double streaming = 0;
  for (const auto& row : r.rows) {
    if (row.config.method() == "streaming_llm") streaming = row.summary.ppl;
  }
  ASSERT_GT(streaming, 0.0);
  int checked = 0;
  for (const auto& row : r.rows) {
    if (row.is_reference || !has_token_budget(row.config)) continue;
    ASSERT_EQ(token_budget(row.config), 64) << row.config.spec();
    EXPECT_LE(row.summary.ppl, 1.15 * streaming)
        << row.config.spec() << ": perplexity " << row.summary.ppl << " against streaming_llm's "
        << streaming;
    ++checked;
  }
  // Every registered method with a budget was measured (full and kivi keep every token).
  std::int64_t budgeted = 0;
  for (const auto& m : registry()) budgeted += m.budget_field.empty() ? 0 : 1;
  EXPECT_EQ(checked, budgeted);
}

TEST(DefaultsModel, CamMergesAndEvalRecordsTheSourceThatRan) {
  const auto& r = defaults_at_64();
  std::map<std::string, const eval::ModelEvalRow*> by_id;
  for (const auto& row : r.rows) by_id[row.config.method()] = &row;
  ASSERT_TRUE(by_id.count("cam"));
  const auto& cam = *by_id["cam"];
  EXPECT_GT(cam.evictions, 0);
  EXPECT_GT(cam.merges, 0) << "cam's default never merged";
  EXPECT_LT(cam.merges, cam.evictions) << "the gate should reject some merges";
  // The engine passes probabilities every step, so source=auto resolves to true attention for
  // the attention-scored methods (those with a `source` field); methods without attention
  // scores say so.
  for (const std::string& id : method_ids()) {
    ASSERT_TRUE(by_id.count(id)) << id;
    EXPECT_EQ(by_id[id]->score_source, CacheConfig(id).has("source") ? "attention" : "none") << id;
  }
}

}  // namespace
}  // namespace vq
