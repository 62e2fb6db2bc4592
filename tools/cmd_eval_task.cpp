// `veloxquant eval --task`: RULER-style long-context tasks through each KV-cache method
// (docs/tasks.md). The flags it shares with `eval` (--model, --tokenizer, --method, --budget,
// --ratio, --json, --plot, --text, --threads, --bootstrap, --bootstrap-seed, --reference) are
// added by cmd_eval.cpp; this file adds the task flags and runs the evaluation.
#include <algorithm>
#include <iostream>

#include "base/input_file.h"
#include "cli.h"
#include "engine/compute/parallel.h"
#include "eval/report/output_set.h"
#include "engine/run/resources.h"
#include "eval/report/results.h"
#include "eval/tasks/task_eval.h"
#include "veloxquant/errors.h"

namespace vq::cli {

namespace {

std::vector<std::string> split_names(const std::string& text) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = text.find(',', start);
    out.push_back(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace

const std::vector<std::string>& task_only_flags() {
  static const std::vector<std::string> flags = {"--lengths", "--depths",   "--samples",
                                                 "--seed",    "--haystack", "--question",
                                                 "--dump-samples"};
  return flags;
}

void add_task_options(CLI::App& cmd, TaskCliOptions& o) {
  cmd.add_option("--task", o.tasks,
                 "Task evaluation (docs/tasks.md): comma-separated RULER task names: niah_single, "
                 "niah_multikey, niah_multivalue, niah_multiquery, vt, cwe, fwe; every method runs at "
                 "--ratio 4,8,16 unless --ratio or --budget says otherwise");
  cmd.add_option("--lengths", o.lengths,
                 "With --task: comma-separated prompt lengths in tokens (default: L/4, L/2, L with "
                 "L = min(the model's context - 128, 4096): room for the answer)");
  cmd.add_option("--depths", o.depths,
                 "With --task: comma-separated needle depths in percent, 0 (first) to 100 (last), "
                 "for the niah_* tasks")
      ->capture_default_str();
  cmd.add_option("--samples", o.samples, "With --task: samples per task x length x depth")
      ->capture_default_str()
      ->check(int_range(1, 1000000));
  cmd.add_option("--seed", o.seed, "With --task: seed of the sample generators")
      ->capture_default_str()
      ->check(uint_range(0, UINT64_MAX));
  cmd.add_option("--haystack", o.haystack,
                 "With --task: noise, essay or needle (default: each task's, docs/tasks.md)");
  cmd.add_option("--question", o.question,
                 "With --task: last (RULER's: after the context) or first (before it; query-aware "
                 "methods then cannot see it)")
      ->capture_default_str();
  cmd.add_option("--dump-samples", o.dump,
                 "With --task: write every sample (prompt, answers, expected completion and the "
                 "parts that determine it) here, one JSON object a line")
      ->check(non_empty_path());
}

void run_task_eval_cli(const TaskCliOptions& t, const TaskCliShared& s) {
  apply_threads(s.threads);
  eval::TaskEvalOptions o;
  o.model = s.model;
  o.tokenizer = s.tokenizer;
  for (const std::string& name : t.tasks) {
    for (const std::string& n : split_names(name)) {
      eval::task_spec(n);  // names the flag and the accepted names
      o.tasks.push_back(n);
    }
  }
  if (!t.lengths.empty()) o.lengths = parse_int_list(t.lengths, "--lengths", 1, std::int64_t{1} << 24);
  o.depths = parse_int_list(t.depths, "--depths", 0, 100);
  o.samples = t.samples;
  o.seed = t.seed;
  if (!t.haystack.empty()) eval::parse_haystack(t.haystack);
  o.haystack = t.haystack;
  o.question = eval::parse_question(t.question);
  if (s.texts.size() > 1) {
    throw Error(ErrorCode::kInvalidArgument,
                "--text is given " + std::to_string(s.texts.size()) +
                    " times: --task reads one essay text");
  }
  if (!s.texts.empty()) o.text = s.texts.front();
  o.methods = s.methods;
  if (s.budget_given) o.budgets = parse_int_list(s.budgets, "--budget", 1);
  o.ratios = s.ratios;
  o.ratios_given = !s.ratios.empty();
  if (!s.budget_given && o.ratios.empty()) o.ratios = {4, 8, 16};
  o.reference = s.reference;
  o.bootstrap_samples = s.bootstrap_samples;
  o.bootstrap_seed = s.bootstrap_seed;
  o.threads = s.threads;
  name_input("--model", o.model);  // an output naming an input is refused (base/input_file.h)
  name_input("--tokenizer", o.tokenizer);
  name_input("--text", o.text);
  eval::OutputSet out;
  if (!s.json.empty()) out.declare("--json", s.json);
  if (!s.plot.empty()) out.declare("--plot", s.plot);
  if (!t.dump.empty()) out.declare("--dump-samples", t.dump);
  o.before_run = [&](const engine::ModelConfig& c) {
    std::int64_t longest = 0;
    for (const std::int64_t l : o.lengths.empty() ? eval::default_lengths(c.seq_len) : o.lengths)
      longest = std::max(longest, l);
    const double runs_at_once = s.threads > 0 ? s.threads : engine::threads();
    engine::check_memory("eval --task",
                       runs_at_once * engine::engine_run_bytes(c, std::max<std::int64_t>(1, longest),
                                                             std::min(c.seq_len, longest + 128), true),
                       "the engine's buffers and a " + std::to_string(longest) +
                           "-position cache per run at once",
                       s.max_memory);
    set_activity("running the tasks");
  };
  set_activity("loading the model and generating the samples");
  const eval::TaskEvalResult r = eval::run_task_eval(o, &std::cerr);
  set_activity("writing the outputs");
  std::cout << "\n" << eval::task_eval_table(r) << std::flush;
  if (out.has("--json")) out.stage("--json", eval::task_eval_json(r, eval::command_line(s.args)).dump(2) + "\n");
  if (out.has("--plot")) out.stage("--plot", eval::task_eval_heatmap(r));
  if (out.has("--dump-samples")) out.stage("--dump-samples", eval::task_samples_jsonl(r));
  out.commit();
  if (!out.summary().empty()) std::cerr << "eval: wrote " << out.summary() << "\n";
}

}  // namespace vq::cli
