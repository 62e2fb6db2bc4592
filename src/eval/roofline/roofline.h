// `veloxquant bench kernels`: the roofline, measured. This machine's peaks (eval/roofline/
// peaks.h), then the project's own kernels at a named model shape's sizes, each reported as a
// fraction of the peak that bounds it (docs/own-models.md, "Roofline (bench kernels)"):
//
//   kind       what is timed                                   rate                 peak used
//   prefill    engine::matmul, M tokens x one projection       2 M N K / time       float weights
//              (q, k, v, o, gate, up, down, classifier; one    (GFLOP/s; GOP/s on   (F32/F16/BF16):
//              the best row per distinct N x K), random weights of      the integer path)    FMA
//              peak; the others each weight type (quantized activations,
//                                                                                    integer dots):
//                                                                                    the best VNNI
//                                                                                    peak
//   decode     engine::matmul with M = 1 over copies of the    weight bytes / time  all-thread read
//              matrix that together exceed the last-level      (GB/s)               bandwidth
//              cache (each call reads its weights from memory,
//              as a real decode step does)
//   attention  the packed-KV kernels (store/packed_attention.h) bytes read / time    all-thread
//   read
//              for one query step over N positions of one KV   (GB/s)               bandwidth
//              head: scores, softmax, weighted values; heads
//              in parallel, enough of them to exceed the cache
//
// Times are the best of `repeats` runs after an untimed one; a decode row's is the median of its
// calls (copies x repeats of them), which one descheduled thread of a shared machine cannot move. Counts (the test re-derives them
// by hand): prefill flops = 2 M N K per projection; decode bytes = N * weight_row_bytes(type, K);
// attention bytes per head for N positions and head_dim D (groups of 32 channels or tokens):
//   f16    N (2D + 2D + 4)                   keys, values, positions
//   q8_0   N ((D + D/16) * 2 + 4)            codes and fp16 block scales, keys and values
//   q4_0   N ((D/2 + D/16) * 2 + 4)
//   kivi2  N (D/4 + D/8 + D/4 + D/8 + 4)     keys per channel: codes, scale and zero per channel
//                                            per 32 tokens; values per token: codes, scale and
//                                            zero per 32 channels
//   kivi4  N (D/2 + D/8 + D/2 + D/8 + 4)
// (KIVI's full-precision tail of recent rows is not part of these rows.)
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/compute/weights.h"

namespace vq::eval {

struct RooflineOptions {
  std::string shape = "llama-110m";       // a named shape (engine/model/shapes.h)
  std::int64_t tokens = 512;              // M of the prefill rows
  int threads = 1;                        // threads of the kernel rows (peaks: 1 and this)
  bool quick = false;                     // small sizes, few repetitions (for tests)
  std::int64_t bandwidth_mib = 1024;      // read-bandwidth buffer
  std::vector<engine::WeightType> types;  // empty: every weight type
  std::vector<std::int64_t> contexts;     // attention positions; empty: 8192, 32768
  int repeats = 3;                        // timed runs per measurement
  std::uint64_t seed = 1;
  std::uint64_t max_memory = 0;  // --max-memory; 0: the available memory
};

inline constexpr std::int64_t kMaxRooflineTokens = 65536;
inline constexpr std::int64_t kMaxRooflineContext = std::int64_t{1} << 20;
inline constexpr std::int64_t kMaxRooflineBandwidthMib = std::int64_t{1} << 20;

// Every weight type the engine's matmuls take, in WeightType order.
const std::vector<engine::WeightType>& roofline_weight_types();
// "f32", "q4_k", ... (lower case, as the flag takes them) and back; the parse throws
// Error(kInvalidArgument) naming `flag`, the known names and the value.
std::string weight_type_flag_name(engine::WeightType type);
engine::WeightType parse_roofline_weight_type(const std::string& text, const std::string& flag);

// Checks every option (Error(kInvalidArgument) naming the flag) and the memory the run needs.
void validate_roofline_options(const RooflineOptions& options);

// Runs the peaks and the kernel rows; returns the result document (kind "kernels").
nlohmann::json run_roofline(const RooflineOptions& options, const std::string& command,
                            const std::function<void(const std::string&)>& progress);

// The document as a readable table (peaks, prefill and decode per type, attention rows).
std::string roofline_table(const nlohmann::json& doc);

}  // namespace vq::eval
