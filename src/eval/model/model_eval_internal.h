// Pieces shared by the eval runner (model_eval.cpp) and its renderers (model_eval_report.cpp,
// pareto.cpp); not part of the eval API.
#pragma once

#include <string>
#include <vector>

#include "eval/model/model_eval.h"

namespace vq::eval {

// A method's non-default fields without the method prefix ("h2o:grace=0,decay=1"), for table
// rows and plot legends; with drop_budget the budget field is left out (it has its own column).
std::string short_spec(const CacheConfig& config, bool drop_budget);

// The part of a run the summaries count: predictions [from, P) (ModelEvalResult::scored_from).
engine::ForcedRun scored_part(const engine::ForcedRun& run, std::int64_t from);

// A row from its runs on every window (ModelEvalRow: one window's values as they are, several
// windows' means, the largest kept bytes, the smallest ratio).
ModelEvalRow make_row(const CacheConfig& config, const std::string& series, bool is_reference,
                      const std::vector<WindowRun>& windows);

// Per-window values of one quantity, in window order.
std::vector<double> window_nll(const ModelEvalRow& row);
std::vector<double> window_kl(const ModelEvalRow& row);
std::vector<double> window_top1(const ModelEvalRow& row);

// The result's bootstrap (options' windows, samples and seed over every window of every text).
PairedBootstrap result_bootstrap(const ModelEvalResult& result);

// Fills every row's `stats` (windows mode): means and 95% intervals, and the paired difference
// to the reference row.
void add_window_stats(ModelEvalResult& result);

// 100 (exp(d) - 1): a change of mean NLL d as the perplexity's change in percent.
double ppl_change_pct(double delta_nll);

}  // namespace vq::eval
