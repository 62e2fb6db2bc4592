// Method spec strings, then a small cache run with the parsed configuration: parsing, field
// validation and every policy's guards must reject bad specs with vq::Error, and a spec that
// parses must run.
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "veloxquant/builder.h"
#include "veloxquant/cache.h"
#include "veloxquant/config.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > 4096) return 0;  // specs are short; longer inputs add nothing
  const std::string spec(reinterpret_cast<const char*>(data), size);
  vq::fuzz::expect_clean([&] {
    const vq::CacheConfig config = vq::CacheConfig::parse(spec);
    // 2 layers, 2 KV heads, head_dim 8, 4 query heads; 48 tokens fed as a prefill of 16 then
    // single steps: enough to pass every small budget and trigger evictions and merges.
    vq::ModelCache caches = vq::KVCacheBuilder::for_model(config, vq::ModelShape{2, 2, 8, 4});
    if (caches.needs_key_filters()) {  // qfilters: one axis per (layer, KV head)
      std::vector<float> f(2 * 2 * 8, 0.0f);
      for (std::size_t i = 0; i < 4; ++i) f[i * 8 + i] = 1.0f;
      caches.set_key_filters(f.data(), static_cast<std::int64_t>(f.size()));
    }
    // finch: the prefill's last 5 tokens are its question (the other methods ignore it).
    if (caches.reads_question()) caches.set_question_length(5);
    std::vector<float> k(2 * 16 * 8), v(2 * 16 * 8);
    std::uint32_t x = 12345;
    auto next = [&] {
      x = x * 1664525u + 1013904223u;
      return static_cast<float>(x >> 8) / 16777216.0f - 0.5f;
    };
    std::int64_t fed = 0;
    while (fed < 48) {
      const std::int64_t s = fed == 0 ? 16 : 1;
      for (auto& f : k) f = next();
      for (auto& f : v) f = next();
      for (std::int64_t l = 0; l < 2; ++l) {
        vq::LayerCache& cache = caches.layer(l);
        (void)cache.update(vq::TensorRef::f32(k.data(), 1, 2, s, 8),
                           vq::TensorRef::f32(v.data(), 1, 2, s, 8));
      }
      fed += s;
    }
    (void)caches.stats();
  });
  return 0;
}
