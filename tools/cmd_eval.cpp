// `veloxquant eval`: KV-cache methods on a real model and text, teacher-forced, against the
// full cache (perplexity, KL, top-1 agreement, kept tokens and bytes, time per token).
#include <iostream>

#include "cli.h"
#include "eval/model_eval.h"
#include "eval/results.h"

namespace vq::cli {
namespace {

struct EvalCliOptions {
  eval::ModelEvalOptions eval;
  std::string budgets = "32,64,128,256";
  std::string json, plot, per_token;
  int threads = 0;
  std::vector<std::string> args;  // the command line, for the result file
};

void run_eval(EvalCliOptions& o) {
  apply_threads(o.threads);
  o.eval.budgets = parse_int_list(o.budgets, "--budget", 1);
  // Fail on unwritable outputs before the (long) run, not after.
  if (!o.json.empty()) eval::check_writable(o.json);
  if (!o.plot.empty()) eval::check_writable(o.plot);
  if (!o.per_token.empty()) eval::check_writable(o.per_token);
  const eval::ModelEvalResult r = eval::run_model_eval(o.eval, &std::cerr);
  std::cout << "\n" << eval::model_eval_table(r) << std::flush;
  if (!o.json.empty()) {
    eval::write_file_atomic(o.json,
                            eval::model_eval_json(r, eval::command_line(o.args)).dump(2) + "\n");
    std::cerr << "eval: wrote " << o.json << "\n";
  }
  if (!o.plot.empty()) {
    eval::write_file_atomic(o.plot, eval::model_eval_plot(r));
    std::cerr << "eval: wrote " << o.plot << "\n";
  }
  if (!o.per_token.empty()) {
    eval::write_file_atomic(o.per_token, eval::model_eval_per_token(r));
    std::cerr << "eval: wrote " << o.per_token << "\n";
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
  cmd->add_option("--model", o->eval.model,
                  "Checkpoint: a llama2.c .bin, or a Hugging Face directory / model.safetensors")
      ->required();
  cmd->add_option("--tokenizer", o->eval.tokenizer,
                  "tokenizer.bin or tokenizer.json (default: next to the model)");
  cmd->add_option("--text", o->eval.text, "UTF-8 text file to read")->required();
  // --tokens, --prefill, --budget: the last occurrence wins, so flags appended to a script
  // (scripts/main.sh "$@") override its own.
  cmd->add_option("--tokens", o->eval.tokens, "Use the text's first N tokens (BOS included)")
      ->capture_default_str()
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd->add_option("--prefill", o->eval.prefill,
                  "Feed the first N tokens as one step (the cache sees them all before evicting); "
                  "the summaries then count only the predictions decoded after it")
      ->capture_default_str()
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd->add_option("--method", o->eval.methods,
                  "Method spec ID[:key=value,...]; repeatable (default: every registered method). "
                  "--budget overrides a budget given in the spec");
  cmd->add_option("--budget", o->budgets,
                  "Comma-separated token budgets (rows per KV head) for methods that have one")
      ->capture_default_str()
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd->add_option("--reference", o->eval.reference,
                  "The run every other one is compared with (first row)")
      ->capture_default_str();
  add_threads_option(cmd, o->threads);
  cmd->add_option("--json", o->json, "Write the results (veloxquant.results/1, kind eval) here");
  cmd->add_option("--plot", o->plot, "Write an SVG plot of perplexity and KL against the budget");
  cmd->add_option("--per-token", o->per_token,
                  "Write every run's per-prediction NLL with the token ids here (tab-separated; "
                  "docs/results.md), for cross-checking with other tools");
  cmd->callback([o, cmd]() {
    o->args = {"veloxquant", "eval"};
    for (const auto& a : cmd->get_options()) {
      for (const auto& r : a->results()) {
        o->args.push_back(a->get_name());
        o->args.push_back(r);
      }
    }
    run_eval(*o);
  });
}

}  // namespace vq::cli
