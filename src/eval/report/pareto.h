// The quality-per-byte view of an equal-memory evaluation (`veloxquant eval --ratio`): the best
// configuration at each compression ratio, and the Pareto plot (perplexity and KL against the
// ratio reached, log x, one series per method or composition, the best per ratio highlighted).
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace vq::eval {

struct ModelEvalResult;

// One evaluated configuration, as the selection sees it.
struct ParetoCandidate {
  double ratio = 1;  // compression ratio reached (full_bytes / kept_bytes)
  double ppl = 0;
  double kl = 0;
};

// What "best" means: the lowest perplexity (ties: lower KL), or the lowest KL against the
// reference, i.e. the closest to the full cache (ties: lower perplexity). They differ where
// forgetting lowers perplexity (a model that degrades past its training context, text out of
// its domain).
enum class ParetoCriterion { kPerplexity, kKl };

// For each asked ratio R: the index of the best candidate (by `criterion`) among those that
// reached at least R (a candidate run for a higher ratio qualifies: it holds fewer bytes); a
// full tie goes to the earlier candidate. nullopt when none reached R.
std::vector<std::optional<std::size_t>> best_per_ratio(
    const std::vector<ParetoCandidate>& candidates, const std::vector<double>& ratios,
    ParetoCriterion criterion = ParetoCriterion::kPerplexity);

// The selection over an equal-memory result's rows (the reference left out), in the order of
// result.options.ratios.
std::vector<std::optional<std::size_t>> best_rows_per_ratio(
    const ModelEvalResult& result, ParetoCriterion criterion = ParetoCriterion::kPerplexity);

// The "best_per_ratio" (kPerplexity) or "closest_per_ratio" (kKl) block of the result file
// (docs/results.md): one entry per asked ratio with the chosen row's method, budget, ratio
// reached, perplexity, KL and the perplexity's change against the reference in percent (null
// fields when no row reached the ratio).
nlohmann::json best_per_ratio_json(const ModelEvalResult& result,
                                   ParetoCriterion criterion = ParetoCriterion::kPerplexity);

// Windows mode: the rows statistically indistinguishable from row `best` at ratio R: every other
// row (the reference left out, one row per setting) that reached R and whose paired difference
// of window NLLs to `best` has a 95% bootstrap interval containing 0, in row order.
std::vector<std::size_t> indistinguishable_rows(const ModelEvalResult& result, std::size_t best,
                                               double ratio);

// Windows mode with --select-from: per ratio, the configuration the selection file (the dev
// split) chose, as measured on this run's windows (the test split): perplexity and its change
// against the reference with 95% intervals ("selected_per_ratio", docs/quality.md).
nlohmann::json selected_per_ratio_json(const ModelEvalResult& result);

// The best-per-ratio table (by perplexity, then the closest by KL) for the terminal; in windows
// mode with intervals, the count of indistinguishable rows and the selected configurations.
std::string best_per_ratio_table(const ModelEvalResult& result);

// The Pareto SVG: perplexity and KL against the ratio reached (log x), one series per method
// spec (budget left out), the reference as a dashed line, the best configuration per ratio as a
// highlighted series.
std::string pareto_plot(const ModelEvalResult& result);

}  // namespace vq::eval
