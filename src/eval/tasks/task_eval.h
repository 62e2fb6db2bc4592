// Task evaluation (`veloxquant eval --task`, docs/tasks.md): RULER-style samples (task_gen.h)
// run through each KV-cache method as `veloxquant generate` runs a prompt (the whole prompt as
// one prefill step, then one greedy decode step per token), the answer scored by
// string_match_all; per method x setting x task x length x depth the mean score with a 95%
// interval, paired with the full cache on the same samples.
//
// Running is apart from reporting: run_task_eval returns the samples and every run; the
// renderers (task_report.cpp) turn them into the table, the JSON, the SVG and the dump.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "engine/model/model.h"
#include "eval/report/bootstrap.h"
#include "eval/tasks/task_gen.h"
#include "veloxquant/cache.h"
#include "veloxquant/config.h"

namespace vq::eval {

struct TaskEvalOptions {
  std::string model, tokenizer;       // paths (tokenizer "" = next to the model)
  std::vector<std::string> tasks;     // task names (task_prompts.h)
  std::vector<std::int64_t> lengths;  // prompt lengths in tokens; empty = default_lengths
  std::vector<std::int64_t> depths = {0, 25, 50, 75, 100};  // percent (niah tasks)
  std::int64_t samples = 10;          // per task x length x depth
  std::uint64_t seed = 0;
  std::string haystack;               // "" = each task's default; noise | essay | needle
  std::string text;                   // essay text file; "" = the built-in WikiText-2 excerpt
  QuestionAt question = QuestionAt::kLast;
  std::vector<std::string> methods;   // specs; empty = every registered method
  std::vector<std::int64_t> budgets;  // budget mode (methods with a token budget)
  std::vector<double> ratios;         // equal-memory mode; used when budgets is empty
  bool ratios_given = false;          // the user gave the ratios (not the CLI's default)
  std::string reference = "full";
  std::int64_t bootstrap_samples = 10000;
  std::uint64_t bootstrap_seed = 0;
  int threads = 0;  // runs at once (0: the engine's thread count)
  // Called once the model is loaded, before anything is generated (the CLI's memory guard).
  std::function<void(const engine::ModelConfig&)> before_run;
};

// The lengths when none are given: L = min(seq_len, 4096), then L/4, L/2, L.
std::vector<std::int64_t> default_lengths(std::int64_t seq_len);

// One configuration on one sample.
struct TaskRun {
  std::string output;        // the generated text (up to the stop)
  double score = 0;          // string_match_all(output, answers)
  std::int64_t n_generated = 0;
  std::int64_t kept_bytes = 0, full_bytes = 0;  // at the end of the run, all layers
  double seconds = 0;        // prefill + decode
};

// A method at one setting (a budget, or an equal-memory ratio whose budget depends on the
// length): its configuration per length.
struct TaskSetting {
  std::string series;                // the method without its budget ("h2o", "full")
  bool is_reference = false;
  std::int64_t budget = 0;           // budget mode; 0 otherwise
  double target_ratio = 0;           // equal-memory mode; 0 otherwise
  // [tasks][lengths] flattened (at()): the configuration run on each task at each length (an
  // equal-memory budget is solved for the task's prompts at that length), and why one did not
  // run ("" = ran).
  std::vector<CacheConfig> configs;
  std::vector<std::string> skipped;
  std::size_t n_lengths = 1;
  std::size_t at(std::size_t task, std::size_t length) const { return task * n_lengths + length; }
};

// Statistics of one setting on one cell (task x length x depth; depth -1: every depth).
struct TaskCell {
  std::size_t setting = 0, task = 0, length = 0;
  std::int64_t depth = -1;
  std::vector<std::size_t> samples;  // indices into TaskEvalResult::samples
  std::int64_t n = 0;
  double accuracy = 0;               // mean score
  Interval ci;                       // 95%: Wilson (0/1 scores) or percentile bootstrap
  bool wilson = false;
  double relative = 0;               // accuracy / the reference's (NaN when that is 0)
  Interval delta_ci;                 // paired bootstrap of score - reference score
  double kept_bytes = 0, compression_ratio = 0;  // means over the samples
  double seconds = 0;                // mean per sample
};

struct TaskEvalResult {
  TaskEvalOptions options;
  std::vector<std::int64_t> lengths;
  std::string model_format, tokenizer_path, chat_template, essay;  // essay: the file or "built-in"
  nlohmann::json model_config;
  std::vector<TaskSample> samples;   // every sample, task by task, length, depth, index
  std::vector<std::size_t> sample_task;  // [samples] index into options.tasks
  std::vector<TaskSetting> settings;     // the reference first
  std::vector<std::vector<TaskRun>> runs;  // [settings][samples]; default where not run (skipped)
  std::vector<TaskCell> cells;       // per depth, then the all-depths cell, per setting
  double seconds = 0;                // wall time of the runs
};

// Loads the model and tokenizer, generates the samples, runs every setting on every sample
// (spread over options.threads threads; the results do not depend on it) and computes the
// cells. Throws vq::Error (kInvalidArgument naming the flag) for bad options before any run.
TaskEvalResult run_task_eval(const TaskEvalOptions& options, std::ostream* progress);

// The result file (kind "task"), the terminal table, the SVG heatmaps (length x depth per
// setting and task) and the samples as JSON lines (docs/tasks.md "Dump").
nlohmann::json task_eval_json(const TaskEvalResult& result, const std::string& command);
std::string task_eval_table(const TaskEvalResult& result);
std::string task_eval_heatmap(const TaskEvalResult& result);
std::string task_samples_jsonl(const TaskEvalResult& result);
// One sample as the dump's JSON object.
nlohmann::json task_sample_json(const TaskSample& sample, std::uint64_t seed,
                                const std::string& chat_template);

}  // namespace vq::eval
