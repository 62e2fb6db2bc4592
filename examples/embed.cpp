// Embedding VeloxQuant in an engine: one cache per layer, called once per layer per step.
// Built by CMake as `embed_example` and run by the test suite, so this code stays true.
#include <cstdio>
#include <vector>

#include "veloxquant/veloxquant.h"

int main() {
  const vq::ModelShape shape{/*n_layers=*/2, /*n_kv_heads=*/4, /*head_dim=*/64,
                             /*n_query_heads=*/8};
  // Spec strings accept field names with or without the method prefix.
  vq::ModelCache caches =
      vq::KVCacheBuilder::for_model(vq::CacheConfig::parse("cam:budget=128"), shape);

  std::vector<float> k(4 * 64), v(4 * 64);  // one new token: [B=1, Hkv=4, S=1, D=64]
  for (int pos = 0; pos < 1000; ++pos) {
    for (std::size_t i = 0; i < k.size(); ++i) {
      k[i] = static_cast<float>((pos * 31 + i * 7) % 17) / 17.0f - 0.5f;
      v[i] = static_cast<float>((pos * 13 + i * 5) % 11) / 11.0f - 0.5f;
    }
    for (int layer = 0; layer < shape.n_layers; ++layer) {
      vq::LayerCache& cache = caches.layer(layer);
      // Zero-copy: the view points into the cache and holds every kept row plus the new one.
      vq::StepView view = cache.begin_step(vq::TensorRef::f32(k.data(), 1, 4, 1, 64),
                                           vq::TensorRef::f32(v.data(), 1, 4, 1, 64));
      const vq::HeadRows& head0 = view.head(0, 0);  // keys/values fp16, positions per row
      (void)head0;  // ... the engine computes attention over view.n_rows() rows here ...
      cache.end_step();  // proxy scoring; pass &probs to report real attention instead
    }
  }
  const vq::CacheStats s = caches.stats();
  std::printf("kept %lld of %lld tokens per head, %lld bytes, compression %.2fx\n",
              static_cast<long long>(s.tokens_kept), static_cast<long long>(s.tokens_seen),
              static_cast<long long>(s.kept_bytes), s.compression_ratio);
  return s.tokens_kept == 128 ? 0 : 1;
}
