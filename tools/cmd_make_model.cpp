// `veloxquant make-model`: a named model shape with deterministic random weights, written as a
// Hugging Face checkpoint (config.json + model.safetensors) the engine and other engines load.
// Also home of the shared --threads and --q8-activations options.
#include <fmt/format.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "base/validate.h"
#include "cli.h"
#include "engine/compute/matmul.h"
#include "engine/model/model.h"
#include "engine/compute/parallel.h"
#include "engine/model/shapes.h"
#include "eval/report/output_set.h"
#include "engine/run/resources.h"
#include "veloxquant/errors.h"

namespace vq::cli {

void add_threads_option(CLI::App* cmd, int& threads) {
  cmd->add_option("--threads", threads,
                  "Engine threads (matmul rows, attention heads); 0 = every core. Results are "
                  "bit-identical for every count")
      ->capture_default_str()
      ->check(thread_count());
}

void apply_threads(int threads) {
  const int cores = engine::available_cores();
  validate::check_threads(threads, "--threads", cores);
  engine::set_threads(threads == 0 ? cores : threads);
}

void add_q8_activations_option(CLI::App* cmd) {
  cmd->add_option_function<std::string>(
         "--q8-activations",
         [](const std::string& v) {
           if (v != "q8_0" && v != "f32") {
             throw Error(ErrorCode::kInvalidArgument,
                         "--q8-activations must be q8_0 or f32, got '" + v + "'");
           }
           engine::set_q8_0_activations(v == "f32" ? engine::Q8_0Activations::kF32
                                                   : engine::Q8_0Activations::kQ8_0);
         },
         "Q8_0 weights: quantize the matmul input to Q8_0 blocks as llama.cpp does (q8_0) or "
         "keep it fp32 (f32: slower, only the weights rounded)")
      ->default_str("q8_0");
}

engine::WeightType parse_weight_type(const std::string& s, const std::string& flag) {
  if (s == "f32") return engine::WeightType::kF32;
  if (s == "f16") return engine::WeightType::kF16;
  if (s == "bf16") return engine::WeightType::kBF16;
  if (s == "q8_0") return engine::WeightType::kQ8_0;
  throw Error(ErrorCode::kInvalidArgument,
              flag + " must be one of f32, f16, bf16, q8_0, got '" + s + "'");
}

namespace {

struct MakeModelOptions {
  std::string shape, out, dtype = "bf16";
  std::int64_t layers = 0;
  std::uint64_t seed = 1;
  int threads = 0;
  bool list = false;
  std::uint64_t max_memory = 0;  // --max-memory; 0: the available memory
};

void run_make_model(const MakeModelOptions& o) {
  if (o.list || o.shape.empty()) {
    for (const engine::NamedShape& s : engine::named_shapes()) {
      const engine::ModelConfig& c = s.config;
      std::cout << fmt::format(
          "{:<14} layers {:>2} (default {:>2}), dim {:>4}, heads {:>2}/{:<2} kv, head_dim {:>3}, "
          "ffn {:>5}, vocab {:>6}: {}\n",
          s.name, c.n_layers, s.default_layers, c.dim, c.n_heads, c.n_kv_heads, c.head_dim,
          c.hidden_dim, c.vocab_size, s.note);
    }
    if (!o.list) {
      throw Error(ErrorCode::kInvalidArgument, "make-model: --shape NAME is required (above)");
    }
    return;
  }
  if (o.out.empty()) throw Error(ErrorCode::kInvalidArgument, "make-model: --out DIR is required");
  const engine::WeightType type = parse_weight_type(o.dtype, "--dtype");
  if (type == engine::WeightType::kQ8_0) {
    throw Error(ErrorCode::kInvalidArgument,
                "--dtype q8_0 has no safetensors type; write f32, f16 or bf16");
  }
  apply_threads(o.threads);
  // Memory: the weights are built in memory, then streamed to the file.
  const engine::NamedShape& shape = engine::find_shape(o.shape);
  engine::ModelConfig sc = shape.config;
  sc.n_layers = o.layers == 0 ? shape.default_layers : std::min(o.layers, sc.n_layers);
  engine::check_memory("make-model", engine::model_weight_bytes(sc, type) + 64.0 * 1024 * 1024,
                     "the weights of --shape " + o.shape + " (" + std::to_string(sc.n_layers) +
                         " layers, " + o.dtype + ") and the write buffers",
                     o.max_memory);

  // Outputs: --out/config.json and --out/model.safetensors, checked like every output
  // (eval/report/output_set.h: no symlink, FIFO or device replaced), written into a temporary
  // directory inside --out and renamed into place at the end. A failure or a signal removes
  // the temporary directory and every directory this run created (CleanupGuard).
  namespace fs = std::filesystem;
  const fs::path out(o.out);
  std::error_code ec;
  if (fs::exists(out, ec) && !fs::is_directory(out, ec)) {
    throw Error(ErrorCode::kIoError, "--out '" + o.out + "' exists and is not a directory", o.out);
  }
  for (const char* name : {"config.json", "model.safetensors"})
    eval::check_output_path("--out", (out / name).string());
  CleanupGuard guard;
  std::vector<fs::path> missing;
  for (fs::path p = fs::absolute(out); !p.empty() && !fs::exists(p, ec); p = p.parent_path())
    missing.insert(missing.begin(), p);
  for (const fs::path& d : missing) {
    if (::mkdir(d.c_str(), 0777) != 0 && errno != EEXIST) {
      throw Error(ErrorCode::kIoError,
                  "--out: cannot create directory '" + d.string() + "': " + std::strerror(errno),
                  o.out);
    }
    guard.add_dir(d.string());
  }
  std::string tmp = (out / ".make-model.XXXXXX").string();
  if (::mkdtemp(tmp.data()) == nullptr) {
    throw Error(ErrorCode::kIoError,
                "--out: cannot create a temporary directory in '" + o.out +
                    "': " + std::strerror(errno),
                o.out);
  }
  guard.add_dir(tmp);
  const std::string pid = std::to_string(::getpid());
  for (const char* name : {"config.json", "model.safetensors"}) {
    guard.add_file((fs::path(tmp) / name).string());
    guard.add_file((fs::path(tmp) / (std::string(name) + ".tmp-" + pid)).string());
  }

  const auto t0 = std::chrono::steady_clock::now();
  const engine::Model m = engine::make_random_model(o.shape, {o.seed, type, o.layers});
  const auto t1 = std::chrono::steady_clock::now();
  engine::write_hf_checkpoint(m, tmp);
  for (const char* name : {"model.safetensors", "config.json"}) {
    eval::check_output_path("--out", (out / name).string());  // still a file or absent
    if (std::rename((fs::path(tmp) / name).c_str(), (out / name).c_str()) != 0) {
      throw Error(ErrorCode::kIoError,
                  "--out: cannot rename the written " + std::string(name) + " into '" + o.out +
                      "': " + std::strerror(errno),
                  o.out);
    }
  }
  (void)::rmdir(tmp.c_str());
  guard.commit();
  const auto t2 = std::chrono::steady_clock::now();
  const auto secs = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
  std::cerr << fmt::format(
      "make-model: {} ({} layers, {:.3f} B parameters, {}) seed {}: generated in {:.1f} s, "
      "wrote {}/config.json and model.safetensors in {:.1f} s\n",
      o.shape, m.config().n_layers, static_cast<double>(m.config().n_params()) / 1e9, o.dtype,
      o.seed, secs(t0, t1), o.out, secs(t1, t2));
}

}  // namespace

void add_make_model_command(CLI::App& app) {
  auto o = std::make_shared<MakeModelOptions>();
  auto* cmd = app.add_subcommand(
      "make-model",
      "Write a named model shape with deterministic random weights as a Hugging Face Llama "
      "checkpoint (config.json + model.safetensors) that this engine and others load");
  cmd->add_option("--shape", o->shape, "Shape name (--list shows them)");
  cmd->add_option("--dtype", o->dtype, "Weight type: bf16, f16 or f32")->capture_default_str();
  cmd->add_option("--layers", o->layers, "Layers to build (0 = the shape's default)")
      ->capture_default_str()
      ->check(int_range(0, 4096));
  cmd->add_option("--seed", o->seed, "Weight seed")
      ->capture_default_str()
      ->check(uint_range(0, UINT64_MAX));
  cmd->add_option("--out", o->out, "Output directory (created when missing)")->check(non_empty_path());
  add_max_memory_option(*cmd, o->max_memory);
  cmd->add_flag("--list", o->list, "List the shapes");
  add_threads_option(cmd, o->threads);
  cmd->callback([o]() { run_make_model(*o); });
}

}  // namespace vq::cli
