// `veloxquant eval`'s harness: the run plan (reference first, budgets, skipped cells), the
// result file (schema, reproducible except timing) and the plot.
#include "engine_test_util.h"
#include "eval/model_eval.h"

namespace vq {
namespace {

eval::ModelEvalOptions small_options() {
  eval::ModelEvalOptions o;
  o.model = test::data("stories260K.bin");
  o.text = test::data("tinystories_validation_excerpt.txt");
  o.tokens = 96;
  // h2o with a fixed window of 16 cannot take budget 16 (its default window scales and can).
  o.methods = {"streaming_llm", "h2o:grace=16", "full:kv_dtype=f32",
               "streaming_llm:merge=sim_weighted"};
  o.budgets = {16, 32};
  return o;
}

nlohmann::json without_timing(nlohmann::json j) {
  for (auto& row : j["rows"]) row.erase("time_per_token_ms");
  return j;
}

TEST(ModelEval, PlansRunsReferenceFirstAndSkipsRejectedBudgets) {
  const auto r = eval::run_model_eval(small_options(), nullptr);
  ASSERT_EQ(r.rows.size(),
            1u + 2u + 1u + 1u + 2u);  // full, streaming x2, h2o@32, full f32, merge x2
  EXPECT_TRUE(r.rows[0].is_reference);
  EXPECT_EQ(r.rows[0].config.method(), "full");
  EXPECT_EQ(r.rows[0].summary.kl_mean, 0.0);
  EXPECT_EQ(r.rows[0].summary.top1_agreement, 1.0);
  EXPECT_EQ(r.rows[0].summary.n_predictions, 95);
  EXPECT_EQ(r.rows[1].config.spec(), "streaming_llm:stream_window_size=12");
  EXPECT_EQ(r.rows[1].series, "streaming_llm");
  ASSERT_EQ(r.skipped.size(), 1u);
  EXPECT_EQ(r.skipped[0].method, "h2o:h2o_grace=16");
  EXPECT_EQ(r.skipped[0].budget, 16);
  EXPECT_NE(r.skipped[0].reason.find("h2o_n_sink + h2o_grace must be < h2o_budget"),
            std::string::npos)
      << r.skipped[0].reason;
  for (const auto& row : r.rows) {
    if (row.is_reference) continue;
    if (row.config.method() == "full") {
      EXPECT_LT(row.summary.kl_mean, 1e-4) << "fp32 storage stays next to the fp16 reference";
    } else {
      EXPECT_GT(row.summary.kl_mean, 0.0) << row.config.spec();
      EXPECT_LE(row.kept_tokens, 32.0);
      EXPECT_GT(row.compression_ratio, 2.9);
    }
    EXPECT_GT(row.time_per_token_ms, 0.0);
  }
  const std::string table = eval::model_eval_table(r);
  EXPECT_NE(table.find("full (reference)"), std::string::npos);
  EXPECT_NE(table.find("skipped h2o:h2o_grace=16 at budget 16"), std::string::npos) << table;
}

TEST(ModelEval, ResultFileIsTheSharedSchemaAndReproducible) {
  const auto a =
      eval::model_eval_json(eval::run_model_eval(small_options(), nullptr), "veloxquant eval ...");
  const auto b =
      eval::model_eval_json(eval::run_model_eval(small_options(), nullptr), "veloxquant eval ...");
  EXPECT_EQ(without_timing(a), without_timing(b));
  EXPECT_EQ(a["schema"], "veloxquant.results/1");
  EXPECT_EQ(a["kind"], "eval");
  EXPECT_EQ(a["settings"]["tokens"], 96);
  EXPECT_EQ(a["settings"]["n_predictions"], 95);
  EXPECT_EQ(a["settings"]["model_config"]["n_kv_heads"], 4);
  EXPECT_EQ(a["settings"]["budgets"], nlohmann::json({16, 32}));
  const auto& row = a["rows"][1];
  for (const char* key :
       {"method", "method_id", "params", "budget", "nll_mean", "ppl", "kl_mean", "top1_agreement",
        "kept_tokens", "kept_bytes", "full_bytes", "compression_ratio", "time_per_token_ms",
        "n_predictions", "text", "tokens", "prefill", "reference"}) {
    EXPECT_TRUE(row.contains(key)) << key;
  }
  EXPECT_EQ(row["budget"], 16);
  EXPECT_TRUE(a["rows"][0]["budget"].is_null());
  EXPECT_EQ(a["rows"][0]["reference"], true);
  EXPECT_EQ(a["skipped"][0]["budget"], 16);
  EXPECT_NEAR(row["ppl"].get<double>(), std::exp(row["nll_mean"].get<double>()), 1e-9);
  EXPECT_NEAR(row["compression_ratio"].get<double>(),
              row["full_bytes"].get<double>() / row["kept_bytes"].get<double>(), 1e-9);
}

TEST(ModelEval, PlotHasOneSeriesPerMethodAndTheReferenceLine) {
  const std::string svg = eval::model_eval_plot(eval::run_model_eval(small_options(), nullptr));
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  for (const char* label : {">streaming_llm<", ">h2o:grace=16<", ">full (reference)<", ">full:kv_dtype=f32<",
                            ">streaming_llm:merge=sim_weighted<"}) {
    EXPECT_NE(svg.find(label), std::string::npos) << label;
  }
  EXPECT_NE(svg.find("stroke-dasharray"), std::string::npos);
}

TEST(ModelEval, PrefillFeedsTheFirstTokensAsOneStep) {
  auto o = small_options();
  o.methods = {"streaming_llm"};
  o.budgets = {16};
  const auto plain = eval::run_model_eval(o, nullptr);
  o.prefill = 48;
  const auto pre = eval::run_model_eval(o, nullptr);
  // The reference is the same either way; the compressed run attends over all 48 prompt rows
  // in the prefill, so it predicts those positions like the full cache does.
  EXPECT_NEAR(pre.rows[0].summary.nll_mean, plain.rows[0].summary.nll_mean, 1e-12);
  EXPECT_LT(pre.rows[1].summary.kl_mean, plain.rows[1].summary.kl_mean);
}

TEST(ModelEval, RejectsBadOptionsBeforeRunning) {
  auto o = small_options();
  o.methods = {"nope"};
  test::expect_error([&] { eval::run_model_eval(o, nullptr); }, ErrorCode::kUnknownMethod,
                     {"unknown method 'nope'"});
  o = small_options();
  o.tokens = 600;
  test::expect_error([&] { eval::run_model_eval(o, nullptr); }, ErrorCode::kInvalidArgument,
                     {"--tokens 600 exceeds the model's context (seq_len 512)"});
  o = small_options();
  o.prefill = 96;
  test::expect_error([&] { eval::run_model_eval(o, nullptr); }, ErrorCode::kInvalidArgument,
                     {"--prefill must be in [0, 95]"});
  const test::TempDir dir("short_text");
  test::write_bytes(dir.path / "t.txt", "Once upon a time.");
  o = small_options();
  o.text = dir / "t.txt";
  test::expect_error([&] { eval::run_model_eval(o, nullptr); }, ErrorCode::kFileError,
                     {"t.txt", "fewer than --tokens 96"});
  o.text = dir / "missing.txt";
  test::expect_error([&] { eval::run_model_eval(o, nullptr); }, ErrorCode::kFileError,
                     {"missing.txt", "cannot open"});
}

}  // namespace
}  // namespace vq
