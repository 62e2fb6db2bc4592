#include "eval/perturb/synthetic.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "base/checked_math.h"
#include "base/rng.h"
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

const char* describe(Geometry g) noexcept {
  switch (g) {
    case Geometry::kSpans:
      return "N(0,I) keys and values; three spans of floor(S/12) tokens at S/6, S/2, 4S/5 with "
             "+4u on their keys; N(0,I) probes (the seed's CaM benchmark)";
    case Geometry::kShift:
      return "keys 4a + N(0,I) for t < 0.7S, 4b + N(0,I) after (topic shift); probes "
             "sqrt(D) b + N(0,I); N(0,I) values";
    case Geometry::kStable:
      return "keys 4a + N(0,I) throughout (null control for shift); probes sqrt(D) a + N(0,I); "
             "N(0,I) values";
    case Geometry::kPlanted:
      return "filler keys N(0,I) orthogonal to u; key 2 sqrt(D) u at S/4; +4u on keys of the "
             "last 10%; probes sqrt(D) u + N(0,I); N(0,I) values";
  }
  return "?";
}

namespace {

// Sequential draws from one counter-RNG stream (seed, head).
class Draws {
 public:
  Draws(std::uint64_t seed, std::uint64_t head) : rng_(seed, 0x5eed, head) {}
  float normal() { return static_cast<float>(rng_.normal(n_++)); }
  void normals(float* out, std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i) out[i] = normal();
  }

 private:
  CounterRng rng_;
  std::uint64_t n_ = 0;
};

