// Shared pieces of the veloxquant command-line tool.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "engine/weights.h"
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

// --threads N on a command (0, the default: every core the process may use), and applying it
// to the engine (throws Error(kInvalidArgument) for N < 0).
void add_threads_option(CLI::App* cmd, int& threads);
void apply_threads(int threads);
// f32 | f16 | bf16 | q8_0 (engine/weights.h), throws Error(kInvalidArgument) naming the flag.
engine::WeightType parse_weight_type(const std::string& text, const std::string& flag);

// Parses comma-separated positive integers ("64,128"); throws Error(kInvalidArgument) naming
// the flag.
std::vector<std::int64_t> parse_int_list(const std::string& text, const std::string& flag,
                                         std::int64_t min_value);

// Method specs for a sweep: each --method SPEC parsed; with none given, every registered
// method with its defaults.
std::vector<CacheConfig> parse_methods(const std::vector<std::string>& specs);

}  // namespace vq::cli
