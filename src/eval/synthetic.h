// Synthetic K/V with planted structure, for model-free benchmarks and the demo.
// All data is fp32 [H][S][D] (one batch row) drawn from the counter RNG, so a (geometry, shape,
// seed) triple always gives the same tensors.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vq::eval {

enum class Geometry {
  kSpans,    // N(0,1) keys plus strong planted spans that probes attend to (CaM's setup)
  kShift,    // topic shift: the second half's keys move to a new subspace; probes follow it
  kStable,   // null control for kShift: one topic throughout
  kPlanted,  // one planted heavy token early in the sequence that every probe attends to
};

Geometry parse_geometry(const std::string& name);  // throws Error(kInvalidArgument)
const char* to_string(Geometry g) noexcept;

struct SyntheticKV {
  std::int64_t heads = 0, tokens = 0, head_dim = 0;
  std::vector<float> keys, values;  // [heads][tokens][head_dim]
  std::vector<float> probes;        // [heads][n_probes][head_dim] probe queries
  std::int64_t n_probes = 0;
  // Geometry-specific markers: first token of the late topic (kShift/kStable), the planted
  // token's position (kPlanted); -1 otherwise.
  std::int64_t late_start = -1;
  std::int64_t planted_pos = -1;
};

SyntheticKV make_synthetic(Geometry geometry, std::int64_t heads, std::int64_t tokens,
                           std::int64_t head_dim, std::int64_t n_probes, std::uint64_t seed);

}  // namespace vq::eval
