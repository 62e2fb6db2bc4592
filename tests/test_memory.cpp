// The bytes a cache reports against the bytes it holds, measured independently: this test
// binary replaces the global operator new/delete with a counter of live heap bytes, so the heap
// a cache keeps between steps is measured without asking the cache.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
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

// The full cache's rows grow in bounded steps at every size (store/growth.h), never by doubling.
// allocated_bytes counts the K and V containers' capacity: per head C rows x 2 (K, V) x D x 2
// bytes (fp16), so C = allocated / (H * 4 * D). By hand, fed one token a step from empty: the
// capacities are c0 = 0, c(k+1) = c(k) + max(c(k) / 8, 16) (each step is taken when c(k) + 1
// rows are needed, and adds at least that one row), so at n rows C is the first c(k) >= n and
// the one before it is below n:  n <= C <= (n - 1) + max((n - 1) / 8, 16). Each growth copies
// the rows held (the old capacity, below n) and from c = 16 on every capacity is at least 9/8
// of the one before (c + 16 >= 9c/8 for c <= 128), so the rows copied by growths up to n sum
// to less than n (1 + 8/9 + (8/9)^2 + ...) = 9n. std::vector's doubling gave C = 1024 at
// n = 513 (the bound: 576); the store before this bound doubled up to 1024 rows.
TEST(Memory, FullCacheCapacityGrowsInBoundedStepsAtEverySize) {
  const std::int64_t H = 2, D = 16, N = 5000;
  const test::KV kv(1, H, N, D, 5);
  LayerCache full = test::make_cache("full", H, D);
  std::int64_t cap = 0, copied = 0;
  for (std::int64_t t = 0; t < N; ++t) {
    full.begin_step(kv.keys(t, 1), kv.values(t, 1));
    full.end_step();
    const std::int64_t n = t + 1;
    const std::int64_t alloc = full.stats().allocated_bytes;
    ASSERT_EQ(alloc % (H * 4 * D), 0) << "n = " << n;
    const std::int64_t c = alloc / (H * 4 * D);
    if (c != cap) {
      copied += n - 1;  // the rows held when the containers moved
      cap = c;
    }
    ASSERT_GE(c, n);
    ASSERT_LE(c, (n - 1) + std::max<std::int64_t>((n - 1) / 8, 16)) << "n = " << n;
  }
  EXPECT_LT(copied, 9 * N);
}

// A prompt of 512 tokens in chunks of 64, then 9 tokens one at a time (bench decode's pattern:
// 512 + 1 warm-up + 8 timed steps = 521 rows). By hand, without a hint: each chunk needs more
// than the step c + max(c / 8, 16) gives (64 > 512 / 8), so the capacity is exactly 64, 128,
// ..., 512 rows after each chunk; the first decode token grows it to 512 + 512 / 8 = 576. With
// expect_positions(521) that step stops at 521: the cache ends holding exactly its 521 rows,
// and never holds more than 521 on the way. Results do not depend on the hint.
TEST(Memory, ExpectPositionsCapsTheFullCachesGrowthAtTheRowsItWillHold) {
  const std::int64_t H = 2, D = 64;
  const test::KV kv(1, H, 521, D, 6);
  LayerCache plain = test::make_cache("full", H, D);
  LayerCache hinted = test::make_cache("full", H, D);
  hinted.expect_positions(521);
  auto rows_of = [&](const LayerCache& c) { return c.stats().allocated_bytes / (H * 4 * D); };
  std::int64_t t = 0;
  for (const std::int64_t S : {64, 64, 64, 64, 64, 64, 64, 64, 1, 1, 1, 1, 1, 1, 1, 1, 1}) {
    for (LayerCache* c : {&plain, &hinted}) {
      c->begin_step(kv.keys(t, S), kv.values(t, S));
      c->end_step();
    }
    t += S;
    if (t <= 512) {
      ASSERT_EQ(rows_of(plain), t);
    } else {
      ASSERT_EQ(rows_of(plain), 576) << "t = " << t;
    }
    ASSERT_EQ(rows_of(hinted), t <= 512 ? t : 521) << "t = " << t;
    for (std::int64_t h = 0; h < H; ++h) {
      const HeadRows a = plain.stored(0, h), b = hinted.stored(0, h);
      ASSERT_EQ(a.n_rows, b.n_rows);
      ASSERT_EQ(std::memcmp(a.keys, b.keys, static_cast<std::size_t>(a.n_rows * D * 2)), 0);
      ASSERT_EQ(std::memcmp(a.values, b.values, static_cast<std::size_t>(a.n_rows * D * 2)), 0);
    }
  }
  EXPECT_EQ(hinted.stats().allocated_bytes, hinted.stats().kept_bytes);
  // More positions than expected still fit: the store grows on in bounded steps.
  hinted.begin_step(kv.keys(0, 1), kv.values(0, 1));
  hinted.end_step();
  EXPECT_EQ(rows_of(hinted), 521 + 521 / 8);
  test::expect_error([&] { hinted.expect_positions(-1); }, ErrorCode::kInvalidArgument,
               {"expect_positions", "-1"});
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
