// Mixed precision (demote=): hand-derived cases of which rows stay fp16, which are demoted and
// which are evicted, the dequantized values of demoted rows, their bytes, and the guards.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "attention_util.h"
#include "test_util.h"

namespace vq {
namespace {

// One head, head_dim 4: the rows' keys and values given row by row ([S][4] each).
struct Rows {
  std::vector<float> k, v;
  std::int64_t n() const { return static_cast<std::int64_t>(k.size() / 4); }
  TensorRef keys(std::int64_t t, std::int64_t n) const {
    return TensorRef::f32(k.data() + t * 4, 1, 1, n, 4);
  }
  TensorRef values(std::int64_t t, std::int64_t n) const {
    return TensorRef::f32(v.data() + t * 4, 1, 1, n, 4);
  }
};

void feed_rows(LayerCache& c, const Rows& r, std::int64_t chunk) {
  for (std::int64_t t = 0; t < r.n(); t += chunk) {
    const std::int64_t n = std::min(chunk, r.n() - t);
    c.update(r.keys(t, n), r.values(t, n));
  }
}

std::vector<std::int32_t> positions(const LayerCache& c) {
  const HeadRows r = c.stored(0, 0);
  return std::vector<std::int32_t>(r.positions, r.positions + r.n_rows);
}

// KNorm (evicts the largest key norm), budget 3, no sinks, no recent window, 2-bit tier of 2
// rows. Keys (a, 0, 0, 0) with a = 1, 5, 2, 4, 3, 0.5 for tokens 0..5; score = -|a|.
//  t3: {0,1,2,3} is over 3 -> token 1 (|a| 5) is demoted (score -5).
//  t4: {0,2,3,4} -> token 3 (4) demoted (-4); the tier holds {1, 3}.
//  t5: {0,2,4,5} -> token 4 (3) demoted (-3); the tier {1, 3, 4} is over 2 -> its lowest score,
//      token 1 (-5), is evicted.
// fp16 rows: 0, 2, 5 (in order); demoted: 3, 4 (in the order demoted); evicted: 1.
Rows knorm_rows() {
  Rows r;
  const float a[6] = {1.0f, 5.0f, 2.0f, 4.0f, 3.0f, 0.5f};
  for (int t = 0; t < 6; ++t) {
    r.k.insert(r.k.end(), {a[t], 0.0f, 0.0f, 0.0f});
    const float x = static_cast<float>(t);
    r.v.insert(r.v.end(), {x, x, x, x});
  }
  // Token 3's value (0, 0.25, 0.5, 1) and token 4's (-1, 0, 1, 2): see ExactDequantizedValues.
  std::copy_n(std::vector<float>{0.0f, 0.25f, 0.5f, 1.0f}.begin(), 4, r.v.begin() + 12);
  std::copy_n(std::vector<float>{-1.0f, 0.0f, 1.0f, 2.0f}.begin(), 4, r.v.begin() + 16);
  return r;
}

const char* kKnormSpec = "knorm:budget=3,n_sink=0,grace=0,demote=kivi2,demote_budget=2";

TEST(Demote, HandDerivedKnormCase) {
  for (std::int64_t chunk : {1, 6}) {
    LayerCache c(CacheConfig::parse(kKnormSpec), LayerShape{});
    feed_rows(c, knorm_rows(), chunk);
    EXPECT_EQ(positions(c), (std::vector<std::int32_t>{0, 2, 5, 3, 4})) << "chunk " << chunk;
    EXPECT_EQ(c.row_scores(0, 0), (std::vector<float>{-1.0f, -2.0f, -0.5f, -4.0f, -3.0f}));
    const CacheStats s = c.stats();
    EXPECT_EQ(s.tokens_kept, 5);
    EXPECT_EQ(s.demoted_rows, 2);
    EXPECT_EQ(s.evictions, 1);  // token 1, out of the tier; demotions are not evictions
    // fp16: 3 rows x (K + V) x 4 channels x 2 bytes = 48. Demoted, 2-bit, one group of 4
    // channels: 1 code byte + fp16 scale + fp16 zero = 5 bytes for K, again for V: 2 x 10 = 20.
    EXPECT_EQ(s.kept_bytes, 48 + 20);
    EXPECT_EQ(s.full_bytes, 6 * 4 * 2 * 2);
  }
  // 4-bit: 2 code bytes + 4 bytes of parameters, for K and V: 2 rows x 12 = 24.
  LayerCache c4(CacheConfig::parse("knorm:budget=3,n_sink=0,grace=0,demote=kivi4,demote_budget=2"),
                LayerShape{});
  feed_rows(c4, knorm_rows(), 1);
  EXPECT_EQ(positions(c4), (std::vector<std::int32_t>{0, 2, 5, 3, 4}));
  EXPECT_EQ(c4.kept_bytes(), 48 + 24);
}

TEST(Demote, ExactDequantizedValues) {
  LayerCache c(CacheConfig::parse(kKnormSpec), LayerShape{});
  feed_rows(c, knorm_rows(), 1);
  const HeadRows r = c.stored(0, 0);
  ASSERT_NE(r.packed, nullptr);
  // fp16 rows are read back exactly.
  EXPECT_EQ(r.key(2, 0), 0.5f);
  EXPECT_EQ(r.value(1, 3), 2.0f);
  // Row 3 (token 3). Key (4, 0, 0, 0): zero 0, scale 4/3 rounded up to fp16 = 1366/1024 =
  // 1.333984375; 4 -> code floor(2.9985 + 0.5) = 3 -> 4.001953125.
  const float k3[4] = {4.001953125f, 0.0f, 0.0f, 0.0f};
  // Value (0, 0.25, 0.5, 1): zero 0, scale 1/3 rounded up to fp16 = 1366/4096 = 0.33349609375;
  // codes 0, floor(0.7496 + 0.5) = 1, floor(1.4993 + 0.5) = 1, floor(2.9985 + 0.5) = 3.
  const float v3[4] = {0.0f, 0.33349609375f, 0.33349609375f, 1.00048828125f};
  // Row 4 (token 4). Key (3, 0, 0, 0): scale 1, exact. Value (-1, 0, 1, 2): zero -1, scale 1.
  const float k4[4] = {3.0f, 0.0f, 0.0f, 0.0f};
  const float v4[4] = {-1.0f, 0.0f, 1.0f, 2.0f};
  for (std::int64_t d = 0; d < 4; ++d) {
    EXPECT_EQ(r.key(3, d), k3[d]) << d;
    EXPECT_EQ(r.value(3, d), v3[d]) << d;
    EXPECT_EQ(r.key(4, d), k4[d]) << d;
    EXPECT_EQ(r.value(4, d), v4[d]) << d;
  }
  float row[4];
  r.packed->load_value(3, row);
  for (std::int64_t d = 0; d < 4; ++d) EXPECT_EQ(row[d], v3[d]) << d;
}

// StreamingLLM, budget 4 = 1 sink + a window of 3, tier of 2: tokens 1, 2, 3, 4 leave the
// window in turn (all with the same score, 0), and the tier keeps the newest two (ties go to the
// oldest position for eviction). After 8 tokens: fp16 0, 5, 6, 7; demoted 3, 4; evicted 1, 2.
TEST(Demote, HandDerivedStreamingCase) {
  test::KV kv(1, 1, 8, 4, 5);
  LayerCache c(CacheConfig::parse("streaming_llm:budget=4,n_sink=1,demote=kivi4,demote_budget=2"),
               LayerShape{});
  test::feed(c, kv, 1);
  EXPECT_EQ(positions(c), (std::vector<std::int32_t>{0, 5, 6, 7, 3, 4}));
  EXPECT_EQ(c.stats().evictions, 2);
  EXPECT_EQ(c.stats().demoted_rows, 2);
}

// Each demoted value is within half a quantization step of its fp16 value, the step being the
// group's range / (2^bits - 1) (fp16 rounding of the scale and zero widens it by at most 2^-10
// relative, and the step is at least 2^-14).
TEST(Demote, DemotedValuesWithinHalfAStep) {
  constexpr std::int64_t D = 16, G = 8;
  for (const char* mode : {"kivi2", "kivi4"}) {
    const double levels = std::string(mode) == "kivi2" ? 3.0 : 15.0;
    test::KV kv(1, 2, 200, D, 21);
    LayerCache c(CacheConfig::parse(
                     std::string("h2o:budget=32,demote_budget=64,demote_group=8,demote=") + mode),
                 LayerShape{});
    test::feed(c, kv, 7);
    const std::int64_t n_demoted = c.stats().demoted_rows / 2;
    ASSERT_EQ(n_demoted, 64);
    for (std::int64_t h = 0; h < 2; ++h) {
      const HeadRows r = c.stored(0, h);
      for (std::int64_t i = r.n_rows - n_demoted; i < r.n_rows; ++i) {
        const std::int64_t t = r.positions[i];
        for (int kind = 0; kind < 2; ++kind) {
          const std::vector<float>& src = kind == 0 ? kv.k : kv.v;
          float orig[D];
          for (std::int64_t d = 0; d < D; ++d) {
            orig[d] =
                half_to_float(float_to_half(src[static_cast<std::size_t>((h * 200 + t) * D + d)]));
          }
          for (std::int64_t g = 0; g < D / G; ++g) {
            const float lo = *std::min_element(orig + g * G, orig + (g + 1) * G);
            const float hi = *std::max_element(orig + g * G, orig + (g + 1) * G);
            const double step = std::max(
                (hi - lo + std::abs(lo) / 1024.0) / levels * (1.0 + 1.0 / 1024.0), 1.0 / 16384.0);
            for (std::int64_t d = g * G; d < (g + 1) * G; ++d) {
              const float got = kind == 0 ? r.key(i, d) : r.value(i, d);
              EXPECT_LE(std::abs(got - orig[d]), 0.5 * step + 1e-6)
                  << mode << " head " << h << " row " << i << " channel " << d;
            }
          }
        }
      }
    }
  }
}

// 512 tokens x 4 heads x head_dim 64, h2o budget 32 + 96 demoted rows: 128 rows held per head,
// and every byte held is below the payload of an fp16 cache holding 128 rows.
TEST(Demote, ResidentBelowFp16AtTheSameRows) {
  test::KV kv(1, 4, 512, 64, 31);
  LayerCache mixed(CacheConfig::parse("h2o:budget=32,demote=kivi2,demote_budget=96"), LayerShape{});
  test::feed(mixed, kv, 1);
  ASSERT_EQ(mixed.tokens_kept(), 128);
  LayerCache full = test::make_cache("full");
  test::feed(full, kv, 1, 0, 128);
  ASSERT_EQ(full.tokens_kept(), 128);
  EXPECT_EQ(full.kept_bytes(), 128 * 64 * 2 * 2 * 4);
  EXPECT_LT(mixed.stats().resident_bytes, full.kept_bytes());
  // Payload: 32 fp16 rows (256 bytes) + 96 rows of 2 x (16 code bytes + 2 groups x 4 bytes).
  EXPECT_EQ(mixed.kept_bytes(), 4 * (32 * 256 + 96 * 48));
}

// True attention (engine-like probabilities over the whole view, demoted rows included), a
// 50-token prefill then chunks of 7 (multi-token steps while demoted rows are held: snapkv
// decides every chunk, the others decide at once or token by token): every attention-scored
// method keeps at most budget + demote_budget rows, its sinks first, distinct positions, and
// two runs are bit-identical.
TEST(Demote, TrueAttentionWithChunksAfterDemotion) {
  constexpr std::int64_t H = 2, Hq = 4, D = 8, S = 100;
  const test::KV kv(1, H, S, D, 41);
  const std::vector<float> q = test::randn(static_cast<std::size_t>(Hq * S * D), 42);
  for (const std::string& id : method_ids()) {
    const CacheConfig probe(id);
    if (!has_token_budget(probe) || !probe.has("source")) continue;
    std::string spec = id + ":source=attention,demote=kivi4,demote_budget=16";
    if (probe.has("merge") && probe.get_enum("merge") != "drop") spec += ",merge=drop";
    const CacheConfig config = with_token_budget(CacheConfig::parse(spec), 40);
    auto run = [&]() {
      LayerCache c(config, LayerShape{H, D, Hq, 0, 1});
      test::feed_attention(c, kv, q, Hq, 50, 0, 50);
      test::feed_attention(c, kv, q, Hq, 7, 50, S);
      return c;
    };
    const LayerCache a = run(), b = run();
    EXPECT_TRUE(test::snapshot(a, 1, H) == test::snapshot(b, 1, H)) << id << ": not deterministic";
    // An all-or-window method (simlayerkv) may keep every row (a busy layer): nothing to demote.
    const bool busy = find_method(id).all_or_window && a.stored(0, 0).n_rows == S;
    if (!busy) {
      EXPECT_GT(a.stats().demoted_rows, 0) << id;
    }
    const std::int64_t n_sink = probe.has("n_sink") ? a.config().get_int("n_sink") : 0;
    for (std::int64_t h = 0; h < H; ++h) {
      const HeadRows r = a.stored(0, h);
      if (busy) {
        EXPECT_EQ(r.n_rows, S) << id;
      } else if (find_method(id).head_types) {  // a retrieval head (1) keeps every row
        if (a.head_types()[static_cast<std::size_t>(h)] != 1) {
          EXPECT_LE(r.n_rows, 40 + 16) << id;
        }
      } else if (!find_method(id).prefill_only) {
        EXPECT_LE(r.n_rows, 40 + 16) << id;
      }
      std::vector<std::int32_t> pos(r.positions, r.positions + r.n_rows);
      for (std::int64_t i = 0; i < n_sink; ++i)
        EXPECT_EQ(pos[static_cast<std::size_t>(i)], i) << id;
      std::sort(pos.begin(), pos.end());
      EXPECT_TRUE(std::adjacent_find(pos.begin(), pos.end()) == pos.end()) << id;
      EXPECT_LT(pos.back(), S) << id;
    }
  }
}

TEST(Demote, Guards) {
  auto message = [](const std::string& spec, ErrorCode code = ErrorCode::kInvalidConfig) {
    try {
      LayerCache c(CacheConfig::parse(spec), LayerShape{});
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << spec;
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("full:demote=kivi2").find("demote=kivi2 needs a method with a token budget"),
            std::string::npos);
  EXPECT_NE(message("h2o:demote=kivi2,quantize=kivi4")
                .find("demote=kivi2 and quantize=kivi4 are exclusive"),
            std::string::npos);
  EXPECT_NE(message("cam:demote=kivi4").find("demote=kivi4 and merge=mean are exclusive"),
            std::string::npos);
  EXPECT_NE(message("h2o:demote_budget=8").find("demote_budget has no effect with demote=none"),
            std::string::npos);
  EXPECT_NE(message("tova:demote_group=8").find("demote_group has no effect with demote=none"),
            std::string::npos);
  EXPECT_EQ(message("cam:demote=kivi4,merge=drop"), "no error");
  // kivi has no token budget and no demote field: the spec names the unknown key.
  EXPECT_NE(message("kivi:demote=kivi2", ErrorCode::kInvalidSpec).find("unknown key 'demote'"),
            std::string::npos);
}

}  // namespace
}  // namespace vq
