// `veloxquant convert`: writes a llama2.c or Hugging Face checkpoint as GGUF (llama.cpp's format).
#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <iostream>

#include "base/input_file.h"
#include "cli.h"
#include "engine/run/gguf_convert.h"
#include "engine/model/model.h"
#include "eval/report/output_set.h"
#include "engine/run/resources.h"
#include "veloxquant/errors.h"

namespace vq::cli {
namespace {

struct ConvertCliOptions {
  std::string from, to, tokenizer, type = "f32";
  std::uint64_t max_memory = 0;  // --max-memory; 0: the available memory
};

void run_convert(const ConvertCliOptions& o) {
  engine::GgmlType type;
  if (o.type == "f32") {
    type = engine::GgmlType::kF32;
  } else if (o.type == "f16") {
    type = engine::GgmlType::kF16;
  } else if (o.type == "bf16") {
    type = engine::GgmlType::kBF16;
  } else if (o.type == "q8_0") {
    type = engine::GgmlType::kQ8_0;
  } else {
    throw Error(ErrorCode::kInvalidArgument,
                "--type must be one of f32, f16, bf16, q8_0, got '" + o.type + "'");
  }
  if (o.to.size() < 5 || o.to.compare(o.to.size() - 5, 5, ".gguf") != 0) {
    throw Error(ErrorCode::kInvalidArgument, "--to must name a .gguf file, got '" + o.to + "'");
  }
  // The output is checked like every output (eval/report/output_set.h): an existing symlink, FIFO,
  // device or directory is refused before any work. The writer writes TO.tmpPID and renames it
  // into place; a failure or a signal removes the temporary file (CleanupGuard).
  eval::check_output_path("--to", o.to);
  name_input("--from", o.from);
  name_input("--tokenizer", o.tokenizer);
  check_not_an_input("--to", o.to);  // checked again before the rename (GgufWriter::write)
  CleanupGuard guard;
  guard.add_file(o.to + ".tmp" + std::to_string(::getpid()));
  set_activity("loading '" + o.from + "'");
  const engine::Model model = engine::Model::load(o.from);
  // The writer holds every converted tensor before writing (the file's size), plus one
  // matrix as fp32 at a time.
  const engine::ModelConfig& c = model.config();
  const double out_bytes =
      static_cast<double>(c.n_params()) *
      (type == engine::GgmlType::kF32 ? 4.0 : type == engine::GgmlType::kQ8_0 ? 34.0 / 32 : 2.0);
  const double largest = 4.0 * static_cast<double>(std::max(c.vocab_size, c.hidden_dim)) *
                         static_cast<double>(c.dim);
  engine::check_memory("convert", out_bytes + largest,
                     "the converted tensors of '" + o.from + "' as " + o.type, o.max_memory);
  set_activity("writing '" + o.to + "'");
  const engine::ConvertReport r = engine::convert_to_gguf(model, o.tokenizer, type, o.to);
  guard.commit();
  std::cerr << fmt::format("convert: wrote {} ({} tensors, {} bytes, {} weights, vocab '{}')\n",
                           o.to, r.n_tensors, r.file_bytes, o.type, r.vocab_model);
  if (!r.kept_as_f32.empty()) {
    std::string names;
    for (const auto& n : r.kept_as_f32) names += (names.empty() ? "" : ", ") + n;
    std::cerr << fmt::format(
        "convert: {} matrices kept as f32 (rows not a multiple of the {} block): {}\n",
        r.kept_as_f32.size(), o.type, names);
  }
}

}  // namespace

void add_convert_command(CLI::App& app) {
  auto o = std::make_shared<ConvertCliOptions>();
  auto* cmd = app.add_subcommand(
      "convert",
      "Write a llama2.c or Hugging Face Llama checkpoint, with its tokenizer, as a GGUF file "
      "(architecture llama, or qwen2 for a model with q/k/v biases) that llama.cpp and "
      "veloxquant can run");
  cmd->add_option("--from", o->from,
                  "Checkpoint: a llama2.c .bin, or a Hugging Face directory / model.safetensors "
                  "(a GGUF file is refused: it is GGUF already)")
      ->required();
  cmd->add_option("--to", o->to, "Output FILE.gguf (written atomically)")
      ->required()
      ->check(non_empty_path());
  add_max_memory_option(*cmd, o->max_memory);
  cmd->add_option("--type", o->type,
                  "Storage of the 2-D weights: f32, f16, bf16 or q8_0 (norms stay f32)")
      ->capture_default_str();
  cmd->add_option("--tokenizer", o->tokenizer,
                  "tokenizer.bin (llama2.c) or tokenizer.json (HF); default: next to the model "
                  "(tok<vocab>.bin or tokenizer.bin; tokenizer.json)");
  cmd->callback([o]() { run_convert(*o); });
}

}  // namespace vq::cli
