// Engine-like attention for tests: real queries attend over a step's view with the causal
// mask built from positions, and the probabilities go back to the cache.
#pragma once

#include <cmath>
#include <vector>

#include "base/kernels.h"
#include "test_util.h"

namespace vq::test {

// probs [B, Hq, S, R] for queries [B, Hq, S, D] (contiguous) over the view; query s sits at
// position first_pos + s and sees rows with position <= its own. A head with fewer rows than
// R (head-wise budgets) gets 0 in the columns past its own rows.
inline std::vector<float> attend(const StepView& view, const std::vector<float>& q, std::int64_t Hq,
                                 std::int64_t first_pos) {
  const std::int64_t B = view.batch(), H = view.n_kv_heads(), D = view.head_dim(),
                     R = view.n_rows(), S = view.n_new(), g = Hq / H;
  std::vector<float> probs(static_cast<std::size_t>(B * Hq * S * R), 0.0f);
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t qh = 0; qh < Hq; ++qh) {
      const HeadRows& rows = view.head(b, qh / g);
      const std::int64_t n = rows.n_rows;
      for (std::int64_t s = 0; s < S; ++s) {
        const float* qv = q.data() + ((b * Hq + qh) * S + s) * D;
        float* p = probs.data() + ((b * Hq + qh) * S + s) * R;
        float m = -INFINITY;
        for (std::int64_t r = 0; r < n; ++r) {
          if (rows.positions[r] > first_pos + s) {
            p[r] = -INFINITY;
            continue;
          }
          float dot = 0;
          for (std::int64_t d = 0; d < D; ++d) dot += rows.key(r, d) * qv[d];
          p[r] = dot / std::sqrt(static_cast<float>(D));
          m = std::max(m, p[r]);
        }
        float sum = 0;
        for (std::int64_t r = 0; r < n; ++r) {
          p[r] = std::isinf(p[r]) ? 0.0f : std::exp(p[r] - m);
          sum += p[r];
        }
        for (std::int64_t r = 0; r < n; ++r) p[r] /= sum;
      }
    }
  }
  return probs;
}

// Feeds tokens [t0, t1) in chunks, passing engine-like attention from queries q
// ([B, Hq, S_total, D]).
inline void feed_attention(LayerCache& cache, const KV& kv, const std::vector<float>& q,
                           std::int64_t Hq, std::int64_t chunk, std::int64_t t0 = 0,
                           std::int64_t t1 = -1) {
  if (t1 < 0) t1 = kv.S;
  for (std::int64_t t = t0; t < t1; t += chunk) {
    const std::int64_t n = std::min(chunk, t1 - t);
    const StepView view = cache.begin_step(kv.keys(t, n), kv.values(t, n));
    std::vector<float> qs(static_cast<std::size_t>(kv.B * Hq * n * kv.D));
    for (std::int64_t b = 0; b < kv.B; ++b) {
      for (std::int64_t h = 0; h < Hq; ++h) {
        for (std::int64_t s = 0; s < n; ++s) {
          for (std::int64_t d = 0; d < kv.D; ++d) {
            qs[((b * Hq + h) * n + s) * kv.D + d] = q[((b * Hq + h) * kv.S + t + s) * kv.D + d];
          }
        }
      }
    }
    const std::vector<float> probs = attend(view, qs, Hq, t);
    const AttentionRef ref{probs.data(), kv.B, Hq, n, view.n_rows()};
    cache.end_step(&ref);
  }
}

}  // namespace vq::test
