// The bytes a cache reports against the bytes it holds, measured independently: this test
// binary replaces the global operator new/delete with a counter of live heap bytes, so the heap
// a cache keeps between steps is measured without asking the cache.
#include <atomic>
#include <cstdlib>
#include <new>
#include <string>

#include "test_util.h"

namespace {

std::atomic<long long> g_live{0};  // heap bytes handed out by operator new and not yet freed

constexpr std::size_t kHeader = 16;  // keeps the returned block 16-byte aligned

void* counted_alloc(std::size_t n) {
  void* p = std::malloc(n + kHeader);
  if (p == nullptr) throw std::bad_alloc();
  *static_cast<std::size_t*>(p) = n;
  g_live += static_cast<long long>(n);
  return static_cast<char*>(p) + kHeader;
}

void counted_free(void* q) noexcept {
  if (q == nullptr) return;
  void* p = static_cast<char*>(q) - kHeader;
  g_live -= static_cast<long long>(*static_cast<std::size_t*>(p));
  std::free(p);
}

}  // namespace

void* operator new(std::size_t n) { return counted_alloc(n); }
void* operator new[](std::size_t n) { return counted_alloc(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted_alloc(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted_alloc(n);
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept { counted_free(p); }
void operator delete[](void* p) noexcept { counted_free(p); }
void operator delete(void* p, std::size_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::size_t) noexcept { counted_free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { counted_free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { counted_free(p); }

namespace vq {
namespace {

struct Held {
  long long heap = 0;  // live heap bytes of the cache after the last step
  CacheStats stats;
};

// Builds a cache for `spec`, feeds tokens one at a time through begin_step/end_step and
// measures the heap it holds afterwards.
Held held_by(const std::string& spec, const test::KV& kv, std::int64_t n_tokens) {
  {
    // Warm-up: one-time allocations (the method registry, parsers) happen outside the count.
    LayerCache warm = test::make_cache(spec, kv.H, kv.D);
    warm.begin_step(kv.keys(0, 1), kv.values(0, 1));
    warm.end_step();
  }
  const long long before = g_live.load();
  LayerCache c = test::make_cache(spec, kv.H, kv.D);
  for (std::int64_t t = 0; t < n_tokens; ++t) {
    c.begin_step(kv.keys(t, 1), kv.values(t, 1));
    c.end_step();
  }
  Held h;
  h.heap = g_live.load() - before;
  h.stats = c.stats();
  return h;
}

// What a cache may hold besides resident_bytes: its config, the policy object and its step
// scratch (a few rows' worth of floats), the layer state and one store object per head. Far
// below one head's rows as fp32 (1024 x 64 x 4 x 2 = 512 KiB), which would show up.
constexpr long long kFixedOverhead = 48 * 1024;

TEST(Memory, ResidentBytesAreTheHeapTheCacheHolds) {
  const test::KV kv(1, 4, 1024, 64, 11);
  for (const char* spec : {"full", "kivi", "kivi:bit_width_inlier=4", "h2o:budget=256",
                           "h2o:budget=256,quantize=kivi2,residual_length=32"}) {
    const Held h = held_by(spec, kv, 1024);
    EXPECT_LE(h.stats.resident_bytes, h.heap) << spec;
    EXPECT_LE(h.heap - h.stats.resident_bytes, kFixedOverhead) << spec;
    EXPECT_GE(h.stats.resident_bytes, h.stats.kept_bytes) << spec;
  }
}

TEST(Memory, QuantizedCacheHoldsLessThanTheFp16PayloadOnceRowsAreQuantized) {
  const test::KV kv(1, 4, 1024, 64, 12);
  const std::int64_t full_fp16 = 1024 * 4 * 64 * 2 * 2;  // K + V, fp16, 1024 tokens, 4 heads
  const Held full = held_by("full", kv, 1024);
  for (const char* spec : {"kivi", "kivi:bit_width_inlier=4"}) {
    const Held q = held_by(spec, kv, 1024);
    EXPECT_LT(q.heap, full_fp16) << spec;
    EXPECT_LT(q.heap, full.heap) << spec;
  }
  // 2 bits, per head: 896 quantized rows x (32 code bytes + 8 value-parameter bytes + 12 bytes
  // of slot, key-group id and position), 28 key groups x 256 parameter bytes, 128 fp16 tail rows
  // x (256 + 8): 87552 bytes, 4 heads: 350208 = 33% of the fp16 payload; with the containers'
  // slack (growth by a quarter) under 40%.
  EXPECT_LT(held_by("kivi", kv, 1024).heap, full_fp16 * 4 / 10);
}

TEST(Memory, EverythingInTheFp16ResidualCostsTheFp16Payload) {
  // 150 tokens < residual_length 128 + group 32: no row is quantized yet, the payload is the
  // fp16 rows themselves (kept == full), and the cache holds at least that.
  const test::KV kv(1, 4, 150, 64, 13);
  const Held q = held_by("kivi", kv, 150);
  const std::int64_t full_fp16 = 150 * 4 * 64 * 2 * 2;
  EXPECT_EQ(q.stats.kept_bytes, full_fp16);
  EXPECT_GE(q.heap, full_fp16);
}

}  // namespace
}  // namespace vq
