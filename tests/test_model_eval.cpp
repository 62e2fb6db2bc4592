// `veloxquant eval`'s harness: the run plan (reference first, budgets, skipped cells), the
// result file (schema, reproducible except timing) and the plot.
#include "engine_test_util.h"
#include "eval/model/model_eval.h"

#include <fmt/format.h>

#include <cmath>
#include <sstream>

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
  // streaming_llm at budget 16 after 95 tokens fed: 16 of 95 rows per head; 5 layers x 4 KV
  // heads x head_dim 8 x (K and V) x 2 bytes = 640 bytes per row.
  EXPECT_EQ(row["kept_bytes"], 16 * 640);
  EXPECT_EQ(row["full_bytes"], 95 * 640);
  EXPECT_NEAR(row["compression_ratio"].get<double>(), 95.0 / 16.0, 1e-12);
  EXPECT_EQ(row["keeps_all"], false);
  EXPECT_EQ(a["rows"][0]["keeps_all"], true);
  EXPECT_EQ(a["settings"]["scored_from"], 0);
  EXPECT_EQ(a["settings"]["n_scored"], 95);
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

TEST(ModelEval, PrefillFeedsTheFirstTokensAsOneStepAndOnlyDecodedPredictionsCount) {
  auto o = small_options();
  o.methods = {"streaming_llm"};
  o.budgets = {16};
  const auto plain = eval::run_model_eval(o, nullptr);
  o.prefill = 48;
  const auto pre = eval::run_model_eval(o, nullptr);
  // The 48 predictions made inside the prefill saw every prompt row whatever the method; the
  // summaries count the 95 - 48 = 47 decoded ones. The full-cache reference predicts them as it
  // does without a prefill.
  EXPECT_EQ(pre.scored_from, 48);
  EXPECT_EQ(pre.rows[0].summary.n_predictions, 47);
  EXPECT_EQ(pre.rows[1].summary.n_predictions, 47);
  double tail = 0;
  for (std::size_t p = 48; p < 95; ++p) tail += plain.rows[0].nll[p] / 47.0;
  EXPECT_NEAR(pre.rows[0].summary.nll_mean, tail, 1e-12);
  // streaming_llm cut the 48 prompt rows to 16 after the prefill: it evicted and compressed.
  EXPECT_FALSE(pre.rows[1].keeps_all);
  EXPECT_GT(pre.rows[1].summary.kl_mean, 0.0);
}

// The main job's scenario on the shipped model and text, cross-checked against run.c's own
// per-token NLL (data/reference, an independent implementation in fp32): a 256-token prefill,
// then 255 decoded predictions.
TEST(ModelEval, PerTokenFileMatchesRunCAndTheSummariesCountTheDecodedPart) {
  eval::ModelEvalOptions o;
  o.model = test::data("stories260K.bin");
  o.text = test::data("tinystories_validation_excerpt.txt");
  o.tokens = 512;
  o.prefill = 256;
  o.methods = {"full:kv_dtype=f32", "snapkv"};
  o.budgets = {64};
  const auto r = eval::run_model_eval(o, nullptr);
  ASSERT_EQ(r.rows.size(), 3u);  // the fp16 reference, fp32 storage as its own row, snapkv
  EXPECT_EQ(r.rows[1].config.spec(), "full:kv_dtype=f32");
  EXPECT_FALSE(r.rows[1].is_reference);
  // 511 tokens fed x 5 layers x 4 KV heads x head_dim 8 x (K and V): 2 bytes each in fp16, 4 in
  // fp32; neither compresses.
  EXPECT_EQ(r.rows[0].kept_bytes, 511 * 5 * 4 * 8 * 2 * 2);
  EXPECT_EQ(r.rows[1].kept_bytes, 511 * 5 * 4 * 8 * 2 * 4);
  EXPECT_TRUE(r.rows[0].keeps_all);
  EXPECT_TRUE(r.rows[1].keeps_all);
  // snapkv compresses the prompt to 64 rows, then grows by one row per decoded token.
  EXPECT_FALSE(r.rows[2].keeps_all);
  EXPECT_EQ(r.rows[2].kept_bytes, (64 + 255) * 5 * 4 * 8 * 2 * 2);

  const std::string reference = "reference/stories260K_fullcache_tinystories_validation_head_first512";
  const auto want_ids = test::read_ids(test::data(reference + ".ids.txt"));
  const auto want = test::read_nll(test::data(reference + ".nll.txt"));
  ASSERT_EQ(want.size(), 511u);
  // The per-token file: header, then run, method, budget, position, token, next_token, scored,
  // nll for every run and position.
  std::istringstream in(eval::model_eval_per_token(r));
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "run\tmethod\tbudget\tposition\ttoken\tnext_token\tscored\tnll");
  std::vector<std::int64_t> lines_per_run(3, 0);
  double run_c_scored = 0, file_scored = 0;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::int64_t run = 0, pos = 0, scored = 0;
    std::int32_t token = 0, next = 0;
    std::string method, budget;
    double nll = 0;
    ASSERT_TRUE(std::getline(f >> run >> std::ws, method, '\t') && std::getline(f, budget, '\t') &&
                (f >> pos >> token >> next >> scored >> nll))
        << line;
    ASSERT_TRUE(run >= 0 && run < 3) << line;
    ++lines_per_run[static_cast<std::size_t>(run)];
    EXPECT_EQ(method, r.rows[static_cast<std::size_t>(run)].config.spec());
    EXPECT_EQ(budget, run == 2 ? "64" : "-");
    EXPECT_EQ(token, want_ids[static_cast<std::size_t>(pos)]) << line;
    EXPECT_EQ(next, want_ids[static_cast<std::size_t>(pos) + 1]) << line;
    EXPECT_EQ(scored, pos >= 256 ? 1 : 0) << line;
    if (run == 1) {  // fp32 storage, full cache: run.c's numbers
      EXPECT_NEAR(nll, want[static_cast<std::size_t>(pos)].nll, 1e-4) << line;
      if (scored) run_c_scored += want[static_cast<std::size_t>(pos)].nll / 255.0;
      if (scored) file_scored += nll / 255.0;
    }
  }
  EXPECT_EQ(lines_per_run, (std::vector<std::int64_t>{511, 511, 511}));
  EXPECT_EQ(r.rows[1].summary.n_predictions, 255);
  EXPECT_NEAR(r.rows[1].summary.nll_mean, run_c_scored, 1e-5);
  EXPECT_NEAR(r.rows[1].summary.ppl, std::exp(run_c_scored), 1e-4);
  EXPECT_NEAR(r.rows[1].summary.nll_mean, file_scored, 1e-12);

  // The table says "keeps all" for runs that held every row, and gives snapkv its ratio.
  const std::string table = eval::model_eval_table(r);
  EXPECT_NE(table.find("the first 256 as one prefill, then 255 decoded predictions"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("keeps all"), std::string::npos) << table;
  EXPECT_NE(table.find(fmt::format("{:.2f}", 511.0 / (64 + 255))), std::string::npos) << table;
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
                     {"--prefill must be in [0, 94]"});
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
