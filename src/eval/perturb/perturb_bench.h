// The model-free perturbation benchmark behind `veloxquant bench perturb`.
//
// For every method spec x token budget x sequence length, and every data seed, the harness
// makes synthetic K/V (eval/perturb/synthetic.h), feeds it to a fresh LayerCache (one prefill call or
// one token per call) and measures
//
//   perturbation = mean over KV heads and probe queries of 1 - cos(o_full, o_kept),
//   o = softmax(q K^T / sqrt(D)) V in fp32,
//
// where o_full attends over every token held by a `full` cache with the method's kv_dtype (so a
// method that keeps everything scores exactly 0) and o_kept over the rows the method keeps
// (or merged). Rows report the mean and sample standard deviation over data seeds, the per-seed
// values, kept tokens and bytes, the compression ratio, merges and evictions, and the update
// time per token; `shift` / `stable` add the share of kept rows in the late block and `planted`
// the planted token's survival rate.
//
// Seeds: seed s of `seeds` is data seed s (s = 0 .. seeds - 1) and feeds only the synthetic
// data; each cache keeps its method's own config seed. Everything but the timing fields
// (names ending in _us) is a pure function of the options.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "eval/perturb/synthetic.h"
#include "veloxquant/config.h"

namespace vq::eval {

enum class Feed {
  kPrefill,  // one begin_step/end_step with all S tokens
  kStream,   // one begin_step/end_step per token
};
Feed parse_feed(const std::string& name);  // throws Error(kInvalidArgument)
const char* to_string(Feed feed) noexcept;

// Largest values the harness accepts (it holds every seed's data for one sequence length).
inline constexpr std::int64_t kMaxBenchTokens = 1 << 20;
inline constexpr std::int64_t kMaxBenchHeads = 256;
inline constexpr std::int64_t kMaxBenchHeadDim = 1024;
inline constexpr std::int64_t kMaxBenchProbes = 4096;
inline constexpr std::int64_t kMaxBenchSeeds = 1000;
// Synthetic K/V plus references held for one sequence length (every seed at once).
inline constexpr std::int64_t kMaxBenchBytes = std::int64_t{4} << 30;

struct PerturbOptions {
  std::vector<std::string> methods;  // method specs as given (--method)
  std::vector<std::int64_t> seqs{256, 512, 1024};
  std::vector<std::int64_t> budgets{64, 128};
  bool budgets_given = false;  // --budget given: a spec writing another budget is an error
  std::int64_t heads = 4;
  std::int64_t head_dim = 64;
  std::int64_t probes = 32;
  std::int64_t seeds = 5;
  Geometry geometry = Geometry::kSpans;
  Feed feed = Feed::kPrefill;
};

// One row of the sweep: a method with one budget applied, at one sequence length.
struct PerturbCase {
  std::string method_arg;  // the --method spec as given
  CacheConfig config;      // parsed, with the budget applied when the method has one
  std::int64_t seq = 0;
};

// Bytes of synthetic data (K/V and probes of every seed at the longest --seq) and full-cache
// references a run of `o` holds at once; plan_perturb refuses more than kMaxBenchBytes.
double perturb_bytes(const PerturbOptions& o);

// Validates every option and returns the rows to run, ordered by sequence length, then method
// (as given), then budget (as given). Methods without a token budget (full) get one row per
// sequence length. Throws Error before anything runs: kInvalidArgument for bad values (empty
// lists, values out of range, duplicates), the spec's own code for a spec that does not parse,
// kInvalidConfig naming the method and budget when a method's guards reject a budget.
std::vector<PerturbCase> plan_perturb(const PerturbOptions& options);

// What one row measured, aggregated over data seeds.
struct PerturbMeasure {
  std::vector<double> perturbation;  // per data seed
  double perturbation_mean = 0, perturbation_std = 0;  // sample std over seeds (0 for 1 seed)
  double kept_tokens = 0;   // mean rows kept per KV head
  double kept_bytes = 0, full_bytes = 0, compression_ratio = 0;
  double merges = 0, evictions = 0;  // per run, all heads
  std::optional<double> late_topic_fraction;  // kShift / kStable
  std::optional<double> planted_survival;     // kPlanted: share of (seed, head) runs
  double time_per_token_us = 0;               // mean over seeds of feed time / seq
};

// Runs one row on the data of every seed. Exposed for tests; run_perturb is the entry point.
PerturbMeasure measure_case(const PerturbOptions& options, const PerturbCase& c);

// Called after each row: (index from 1, total rows, the row, its result, seconds it took).
using PerturbProgress = std::function<void(std::size_t, std::size_t, const PerturbCase&,
                                           const PerturbMeasure&, double)>;

// One measured row.
struct PerturbRow {
  PerturbCase c;
  PerturbMeasure measure;
};

// plan_perturb, then every row, in plan order. Writes nothing.
std::vector<PerturbRow> run_perturb_rows(const PerturbOptions& options,
                                         const PerturbProgress& progress = {});

// The result document (docs/results.md, kind "perturb") of measured rows; `command` is recorded
// as the command line.
nlohmann::json perturb_json(const PerturbOptions& options, const std::vector<PerturbRow>& rows,
                            const std::string& command);

// run_perturb_rows, then perturb_json. Writes no files.
nlohmann::json run_perturb(const PerturbOptions& options, const std::string& command,
                           const PerturbProgress& progress = {});

// The options as the result file's "settings".
nlohmann::json perturb_settings_json(const PerturbOptions& options);

// An SVG figure of a perturb result document: one panel per sequence length with perturbation
// (mean, error bars = std over seeds) against the budget, one series per --method; plus
// late-topic-fraction (shift / stable) or planted-survival (planted) panels. Methods without a
// budget are drawn as dashed flat lines across the budgets (left out, and named in the title,
// when their perturbation is 0 everywhere), merging with the gate off as dashed lines.
std::string perturb_plot_svg(const nlohmann::json& results);

// Markdown tables of perturb result documents: per document, perturbation mean +- std per
// method (rows) and (seq, budget) (columns); merges / evictions of the methods with a merge
// disposition; and the late-topic fraction or planted survival when present. Throws
// Error(kInvalidArgument) for a document that is not a perturb result.
std::string perturb_markdown(const std::vector<nlohmann::json>& results);

}  // namespace vq::eval
