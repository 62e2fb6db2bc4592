// Installed-package consumer, C++ side: the public C++ API through the shared (or static)
// library, including a vq::Error thrown inside the library and caught here.
#include <veloxquant/veloxquant.h>

#include <cstdio>
#include <string>
#include <vector>

int main() {
  try {
    (void)vq::CacheConfig::parse("h2o:budget=0");
    return 1;  // must not get here
  } catch (const vq::Error& e) {
    if (e.code() != vq::ErrorCode::kInvalidConfig ||
        std::string(e.what()).find("h2o_budget") == std::string::npos) {
      return 1;
    }
  }
  vq::ModelCache caches(vq::CacheConfig::parse("streaming_llm:n_sink=2,window_size=6"),
                        vq::ModelShape{2, 1, 2, 0});
  std::vector<float> kv = {0.5f, -0.5f};  // [B=1, Hkv=1, S=1, D=2]
  for (int pos = 0; pos < 20; ++pos) {
    for (std::int64_t l = 0; l < caches.n_layers(); ++l) {
      caches.layer(l).update(vq::TensorRef::f32(kv.data(), 1, 1, 1, 2),
                             vq::TensorRef::f32(kv.data(), 1, 1, 1, 2));
    }
  }
  const vq::CacheStats s = caches.stats();
  if (s.tokens_seen != 20 || s.tokens_kept != 8 || s.kept_bytes != 2 * 8 * 2 * 2 * 2) return 1;
  std::printf("consumer_cpp: ok (%zu methods registered, kept %lld of %lld)\n",
              vq::registry().size(), static_cast<long long>(s.tokens_kept),
              static_cast<long long>(s.tokens_seen));
  return 0;
}