double dot(const float* a, const float* b, std::int64_t d) {
  double s = 0;
  for (std::int64_t i = 0; i < d; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// out <- out / |out| (a zero draw is impossible in practice: D normals all exactly 0).
void normalise(float* out, std::int64_t d) {
  const double n = std::sqrt(dot(out, out, d));
  for (std::int64_t i = 0; i < d; ++i) out[i] = static_cast<float>(out[i] / n);
}

void unit_vector(Draws& g, float* out, std::int64_t d) {
  g.normals(out, d);
  normalise(out, d);
}

// x <- x - (x . u) u for a unit vector u.
void remove_component(float* x, const float* u, std::int64_t d) {
  const double c = dot(x, u, d);
  for (std::int64_t i = 0; i < d; ++i) x[i] = static_cast<float>(x[i] - c * u[i]);
}

// x <- x + s u
void add_scaled(float* x, const float* u, float s, std::int64_t d) {
  for (std::int64_t i = 0; i < d; ++i) x[i] += s * u[i];
}

// Sizes come from flags: refuses what is too small, and element counts beyond memory's range.
void check_sizes(std::int64_t heads, std::int64_t tokens, std::int64_t head_dim,
                 std::int64_t n_probes) {
  if (heads < 1 || head_dim < 1 || n_probes < 1 || tokens < kMinSyntheticTokens) {
    throw Error(ErrorCode::kInvalidArgument,
                "[synthetic] needs heads, head_dim and probes >= 1 and tokens >= " +
                    std::to_string(kMinSyntheticTokens) + ", got heads " +
                    std::to_string(heads) + ", tokens " + std::to_string(tokens) +
                    ", head_dim " + std::to_string(head_dim) + ", probes " +
                    std::to_string(n_probes));
  }
  const auto kv_elems = detail::checked_product({heads, tokens, head_dim});
  const auto probe_elems = detail::checked_product({heads, n_probes, head_dim});
  constexpr std::int64_t kMaxElems = std::int64_t{1} << 40;  // 4 TiB of fp32: never allocatable
  if (!kv_elems || !probe_elems || *kv_elems > kMaxElems || *probe_elems > kMaxElems) {
    throw Error(ErrorCode::kInvalidArgument, "[synthetic] heads " + std::to_string(heads) +
                                                 " x tokens " + std::to_string(tokens) +
                                                 " (or probes " + std::to_string(n_probes) +
                                                 ") x head_dim " + std::to_string(head_dim) +
                                                 " elements is too large (at most 2^40)");
  }
}

// Where the geometry's features lie (spans, the late block, the planted token).
void place_features(Geometry geometry, SyntheticKV& kv) {
  const std::int64_t S = kv.tokens;
  switch (geometry) {
    case Geometry::kSpans:
      kv.span_len = std::max<std::int64_t>(1, S / 12);
      kv.span_starts = {S / 6, S / 2, (4 * S) / 5};
      break;
    case Geometry::kShift:
    case Geometry::kStable:
      kv.late_start = (7 * S) / 10;
      break;
    case Geometry::kPlanted:
      kv.planted_pos = S / 4;
      kv.burst_start = (9 * S) / 10;
      break;
  }
}

// Shapes head h's noise (keys K, probes Q) by the geometry along the directions a and b, and
// records the probes' axis.
void shape_head(Geometry geometry, SyntheticKV& kv, std::int64_t h, const std::vector<float>& a,
                const std::vector<float>& b) {
  const std::int64_t D = kv.head_dim, S = kv.tokens, P = kv.n_probes;
  const float sqrt_d = std::sqrt(static_cast<float>(D));
  float* K = kv.keys.data() + h * S * D;
  float* Q = kv.probes.data() + h * P * D;
  float* axis = kv.axis.data() + h * D;
  switch (geometry) {
    case Geometry::kSpans: {
      for (const std::int64_t start : kv.span_starts) {
        for (std::int64_t t = start; t < std::min(S, start + kv.span_len); ++t) {
          add_scaled(K + t * D, a.data(), 4.0f, D);
        }
      }
      std::copy(a.begin(), a.end(), axis);
      break;
    }
    case Geometry::kShift:
    case Geometry::kStable: {
      const bool shift = geometry == Geometry::kShift;
      for (std::int64_t t = 0; t < S; ++t) {
        const float* topic = shift && t >= kv.late_start ? b.data() : a.data();
        add_scaled(K + t * D, topic, 4.0f, D);
      }
      const std::vector<float>& probe_topic = shift ? b : a;
      for (std::int64_t p = 0; p < P; ++p) add_scaled(Q + p * D, probe_topic.data(), sqrt_d, D);
      std::copy(probe_topic.begin(), probe_topic.end(), axis);
      break;
    }
    case Geometry::kPlanted: {
      for (std::int64_t t = 0; t < S; ++t) {
        float* k = K + t * D;
        if (t == kv.planted_pos) {
          for (std::int64_t d = 0; d < D; ++d) k[d] = 2.0f * sqrt_d * a[d];
          continue;
        }
        remove_component(k, a.data(), D);
        if (t >= kv.burst_start) add_scaled(k, a.data(), 4.0f, D);
      }
      for (std::int64_t p = 0; p < P; ++p) add_scaled(Q + p * D, a.data(), sqrt_d, D);
      std::copy(a.begin(), a.end(), axis);
      break;
    }
  }
}

}  // namespace

SyntheticKV make_synthetic(Geometry geometry, std::int64_t heads, std::int64_t tokens,
                           std::int64_t head_dim, std::int64_t n_probes, std::uint64_t seed) {
  check_sizes(heads, tokens, head_dim, n_probes);
  SyntheticKV kv;
  kv.heads = heads;
  kv.tokens = tokens;
  kv.head_dim = head_dim;
  kv.n_probes = n_probes;
  const std::int64_t D = head_dim, S = tokens, P = n_probes;
  kv.keys.resize(static_cast<std::size_t>(heads * S * D));
  kv.values.resize(kv.keys.size());
  kv.probes.resize(static_cast<std::size_t>(heads * P * D));
  kv.axis.resize(static_cast<std::size_t>(heads * D));
  place_features(geometry, kv);

  std::vector<float> a(static_cast<std::size_t>(D)), b(static_cast<std::size_t>(D));
  for (std::int64_t h = 0; h < heads; ++h) {
    // Draw order per head: directions, keys, values, probes (each a fixed count of normals).
    Draws g(seed, static_cast<std::uint64_t>(h));
    unit_vector(g, a.data(), D);
    g.normals(b.data(), D);
    if (D > 1) {
      // b orthonormal to a (Gram-Schmidt). With D = 1 there is no second direction; b = a.
      remove_component(b.data(), a.data(), D);
      normalise(b.data(), D);
    } else {
      b = a;
    }
    g.normals(kv.keys.data() + h * S * D, S * D);
    g.normals(kv.values.data() + h * S * D, S * D);
    g.normals(kv.probes.data() + h * P * D, P * D);
    shape_head(geometry, kv, h, a, b);
  }
  return kv;
}

}  // namespace vq::eval
