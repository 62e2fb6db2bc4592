// `veloxquant generate`: text from a model through a compressed KV cache, with run.c's sampler.
#include <fmt/format.h>

#include <algorithm>
#include <iostream>

#include "cli.h"
#include "engine/run/generate.h"
#include "engine/model/model.h"
#include "engine/tokenizers/tokenizer.h"
#include "engine/run/resources.h"
#include "veloxquant/config.h"
#include "veloxquant/errors.h"

namespace vq::cli {
namespace {

struct GenerateCliOptions {
  std::string model, tokenizer, prompt, question, method = "full";
  std::string qfilters;  // --qfilters ("" = <model>.qfilters)
  std::int64_t steps = 256;
  float temperature = 0.0f, top_p = 0.9f;
  std::uint64_t seed = 42;
  int threads = 0;
  std::uint64_t max_memory = 0;  // --max-memory; 0: the available memory
  std::string head_pattern;      // --duo-pattern
};

void run_generate(const GenerateCliOptions& o) {
  apply_threads(o.threads);
  engine::GenerateOptions g;
  g.method = CacheConfig::parse(o.method);  // validate flags before loading anything
  g.prompt = o.prompt;
  g.question = o.question;
  g.steps = o.steps;
  g.temperature = o.temperature;
  g.top_p = o.top_p;
  g.seed = o.seed;
  set_activity("loading the model '" + o.model + "'");
  engine::Model model = engine::Model::load(o.model);
  if (!o.qfilters.empty()) model.set_qfilters_path(o.qfilters);
  set_activity("loading the tokenizer");
  const auto tokenizer = engine::load_tokenizer(o.tokenizer, model);
  if (!o.head_pattern.empty()) {
    g.head_pattern = load_head_pattern(o.head_pattern, model.config().n_layers,
                                       model.config().n_kv_heads);
  }
  {
    const engine::ModelConfig& c = model.config();
    // --steps against the model's context, named before anything runs.
    const std::int64_t context = engine::generate_positions(c, o.steps, "--steps");
    const auto prompt = static_cast<std::int64_t>(tokenizer->encode(o.prompt + o.question, true).size());
    engine::check_memory(
        "generate",
        engine::engine_run_bytes(c, std::max<std::int64_t>(1, std::min(prompt, context)), context,
                               engine::reads_attention(g.method, c)),
        "the engine's buffers and a " + std::to_string(context) + "-position cache for " +
            model.path(),
        o.max_memory);
  }
  set_activity("generating");
  const engine::GenerateResult r = engine::generate(
      model, *tokenizer, g, [](const std::string& piece) { std::cout << piece << std::flush; });
  std::cout << "\n" << std::flush;
  const double tps =
      r.decode_seconds > 0 ? static_cast<double>(r.n_decode) / r.decode_seconds : 0.0;
  std::cerr << fmt::format(
      "generate: {} tokens ({} prompt incl. BOS, {} decode steps{}); decode {:.0f} tok/s; "
      "cache {} (score source {}): {} rows/head kept, {} of {} bytes ({} resident)\n",
      r.ids.size(), r.n_prompt, r.n_decode, r.stopped ? ", stopped at a stop token" : "", tps,
      g.method.spec(), r.cache.score_source, r.cache.tokens_kept, r.cache.kept_bytes,
      r.cache.full_bytes, r.cache.resident_bytes);
  if (r.reconstruction_seconds > 0) {  // kvzip: the reconstruction pass against the prefill
    std::cerr << fmt::format(
        "generate: reconstruction pass {:.2f} ms against the prompt's prefill {:.2f} ms\n",
        1000.0 * r.reconstruction_seconds, 1000.0 * r.prefill_seconds);
  }
  if (r.cache.retrieval_heads + r.cache.streaming_heads > 0) {  // head types (duoattention)
    std::cerr << fmt::format(
        "generate: head types (all layers): {} retrieval heads ({} bytes), {} streaming heads "
        "({} bytes)\n",
        r.cache.retrieval_heads, r.cache.retrieval_bytes, r.cache.streaming_heads,
        r.cache.streaming_bytes);
  }
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto o = std::make_shared<GenerateCliOptions>();
  auto* cmd = app.add_subcommand(
      "generate",
      "Generate text from a Llama-architecture checkpoint (llama2.c, Hugging Face safetensors or "
      "GGUF) through a compressed KV cache (llama2.c run.c's sampler: temperature, top-p, "
      "xorshift seed)");
  cmd->add_option("--model", o->model,
                  "Checkpoint: a llama2.c .bin, a Hugging Face directory / model.safetensors "
                  "(config.json beside it), or a GGUF file (.gguf, or a file starting with GGUF)")
      ->required()
      ->check(non_empty_path());
  cmd->add_option("--tokenizer", o->tokenizer,
                  "tokenizer.bin (llama2.c), tokenizer.json (HF) or a .gguf file's vocabulary; "
                  "default: next to the model (tok<vocab>.bin or tokenizer.bin; tokenizer.json), "
                  "or a GGUF model's own")
      ->check(non_empty_path());
  cmd->add_option("--qfilters", o->qfilters,
                  "Key-filter file of method qfilters (default: <model>.qfilters, made by "
                  "`veloxquant calibrate`)")
      ->check(non_empty_path());
  cmd->add_option("--prompt", o->prompt, "Prompt text (default: empty, start from BOS)");
  cmd->add_option("--question", o->question,
                  "The prompt's question, appended to --prompt as is (start it with a space or "
                  "newline): its tokens are what method finch scores the prompt with (default: "
                  "none; finch then uses its fixed window)");
  cmd->add_option("--steps", o->steps,
                  "Positions to run, prompt included (0 = the model's context; at most the "
                  "model's context)")
      ->capture_default_str()
      ->check(int_range(0, engine::kMaxGenerateSteps));
  cmd->add_option("--temperature", o->temperature, "0 = greedy (argmax)")
      ->capture_default_str()
      ->check(real_range(0, engine::kMaxTemperature));
  cmd->add_option("--top-p", o->top_p, "Nucleus sampling threshold in [0, 1] (0 or 1: off)")
      ->capture_default_str()
      ->check(real_range(0, 1));
  cmd->add_option("--seed", o->seed, "xorshift RNG seed (nonzero)")
      ->capture_default_str()
      ->check(uint_range(0, UINT64_MAX));
  add_max_memory_option(*cmd, o->max_memory);
  cmd->add_option("--method", o->method, "KV-cache method spec ID[:key=value,...]")
      ->capture_default_str();
  add_head_pattern_option(*cmd, o->head_pattern);
  add_threads_option(cmd, o->threads);
  add_q8_activations_option(cmd);
  cmd->callback([o]() { run_generate(*o); });
}

}  // namespace vq::cli
