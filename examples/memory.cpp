// What a cache reports against what the process holds: fills one LayerCache with random K/V,
// one token a step, and prints kept_bytes, resident_bytes and the fp16 full cost beside the
// growth of the process's resident set (Linux /proc/self/status VmRSS). The K/V of each step are
// made on the fly, so the RSS growth is the cache (plus the allocator's own overhead).
// Built by CMake as `memory_example`:
//   build/memory_example SPEC [SEQ=32768] [KV_HEADS=8] [HEAD_DIM=64]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "veloxquant/veloxquant.h"

namespace {

// A field of /proc/self/status in kB, or -1 where there is none (not Linux).
long status_kb(const char* key) {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  long value = -1;
  const std::size_t n = std::strlen(key);
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strncmp(line, key, n) == 0) value = std::strtol(line + n, nullptr, 10);
  }
  std::fclose(f);
  return value;
}

long positive_arg(int argc, char** argv, int i, long def, const char* name) {
  if (argc <= i) return def;
  char* end = nullptr;
  const long v = std::strtol(argv[i], &end, 10);
  if (end == argv[i] || *end != '\0' || v < 1) {
    std::fprintf(stderr, "memory_example: %s must be a positive integer, got '%s'\n", name,
                 argv[i]);
    std::exit(2);
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 5) {
    std::fprintf(stderr, "usage: memory_example SPEC [SEQ=32768] [KV_HEADS=8] [HEAD_DIM=64]\n");
    return 2;
  }
  const long seq = positive_arg(argc, argv, 2, 32768, "SEQ");
  const long heads = positive_arg(argc, argv, 3, 8, "KV_HEADS");
  const long dim = positive_arg(argc, argv, 4, 64, "HEAD_DIM");
  try {
    const vq::CacheConfig config = vq::CacheConfig::parse(argv[1]);
    std::vector<float> k(static_cast<std::size_t>(heads * dim)), v(k.size());  // [1, H, 1, D]
    std::mt19937 rng(1);
    std::normal_distribution<float> normal;
    const long rss0 = status_kb("VmRSS:");
    vq::LayerCache cache(config, vq::LayerShape{heads, dim, 0, 0, 1});
    for (long t = 0; t < seq; ++t) {
      for (float& x : k) x = normal(rng);
      for (float& x : v) x = normal(rng);
      cache.begin_step(vq::TensorRef::f32(k.data(), 1, heads, 1, dim),
                       vq::TensorRef::f32(v.data(), 1, heads, 1, dim));
      cache.end_step();
    }
    const long rss1 = status_kb("VmRSS:");
    const vq::CacheStats s = cache.stats();
    std::printf(
        "%s, %ld tokens x %ld KV heads x head_dim %ld: kept %lld B, resident %lld B, "
        "full fp16 %lld B; process RSS +%ld kB (%ld -> %ld kB, peak %ld kB)\n",
        config.spec().c_str(), seq, heads, dim, static_cast<long long>(s.kept_bytes),
        static_cast<long long>(s.resident_bytes), static_cast<long long>(s.full_bytes), rss1 - rss0,
        rss0, rss1, status_kb("VmHWM:"));
  } catch (const vq::Error& e) {
    std::fprintf(stderr, "memory_example: %s\n", e.what());
    return 2;
  }
  return 0;
}
