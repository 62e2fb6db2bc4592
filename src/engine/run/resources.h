// The memory guard: every command estimates what a run needs and refuses it, before
// allocating, when that exceeds the memory available (or the --max-memory flag).
#pragma once

#include <cstdint>
#include <string>

#include "engine/compute/weights.h"
#include "engine/model/model.h"
#include "veloxquant/config.h"

namespace vq::engine {

// MemAvailable from /proc/meminfo in bytes, or the room left under the process's cgroup v2
// memory limit (memory.max - memory.current) when that is smaller; 0 when neither can be read.
std::uint64_t available_memory_bytes();

// Parses a --max-memory value: a positive integer number of bytes with an optional suffix K, M,
// G or T (powers of 1024; "KiB", "MB" etc. accepted too), e.g. "512M", "8G". Throws
// Error(kInvalidArgument) naming `flag`.
std::uint64_t parse_memory_size(const std::string& text, const std::string& flag);

// "1.5 GiB", "12.0 MiB", "512 bytes".
std::string format_bytes(double bytes);

// Throws Error(kInvalidArgument) when `estimate_bytes` exceeds the limit: `max_memory` when
// nonzero (the user's --max-memory), else the available memory (no check when that is unknown).
// The message names `command`, the estimate, `what` (what the memory is for) and the limit.
void check_memory(const std::string& command, double estimate_bytes, const std::string& what,
                  std::uint64_t max_memory);

// Bytes of a model's weights held in memory with matrices of `type` (engine/weights.h) and norm
// vectors in fp32: what make_random_model builds for a named shape.
double model_weight_bytes(const engine::ModelConfig& model, engine::WeightType type);

// An upper estimate of what the reference engine allocates for one run of `model`: its working
// buffers for `chunk` positions per forward call over a `context`-position run (RoPE tables and
// the attention tiles' per-thread scratch, for engine::threads() threads, sized by the
// context), plus a cache holding all `context` positions of every layer in fp32. The chunk's
// attention probabilities [Hq][chunk][context] count only when `attention_probs`: the engine
// materialises them only for a method that reads them (reads_attention below).
double engine_run_bytes(const engine::ModelConfig& model, std::int64_t chunk, std::int64_t context,
                        bool attention_probs);

// Whether a cache of `method` for `model` reads the attention probabilities the engine passes
// (LayerCache::reads_attention). A spec that does not parse counts as reading (the estimate
// stays an upper one; the run reports the spec's error).
bool reads_attention(const std::string& method, const engine::ModelConfig& model);
bool reads_attention(const CacheConfig& method, const engine::ModelConfig& model);

}  // namespace vq::engine
