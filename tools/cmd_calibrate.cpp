// `veloxquant calibrate`: Q-Filters' key filters for a model (method qfilters,
// src/policies/methods/qfilters.cpp). Runs the model over a text's first N tokens, collects every
// layer's queries (after RoPE) per query head, takes each head's dominant direction (the first
// right singular vector of its queries, sign: their mean projection positive), averages a KV
// head's group, and writes the filter file (engine/run/qfilters_file.h), by default next to the
// model as <model>.qfilters, atomically.
#include <fmt/format.h>

#include <cmath>
#include <iostream>

#include "base/input_file.h"
#include "cli.h"
#include "engine/formats/mapped_file.h"
#include "engine/model/model.h"
#include "engine/run/qfilters_file.h"
#include "engine/run/resources.h"
#include "engine/tokenizers/tokenizer.h"
#include "veloxquant/errors.h"

namespace vq::cli {
namespace {

struct CalibrateCliOptions {
  std::string model, tokenizer, text, out;
  std::int64_t tokens = 2048;
  std::int64_t chunk = 64;
  int threads = 0;
  std::uint64_t max_memory = 0;
};

void run_calibrate(const CalibrateCliOptions& o) {
  apply_threads(o.threads);
  name_input("--model", o.model);
  name_input("--tokenizer", o.tokenizer);
  name_input("--text", o.text);
  set_activity("loading the model '" + o.model + "'");
  const engine::Model model = engine::Model::load(o.model);
  const engine::ModelConfig& c = model.config();
  const std::string out = o.out.empty() ? model.path() + ".qfilters" : o.out;
  check_not_an_input("--out", out);
  const std::int64_t window = std::min(o.tokens, c.seq_len);
  engine::check_memory("calibrate",
                       engine::engine_run_bytes(c, std::min(o.chunk, window), window, false) +
                           8.0 * static_cast<double>(c.n_layers * c.n_heads) *
                               static_cast<double>(c.head_dim * (c.head_dim + 1)),
                       "the engine's buffers, a " + std::to_string(window) +
                           "-position cache and the query statistics for " + model.path(),
                       o.max_memory);
  set_activity("loading the tokenizer and the text");
  const auto tokenizer = engine::load_tokenizer(o.tokenizer, model);
  const std::vector<std::int32_t> ids =
      engine::encode_first(*tokenizer, engine::read_text_file(o.text), o.tokens);
  if (static_cast<std::int64_t>(ids.size()) < o.tokens) {
    throw Error(ErrorCode::kFileError,
                "'" + o.text + "': encodes to only " + std::to_string(ids.size()) +
                    " tokens, fewer than --tokens " + std::to_string(o.tokens),
                o.text);
  }
  set_activity("collecting the queries");
  const engine::KeyFilters f = engine::calibrate_key_filters(model, ids, o.chunk);
  set_activity("writing '" + out + "'");
  engine::write_key_filters(out, f);
  std::cerr << fmt::format(
      "calibrate: {} layers x {} KV heads x head_dim {} ({} query heads) from {} tokens of '{}'; "
      "model fingerprint {:016x}; wrote {}\n",
      f.n_layers, f.n_kv_heads, f.head_dim, c.n_heads, f.tokens, o.text, f.fingerprint, out);
}

}  // namespace

void add_calibrate_command(CLI::App& app) {
  auto o = std::make_shared<CalibrateCliOptions>();
  auto* cmd = app.add_subcommand(
      "calibrate",
      "Q-Filters calibration (method qfilters): run the model over a text, take each head's "
      "dominant query direction (SVD of its post-RoPE queries), and write the key-filter file "
      "the method loads (default <model>.qfilters)");
  cmd->add_option("--model", o->model,
                  "Checkpoint: a llama2.c .bin, a Hugging Face directory / model.safetensors, or "
                  "a GGUF file")
      ->required()
      ->check(non_empty_path());
  cmd->add_option("--tokenizer", o->tokenizer,
                  "tokenizer.bin (llama2.c), tokenizer.json (HF) or a .gguf file's vocabulary; "
                  "default: next to the model, or a GGUF model's own")
      ->check(non_empty_path());
  cmd->add_option("--text", o->text, "Calibration text (UTF-8)")
      ->required()
      ->check(non_empty_path());
  cmd->add_option("--tokens", o->tokens,
                  "Use the text's first N tokens (BOS included), run in windows of the model's "
                  "context")
      ->capture_default_str()
      ->check(int_range(1, std::int64_t{1} << 24));
  cmd->add_option("--chunk", o->chunk, "Tokens per forward step (results do not depend on it)")
      ->capture_default_str()
      ->check(int_range(1, 4096));
  cmd->add_option("--out", o->out, "Filter file to write (default: <model>.qfilters)")
      ->check(non_empty_path());
  add_max_memory_option(*cmd, o->max_memory);
  add_threads_option(cmd, o->threads);
  cmd->callback([o]() { run_calibrate(*o); });
}

}  // namespace vq::cli
