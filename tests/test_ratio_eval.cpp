// `veloxquant eval --ratio` on the shipped model: the settings the equal-memory mode runs, the
// ratios it reaches (worked out by hand from stories260K's shapes: 640 bytes per fp16 row over
// its 5 layers x 4 KV heads, head_dim 8), the correction by running, and the result file.
#include "engine_test_util.h"
#include "eval/model/model_eval.h"
#include "eval/report/pareto.h"
#include "veloxquant/registry.h"

namespace vq {
namespace {

eval::ModelEvalOptions ratio_options() {
  eval::ModelEvalOptions o;
  o.model = test::data("stories260K.bin");
  o.text = test::data("tinystories_dev.txt");
  o.tokens = 96;  // 95 rows fed: full_bytes = 95 x 640 = 60800
  o.ratios = {8};
  return o;
}

const eval::ModelEvalRow* find_row(const eval::ModelEvalResult& r, const std::string& method) {
  for (const auto& row : r.rows) {
    if (!row.is_reference && row.config.method() == method) return &row;
  }
  return nullptr;
}

TEST(RatioEval, EvictionKiviAndCompositionAt8x) {
  eval::ModelEvalOptions o = ratio_options();
  o.methods = {"streaming_llm", "kivi", "h2o:quantize=kivi2"};
  const auto r = eval::run_model_eval(o, nullptr);
  ASSERT_GE(r.rows.size(), 3u);
  EXPECT_TRUE(r.rows[0].is_reference);
  // streaming_llm: 60800 / 8 = 7600 bytes = 11.875 rows -> budget 11, 7040 bytes, 95 / 11.
  const auto* s = find_row(r, "streaming_llm");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(token_budget(s->config), 11);
  EXPECT_EQ(s->kept_bytes, 7040);
  EXPECT_EQ(s->full_bytes, 60800);
  EXPECT_DOUBLE_EQ(s->compression_ratio, 95.0 / 11.0);
  EXPECT_TRUE(s->ratio_met);
  EXPECT_EQ(s->target_ratio, 8.0);
  EXPECT_EQ(s->solver_runs, 1);  // the prediction held
  // kivi: 95 rows stay in its 128-row fp16 tail at either width (ratio 1): the nearest is the
  // first variant (2 bits), marked not met with the widths' ratios.
  const auto* k = find_row(r, "kivi");
  ASSERT_NE(k, nullptr);
  EXPECT_FALSE(k->ratio_met);
  EXPECT_EQ(k->kept_bytes, 60800);
  EXPECT_NE(k->ratio_note.find("nearest"), std::string::npos) << k->ratio_note;
  // h2o:quantize=kivi2: its smallest budget (64) holds 20 x 1312 = 26240 bytes > 7600.
  EXPECT_EQ(find_row(r, "h2o"), nullptr);
  ASSERT_EQ(r.skipped.size(), 1u);
  EXPECT_EQ(r.skipped[0].ratio, 8.0);
  EXPECT_NE(r.skipped[0].reason.find("not reachable"), std::string::npos) << r.skipped[0].reason;
  // The result file carries the target, the ratio reached and the best per ratio.
  const auto j = eval::model_eval_json(r, "veloxquant eval --ratio 8");
  EXPECT_EQ(j["settings"]["ratios"], nlohmann::json::array({8.0}));
  EXPECT_TRUE(j["settings"]["budgets"].is_null());
  EXPECT_EQ(j["rows"][1]["target_ratio"], 8.0);
  EXPECT_EQ(j["rows"][1]["ratio_reached"], 95.0 / 11.0);
  ASSERT_EQ(j["best_per_ratio"].size(), 1u);
  EXPECT_EQ(j["best_per_ratio"][0]["method"], "streaming_llm:stream_window_size=7");
  EXPECT_EQ(j["closest_per_ratio"][0]["method"], "streaming_llm:stream_window_size=7");
  EXPECT_EQ(j["skipped"][0]["ratio"], 8.0);
  const std::string table = eval::model_eval_table(r);
  EXPECT_NE(table.find("best configuration per ratio"), std::string::npos) << table;
  const std::string svg = eval::model_eval_plot(r);
  EXPECT_NE(svg.find("best configuration per ratio"), std::string::npos);
  EXPECT_NE(svg.find("compression ratio reached"), std::string::npos);
}

TEST(RatioEval, SnapkvIsCorrectedByRunning) {
  // 96 tokens, the first 48 as one prefill: snapkv cuts the prompt to its budget b and keeps
  // the 47 decoded rows, so it ends with b + 47 rows. 1.5x of 95 rows = 63.33 rows -> b <= 16.
  // The first prediction (63 rows, no prompt cut since 63 > 48) holds all 95 rows; the checks
  // correct it by the measured excess until the run reaches 1.5x.
  eval::ModelEvalOptions o = ratio_options();
  o.prefill = 48;
  o.ratios = {1.5};
  o.methods = {"snapkv:obs_window=8"};
  const auto r = eval::run_model_eval(o, nullptr);
  ASSERT_EQ(r.rows.size(), 2u) << (r.skipped.empty() ? "" : r.skipped[0].reason);
  const auto& row = r.rows[1];
  EXPECT_EQ(token_budget(row.config), 16);
  EXPECT_EQ(row.kept_bytes, 63 * 640);
  EXPECT_TRUE(row.ratio_met);
  EXPECT_GT(row.solver_runs, 1);
  EXPECT_LE(row.solver_runs, 8);
}

TEST(RatioEval, RejectsBadRatios) {
  eval::ModelEvalOptions o = ratio_options();
  o.ratios = {0.5};
  EXPECT_THROW(eval::run_model_eval(o, nullptr), Error);
}

}  // namespace
}  // namespace vq
