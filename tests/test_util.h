// Helpers shared by the test files.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "base/rng.h"
#include "veloxquant/veloxquant.h"

namespace vq::test {

// The reference scripts' inputs (tests/reference_inputs.py, u): a splitmix64 hash of i under
// `seed`, as a double in [-0.5, 0.5).
inline double hash_uniform(std::uint64_t seed, std::uint64_t i) {
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ull + (i + 1) * 0xBF58476D1CE4E5B9ull;
  z ^= z >> 31;
  z *= 0x94D049BB133111EBull;
  z ^= z >> 29;
  return static_cast<double>(z >> 11) / 9007199254740992.0 - 0.5;
}

// The true positions of the rows (b, h) stores between steps.
inline std::vector<std::int32_t> stored_positions(const LayerCache& c, std::int64_t b,
                                                  std::int64_t h) {
  const HeadRows r = c.stored(b, h);
  return std::vector<std::int32_t>(r.positions, r.positions + r.n_rows);
}

// n standard normals from stream `seed`.
inline std::vector<float> randn(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  CounterRng rng(seed, 99, 7);
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = scale * static_cast<float>(rng.normal(i));
  return out;
}

// K/V for B x H x S x D, contiguous [B, H, S, D].
struct KV {
  std::int64_t B, H, S, D;
  std::vector<float> k, v;
  KV(std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t d, std::uint64_t seed)
      : B(b), H(h), S(s), D(d),
        k(randn(static_cast<std::size_t>(b * h * s * d), seed)),
        v(randn(static_cast<std::size_t>(b * h * s * d), seed + 1000)) {}
  // The tokens [t0, t0 + n) as a strided view into the full tensors.
  TensorRef keys(std::int64_t t0, std::int64_t n) const { return slice(k, t0, n); }
  TensorRef values(std::int64_t t0, std::int64_t n) const { return slice(v, t0, n); }

 private:
  TensorRef slice(const std::vector<float>& x, std::int64_t t0, std::int64_t n) const {
    TensorRef t = TensorRef::f32(x.data() + t0 * D, B, H, n, D);
    t.stride[0] = H * S * D;
    t.stride[1] = S * D;
    return t;
  }
};

// Feeds tokens [0, S) in chunks of `chunk` through update(); returns the last KVRows.
inline KVRows feed(LayerCache& cache, const KV& kv, std::int64_t chunk, std::int64_t t0 = 0,
                   std::int64_t t1 = -1) {
  if (t1 < 0) t1 = kv.S;
  KVRows last;
  for (std::int64_t t = t0; t < t1; t += chunk) {
    const std::int64_t n = std::min(chunk, t1 - t);
    last = cache.update(kv.keys(t, n), kv.values(t, n));
  }
  return last;
}

// Everything a cache stores, as fp32 copies, for bit-exact comparisons.
struct Snapshot {
  std::vector<std::vector<float>> keys, values;     // [B*H][rows*D]
  std::vector<std::vector<std::int32_t>> positions;  // [B*H][rows]
  bool operator==(const Snapshot& o) const {
    if (keys.size() != o.keys.size() || positions != o.positions) return false;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (keys[i].size() != o.keys[i].size() || values[i].size() != o.values[i].size()) return false;
      // Bitwise: memcmp, so -0.0 vs 0.0 or NaN payloads count as differences.
      if (std::memcmp(keys[i].data(), o.keys[i].data(), keys[i].size() * 4) != 0) return false;
      if (std::memcmp(values[i].data(), o.values[i].data(), values[i].size() * 4) != 0) return false;
    }
    return true;
  }
};

inline Snapshot snapshot(const LayerCache& cache, std::int64_t B, std::int64_t H) {
  Snapshot s;
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < H; ++h) {
      const HeadRows r = cache.stored(b, h);
      const std::int64_t D = cache.shape().head_dim;
      std::vector<float> k, v;
      std::vector<std::int32_t> p;
      for (std::int64_t i = 0; i < r.n_rows; ++i) {
        for (std::int64_t d = 0; d < D; ++d) {
          k.push_back(r.key(i, d));
          v.push_back(r.value(i, d));
        }
        p.push_back(r.positions[i]);
      }
      s.keys.push_back(k);
      s.values.push_back(v);
      s.positions.push_back(p);
    }
  }
  return s;
}

// Expects `fn` to throw vq::Error with `code` and a message containing every fragment.
template <typename Fn>
void expect_error(Fn&& fn, ErrorCode code, const std::vector<std::string>& fragments) {
  try {
    fn();
    ADD_FAILURE() << "expected vq::Error(" << to_string(code) << ") but nothing was thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const auto& f : fragments) {
      EXPECT_NE(std::string(e.what()).find(f), std::string::npos)
          << "message '" << e.what() << "' lacks '" << f << "'";
    }
  }
}

// A method that scores keys against calibrated filters (qfilters) needs them before its first
// step (LayerCache::set_key_filters); the generic harnesses give it fixed ones for the shape they
// feed: head h's filter is the unit vector along (cos(0.7 (i + 1) + h))_i. Nothing for methods
// that need none.
inline std::vector<float> fixed_key_filters(std::int64_t heads, std::int64_t D) {
  std::vector<float> f(static_cast<std::size_t>(heads * D));
  for (std::int64_t h = 0; h < heads; ++h) {
    double n2 = 0;
    for (std::int64_t i = 0; i < D; ++i) n2 += std::pow(std::cos(0.7 * double(i + 1) + double(h)), 2);
    for (std::int64_t i = 0; i < D; ++i) {
      f[static_cast<std::size_t>(h * D + i)] =
          static_cast<float>(std::cos(0.7 * double(i + 1) + double(h)) / std::sqrt(n2));
    }
  }
  return f;
}
inline void give_key_filters(LayerCache& c, std::int64_t H, std::int64_t D) {
  if (!c.needs_key_filters()) return;
  const std::vector<float> f = fixed_key_filters(H, D);
  c.set_key_filters(f.data(), H * D);
}
inline void give_key_filters(ModelCache& m) {
  if (!m.needs_key_filters()) return;
  const ModelShape& s = m.shape();
  const std::vector<float> f = fixed_key_filters(s.n_layers * s.n_kv_heads, s.head_dim);
  m.set_key_filters(f.data(), static_cast<std::int64_t>(f.size()));
}

// With H and D given, a method that needs key filters gets give_key_filters'.
inline LayerCache make_cache(const std::string& spec, std::int64_t H = 0, std::int64_t D = 0,
                             std::int64_t layer = 0, std::int64_t n_layers = 1) {
  LayerCache c(CacheConfig::parse(spec), LayerShape{H, D, 0, layer, n_layers});
  if (H > 0 && D > 0) give_key_filters(c, H, D);
  return c;
}

}  // namespace vq::test
