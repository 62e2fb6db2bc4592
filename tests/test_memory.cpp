// The bytes a cache reports against the bytes it holds, measured independently: this test
// binary replaces the global operator new/delete with a counter of live heap bytes, so the heap
// a cache keeps between steps is measured without asking the cache.
#include <atomic>
#include <cstdlib>
#include <new>
#include <string>

#include "policies/layer_state.h"
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
  // 2 bits, per head: 896 quantized rows x (32 code bytes + 8 value-parameter bytes + 4 bytes
  // of position), 28 key groups x (256 parameter bytes + 4 bytes of first row), 128 fp16 tail
  // rows x (256 + 4): 79984 bytes, 4 heads: 319936 = 31% of the fp16 payload; with the
  // containers' slack (the positions double, the tail is capped at 160 rows) under 40%.
  EXPECT_LT(held_by("kivi", kv, 1024).heap, full_fp16 * 4 / 10);
}

// ggml's KV types: resident bytes are the heap held (counting allocator), and the payload is
// exactly the rows' codes and fp16 scales: per row and head, keys and values alike, q8_0 64 code
// bytes + 2 scales x 2 bytes = 68, q4_0 32 + 4 = 36 (so 1024 rows x 4 heads x 2 halves:
// 557056 and 294912 bytes, 53% and 28% of the fp16 payload's 1048576).
TEST(Memory, GgmlKvTypesHoldTheirBlocksExactly) {
  const test::KV kv(1, 4, 1024, 64, 14);
  for (const char* spec : {"full:kv_dtype=q8_0", "full:kv_dtype=q4_0",
                           "h2o:budget=256,kv_dtype=q8_0", "cam:budget=256,kv_dtype=q4_0"}) {
    const Held h = held_by(spec, kv, 1024);
    EXPECT_LE(h.stats.resident_bytes, h.heap) << spec;
    EXPECT_LE(h.heap - h.stats.resident_bytes, kFixedOverhead) << spec;
    EXPECT_GE(h.stats.resident_bytes, h.stats.kept_bytes) << spec;
    const std::int64_t per_row = std::string(spec).find("q8_0") != std::string::npos ? 68 : 36;
    std::int64_t rows = 0;
    for (const std::int64_t k : h.stats.tokens_kept_per_head) rows += k;
    EXPECT_EQ(h.stats.kept_bytes, rows * per_row * 2) << spec;
  }
  EXPECT_EQ(held_by("full:kv_dtype=q8_0", kv, 1024).stats.kept_bytes, 557056);
  EXPECT_EQ(held_by("full:kv_dtype=q4_0", kv, 1024).stats.kept_bytes, 294912);
}

TEST(Memory, EverythingInTheFp16ResidualCostsTheFp16Payload) {
  // 128 tokens = residual_length: no row is quantized yet, the payload is the fp16 rows
  // themselves (kept == full), and the cache holds at least that.
  const test::KV kv(1, 4, 128, 64, 13);
  const Held q = held_by("kivi", kv, 128);
  const std::int64_t full_fp16 = 128 * 4 * 64 * 2 * 2;
  EXPECT_EQ(q.stats.kept_bytes, full_fp16);
  EXPECT_GE(q.heap, full_fp16);
}

// What the full cache and kivi (defaults: residual_length 128, group 32) keep, context by
// context: `prefill` tokens as one step, then one token a step up to `n_tokens`. For every
// context length n (after the step that reaches it): kivi's resident bytes never exceed the
// fp16 full cache's, and from the first quantized row on (n > 128, the first value leaving the
// residual) they are strictly below. While every row is in the fp16 tail (n <= 128) both hold
// the same rows and positions, grown the same way, so they are equal when fed one token a
// step. The heap measured by the counting allocator is resident_bytes plus a constant (the
// objects), at every n.
void expect_kivi_at_or_below_full(std::int64_t prefill, std::int64_t n_tokens) {
  const std::int64_t H = 4, D = 64;
  const test::KV kv(1, H, n_tokens, D, 17);
  held_by("kivi", kv, 1);  // warm-up (one-time allocations outside the counts)
  long long heap_full = 0, heap_kivi = 0;
  auto counted = [](long long& heap, auto&& f) {
    const long long before = g_live.load();
    f();
    heap += g_live.load() - before;
  };
  LayerCache full = test::make_cache("full", H, D);
  LayerCache kivi = test::make_cache("kivi", H, D);
  auto step = [&](LayerCache& c, long long& heap, std::int64_t t0, std::int64_t n) {
    counted(heap, [&] {
      c.begin_step(kv.keys(t0, n), kv.values(t0, n));
      c.end_step();
    });
  };
  std::int64_t t = 0;
  long long unreported_full = -1, unreported_kivi = -1;  // heap - resident after the first step
  while (t < n_tokens) {
    const std::int64_t n = t == 0 && prefill > 0 ? prefill : 1;
    step(full, heap_full, t, n);
    step(kivi, heap_kivi, t, n);
    t += n;
    const CacheStats f = full.stats(), q = kivi.stats();
    // The heap beyond resident_bytes is a constant (objects, config): resident tracks the heap
    // byte for byte as the context grows.
    if (unreported_full < 0) {
      unreported_full = heap_full - f.resident_bytes;
      unreported_kivi = heap_kivi - q.resident_bytes;
    }
    ASSERT_EQ(heap_full - f.resident_bytes, unreported_full)
        << "prefill " << prefill << ", n = " << t;
    ASSERT_EQ(heap_kivi - q.resident_bytes, unreported_kivi)
        << "prefill " << prefill << ", n = " << t;
    ASSERT_LE(q.resident_bytes, f.resident_bytes) << "prefill " << prefill << ", n = " << t;
    if (t > 128) {
      ASSERT_LT(q.kept_bytes, f.kept_bytes) << "prefill " << prefill << ", n = " << t;
      ASSERT_LT(q.resident_bytes, f.resident_bytes) << "prefill " << prefill << ", n = " << t;
    } else {
      ASSERT_EQ(q.kept_bytes, f.kept_bytes) << "prefill " << prefill << ", n = " << t;
      if (prefill == 0) {
        ASSERT_EQ(q.resident_bytes, f.resident_bytes) << "n = " << t;
      }
    }
  }
}

