// Shared pieces of the veloxquant command-line tool.
#pragma once

#include <CLI/CLI.hpp>
#include <limits>
#include <string>
#include <vector>

#include "engine/compute/weights.h"
#include "veloxquant/config.h"

namespace vq::cli {

// Each command file adds its subcommand to the app.
void add_list_command(CLI::App& app);
void add_demo_command(CLI::App& app);
// `bench perturb` records the command line (argv) in its result files.
void add_bench_command(CLI::App& app, int argc, const char* const* argv);
void add_generate_command(CLI::App& app);
void add_eval_command(CLI::App& app);
void add_make_model_command(CLI::App& app);
void add_convert_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_calibrate_command(CLI::App& app);  // Q-Filters' key filters (cmd_calibrate.cpp)

// `eval --task` (cmd_eval_task.cpp): its own flags, and the ones it shares with `eval`.
struct TaskCliOptions {
  std::vector<std::string> tasks;  // --task, comma-separated and/or repeated
  std::string lengths;             // "" = the default lengths
  std::string depths = "0,25,50,75,100";
  std::int64_t samples = 10;
  std::uint64_t seed = 0;
  std::string haystack, question = "last", dump;
};
struct TaskCliShared {
  std::string model, tokenizer, budgets, reference, json, plot;
  std::vector<std::string> texts, methods, args;
  std::vector<double> ratios;
  bool budget_given = false;
  std::int64_t bootstrap_samples = 10000;
  std::uint64_t bootstrap_seed = 0;
  int threads = 0;
  std::uint64_t max_memory = 0;
};
void add_task_options(CLI::App& cmd, TaskCliOptions& options);
// The flags only --task reads (an error without --task).
const std::vector<std::string>& task_only_flags();
void run_task_eval_cli(const TaskCliOptions& task, const TaskCliShared& shared);

// --threads N on a command (0, the default: every core the process may use), and applying it
// to the engine (throws Error(kInvalidArgument) for N < 0).
void add_threads_option(CLI::App* cmd, int& threads);
void apply_threads(int threads);
// --q8-activations q8_0|f32 on a command: what matmuls with Q8_0 weights do with their input
// (engine/matmul.h's Q8_0Activations; default q8_0, as llama.cpp), applied when the flag is
// parsed; another value throws Error(kInvalidArgument) naming the flag.
void add_q8_activations_option(CLI::App* cmd);
// f32 | f16 | bf16 | q8_0 (engine/weights.h), throws Error(kInvalidArgument) naming the flag.
engine::WeightType parse_weight_type(const std::string& text, const std::string& flag);

// Parses comma-separated integers in [min_value, max_value] ("64,128"), each with
// validate::parse_int; throws Error(kInvalidArgument) naming the flag, the range and the item
// (no wrapping of 2^63).
std::vector<std::int64_t> parse_int_list(
    const std::string& text, const std::string& flag, std::int64_t min_value,
    std::int64_t max_value = std::numeric_limits<std::int64_t>::max());

// A thread-count flag: an integer in [0, the cores this process may use] (0: every core);
// more threads than cores only slow a run down, so more are refused naming the core count.
CLI::Validator thread_count();

// Method specs for a sweep: each --method SPEC parsed; with none given, every registered
// method with its defaults.
std::vector<CacheConfig> parse_methods(const std::vector<std::string>& specs);

// Flag checks run by CLI11 before a command runs (the error names the flag), the CLI11 form of
// the validators every surface shares (base/validate.h: parse_int, parse_uint, parse_real,
// thread_problem), so the messages read as the C API's and the Python module's:
// an integer flag must parse exactly (no wrapping or saturation of 2^63, 2^64, -1) and lie in
// [min_value, max_value]: "--steps must be an integer in [0, 1048576], got 18446744073709551616".
CLI::Validator int_range(std::int64_t min_value, std::int64_t max_value);
// The same for an unsigned 64-bit flag (seeds).
CLI::Validator uint_range(std::uint64_t min_value, std::uint64_t max_value);
// A floating-point flag must be finite, in [min_value, max_value] (shown with enough digits
// that 1.0000001 is not printed as 1) and 0 or at least 1e-30 in magnitude (no silent
// rounding to 0 in single precision).
CLI::Validator real_range(double min_value, double max_value);
// A file path flag must not be empty.
CLI::Validator non_empty_path();

// Adds `--max-memory SIZE` (engine/run/resources.h) to a command; `bytes` stays 0 when not given
// (the limit is then the available memory).
void add_max_memory_option(CLI::App& cmd, std::uint64_t& bytes);
// --duo-pattern FILE (alias --head-pattern): a head pattern file (cache.h, load_head_pattern)
// for the methods with head types (duoattention); other methods ignore it.
void add_head_pattern_option(CLI::App& cmd, std::string& path);

// Files and directories a command is writing that must not outlive it: removed when the
// guard is destroyed without commit(), and by a handler for SIGINT, SIGTERM and SIGHUP (which
// then re-raises the signal), so a killed `make-model` or `convert` leaves no temporary file or
// half-made directory behind. Paths are removed in reverse order of add (files before the
// directories that hold them); unlink and rmdir only, which are async-signal-safe. One guard at
// a time per process.
class CleanupGuard {
 public:
  CleanupGuard();
  ~CleanupGuard();
  CleanupGuard(const CleanupGuard&) = delete;
  CleanupGuard& operator=(const CleanupGuard&) = delete;
  void add_file(const std::string& path);
  void add_dir(const std::string& path);  // removed when empty
  // Keeps everything (the outputs are in place); the signal handlers are restored.
  void commit();

 private:
  bool active_ = true;
};

// What the running command is doing, for the message when it fails with an unexpected
// exception (e.g. std::bad_alloc): "loading the model 'x.bin'". Set by the commands.
void set_activity(std::string what);

}  // namespace vq::cli
