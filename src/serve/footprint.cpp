#include "serve/footprint.h"

#include <algorithm>
#include <string>
#include <vector>

#include "veloxquant/errors.h"

namespace vq::serve {

namespace {

// Drives one cache through steps of the sizes `next_step(pos)` gives until max_positions and
// returns the largest resident_bytes after a step.
template <class NextStep>
std::int64_t peak(const CacheConfig& method, const ModelShape& shape, std::int64_t max_positions,
                  std::int64_t chunk, std::int64_t limit, NextStep next_step) {
  ModelCache cache = KVCacheBuilder::for_model(method, shape);
  cache.expect_positions(max_positions);  // as a session's cache (scheduler.cpp)
  // qfilters: the filters' values change no byte the cache holds; unit filters stand in for the
  // model's (the session's cache loads the real ones, engine/run/qfilters_file.h).
  if (cache.needs_key_filters()) {
    std::vector<float> unit(static_cast<std::size_t>(shape.n_layers * shape.n_kv_heads *
                                                     shape.head_dim),
                            0.0f);
    for (std::size_t i = 0; i < unit.size(); i += static_cast<std::size_t>(shape.head_dim)) {
      unit[i] = 1.0f;
    }
    cache.set_key_filters(unit.data(), static_cast<std::int64_t>(unit.size()));
  }
  // kvzip: a session's prompt waits for its reconstruction pass (scheduler.cpp), so the prompt
  // is held whole until the pass and its cut (below).
  const bool reconstructs = cache.reads_reconstruction();
  if (reconstructs) cache.set_reconstruction(true);
  const std::int64_t Hkv = shape.n_kv_heads, D = shape.head_dim, Hq = shape.n_query_heads;
  std::vector<float> k(static_cast<std::size_t>(chunk * Hkv * D));
  std::vector<float> v(k.size());
  std::vector<float> probs;
  std::uint32_t state = 12345u;
  auto fill = [&](std::vector<float>& x, std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i) {
      state = state * 1664525u + 1013904223u;  // a fixed LCG: same rows every run
      x[static_cast<std::size_t>(i)] =
          static_cast<float>(state >> 8) / static_cast<float>(1u << 24) - 0.5f;
    }
  };
  std::int64_t best = cache.stats().resident_bytes;
  std::int64_t pos = 0;
  while (pos < max_positions) {
    const std::int64_t S = std::min(next_step(pos), max_positions - pos);
    fill(k, S * Hkv * D);
    fill(v, S * Hkv * D);
    TensorRef kref = TensorRef::f32(k.data(), 1, Hkv, S, D);
    TensorRef vref = TensorRef::f32(v.data(), 1, Hkv, S, D);
    for (std::int64_t l = 0; l < shape.n_layers; ++l) {
      const StepView view = cache.layer(l).begin_step(kref, vref);
      const std::int64_t R = view.n_rows();
      // Uniform probabilities, built only for a cache that reads them (an engine's contract:
      // AttentionRef with null data otherwise); full, kivi, the key scorers and proxy sources
      // skip the Hq * S * R buffer (llama-110m, a 512-token chunk at 4k rows: 12 x 512 x 4096
      // floats, 96 MiB).
      AttentionRef a{nullptr, 1, Hq, S, R};
      if (cache.layer(l).reads_attention()) {
        probs.assign(static_cast<std::size_t>(Hq * S * R), 1.0f / static_cast<float>(R));
        a.data = probs.data();
      }
      cache.observe_layer_similarity(l, 0.9);
      cache.layer(l).end_step(&a);
    }
    pos += S;
    best = std::max(best, cache.stats().resident_bytes);
    // kvzip: where the prompt ends (a decode step or the last position follows), one
    // reconstruction step over the positions left (at most a chunk's rows: the stores never grow
    // past max_positions rows) and the cut. With no position left the session's pass could not
    // run either (the request fails), and the prompt stays whole.
    const bool prompt_ends = pos >= max_positions || std::min(next_step(pos), max_positions - pos) <= 1;
    if (reconstructs && S > 1 && prompt_ends && pos < max_positions) {
      const std::int64_t m = std::min(chunk, max_positions - pos);
      fill(k, m * Hkv * D);
      TensorRef kr = TensorRef::f32(k.data(), 1, Hkv, m, D);
      for (std::int64_t l = 0; l < shape.n_layers; ++l) {
        const std::int64_t R = cache.layer(l).begin_step(kr, kr).n_rows();
        probs.assign(static_cast<std::size_t>(Hq * m * R), 1.0f / static_cast<float>(R));
        const AttentionRef a{probs.data(), 1, Hq, m, R};
        cache.layer(l).end_reconstruction_step(&a);
      }
      best = std::max(best, cache.stats().resident_bytes);
      cache.compress();
      best = std::max(best, cache.stats().resident_bytes);
    }
    if (limit > 0 && best > limit) break;
  }
  return best;
}

}  // namespace

std::int64_t session_footprint(const CacheConfig& method, const ModelShape& shape,
                               std::int64_t max_positions, std::int64_t chunk,
                               std::int64_t limit) {
  if (max_positions < 1 || chunk < 1 || chunk > max_positions) {
    throw Error(ErrorCode::kInvalidArgument,
                "[serve] footprint: need max_positions >= 1 and chunk in [1, max_positions], got " +
                    std::to_string(max_positions) + " and " + std::to_string(chunk));
  }
  // Prefill only; one chunk then decode; turns of two chunks and `chunk` decode steps.
  const std::int64_t a = peak(method, shape, max_positions, chunk, limit, [&](std::int64_t) { return chunk; });
  if (limit > 0 && a > limit) return a;
  const std::int64_t b = peak(method, shape, max_positions, chunk, limit,
                              [&](std::int64_t pos) { return pos == 0 ? chunk : 1; });
  const std::int64_t c = peak(method, shape, max_positions, chunk, limit, [&](std::int64_t pos) {
    return pos % (3 * chunk) < 2 * chunk ? chunk : std::int64_t{1};
  });
  return std::max({a, b, c});
}

}  // namespace vq::serve