// The full cache's capacity beyond 1024 rows grows by 1/8 (not by doubling): fed one token a
// step, at every context n its resident bytes stay within the fp16 rows and positions of
// 9/8 n + 1 rows (per head: 2 * 2 * D bytes of K and V, 4 of position) plus 4 KiB of
// bookkeeping. Doubling held up to 2n rows (n = 8193: 16384 rows of capacity).
TEST(Memory, FullCacheCapacityGrowsInBoundedSteps) {
  const std::int64_t H = 1, D = 8, N = 8193;
  const test::KV kv(1, H, N, D, 5);
  LayerCache full = test::make_cache("full", H, D);
  for (std::int64_t t = 0; t < N; ++t) {
    full.begin_step(kv.keys(t, 1), kv.values(t, 1));
    full.end_step();
    if (t + 1 <= 1024) continue;
    const double rows = 9.0 / 8.0 * static_cast<double>(t + 1) + 1;
    const double bound = rows * static_cast<double>(H * (4 * D + 4)) + 4096;
    ASSERT_LE(static_cast<double>(full.stats().resident_bytes), bound) << "n = " << t + 1;
  }
}

TEST(Memory, KiviHoldsNoMoreThanTheFp16FullCacheAtEveryContextLength) {
  expect_kivi_at_or_below_full(0, 1024);  // every context 1 .. 1024, one token a step
}

TEST(Memory, KiviHoldsNoMoreThanTheFp16FullCacheAfterAPrefill) {
  // A prompt read as one step (inside the tail, at its end, past it without a key group, one
  // key group, several, the main job's 256), then decoded token by token.
  for (const std::int64_t prefill : {2, 64, 100, 128, 129, 130, 159, 160, 161, 200, 256, 512}) {
    expect_kivi_at_or_below_full(prefill, 600);
  }
}

TEST(Memory, APrefillCutToTheBudgetHoldsWhatTheBudgetNeeds) {
  // h2o at budget 64 reads a 256-token prompt as one step and cuts it to 64 rows. Afterwards
  // every per-row container holds 64 rows plus room for one more (the next decode token); the
  // row store also keeps 64 / 32 = 2 slots of front slack (rows dropped from the front move
  // the few rows before them, not all after). By hand, per head: K and V 67 x 64 x fp16 = 8576
  // bytes each, positions 67 x 4, the policy's live indices 65 x 8 (empty between steps,
  // refilled next step), score and aux 65 x 4 each. Besides: one HeadState, one RNG and one
  // HeadRows per head.
  const std::int64_t H = 4, D = 64;
  const test::KV kv(1, H, 256, D, 19);
  LayerCache c = test::make_cache("h2o:budget=64", H, D);
  const long long before = g_live.load();
  c.begin_step(kv.keys(0, 256), kv.values(0, 256));
  c.end_step();
  const long long heap = g_live.load() - before;
  const CacheStats s = c.stats();
  ASSERT_EQ(s.tokens_kept, 64);
  const std::int64_t per_head = 2 * 8576 + 67 * 4 + 65 * 8 + 2 * 65 * 4;
  const std::int64_t tables =
      static_cast<std::int64_t>(sizeof(detail::HeadState) + sizeof(CounterRng) + sizeof(HeadRows));
  EXPECT_EQ(s.resident_bytes, H * (per_head + tables));
  EXPECT_LE(heap - s.resident_bytes, kFixedOverhead);
}

}  // namespace
}  // namespace vq
