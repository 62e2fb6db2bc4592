// `veloxquant eval`: KV-cache methods on a real model and text, teacher-forced, against the
// full cache (perplexity, KL, top-1 agreement, kept tokens and bytes, time per token).
#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>

#include "base/input_file.h"
#include "base/validate.h"
#include "cli.h"
#include "engine/compute/parallel.h"
#include "eval/model/model_eval.h"
#include "eval/report/output_set.h"
#include "engine/run/resources.h"
#include "eval/report/results.h"
#include "veloxquant/errors.h"

namespace vq::cli {
namespace {

struct EvalCliOptions {
  eval::ModelEvalOptions eval;
  std::string budgets = "32,64,128,256";
  std::string ratios;         // --ratio; "" = budget mode
  bool budget_given = false;  // --budget on the command line (not its default)
  bool ratio_given = false;   // --ratio on the command line (even empty: an error)
  std::vector<std::string> texts;  // --text, repeatable (windows mode)
  std::string json, plot, per_token;
  int threads = 0;
  std::uint64_t max_memory = 0;  // --max-memory; 0: the available memory
  std::vector<std::string> args;  // the command line, for the result file
  TaskCliOptions task;             // --task and its flags (cmd_eval_task.cpp)
};



// "2,4,8.5": comma-separated finite numbers >= 1; throws Error(kInvalidArgument) naming --ratio.
std::vector<double> parse_ratio_list(const std::string& text) {
  auto bad = [](const std::string& why) {
    return vq::Error(
        ErrorCode::kInvalidArgument,
        "--ratio expects comma-separated compression ratios >= 1 (e.g. 2,4,8,16,32), " + why);
  };
  if (text.empty()) throw bad("got an empty value");
  std::vector<double> out;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = text.find(',', start);
    const std::string item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    std::size_t used = 0;
    double v = 0;
    try {
      v = std::stod(item, &used);
    } catch (const std::exception&) {
      throw bad("got '" + item + "'");
    }
    if (item.empty() || used != item.size() || !std::isfinite(v)) throw bad("got '" + item + "'");
    if (v < 1.0) throw bad("got " + item);
    out.push_back(v);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// Flags of the teacher-forced evaluation that --task does not read.
constexpr const char* kTextOnlyFlags[] = {"--windows", "--window-stride", "--select-from",
                                          "--tokens",  "--prefill",       "--per-token",
                                          "--duo-pattern"};

// `eval --task`: the flags it shares with `eval`, handed over.
void run_task_mode(EvalCliOptions& o, CLI::App& cmd) {
  for (const char* flag : kTextOnlyFlags) {
    if (cmd.count(flag) > 0) {
      throw vq::Error(ErrorCode::kInvalidArgument,
                      std::string(flag) + " belongs to the text evaluation; --task does not read it");
    }
  }
  if (o.ratio_given && o.budget_given) {
    throw vq::Error(ErrorCode::kInvalidArgument,
                    "--ratio and --budget cannot be given together: --ratio sets each method's "
                    "budget (or bit width) to reach the ratio; use one or the other");
  }
  TaskCliShared s;
  s.model = o.eval.model;
  s.tokenizer = o.eval.tokenizer;
  s.budgets = o.budgets;
  s.budget_given = o.budget_given;
  if (o.ratio_given) s.ratios = parse_ratio_list(o.ratios);
  s.reference = o.eval.reference;
  s.json = o.json;
  s.plot = o.plot;
  s.texts = o.texts;
  s.methods = o.eval.methods;
  s.args = o.args;
  s.bootstrap_samples = o.eval.bootstrap_samples;
  s.bootstrap_seed = o.eval.bootstrap_seed;
  s.threads = o.threads;
  s.max_memory = o.max_memory;
  run_task_eval_cli(o.task, s);
}

void run_eval(EvalCliOptions& o) {
  apply_threads(o.threads);
  if (o.ratio_given && o.budget_given) {
    throw vq::Error(ErrorCode::kInvalidArgument,
                    "--ratio and --budget cannot be given together: --ratio sets each method's "
                    "budget (or bit width) to reach the ratio; use one or the other");
  }
  o.eval.budgets = parse_int_list(o.budgets, "--budget", 1);
  o.eval.budgets_given = o.budget_given;
  if (o.ratio_given) o.eval.ratios = parse_ratio_list(o.ratios);
  o.eval.text = o.texts.front();
  o.eval.more_texts.assign(o.texts.begin() + 1, o.texts.end());
  o.eval.threads = o.threads;
  // Every output is checked before the (long) run and all are written together at the end,
  // or none is (eval/report/output_set.h).
  // Inputs are named first, so an output naming one is refused now (base/input_file.h).
  name_input("--model", o.eval.model);
  name_input("--tokenizer", o.eval.tokenizer);
  name_input("--qfilters", o.eval.qfilters);
  for (const std::string& t : o.texts) name_input("--text", t);
  name_input("--select-from", o.eval.select_from);
  name_input("--duo-pattern", o.eval.head_pattern);
  eval::OutputSet out;
  if (!o.json.empty()) out.declare("--json", o.json);
  if (!o.plot.empty()) out.declare("--plot", o.plot);
  if (!o.per_token.empty()) out.declare("--per-token", o.per_token);
  o.eval.before_run = [&o](const engine::ModelConfig& c) {
    const std::int64_t chunk = std::max<std::int64_t>(1, o.eval.prefill);
    // The reference runs keep every position's logits (one per window); with windows, up to
    // one run per thread at once.
    const double windows = static_cast<double>(
        std::max<std::int64_t>(1, o.eval.windows * static_cast<std::int64_t>(o.texts.size())));
    const double runs_at_once =
        o.eval.windows > 0 ? std::min(windows, static_cast<double>(engine::threads())) : 1.0;
    const double logits = 4.0 * windows * static_cast<double>(o.eval.tokens) *
                          static_cast<double>(c.vocab_size);
    // The chunk's probabilities count when a method reads them (every method: some do).
    bool probs = o.eval.methods.empty();
    for (const std::string& m : o.eval.methods) probs = probs || engine::reads_attention(m, c);
    engine::check_memory(
        "eval", runs_at_once * engine::engine_run_bytes(c, chunk, o.eval.tokens, probs) + logits,
        "the engine's buffers and a " + std::to_string(o.eval.tokens) + "-position cache per " +
            "run at once, and the reference logits of every window",
        o.max_memory);
    set_activity("running the methods");
  };
  set_activity("loading the model, tokenizer and text");
  const eval::ModelEvalResult r = eval::run_model_eval(o.eval, &std::cerr);
  set_activity("writing the outputs");
  // Series names can come from a --select-from file: printed escaped (base/validate.h).
  std::cout << "\n" << validate::printable(eval::model_eval_table(r), true) << std::flush;
  if (out.has("--json")) {
    out.stage("--json", eval::model_eval_json(r, eval::command_line(o.args)).dump(2) + "\n");
  }
  if (out.has("--plot")) out.stage("--plot", eval::model_eval_plot(r));
  if (out.has("--per-token")) out.stage("--per-token", eval::model_eval_per_token(r));
  out.commit();
  if (!out.summary().empty()) std::cerr << "eval: wrote " << out.summary() << "\n";
}

// Inputs: the model, its tokenizer, the texts.
void add_input_options(CLI::App& cmd, EvalCliOptions& o) {
  cmd.add_option("--model", o.eval.model,
                 "Checkpoint: a llama2.c .bin, a Hugging Face directory / model.safetensors "
                 "(config.json beside it), or a GGUF file (.gguf, or a file starting with GGUF)")
      ->required()
      ->check(non_empty_path());
  cmd.add_option("--tokenizer", o.eval.tokenizer,
                 "tokenizer.bin (llama2.c), tokenizer.json (HF) or a .gguf file's vocabulary; "
                 "default: next to the model (tok<vocab>.bin or tokenizer.bin; tokenizer.json), "
                 "or a GGUF model's own")
      ->check(non_empty_path());
  cmd.add_option("--qfilters", o.eval.qfilters,
                 "Key-filter file of method qfilters (default: <model>.qfilters, made by "
                 "`veloxquant calibrate`)")
      ->check(non_empty_path());
  cmd.add_option("--text", o.texts,
                 "UTF-8 text file to read (at most 64 MiB); with --windows, repeatable (every "
                 "text gives N windows); with --task, the essay haystack (default: the built-in "
                 "WikiText-2 excerpt)")
      ->check(non_empty_path());
}

// Windows, their bootstrap intervals, and the dev/test selection over them.
void add_window_options(CLI::App& cmd, EvalCliOptions& o) {
  cmd.add_option("--windows", o.eval.windows,
                 "Run the scenario (--tokens, --prefill) on N disjoint windows of each text, each "
                 "with a fresh cache, and report means with 95% paired-bootstrap intervals over "
                 "the windows and every window's values (docs/quality.md)")
      ->check(int_range(1, 100000));
  cmd.add_option("--window-stride", o.eval.window_stride,
                 "Text tokens from one window's start to the next (default: the window's text "
                 "tokens, i.e. consecutive windows; shorter would overlap and is refused)")
      ->check(int_range(1, std::int64_t{1} << 30));
  cmd.add_option("--bootstrap", o.eval.bootstrap_samples,
                 "Bootstrap resamples for the intervals (with --windows or --task)")
      ->capture_default_str()
      ->check(int_range(1, 1000000));
  cmd.add_option("--bootstrap-seed", o.eval.bootstrap_seed,
                 "Seed of the bootstrap's resampling (with --windows or --task; same seed, same intervals)")
      ->capture_default_str()
      ->check(uint_range(0, UINT64_MAX));  // -1 would wrap to 2^64 - 1
  cmd.add_option("--select-from", o.eval.select_from,
                 "With --windows and --ratio: an eval result file of the same scenario on another "
                 "split (the dev part); its best configuration per ratio is reported on this "
                 "run's windows (the test part) with its interval")
      ->check(non_empty_path());
}

// The scenario: how many tokens are read, and how many of them are one prefill step.
void add_scenario_options(CLI::App& cmd, EvalCliOptions& o) {
  // --tokens, --prefill and --budget (add_method_options): the last occurrence wins, so flags
  // appended to a script (scripts/main.sh "$@") override its own.
  cmd.add_option("--tokens", o.eval.tokens, "Use the text's first N tokens (BOS included)")
      ->capture_default_str()
      ->check(int_range(2, eval::kMaxEvalTokens))
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd.add_option("--prefill", o.eval.prefill,
                 "Feed the first N tokens as one step (the cache sees them all before evicting); "
                 "the summaries then count only the predictions decoded after it")
      ->capture_default_str()
      ->check(int_range(0, eval::kMaxEvalTokens))
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

// Methods and budgets (or equal-memory ratios), and the reference run.
void add_method_options(CLI::App& cmd, EvalCliOptions& o) {
  cmd.add_option("--method", o.eval.methods,
                 "Method spec ID[:key=value,...]; repeatable (default: every registered method). "
                 "A budget written in the spec is the one that runs (with --budget, only when "
                 "--budget says the same)");
  cmd.add_option("--budget", o.budgets,
                 "Comma-separated token budgets (rows per KV head) for methods that have one")
      ->capture_default_str()
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd.add_option("--ratio", o.ratios,
                 "Equal-memory mode: comma-separated compression ratios in bytes (full fp16 "
                 "bytes / kept bytes at the end of the text, e.g. 2,4,8,16,32); each method runs "
                 "at the budget (or, without one, the bit width) that reaches each ratio, and the "
                 "table reports the ratio reached. Not with --budget")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd.add_option("--reference", o.eval.reference,
                 "The run every other one is compared with (first row)")
      ->capture_default_str();
}

// Outputs (all checked before the run, written together at the end), and the memory limit.
void add_output_options(CLI::App& cmd, EvalCliOptions& o) {
  cmd.add_option("--json", o.json, "Write the results (veloxquant.results/1, kind eval; with --task, kind task) here")
      ->check(non_empty_path());
  cmd.add_option("--plot", o.plot,
                 "Write an SVG plot of perplexity and KL against the budget (with --ratio: the "
                 "ratio reached; with --task, heatmaps of accuracy by length and depth)")
      ->check(non_empty_path());
  add_max_memory_option(cmd, o.max_memory);
  add_head_pattern_option(cmd, o.eval.head_pattern);
  cmd.add_option("--per-token", o.per_token,
                 "Write every run's per-prediction NLL with the token ids here (tab-separated; "
                 "docs/results.md), for cross-checking with other tools")
      ->check(non_empty_path());
}

// The command line as parsed, for the result file: each option's name with each of its values.
std::vector<std::string> parsed_command_line(const CLI::App& cmd) {
  std::vector<std::string> args = {"veloxquant", "eval"};
  for (const auto& a : cmd.get_options()) {
    for (const auto& r : a->results()) {
      args.push_back(a->get_name());
      args.push_back(r);
    }
  }
  return args;
}

// The text evaluation (no --task): no task flags, a --text, and the interval flags only with
// --windows.
void check_text_mode(const CLI::App& cmd, const EvalCliOptions& o) {
  for (const std::string& flag : task_only_flags()) {
    if (cmd.count(flag) > 0) throw vq::Error(ErrorCode::kInvalidArgument, flag + " needs --task NAME");
  }
  if (o.texts.empty()) {
    throw vq::Error(ErrorCode::kInvalidArgument,
                    "--text is required (the text to read), unless --task NAME runs the tasks");
  }
  if (cmd.count("--windows") == 0) {
    for (const char* flag : {"--bootstrap", "--bootstrap-seed"}) {
      if (cmd.count(flag) > 0) {
        throw vq::Error(ErrorCode::kInvalidArgument,
                        std::string(flag) + " needs --windows N (the intervals are over windows)");
      }
    }
  }
}

}  // namespace

void add_eval_command(CLI::App& app) {
  auto o = std::make_shared<EvalCliOptions>();
  auto* cmd = app.add_subcommand(
      "eval",
      "Evaluate KV-cache methods on a real model: read a text teacher-forced (optionally after "
      "a prefill), token by token, through each method at each budget, and report perplexity, "
      "KL(full || method), top-1 agreement with the full cache, kept tokens and bytes, and time "
      "per token");
  add_input_options(*cmd, *o);
  add_window_options(*cmd, *o);
  add_scenario_options(*cmd, *o);
  add_method_options(*cmd, *o);
  add_threads_option(cmd, o->threads);
  add_q8_activations_option(cmd);
  add_output_options(*cmd, *o);
  add_task_options(*cmd, o->task);
  cmd->callback([o, cmd]() {
    o->budget_given = cmd->count("--budget") > 0;
    o->ratio_given = cmd->count("--ratio") > 0;
    o->args = parsed_command_line(*cmd);
    if (cmd->count("--task") > 0) {
      run_task_mode(*o, *cmd);
      return;
    }
    check_text_mode(*cmd, *o);
    run_eval(*o);
  });
}

}  // namespace vq::cli
