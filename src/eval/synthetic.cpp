#include "eval/synthetic.h"

#include <cmath>

#include "core/rng.h"
#include "veloxquant/errors.h"

namespace vq::eval {

Geometry parse_geometry(const std::string& name) {
  if (name == "spans") return Geometry::kSpans;
  if (name == "shift") return Geometry::kShift;
  if (name == "stable") return Geometry::kStable;
  if (name == "planted") return Geometry::kPlanted;
  throw Error(ErrorCode::kInvalidArgument,
              "unknown geometry '" + name + "'; allowed: spans, shift, stable, planted");
}

const char* to_string(Geometry g) noexcept {
  switch (g) {
    case Geometry::kSpans: return "spans";
    case Geometry::kShift: return "shift";
    case Geometry::kStable: return "stable";
    case Geometry::kPlanted: return "planted";
  }
  return "?";
}

namespace {

// Draws standard normals from one counter stream.
class Normals {
 public:
  Normals(std::uint64_t seed, std::uint64_t stream) : rng_(seed, 0x5eed, stream) {}
  float next() { return static_cast<float>(rng_.normal(n_++)); }
  double uniform() { return rng_.uniform(1000000000ull + n_++); }

 private:
  CounterRng rng_;
  std::uint64_t n_ = 0;
};

void unit_vector(Normals& g, float* out, std::int64_t d) {
  double norm = 0;
  for (std::int64_t i = 0; i < d; ++i) {
    out[i] = g.next();
    norm += static_cast<double>(out[i]) * out[i];
  }
  const float inv = static_cast<float>(1.0 / std::sqrt(norm));
  for (std::int64_t i = 0; i < d; ++i) out[i] *= inv;
}

}  // namespace

SyntheticKV make_synthetic(Geometry geometry, std::int64_t heads, std::int64_t tokens,
                           std::int64_t head_dim, std::int64_t n_probes, std::uint64_t seed) {
  if (heads < 1 || tokens < 1 || head_dim < 1 || n_probes < 1) {
    throw Error(ErrorCode::kInvalidArgument,
                "[synthetic] heads, tokens, head_dim and probes must be >= 1");
  }
  SyntheticKV kv;
  kv.heads = heads;
  kv.tokens = tokens;
  kv.head_dim = head_dim;
  kv.n_probes = n_probes;
  const std::int64_t D = head_dim, S = tokens;
  kv.keys.resize(static_cast<std::size_t>(heads * S * D));
  kv.values.resize(kv.keys.size());
  kv.probes.resize(static_cast<std::size_t>(heads * n_probes * D));
  const float sqrt_d = std::sqrt(static_cast<float>(D));
  std::vector<float> dir(static_cast<std::size_t>(D)), dir2(static_cast<std::size_t>(D));

  for (std::int64_t h = 0; h < heads; ++h) {
    Normals g(seed, static_cast<std::uint64_t>(h));
    float* K = kv.keys.data() + h * S * D;
    float* V = kv.values.data() + h * S * D;
    float* P = kv.probes.data() + h * n_probes * D;
    for (std::int64_t i = 0; i < S * D; ++i) K[i] = g.next();
    for (std::int64_t i = 0; i < S * D; ++i) V[i] = g.next();

    switch (geometry) {
      case Geometry::kSpans: {
        // Spans of 16 tokens, one per 128, sharing a strong key direction and a value centroid;
        // half the probes look for one of the spans, half are plain noise.
        const std::int64_t span_len = std::min<std::int64_t>(16, S);
        const std::int64_t n_spans = std::max<std::int64_t>(1, S / 128);
        std::vector<std::vector<float>> dirs;
        for (std::int64_t s = 0; s < n_spans; ++s) {
          const std::int64_t slot = S / n_spans;
          const std::int64_t start =
              s * slot + static_cast<std::int64_t>(g.uniform() * static_cast<double>(std::max<std::int64_t>(1, slot - span_len)));
          unit_vector(g, dir.data(), D);
          unit_vector(g, dir2.data(), D);
          dirs.push_back(dir);
          for (std::int64_t t = start; t < std::min(S, start + span_len); ++t) {
            for (std::int64_t d = 0; d < D; ++d) {
              K[t * D + d] = 0.5f * K[t * D + d] + 1.5f * sqrt_d * dir[d];
              V[t * D + d] = 0.5f * V[t * D + d] + 2.0f * sqrt_d * dir2[d] / sqrt_d;
            }
          }
        }
        for (std::int64_t p = 0; p < n_probes; ++p) {
          for (std::int64_t d = 0; d < D; ++d) P[p * D + d] = g.next();
          if (p % 2 == 0) {
            const auto& u = dirs[static_cast<std::size_t>(p / 2) % dirs.size()];
            for (std::int64_t d = 0; d < D; ++d) P[p * D + d] = 0.5f * P[p * D + d] + sqrt_d * u[d];
          }
        }
        break;
      }
      case Geometry::kShift:
      case Geometry::kStable: {
        // Two topic directions; with kShift the second half of the sequence (and the probes)
        // move to topic B, with kStable everything stays on topic A.
        unit_vector(g, dir.data(), D);
        unit_vector(g, dir2.data(), D);
        kv.late_start = S / 2;
        for (std::int64_t t = 0; t < S; ++t) {
          const bool late = geometry == Geometry::kShift && t >= kv.late_start;
          const float* u = late ? dir2.data() : dir.data();
          for (std::int64_t d = 0; d < D; ++d) K[t * D + d] = 0.7f * K[t * D + d] + 0.8f * sqrt_d * u[d];
        }
        const float* u = geometry == Geometry::kShift ? dir2.data() : dir.data();
        for (std::int64_t p = 0; p < n_probes; ++p) {
          for (std::int64_t d = 0; d < D; ++d) P[p * D + d] = 0.7f * g.next() + 0.8f * sqrt_d * u[d];
        }
        break;
      }
      case Geometry::kPlanted: {
        // One token early in the sequence whose key every probe aligns with strongly.
        kv.planted_pos = std::min<std::int64_t>(S - 1, std::max<std::int64_t>(4, S / 16));
        unit_vector(g, dir.data(), D);
        const std::int64_t t = kv.planted_pos;
        for (std::int64_t d = 0; d < D; ++d) K[t * D + d] = 2.0f * sqrt_d * dir[d];
        for (std::int64_t p = 0; p < n_probes; ++p) {
          for (std::int64_t d = 0; d < D; ++d) P[p * D + d] = g.next() + 0.6f * sqrt_d * dir[d];
        }
        break;
      }
    }
  }
  return kv;
}

}  // namespace vq::eval
