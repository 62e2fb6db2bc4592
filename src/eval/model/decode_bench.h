// `veloxquant bench decode`: decode speed of the engine at real model shapes and long contexts.
//
// Per context N and method: every layer's cache is filled with N positions (synthetic K/V
// through the cache API, begin_step/end_step in chunks, or a real prefill), then `steps` greedy
// decode steps run through the real forward and are timed, split into weights (matmuls),
// attention and cache work (time inside begin_step/end_step). The machine's read bandwidth is
// measured in the same run, so bytes read per token can be set against it.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/compute/weights.h"

namespace vq::eval {

struct DecodeBenchOptions {
  std::string shape;        // a named shape (engine/shapes.h), or
  std::string model_path;   // a checkpoint; exactly one of the two
  std::int64_t layers = 0;  // shape: layers to build (0: the shape's default)
  std::uint64_t seed = 1;   // shape weights and synthetic K/V
  engine::WeightType weight_type = engine::WeightType::kBF16;  // shape weights
  std::vector<std::int64_t> contexts;                          // N, each >= 1
  std::vector<std::string> methods;  // specs; the budget applies to those with a token budget
  std::int64_t budget = 2048;        // 0: keep each spec's own budget
  bool budget_given = false;         // --budget given: a spec writing another budget is an error
  std::vector<int> threads;          // thread counts, each >= 1
  std::int64_t steps = 16;           // timed decode steps
  std::int64_t warmup = 2;           // untimed decode steps first
  std::int64_t fill_chunk = 256;     // positions per synthetic fill step
  bool prefill_real = false;         // fill by running the model over N tokens
  std::int64_t prefill_chunk = 64;   // prefill_real: prompt tokens per forward step
  std::int64_t bandwidth_mib = 512;  // buffer for the bandwidth measurement
  std::uint64_t max_memory = 0;      // --max-memory; 0: the available memory (engine/run/resources.h)
  std::string head_pattern;          // --duo-pattern: for methods with head types ("" = none)
};

struct DecodeProgress {
  std::size_t index = 0, total = 0;
  std::string line;
};

// Upper bounds of the flags (inclusive). With them no size computed from the flags overflows;
// the memory guard (engine/run/resources.h) then refuses runs too large for the machine.
inline constexpr std::int64_t kMaxDecodeContext = std::int64_t{1} << 24;  // --context, --budget,
                                                                         // --fill-chunk,
                                                                         // --prefill-chunk
inline constexpr std::int64_t kMaxDecodeSteps = std::int64_t{1} << 20;    // --steps, --warmup
inline constexpr std::int64_t kMaxDecodeLayers = 4096;                    // --layers
inline constexpr std::int64_t kMaxBandwidthMib = std::int64_t{1} << 20;   // --bandwidth-mib

// Validates everything a run needs before it starts (Error(kInvalidArgument) naming the flag):
// every count in its range above, thread counts in [1, the cores this process may use],
// --layers only with --shape, every spec's budget against --budget (policies/spec_budget.h).
void validate_decode_options(const DecodeBenchOptions& options);

// Runs the benchmark and returns the result document (kind "decode", docs/results.md).
nlohmann::json run_decode_bench(const DecodeBenchOptions& options, const std::string& command,
                                const std::function<void(const DecodeProgress&)>& progress);

// ms per token against context, one line per method (and thread count when several).
std::string decode_plot_svg(const nlohmann::json& doc);

// Read bandwidth in bytes per second: the best of `repeats` passes summing a buffer of `mib`
// MiB as 64-bit integers on `threads` threads (each thread its own contiguous part).
double measure_read_bandwidth(std::int64_t mib, int threads, int repeats = 5);

// The process's peak resident set size in bytes (getrusage), and its current one (/proc).
std::int64_t peak_rss_bytes();
std::int64_t current_rss_bytes();

}  // namespace vq::eval
