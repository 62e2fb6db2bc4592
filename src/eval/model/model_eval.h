// Model-level evaluation of KV-cache methods (`veloxquant eval`): a real model reads a text
// teacher-forced through each method at each budget; the full-cache reference run comes first
// and every other run is compared with it (perplexity, KL, top-1 agreement, kept tokens and
// bytes, time per token). Results go to the shared result-file schema (docs/results.md).
//
// Running is apart from reporting: run_model_eval returns rows (one per configuration, with the
// values of every window); the renderers below (model_eval_report.cpp, pareto.cpp) turn rows
// into the table, the JSON, the per-token file and the SVG.
//
// Windows (options.windows >= 1, docs/quality.md): the scenario (prefill + decoded predictions)
// runs on N disjoint windows of each text, each with a fresh cache; every configuration runs on
// every window, the runs spread over the engine's threads (each run single-threaded, so a
// window's values do not depend on the thread count or the order). Rows then carry per-window
// values, their means and 95% paired-bootstrap intervals (eval/report/bootstrap.h).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "engine/run/evaluate.h"
#include "eval/report/bootstrap.h"
#include "veloxquant/config.h"

namespace vq::eval {

// The largest --tokens / --prefill (the engine's largest context), checked by the front ends
// (the CLI's flags, the Python arguments) with base/validate.h.
inline constexpr std::int64_t kMaxEvalTokens = std::int64_t{1} << 20;

struct ModelEvalOptions {
  std::string model, tokenizer, text;  // paths (tokenizer "" = next to the model)
  std::string qfilters;  // qfilters' key-filter file ("" = <model>.qfilters, Model::qfilters_path)
  std::vector<std::string> more_texts;  // windows mode: further texts (--text repeated)
  std::int64_t tokens = 512;           // the text's first N tokens (BOS included); with
                                       // windows, the tokens of each window
  std::int64_t prefill = 0;            // the first N go in as one step (0 or 1: none)
  std::vector<std::string> methods;    // specs; empty = every registered method
  std::vector<std::int64_t> budgets = {32, 64, 128, 256};
  // Whether `budgets` was written by the user (--budget) rather than left at its default. A
  // budget written in a method spec ("h2o:budget=16") wins over the default list; a written
  // list that says otherwise is an error naming both.
  bool budgets_given = false;
  // Equal-memory mode (--ratio): when not empty, `budgets` is ignored and each method runs at
  // the setting that reaches each compression ratio in bytes (eval/model/ratio_solver.h): the budget
  // for methods with one, the bit width for methods without (the nearest ratio it reaches).
  std::vector<double> ratios;
  std::string reference = "full";  // the run every other is compared with
  // Windows mode when >= 1: N windows per text. A window is `tokens` tokens: when the text's
  // encoding starts with the tokenizer's BOS, BOS then tokens - 1 text tokens (window 0 is the
  // text's first `tokens` tokens, the one-window scenario), else `tokens` text tokens. Window k
  // starts k * window_stride text tokens after window 0 (0: the window's text tokens, i.e.
  // consecutive; a smaller stride would overlap and is refused).
  std::int64_t windows = 0;
  std::int64_t window_stride = 0;
  std::int64_t bootstrap_samples = 10000;  // resamples of the paired bootstrap
  std::uint64_t bootstrap_seed = 0;
  // Windows + ratios: a result file of the same scenario on another split (the dev part) whose
  // best configuration per ratio is reported on this run's windows (--select-from).
  std::string select_from;
  int threads = 0;  // runs at once (0: the engine's thread count)
  // A head pattern file (--duo-pattern; cache.h, load_head_pattern) for the methods with head
  // types (duoattention), read with the model's shape; "" = none.
  std::string head_pattern;
  // Called once the model is loaded and the text encoded, before the runs allocate anything
  // (the CLI's memory guard); may throw to refuse the run.
  std::function<void(const engine::ModelConfig&)> before_run;
};

// One configuration on one window.
struct WindowRun {
  engine::ForcedSummary summary;  // over the scored predictions
  std::vector<double> nll;        // [tokens - 1] per prediction, every position
  double kept_tokens = 0;         // mean rows per KV head per layer over the predictions
  CacheStats cache;               // at the end of the window
  double time_per_token_ms = 0;
  double prefill_ms = 0;          // the prefill step (0 without one)
  double reconstruction_ms = 0;   // kvzip's reconstruction pass after it (0: none)
};

// Windows mode: means over the windows and 95% paired-bootstrap intervals (eval/report/bootstrap.h).
struct RowStats {
  Interval nll, ppl, kl, top1;  // ppl: exp of the NLL interval's ends
  double delta_nll = 0;         // mean over windows of NLL(row) - NLL(reference)
  Interval delta_nll_ci;
  double delta_ppl_pct = 0;     // 100 (exp(delta_nll) - 1): the perplexity's change in %
  Interval delta_ppl_pct_ci;
};

struct ModelEvalRow {
  CacheConfig config;
  std::string series;  // the method's non-default fields, prefixes and budget left out
                       // ("h2o:grace=0,decay=1"): table rows, plot series
  bool is_reference = false;
  engine::ForcedSummary summary;
  double kept_tokens = 0;  // mean rows per KV head per layer over the predictions
  std::int64_t kept_bytes = 0, full_bytes = 0;  // at the end of the text, all layers
  double compression_ratio = 1;
  double time_per_token_ms = 0;
  // The prefill step's time and a reconstruction pass's after it (kvzip), means over windows in
  // ms; reconstruction_ms 0 for methods without one (the JSON then leaves both out).
  double prefill_ms = 0, reconstruction_ms = 0;
  std::int64_t evictions = 0, merges = 0;  // rows removed (all layers, heads) and, of those, merged
  // Nothing evicted, merged or compressed: the run held every row (kept_bytes >= full_bytes).
  // The table says "keeps all" instead of a ratio.
  bool keeps_all = false;
  std::vector<double> nll;  // [n_tokens - 1] per prediction of window 0 (--per-token)
  std::int64_t resident_bytes = 0;  // every byte the cache keeps (CacheStats), end of the text
  std::string score_source = "none";  // the source that ran (CacheStats::score_source)
  // Equal-memory mode only (ModelEvalOptions::ratios); 0 otherwise.
  double target_ratio = 0;  // the ratio asked for
  bool ratio_met = false;   // compression_ratio >= target_ratio
  std::string ratio_note;   // why not met (not reachable, or the nearest bit width); "" if met
  int solver_runs = 0;      // runs the solver made for this cell (the prediction, its checks)
  // Every window's run (one in the one-window scenario). With several windows, summary holds
  // the means over windows (ppl = exp(mean NLL)), kept_bytes the largest and
  // compression_ratio the smallest over windows, kept_tokens and time the means.
  std::vector<WindowRun> windows;
  std::optional<RowStats> stats;  // windows mode only
};

// Where a window lies.
struct WindowInfo {
  std::string text;         // the file
  std::int64_t index = 0;   // within its text
  std::int64_t start = 0;   // its first text token in the text's encoding (BOS excluded)
};

// The configuration a selection file (--select-from) chose for one ratio.
struct SelectedConfig {
  double ratio = 0;
  std::string series;  // "" when the selection file had none for this ratio
};

struct ModelEvalSkip {
  std::string method;  // the spec as given
  std::int64_t budget = 0;
  std::string reason;
  double ratio = 0;  // equal-memory mode: the ratio that could not be set up (budget 0)
};

struct ModelEvalResult {
  ModelEvalOptions options;
  std::string model_format, tokenizer_path;
  nlohmann::json model_config;         // dims of the model, for the settings block
  std::int64_t n_tokens = 0;           // tokens read (= options.tokens)
  std::vector<std::int32_t> ids;       // [n_tokens] the token ids read (window 0)
  std::vector<std::vector<std::int32_t>> window_ids;  // [windows][n_tokens], window 0 first
  // The first prediction the summaries count: predictions made by decode steps, i.e. from
  // position `prefill` on when a prefill of >= 2 tokens was fed (the prefill's own predictions
  // saw every prompt row whatever the method), else 0.
  std::int64_t scored_from = 0;
  std::vector<ModelEvalRow> rows;      // the reference first
  std::vector<ModelEvalSkip> skipped;  // method x budget cells the method's guards reject
  std::vector<WindowInfo> windows;     // windows mode: every window, text by text
  std::vector<SelectedConfig> selected;  // from options.select_from
  std::string selected_text;             // the selection file's text(s)
  // The same windows' runs for every row, with at least 2 windows: the bootstrap over them.
  bool windowed() const noexcept { return options.windows >= 1; }
};

// Loads the model, tokenizer and text, then runs the reference and every method x budget (or,
// with options.ratios, every method x ratio: the solver's predicted setting, checked by running
// it and corrected up to seven times when the measured kept_bytes miss the target; a ratio a
// method cannot reach gives a row marked ratio_met = false with the nearest setting tried, or a
// skip when no setting could run).
// A budget a method's guards reject (e.g. h2o's n_sink + grace >= budget) is skipped and
// recorded, not fatal. Progress lines go to `progress` (may be null). Throws vq::Error for bad
// files, specs or options before any run starts.
// Windows mode: every setting runs on every window (the ratio solver checks its settings on
// window 0; ratio_met then requires every window to reach the ratio), and each row carries
// `stats`. Runs spread over options.threads threads; the values do not depend on it.
ModelEvalResult run_model_eval(const ModelEvalOptions& options, std::ostream* progress);

// The result file (kind "eval"): the envelope, settings and one row per run.
nlohmann::json model_eval_json(const ModelEvalResult& result, const std::string& command);
// The terminal table.
std::string model_eval_table(const ModelEvalResult& result);
// Every run's per-prediction NLL with the token ids, tab-separated (docs/results.md): a header
// line, then one line per run and position: run, method, budget, position, token, next_token,
// scored, nll (windows mode: a leading column "window", every window's positions).
std::string model_eval_per_token(const ModelEvalResult& result);
// An SVG: perplexity and KL against the budget (log x), one series per method, the reference
// as a dashed line; in equal-memory mode against the ratio reached (eval/report/pareto.h).
std::string model_eval_plot(const ModelEvalResult& result);

}  // namespace vq::eval
