// `veloxquant eval`: KV-cache methods on a real model and text, teacher-forced, against the
// full cache (perplexity, KL, top-1 agreement, kept tokens and bytes, time per token).
#include <algorithm>
#include <iostream>

#include "cli.h"
#include "eval/model_eval.h"
#include "eval/output_set.h"
#include "eval/resources.h"
#include "eval/results.h"

namespace vq::cli {
namespace {

struct EvalCliOptions {
  eval::ModelEvalOptions eval;
  std::string budgets = "32,64,128,256";
  std::string json, plot, per_token;
  int threads = 0;
  std::uint64_t max_memory = 0;  // --max-memory; 0: the available memory
  std::vector<std::string> args;  // the command line, for the result file
};

void run_eval(EvalCliOptions& o) {
  apply_threads(o.threads);
  o.eval.budgets = parse_int_list(o.budgets, "--budget", 1);
  // Every output is checked before the (long) run and all are written together at the end,
  // or none is (eval/output_set.h).
  eval::OutputSet out;
  if (!o.json.empty()) out.declare("--json", o.json);
  if (!o.plot.empty()) out.declare("--plot", o.plot);
  if (!o.per_token.empty()) out.declare("--per-token", o.per_token);
  o.eval.before_run = [&o](const engine::ModelConfig& c) {
    const std::int64_t chunk = std::max<std::int64_t>(1, o.eval.prefill);
    // The reference run keeps every position's logits.
    const double logits =
        4.0 * static_cast<double>(o.eval.tokens) * static_cast<double>(c.vocab_size);
    eval::check_memory("eval", eval::engine_run_bytes(c, chunk, o.eval.tokens) + logits,
                       "the engine's buffers, a " + std::to_string(o.eval.tokens) +
                           "-position cache and the reference logits",
                       o.max_memory);
    set_activity("running the methods");
  };
  set_activity("loading the model, tokenizer and text");
  const eval::ModelEvalResult r = eval::run_model_eval(o.eval, &std::cerr);
  set_activity("writing the outputs");
  std::cout << "\n" << eval::model_eval_table(r) << std::flush;
  if (out.has("--json")) {
    out.stage("--json", eval::model_eval_json(r, eval::command_line(o.args)).dump(2) + "\n");
  }
  if (out.has("--plot")) out.stage("--plot", eval::model_eval_plot(r));
  if (out.has("--per-token")) out.stage("--per-token", eval::model_eval_per_token(r));
  out.commit();
  if (!out.summary().empty()) std::cerr << "eval: wrote " << out.summary() << "\n";
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
      ->required()
      ->check(non_empty_path());
  cmd->add_option("--tokenizer", o->eval.tokenizer,
                  "tokenizer.bin or tokenizer.json (default: next to the model)")
      ->check(non_empty_path());
  cmd->add_option("--text", o->eval.text, "UTF-8 text file to read (at most 64 MiB)")
      ->required()
      ->check(non_empty_path());
  // --tokens, --prefill, --budget: the last occurrence wins, so flags appended to a script
  // (scripts/main.sh "$@") override its own.
  cmd->add_option("--tokens", o->eval.tokens, "Use the text's first N tokens (BOS included)")
      ->capture_default_str()
      ->check(int_range(2, std::int64_t{1} << 20))
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd->add_option("--prefill", o->eval.prefill,
                  "Feed the first N tokens as one step (the cache sees them all before evicting); "
                  "the summaries then count only the predictions decoded after it")
      ->capture_default_str()
      ->check(int_range(0, std::int64_t{1} << 20))
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
  add_q8_activations_option(cmd);
  cmd->add_option("--json", o->json, "Write the results (veloxquant.results/1, kind eval) here")
      ->check(non_empty_path());
  cmd->add_option("--plot", o->plot, "Write an SVG plot of perplexity and KL against the budget")
      ->check(non_empty_path());
  add_max_memory_option(*cmd, o->max_memory);
  cmd->add_option("--per-token", o->per_token,
                  "Write every run's per-prediction NLL with the token ids here (tab-separated; "
                  "docs/results.md), for cross-checking with other tools")
      ->check(non_empty_path());
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
