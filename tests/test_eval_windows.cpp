// `eval --windows`: the windows are the text's tokens cut as documented (checked against the
// tokenizer's own encoding of the whole text), window 0 is the one-window scenario, each
// window's values do not depend on the thread count, the order or the other windows, the
// intervals are the documented bootstrap over the per-window values, and bad window options
// fail before any run. A budget written in a method spec is the budget that runs.
#include <gtest/gtest.h>

#include <algorithm>

#include "engine/formats/mapped_file.h"
#include "engine/tokenizers/tokenizer.h"
#include "engine_test_util.h"
#include "eval/model/model_eval.h"
#include "veloxquant/errors.h"
#include "veloxquant/registry.h"

namespace vq {
namespace {

eval::ModelEvalOptions windows_options() {
  eval::ModelEvalOptions o;
  o.model = test::data("stories260K.bin");
  o.text = test::data("tinystories_dev.txt");
  o.tokens = 40;
  o.prefill = 20;
  o.windows = 5;
  o.methods = {"h2o", "streaming_llm"};
  o.budgets = {8, 16};
  o.bootstrap_samples = 500;
  return o;
}

// Every per-window value of every row, in order.
std::vector<double> window_values(const eval::ModelEvalResult& r) {
  std::vector<double> out;
  for (const auto& row : r.rows) {
    for (const auto& w : row.windows) {
      out.insert(out.end(), {w.summary.nll_mean, w.summary.kl_mean, w.summary.top1_agreement,
                             static_cast<double>(w.cache.kept_bytes)});
      out.insert(out.end(), w.nll.begin(), w.nll.end());
    }
  }
  return out;
}

TEST(EvalWindows, WindowsAreBosThenConsecutiveSlicesOfTheWholeEncoding) {
  eval::ModelEvalOptions o = windows_options();
  o.window_stride = 50;
  const eval::ModelEvalResult r = eval::run_model_eval(o, nullptr);
  const engine::Model model = engine::Model::load(o.model);
  const auto tok = engine::load_tokenizer("", model);
  const std::vector<std::int32_t> ids = tok->encode(engine::read_text_file(o.text));
  ASSERT_EQ(ids[0], tok->bos_id());
  ASSERT_EQ(r.window_ids.size(), 5u);
  for (std::size_t k = 0; k < 5; ++k) {
    std::vector<std::int32_t> want = {ids[0]};
    want.insert(want.end(), ids.begin() + 1 + 50 * static_cast<std::ptrdiff_t>(k),
                ids.begin() + 1 + 50 * static_cast<std::ptrdiff_t>(k) + 39);
    EXPECT_EQ(r.window_ids[k], want) << "window " << k;
    EXPECT_EQ(r.windows[k].start, 1 + 50 * static_cast<std::int64_t>(k));
  }
}

TEST(EvalWindows, WindowZeroIsTheOneWindowScenario) {
  eval::ModelEvalOptions o = windows_options();
  const eval::ModelEvalResult w = eval::run_model_eval(o, nullptr);
  o.windows = 0;
  const eval::ModelEvalResult one = eval::run_model_eval(o, nullptr);
  ASSERT_EQ(w.rows.size(), one.rows.size());
  for (std::size_t i = 0; i < w.rows.size(); ++i) {
    EXPECT_EQ(w.rows[i].windows[0].nll, one.rows[i].nll) << w.rows[i].config.spec();
    EXPECT_EQ(w.rows[i].windows[0].summary.kl_mean, one.rows[i].summary.kl_mean);
    EXPECT_FALSE(one.rows[i].stats.has_value());
    ASSERT_TRUE(w.rows[i].stats.has_value());
  }
}

TEST(EvalWindows, ValuesDoNotDependOnThreadsOrderOrTheOtherWindows) {
  eval::ModelEvalOptions o = windows_options();
  o.threads = 1;
  const eval::ModelEvalResult one = eval::run_model_eval(o, nullptr);
  const std::vector<double> base = window_values(one);
  for (const int t : {2, 3, 8}) {
    o.threads = t;
    const eval::ModelEvalResult r = eval::run_model_eval(o, nullptr);
    EXPECT_EQ(window_values(r), base) << t << " threads";  // bit for bit
    for (std::size_t i = 0; i < r.rows.size(); ++i) {
      EXPECT_EQ(r.rows[i].stats->nll.lo, one.rows[i].stats->nll.lo);
      EXPECT_EQ(r.rows[i].stats->delta_ppl_pct_ci.hi, one.rows[i].stats->delta_ppl_pct_ci.hi);
    }
  }
  // Fewer windows: the first three windows' values are the same as in the five-window run.
  o.windows = 3;
  o.threads = 2;
  const eval::ModelEvalResult three = eval::run_model_eval(o, nullptr);
  for (std::size_t i = 0; i < three.rows.size(); ++i) {
    ASSERT_EQ(three.rows[i].windows.size(), 3u);
    for (std::size_t w = 0; w < 3; ++w)
      EXPECT_EQ(three.rows[i].windows[w].nll, one.rows[i].windows[w].nll);
  }
}

TEST(EvalWindows, EqualMemoryModeRunsTheSolvedSettingOnEveryWindow) {
  eval::ModelEvalOptions o = windows_options();
  o.budgets.clear();
  o.ratios = {4};
  o.threads = 2;
  const eval::ModelEvalResult r = eval::run_model_eval(o, nullptr);
  ASSERT_EQ(r.rows.size(), 3u);  // full, h2o at 4x, streaming_llm at 4x
  for (const auto& row : r.rows) {
    ASSERT_EQ(row.windows.size(), 5u);
    // The row's figures are the means over windows, ppl = exp(mean NLL).
    double nll = 0;
    for (const auto& w : row.windows) nll += w.summary.nll_mean;
    EXPECT_NEAR(row.summary.nll_mean, nll / 5, 1e-12);
    EXPECT_NEAR(row.summary.ppl, std::exp(nll / 5), 1e-9);
    EXPECT_LE(row.stats->ppl.lo, row.summary.ppl);
    EXPECT_GE(row.stats->ppl.hi, row.summary.ppl);
  }
  EXPECT_EQ(r.rows[0].stats->delta_nll, 0.0);  // the reference against itself
  const nlohmann::json j = eval::model_eval_json(r, "test");
  EXPECT_EQ(j["settings"]["windows"], 5);
  EXPECT_EQ(j["rows"][1]["windows"].size(), 5u);
  EXPECT_TRUE(j["best_per_ratio"][0].contains("indistinguishable"));
  EXPECT_NE(eval::model_eval_table(r).find("95% CI"), std::string::npos);
  // The Pareto plot draws a bar per point with an interval: more <line elements than the same
  // rows without their intervals.
  eval::ModelEvalResult bare = r;
  bare.options.windows = 0;
  for (auto& row : bare.rows) row.stats.reset();
  auto lines = [](const std::string& svg) {
    std::size_t n = 0;
    for (std::size_t at = svg.find("<line"); at != std::string::npos; at = svg.find("<line", at + 1))
      ++n;
    return n;
  };
  const std::string svg = eval::model_eval_plot(r);
  EXPECT_NE(svg.find("bars: 95% bootstrap intervals"), std::string::npos);
  EXPECT_GT(lines(svg), lines(eval::model_eval_plot(bare)));
}

TEST(EvalWindows, SeveralTextsGiveWindowsEach) {
  eval::ModelEvalOptions o = windows_options();
  o.windows = 2;
  o.more_texts = {test::data("wikitext2_test_excerpt.txt")};
  const eval::ModelEvalResult r = eval::run_model_eval(o, nullptr);
  ASSERT_EQ(r.windows.size(), 4u);
  EXPECT_EQ(r.windows[2].text, o.more_texts[0]);
  EXPECT_EQ(r.windows[2].index, 0);
  EXPECT_EQ(r.rows[1].windows.size(), 4u);
}

TEST(EvalWindows, BadWindowOptionsFailBeforeRunning) {
  auto message = [](const eval::ModelEvalOptions& o) {
    try {
      (void)eval::run_model_eval(o, nullptr);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  eval::ModelEvalOptions o = windows_options();
  o.windows = 1000;  // 1000 x 39 text tokens: more than the part holds
  EXPECT_NE(message(o).find("at most"), std::string::npos) << message(o);
  EXPECT_NE(message(o).find("tinystories_dev.txt"), std::string::npos);
  o = windows_options();
  o.window_stride = 10;  // shorter than the window's 39 text tokens
  EXPECT_NE(message(o).find("windows would overlap"), std::string::npos) << message(o);
  o = windows_options();
  o.windows = 0;
  o.more_texts = {o.text};
  EXPECT_NE(message(o).find("several texts need --windows"), std::string::npos) << message(o);
  o = windows_options();
  o.select_from = "x.json";
  EXPECT_NE(message(o).find("--select-from needs --ratio"), std::string::npos) << message(o);
}

TEST(EvalWindows, ABudgetWrittenInTheSpecIsTheBudgetThatRuns) {
  eval::ModelEvalOptions o;
  o.model = test::data("stories260K.bin");
  o.text = test::data("tinystories_dev.txt");
  o.tokens = 40;
  o.methods = {"h2o:budget=16"};  // the default budget list is 32, 64, 128, 256
  const eval::ModelEvalResult r = eval::run_model_eval(o, nullptr);
  ASSERT_EQ(r.rows.size(), 2u);
  EXPECT_EQ(token_budget(r.rows[1].config), 16);
  o.budgets = {16};
  o.budgets_given = true;  // --budget 16: says the same
  EXPECT_EQ(eval::run_model_eval(o, nullptr).rows.size(), 2u);
  o.budgets = {32, 64};  // --budget 32,64 contradicts the spec
  try {
    (void)eval::run_model_eval(o, nullptr);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'h2o:budget=16' writes budget 16 but --budget 32,64"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace vq
