// KIVI storage against values derived by hand from the definition in src/store/kivi_store.cpp:
//   zero = lo rounded down to fp16, scale = max((hi - zero) / (2^bits - 1), 2^-14) rounded up to
//   fp16, q = clamp(floor((x - zero) / scale + 0.5), 0, 2^bits - 1), x' = q * scale + zero.
// Every expected number below was worked out by hand (fp16 grid: in [2^e, 2^(e+1)) the spacing
// is 2^(e-10)) and cross-checked with Python's struct 'e' (IEEE half) conversion, not with the
// code under test.
#include <cmath>
#include <vector>

#include "store/store.h"
#include "test_util.h"

namespace vq {
namespace {

// A store fed `k`/`v` ([n][D] fp32), every row settled (quantized where the tail overflows) and
// compacted.
std::unique_ptr<detail::RowStore> fed(int bits, std::int64_t G, std::int64_t D,
                                      const std::vector<float>& k, const std::vector<float>& v) {
  auto store = detail::make_kivi_store(bits, G, 0, DType::kF32, D);
  const auto n = static_cast<std::int64_t>(k.size()) / D;
  store->append(TensorRef::f32(k.data(), 1, 1, n, D), TensorRef::f32(v.data(), 1, 1, n, D), 0, 0,
                0);
  std::vector<std::int64_t> all(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) all[static_cast<std::size_t>(i)] = i;
  store->settle(all.data(), n);
  store->keep(all.data(), n);
  return store;
}

std::vector<float> keys_of(const detail::RowStore& s, std::int64_t D) {
  std::vector<float> out(static_cast<std::size_t>(s.size() * D));
  for (std::int64_t i = 0; i < s.size(); ++i) s.read_key(i, out.data() + i * D);
  return out;
}
std::vector<float> values_of(const detail::RowStore& s, std::int64_t D) {
  std::vector<float> out(static_cast<std::size_t>(s.size() * D));
  for (std::int64_t i = 0; i < s.size(); ++i) s.read_value(i, out.data() + i * D);
  return out;
}

TEST(KiviQuantizer, TwoBitsOneKeyGroupAndItsValueRowsByHand) {
  // D = 2, G = 4: the four tokens form one key group (per channel over the 4 tokens); each
  // value row is one group of its 2 channels.
  const std::vector<float> k = {0.0f, -1.0f,  //
                                1.0f, -0.5f,  //
                                2.5f, 0.25f,  //
                                3.0f, 0.5f};
  const std::vector<float> v = {1.0f,  4.0f,  //
                                0.5f,  0.5f,  //
                                -2.0f, 1.0f,  //
                                0.0f,  0.2f};
  auto s = fed(2, 4, 2, k, v);
  ASSERT_EQ(s->size(), 4);
  // Key channel 0: zero 0, scale 3/3 = 1; 2.5 -> floor(3.0) = 3. Channel 1: zero -1, scale
  // 1.5/3 = 0.5; 0.25 -> floor(2.5 + 0.5) = 3.
  EXPECT_EQ(keys_of(*s, 2), (std::vector<float>{0, -1, 1, -0.5f, 3, 0.5f, 3, 0.5f}));
  // Values: [1, 4] zero 1 scale 1 (exact); [0.5, 0.5] constant: scale is the floor 2^-14, codes
  // 0 (exact); [-2, 1] exact; [0, 0.2]: scale 0.2/3 = 0.0666.. rounded up on the 2^-14 grid
  // = 1093 * 2^-14 = 0.06671142578125, 0.2 -> floor(2.998 + 0.5) = 3 -> 3279 * 2^-14.
  EXPECT_EQ(values_of(*s, 2), (std::vector<float>{1, 4, 0.5f, 0.5f, -2, 1, 0, 0.20013427734375f}));
  // Payload: 4 rows x (1 key byte + 1 value byte), 4 value groups x fp16 scale + zero, one key
  // group x 2 channels x fp16 scale + zero.
  EXPECT_EQ(s->bytes(), 4 * 2 + 4 * 4 + 2 * 4);
}

TEST(KiviQuantizer, TwoBitsScaleAndZeroRoundOutwardToFp16) {
  // One value row [0, 0.2, 0.5, 1] (D = G = 4): scale 1/3 is not an fp16; rounded up on the
  // 2^-12 grid of [0.25, 0.5): 1366 * 2^-12 = 0.33349609375. Codes: 0.2 / s = 0.5997 -> 1,
  // 0.5 / s = 1.4993 -> 1, 1 / s = 2.9985 -> 3 (3 * 1366 * 2^-12 = 1.00048828125).
  // Key channel 0 over the 4 tokens [-0.1, 0.2, 0.3, 0.5]: -0.1 rounded down on the 2^-14 grid
  // of [0.0625, 0.125) is -1639 * 2^-14 = -0.10003662109375; scale 0.60003662 / 3 = 0.2000122
  // rounded up on the 2^-13 grid = 1639 * 2^-13 = 0.2000732421875; codes 0, 1, 2, 3.
  const std::vector<float> k = {-0.1f, 0, 0, 0,  //
                                0.2f,  0, 0, 0,  //
                                0.3f,  0, 0, 0,  //
                                0.5f,  0, 0, 0};
  const std::vector<float> v = {0, 0.2f, 0.5f, 1.0f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  auto s = fed(2, 4, 4, k, v);
  const std::vector<float> vals = values_of(*s, 4);
  EXPECT_EQ(std::vector<float>(vals.begin(), vals.begin() + 4),
            (std::vector<float>{0, 0.33349609375f, 0.33349609375f, 1.00048828125f}));
  const std::vector<float> keys = keys_of(*s, 4);
  EXPECT_EQ((std::vector<float>{keys[0], keys[4], keys[8], keys[12]}),
            (std::vector<float>{-0.10003662109375f, 0.10003662109375f, 0.30010986328125f,
                                0.50018310546875f}));
}

TEST(KiviQuantizer, FourBitsOneGroupByHand) {
  // Value row [-1, 0, 0.7, 2] (D = G = 4), 15 levels: zero -1, scale 3/15 = 0.2 rounded up on
  // the 2^-13 grid = 1639 * 2^-13 = 0.2000732421875. (x + 1) / s = 0, 4.998, 8.497, 14.995 ->
  // codes 0, 5, 8, 15 -> -1, 8195 * 2^-13 - 1, 13112 * 2^-13 - 1, 24585 * 2^-13 - 1.
  // Key channel 0 over the 4 tokens [0, 0.3, 7.5, 15]: zero 0, scale 1: codes 0, 0, 8, 15.
  const std::vector<float> k = {0, 0, 0, 0, 0.3f, 0, 0, 0, 7.5f, 0, 0, 0, 15, 0, 0, 0};
  const std::vector<float> v = {-1, 0, 0.7f, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  auto s = fed(4, 4, 4, k, v);
  const std::vector<float> vals = values_of(*s, 4);
  EXPECT_EQ(std::vector<float>(vals.begin(), vals.begin() + 4),
            (std::vector<float>{-1, 0.0003662109375f, 0.6005859375f, 2.0010986328125f}));
  const std::vector<float> keys = keys_of(*s, 4);
  EXPECT_EQ((std::vector<float>{keys[0], keys[4], keys[8], keys[12]}),
            (std::vector<float>{0, 0, 8, 15}));
  // 4-bit codes: D = 4 channels -> 2 bytes per row for keys and again for values.
  EXPECT_EQ(s->bytes(), 4 * 2 * 2 + 4 * 4 + 4 * 4);
}

TEST(KiviRequantize, EvictionRegroupsFromTheStoredValuesWithinOneStep) {
  // D = 1, G = 4, 2 bits. Key groups A = [0, 1.2, 2, 3] (zero 0, scale 1: stored [0, 1, 2, 3],
  // 1.2 becomes 1) and B = [10, 11, 12, 13] (zero 10, scale 1: stored exactly).
  const std::vector<float> k = {0, 1.2f, 2, 3, 10, 11, 12, 13};
  const std::vector<float> v(8, 0.5f);
  auto s = fed(2, 4, 1, k, v);
  EXPECT_EQ(keys_of(*s, 1), (std::vector<float>{0, 1, 2, 3, 10, 11, 12, 13}));
  // Keep rows 1, 3 of A and 4, 6 of B: 2 + 2 rows fit one group, so they are re-quantized as
  // one group from the STORED keys [1, 3, 10, 12] (not the originals [1.2, 3, 10, 12]):
  // zero 1, scale 11/3 = 3.667 rounded up on the 2^-9 grid = 1878 * 2^-9 = 3.66796875;
  // (x - 1) / s = 0, 0.545, 2.454, 2.999 -> codes 0, 1, 2, 3.
  // (From the originals it would be zero 1.19921875, scale 3.6015625: a different result.)
  const std::vector<std::int64_t> kept = {1, 3, 4, 6};
  s->settle(kept.data(), 4);
  s->keep(kept.data(), 4);
  const std::vector<float> after = keys_of(*s, 1);
  EXPECT_EQ(after, (std::vector<float>{1, 4.66796875f, 8.3359375f, 12.00390625f}));
  // One re-quantization moves each stored value by at most half the new step.
  const std::vector<float> stored = {1, 3, 10, 12};
  for (std::size_t i = 0; i < 4; ++i) EXPECT_LE(std::fabs(after[i] - stored[i]), 3.66796875f / 2);
  // One key group left: 4 rows x 2 code bytes + 4 value groups x 4 + 1 key group x 4.
  EXPECT_EQ(s->bytes(), 4 * 2 + 4 * 4 + 4);
  // Settling again without evictions changes nothing (no compounding).
  s->settle(std::vector<std::int64_t>{0, 1, 2, 3}.data(), 4);
  EXPECT_EQ(keys_of(*s, 1), after);
}

TEST(KiviRequantize, MergedKeyInsideTheGridKeepsTheOtherCodes) {
  // D = 1, G = 4: group [0, 1, 2, 3] (zero 0, scale 1).
  const std::vector<float> k = {0, 1, 2, 3};
  const std::vector<float> v(4, 0.0f);
  auto s = fed(2, 4, 1, k, v);
  // 2.2 lies inside the grid [0, 3]: row 1 gets code 2, the others keep theirs.
  const float in1 = 2.2f;
  s->write_key(1, &in1);
  EXPECT_EQ(keys_of(*s, 1), (std::vector<float>{0, 2, 2, 3}));
  // 6 lies outside: the channel is re-quantized from the stored values [6, 2, 2, 3]: zero 2,
  // scale 4/3 rounded up on the 2^-10 grid = 1366 * 2^-10 = 1.333984375; codes 3, 0, 0, 1.
  const float in0 = 6.0f;
  s->write_key(0, &in0);
  EXPECT_EQ(keys_of(*s, 1), (std::vector<float>{6.001953125f, 2, 2, 3.333984375f}));
}

TEST(KiviStore, ValuesLeaveTheTailOneTokenAtATimeKeysAGroupAtATime) {
  // The paper's rule, D = 2, G = 2, residual 2, 2 bits, fp32 tail, tokens fed one a step:
  // values are quantized as each token leaves the last 2 rows; keys when the key tail reaches
  // residual + G = 4 rows, its oldest 2 as one group.
  auto s = detail::make_kivi_store(2, 2, 2, DType::kF32, 2);
  const std::vector<float> k = {0.2f, 1, 0, 1, 5, 5, 6, 6};
  const std::vector<float> v = {0, 0.2f, 1, 4, 7, 7, 8, 8};
  auto feed = [&](std::int64_t t) {
    s->append(TensorRef::f32(k.data() + t * 2, 1, 1, 1, 2),
              TensorRef::f32(v.data() + t * 2, 1, 1, 1, 2), 0, 0, static_cast<std::int32_t>(t));
    std::vector<std::int64_t> all(static_cast<std::size_t>(t + 1));
    for (std::int64_t i = 0; i <= t; ++i) all[static_cast<std::size_t>(i)] = i;
    s->settle(all.data(), t + 1);
    s->keep(all.data(), t + 1);
  };
  feed(0);
  feed(1);
  EXPECT_EQ(s->bytes(), 2 * 2 * 8);  // two rows, keys and values fp32 (8 bytes a row each)
  feed(2);
  // Row 0's value left the tail: [0, 0.2] -> zero 0, scale 0.2 / 3 = 0.0666.. rounded up on
  // fp16's 2^-14 grid of [2^-4, 2^-3) = 1093 * 2^-14 = 0.06671142578125; 0.2 -> code 3 ->
  // 3279 * 2^-14 = 0.20013427734375. Its key is still exact (the key tail holds 3 < 4 rows).
  EXPECT_EQ(values_of(*s, 2), (std::vector<float>{0, 0.20013427734375f, 1, 4, 7, 7}));
  EXPECT_EQ(keys_of(*s, 2), (std::vector<float>{0.2f, 1, 0, 1, 5, 5}));
  // Keys 3 x 8 + values 2 x 8 + row 0's value: 1 code byte + fp16 scale + zero.
  EXPECT_EQ(s->bytes(), 24 + 16 + 5);
  feed(3);
  // Row 1's value left too ([1, 4]: zero 1, scale 1, exact); the key tail reached 4 rows, so
  // keys 0 and 1 became one group: channel 0 [0.2, 0] as the value above (0.2 -> code 3),
  // channel 1 [1, 1] constant (exact).
  EXPECT_EQ(values_of(*s, 2), (std::vector<float>{0, 0.20013427734375f, 1, 4, 7, 7, 8, 8}));
  EXPECT_EQ(keys_of(*s, 2), (std::vector<float>{0.20013427734375f, 1, 0, 1, 5, 5, 6, 6}));
  // Key codes 2 x 1 byte + key group 2 channels x 4 bytes + value codes 2 x 1 + value
  // parameters 2 x 4 + key tail 2 x 8 + value tail 2 x 8.
  EXPECT_EQ(s->bytes(), 2 + 8 + 2 + 8 + 16 + 16);
}

TEST(KiviStore, ResidentBytesCountedFromTheLayoutByHand) {
  // D = 4, G = 4, 2 bits, no residual, fp32 tail: 16 rows appended as one chunk, settled into
  // 4 key groups, then row 15 is evicted. Capacities from the growth rules stated in
  // kivi_store.cpp:
  //  - tail: 16 rows x 16 bytes appended at once (exact), emptied by the settle, then given
  //    back (a prompt step keeps exactly its tail rows, here none): 0 bytes;
  //  - positions: 16 (exact, kept after the small cut): 64 bytes;
  //  - quantized containers grow by an eighth: key codes and key groups (scales, zeros: 4
  //    entries a group) group by group, sizes 4, 8, 12, 16 -> capacities 4, 9, 13, 18; first
  //    rows 1, 2, 3, 4 -> 4; value codes, scales and zeros all 16 rows at once -> 18.
  // Payload for the 15 rows left: key and value codes 15 x 1 byte each; value scale and zero
  // 15 x 2 bytes each; key scale and zero 4 groups x 4 channels x 2 bytes each.
  std::vector<float> k = test::randn(16 * 4, 90), v = test::randn(16 * 4, 91);
  auto s = fed(2, 4, 4, k, v);
  std::vector<std::int64_t> first15(15);
  for (std::int64_t i = 0; i < 15; ++i) first15[static_cast<std::size_t>(i)] = i;
  s->keep(first15.data(), 15);
  EXPECT_EQ(s->bytes(), 15 + 15 + 30 + 30 + 32 + 32);
  const std::int64_t allocated = 18 + 18 + 36 + 36 + 36 + 36;
  EXPECT_EQ(s->allocated_bytes(), allocated);
  // Bookkeeping: the positions and the key groups' first rows, nothing per row besides.
  EXPECT_EQ(s->resident_bytes(), allocated + 64 + 4 * 4);
}

TEST(KiviCache, NoRowIsHeldTwice) {
  // While everything is in the fp16 tail, the payload is exactly the fp16 full cost; once rows
  // are quantized it drops below, and what the cache keeps (resident) follows it.
  const std::int64_t H = 4, D = 64;
  test::KV kv(1, H, 1024, D, 7);
  LayerCache c = test::make_cache("kivi");  // residual_length 128, group 32
  auto feed = [&](std::int64_t t0, std::int64_t t1) {
    for (std::int64_t t = t0; t < t1; ++t) {
      c.begin_step(kv.keys(t, 1), kv.values(t, 1));
      c.end_step();
    }
  };
  feed(0, 128);
  CacheStats s = c.stats();
  EXPECT_EQ(s.kept_bytes, s.full_bytes);  // 128 <= residual_length: nothing quantized yet
  EXPECT_GE(s.resident_bytes, s.kept_bytes);
  feed(128, 150);
  s = c.stats();
  // 150 < 128 + 32: no key group yet, but the values of the 22 rows past the residual left the
  // tail, per head: keys 150 x 128 bytes, values 128 x 128 + 22 x (16 code bytes + 2 groups x
  // 4 parameter bytes).
  EXPECT_EQ(s.kept_bytes, H * (150 * 128 + 128 * 128 + 22 * 24));
  EXPECT_GE(s.resident_bytes, s.kept_bytes);
  feed(150, 1024);
  s = c.stats();
  // 896 quantized rows x (2 x 16 code bytes + 2 value groups x 4) + 28 key groups x 64 x 4,
  // plus the 128-row fp16 tail (512 bytes a row), per head.
  EXPECT_EQ(s.kept_bytes, H * (896 * (32 + 8) + 28 * 64 * 4 + 128 * 4 * D));
  EXPECT_LT(s.resident_bytes, s.full_bytes / 2);
  EXPECT_GE(s.resident_bytes, s.allocated_bytes);
}

}  // namespace
}  // namespace vq

namespace vq {
namespace {

TEST(QuantizeOption, ABudgetInsideTheFp16ResidualIsAnErrorNamingTheFields) {
  // The key tail holds residual_length .. residual_length + kivi_group_size - 1 rows before its
  // oldest group is quantized; under a budget below residual_length + kivi_group_size no key
  // ever leaves it.
  test::expect_error([] { CacheConfig::parse("h2o:budget=63,quantize=kivi2"); },
                     ErrorCode::kInvalidConfig,
                     {"[h2o] quantize=kivi2 would never quantize a key", "budget (63)",
                      "residual_length (32)", "kivi_group_size (32) = 64"});
  test::expect_error(
      [] { CacheConfig::parse("tova:budget=100,quantize=kivi4,residual_length=80,kivi_group_size=32"); },
      ErrorCode::kInvalidConfig, {"budget (100)", "residual_length (80)", "= 112"});
  // The budget sweep (eval --budget) goes through the same validation.
  test::expect_error(
      [] { with_token_budget(CacheConfig::parse("h2o:budget=256,quantize=kivi2"), 32); },
      ErrorCode::kInvalidConfig, {"would never quantize a key"});
  EXPECT_NO_THROW(CacheConfig::parse("h2o:budget=64,quantize=kivi2"));
  EXPECT_NO_THROW(CacheConfig::parse("h2o:budget=32,quantize=none"));
}

TEST(QuantizeOption, ChangesTheBytesAtTheSmallestBudgetItAccepts) {
  // h2o at budget 64 (residual 32, group 32). After 64 tokens nothing was evicted and the tail
  // reached 64 = residual + group rows, so its oldest 32 rows were packed. Per head, by hand:
  // plain fp16 64 rows x 64 x 2 x 2 = 16384 bytes; quantized 32 rows x (16 + 16 code bytes + 2
  // value groups x 4 parameter bytes) + 1 key group x 64 channels x 4 + 32 fp16 rows x 256 =
  // 1280 + 256 + 8192 = 9728 bytes.
  const std::int64_t H = 2, D = 64;
  test::KV kv(1, H, 300, D, 21);
  LayerCache plain = test::make_cache("h2o:budget=64", H, D);
  LayerCache quant = test::make_cache("h2o:budget=64,quantize=kivi2", H, D);
  auto feed = [&](std::int64_t t0, std::int64_t t1) {
    for (std::int64_t t = t0; t < t1; ++t) {
      for (LayerCache* c : {&plain, &quant}) {
        c->begin_step(kv.keys(t, 1), kv.values(t, 1));
        c->end_step();
      }
    }
  };
  feed(0, 64);
  EXPECT_EQ(plain.kept_bytes(), H * 16384);
  EXPECT_EQ(quant.kept_bytes(), H * 9728);
  // Evicting: the tail never holds 64 rows after a step, so at least one row stays packed.
  feed(64, 300);
  EXPECT_EQ(quant.tokens_kept(), 64);
  EXPECT_EQ(plain.kept_bytes(), H * 16384);
  EXPECT_LT(quant.kept_bytes(), plain.kept_bytes());
}

}  // namespace
}  // namespace vq
