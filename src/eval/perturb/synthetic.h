// Synthetic K/V with planted structure, for model-free benchmarks (`bench perturb`, `demo`).
//
// All data is fp32 [H][S][D] (one batch row). Each KV head h draws from its own counter-RNG
// stream keyed by (seed, h), so a (geometry, heads, tokens, head_dim, probes, seed) tuple always
// gives the same tensors, and head h's data does not depend on how many heads are drawn.
// Notation: N(0, I) is a vector of D independent standard normals; a "unit vector" is a
// normalised N(0, I) draw; S = tokens, D = head_dim. Values are N(0, I) in every geometry,
// independent of the keys, so only *which* rows a cache keeps (and how it merges them)
// decides how far its attention output moves.
//
// spans (the seed library's CaM benchmark, benchmark_cam.py):
//   keys N(0, I); three spans of m = max(1, floor(S / 12)) tokens starting at floor(S / 6),
//   floor(S / 2) and floor(4 S / 5) get +4 u on their keys (u one unit vector per head);
//   probes N(0, I) (not aimed at the spans). Keys of the spans attract more key-as-query
//   attention, so score-based methods favour them; the probes read the whole sequence.
//
// shift / stable (topic shift with a null control, after the seed's MorphKV benchmark):
//   a, b are orthonormal topic directions; the early block is t < L = floor(7 S / 10), the
//   late block t >= L. Keys k_t = 4 d_t + n_t with n_t ~ N(0, I) and d_t = a in the early
//   block; in the late block d_t = b (shift) or a (stable). Probes q = sqrt(D) p + N(0, I) with
//   p = b (shift) or a (stable). Under `shift` the recent context and the probes move to a new
//   topic: a late key gains 16 / sqrt(D) (2 at D = 64) logits on late keys under key-as-query
//   attention, and a probe gains 4 logits on late keys, so the full cache's probes put most of
//   their attention on the late block (about 95% at D = 64). `stable` is the same sequence
//   with no shift (every token and every probe on topic a): the null control. The late block
//   is the same positions in both, so `late_topic_fraction` (the share of kept rows with
//   position >= L) under stable is what a method keeps of that block without a topic change.
//
// planted (a planted heavy token that rises late, after the seed's Keyformer benchmark):
//   u is a unit vector; filler keys are N(0, I) with their u component removed, so they are
//   orthogonal to u. The planted token at P = floor(S / 4) has key 2 sqrt(D) u. The burst,
//   t >= B = floor(9 S / 10), has filler keys + 4 u. Probes q = sqrt(D) u + N(0, I). Before
//   the burst the planted token gets logit exactly 0 from every filler key (filler rows get
//   N(0, 1) logits from each other): an ordinary row for a scorer that looks at one step, and
//   a young, light row for a cumulative one. The burst attends to it with 8 logits and every
//   probe puts almost all its attention on it (2 sqrt(D) = 16 logits at D = 64), so whether a
//   cache still holds it decides the perturbation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vq::eval {

enum class Geometry {
  kSpans,    // N(0, I) keys plus three strongly planted spans (the seed's CaM setup)
  kShift,    // topic shift: the last 30% of tokens and the probes move to a new topic
  kStable,   // null control for kShift: one topic throughout
  kPlanted,  // one planted token that the final burst and every probe attend to
};

Geometry parse_geometry(const std::string& name);  // throws Error(kInvalidArgument)
const char* to_string(Geometry g) noexcept;
// One line describing the geometry (for result files and --help).
const char* describe(Geometry g) noexcept;

// Fewest tokens make_synthetic accepts (every geometry's blocks are non-empty from here on).
inline constexpr std::int64_t kMinSyntheticTokens = 8;

struct SyntheticKV {
  std::int64_t heads = 0, tokens = 0, head_dim = 0;
  std::vector<float> keys, values;  // [heads][tokens][head_dim]
  std::vector<float> probes;        // [heads][n_probes][head_dim] probe queries
  std::int64_t n_probes = 0;
  // The direction the geometry plants, per head: [heads][head_dim], unit length. spans: the
  // span direction u; shift: the late topic b; stable: the topic a; planted: u.
  std::vector<float> axis;
  // Geometry markers (-1 / empty when the geometry has none):
  std::vector<std::int64_t> span_starts;  // kSpans: first token of each span
  std::int64_t span_len = 0;              // kSpans: tokens per span (clipped at the end)
  std::int64_t late_start = -1;           // kShift / kStable: L, first token of the late block
  std::int64_t planted_pos = -1;          // kPlanted: P, the planted token's position
  std::int64_t burst_start = -1;          // kPlanted: B, first token of the burst

  const float* key(std::int64_t h, std::int64_t t) const {
    return keys.data() + (h * tokens + t) * head_dim;
  }
  const float* probe(std::int64_t h, std::int64_t p) const {
    return probes.data() + (h * n_probes + p) * head_dim;
  }
  const float* axis_of(std::int64_t h) const { return axis.data() + h * head_dim; }
};

// Throws Error(kInvalidArgument) unless heads, head_dim, n_probes >= 1 and
// tokens >= kMinSyntheticTokens.
SyntheticKV make_synthetic(Geometry geometry, std::int64_t heads, std::int64_t tokens,
                           std::int64_t head_dim, std::int64_t n_probes, std::uint64_t seed);

}  // namespace vq::eval
