// The method family of issue 3: exact reductions, snapkv, the per-layer schedules, KIVI
// storage, key-only scorers and composition (merge / quantize on any eviction method).
#include <gtest/gtest.h>

#include <cmath>

#include "store/store.h"
#include "policies/schedules.h"
#include "reference_policies.h"
#include "test_util.h"

namespace vq {
namespace {

using test::KV;

std::vector<std::int32_t> positions_of(const LayerCache& c, std::int64_t b, std::int64_t h) {
  const HeadRows r = c.stored(b, h);
  return std::vector<std::int32_t>(r.positions, r.positions + r.n_rows);
}

KV peaked(std::int64_t B, std::int64_t H, std::int64_t S, std::int64_t D, std::uint64_t seed) {
  KV kv(B, H, S, D, seed);
  for (auto& x : kv.k) x *= 2.0f;
  return kv;
}

// ---- Exact reductions to h2o (written with the seed library's grace 0, decay 1; the identities
// hold for any grace and decay the two sides share) ----

TEST(Reductions, ChunkKVWithChunkSizeOneIsH2OOnASingleKVHead) {
  for (std::int64_t chunk : {1, 5}) {
    KV kv = peaked(2, 1, 150, 16, 3);
    LayerCache c = test::make_cache("chunkkv:budget=24,chunk_size=1,grace=0,decay=1");
    LayerCache h = test::make_cache("h2o:budget=24,grace=0,decay=1");
    test::feed(c, kv, chunk);
    test::feed(h, kv, chunk);
    EXPECT_TRUE(test::snapshot(c, 2, 1) == test::snapshot(h, 2, 1)) << "chunk " << chunk;
  }
}

TEST(Reductions, PyramidKVWithBetaOneIsH2OInEveryLayer) {
  KV kv = peaked(1, 2, 120, 16, 4);
  ModelCache p(CacheConfig::parse("pyramidkv:budget=24,beta=1,grace=0,decay=1"), ModelShape{4, 2, 16, 0});
  ModelCache h(CacheConfig::parse("h2o:budget=24,grace=0,decay=1"), ModelShape{4, 2, 16, 0});
  EXPECT_EQ(p.layer_budgets(), (std::vector<std::int64_t>{24, 24, 24, 24}));
  for (std::int64_t l = 0; l < 4; ++l) {
    test::feed(p.layer(l), kv, 3);
    test::feed(h.layer(l), kv, 3);
    EXPECT_TRUE(test::snapshot(p.layer(l), 1, 2) == test::snapshot(h.layer(l), 1, 2)) << l;
  }
}

TEST(Reductions, SqueezeWithStrengthZeroIsH2OInEveryLayer) {
  // Driven as an engine does: each token goes through every layer in turn. Nothing is evicted
  // before the 24th token, when every layer reports and the (uniform) budgets are decided.
  ModelCache s(CacheConfig::parse("squeeze:budget=24,strength=0,grace=0,decay=1"), ModelShape{3, 2, 16, 0});
  ModelCache h(CacheConfig::parse("h2o:budget=24,grace=0,decay=1"), ModelShape{3, 2, 16, 0});
  std::vector<KV> data;
  for (std::int64_t l = 0; l < 3; ++l) data.push_back(peaked(1, 2, 150, 16, 10 + static_cast<std::uint64_t>(l)));
  for (std::int64_t t = 0; t < 150; ++t) {
    for (std::int64_t l = 0; l < 3; ++l) {
      test::feed(s.layer(l), data[static_cast<std::size_t>(l)], 1, t, t + 1);
      test::feed(h.layer(l), data[static_cast<std::size_t>(l)], 1, t, t + 1);
    }
  }
  for (std::int64_t l = 0; l < 3; ++l) {
    EXPECT_TRUE(test::snapshot(s.layer(l), 1, 2) == test::snapshot(h.layer(l), 1, 2)) << l;
  }
  EXPECT_EQ(s.layer_budgets(), (std::vector<std::int64_t>{24, 24, 24}));
}

TEST(Reductions, KeyformerWithTauZeroIsH2O) {
  KV kv = peaked(1, 3, 140, 16, 5);
  for (std::int64_t chunk : {1, 7}) {
    LayerCache k = test::make_cache("keyformer:budget=24,recent=0,tau_init=0,tau_end=0");
    LayerCache h = test::make_cache("h2o:budget=24,grace=0,decay=1");
    test::feed(k, kv, chunk);
    test::feed(h, kv, chunk);
    EXPECT_TRUE(test::snapshot(k, 1, 3) == test::snapshot(h, 1, 3));
  }
}

// ---- snapkv ----

TEST(SnapKV, KeepsSinksWindowAndTopScoredRowsInPositionOrder) {
  KV kv = peaked(1, 2, 100, 16, 6);
  LayerCache c = test::make_cache("snapkv:budget=30,obs_window=8,n_sink=2,kernel=3");
  c.update(kv.keys(0, 100), kv.values(0, 100));
  for (std::int64_t h = 0; h < 2; ++h) {
    const auto pos = positions_of(c, 0, h);
    ASSERT_EQ(pos.size(), 30u);
    EXPECT_EQ(pos[0], 0);
    EXPECT_EQ(pos[1], 1);
    for (int i = 0; i < 8; ++i) EXPECT_EQ(pos[22 + i], 92 + i) << "window row";
    EXPECT_TRUE(std::is_sorted(pos.begin(), pos.end()));
  }
  // Decode tokens are appended without eviction.
  KV more = peaked(1, 2, 5, 16, 7);
  for (std::int64_t t = 0; t < 5; ++t) c.update(more.keys(t, 1), more.values(t, 1));
  EXPECT_EQ(c.tokens_kept(), 35);
}

// Reference scores for one head: window mass then pooling, as the doc block specifies.
std::vector<float> snap_pooled(const std::vector<ref::Token>& toks, std::size_t w, std::size_t kernel,
                               bool avg) {
  const std::size_t n = toks.size(), m = n - w;
  std::vector<ref::Row> rows;
  for (std::size_t i = 0; i < n; ++i) rows.push_back({toks[i].k, toks[i].v, static_cast<std::int32_t>(i)});
  std::vector<float> mass(m, 0.0f);
  for (std::size_t r = m; r < n; ++r) {
    const auto a = ref::weights(rows, r + 1, toks[r].k);
    for (std::size_t j = 0; j < m; ++j) mass[j] += a[j];
  }
  std::vector<float> pooled(m);
  const std::size_t half = kernel / 2;
  for (std::size_t j = 0; j < m; ++j) {
    const std::size_t lo = j >= half ? j - half : 0, hi = std::min(m - 1, j + half);
    float acc = avg ? 0.0f : mass[lo];
    for (std::size_t i = lo; i <= hi; ++i) acc = avg ? acc + mass[i] : std::max(acc, mass[i]);
    pooled[j] = avg ? acc / static_cast<float>(kernel) : acc;
  }
  return pooled;
}

TEST(SnapKV, PoolingHandCase) {
  // D = 1, fp32: 8 tokens, window 2, no sinks, keep 2 of the 6 candidates. Token 2 has a key
  // the window keys align with; pooling (kernel 3) spreads its mass to tokens 1 and 3.
  std::vector<float> k = {0.1f, 0.0f, 3.0f, 0.0f, -0.5f, 0.2f, 1.0f, 1.0f};
  std::vector<float> v(8, 0.0f);
  std::vector<ref::Token> toks;
  for (float x : k) toks.push_back({{x}, {0.0f}});
  for (const char* pool : {"max", "avg"}) {
    const bool avg = std::string(pool) == "avg";
    const auto pooled = snap_pooled(toks, 2, 3, avg);
    // Expected kept candidates: the two highest pooled scores, ties to the lowest index.
    std::vector<std::size_t> order = {0, 1, 2, 3, 4, 5};
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return pooled[a] > pooled[b]; });
    std::vector<std::int32_t> want = {static_cast<std::int32_t>(std::min(order[0], order[1])),
                                      static_cast<std::int32_t>(std::max(order[0], order[1])), 6, 7};
    LayerCache c = test::make_cache(std::string("snapkv:budget=4,obs_window=2,n_sink=0,kernel=3,kv_dtype=f32,pool=") + pool);
    c.update(TensorRef::f32(k.data(), 1, 1, 8, 1), TensorRef::f32(v.data(), 1, 1, 8, 1));
    EXPECT_EQ(positions_of(c, 0, 0), want) << pool;
  }
  // With max pooling token 2's neighbours inherit its mass: 1, 2 or 3 must be kept twice.
  const auto pooled_max = snap_pooled(toks, 2, 3, false);
  EXPECT_EQ(pooled_max[1], pooled_max[2]);
  EXPECT_EQ(pooled_max[3], pooled_max[2]);
}

// ---- per-layer schedules ----

TEST(PyramidKV, BudgetsDecreaseWithDepthAndAverageToTheRequest) {
  ModelCache m(CacheConfig::parse("pyramidkv:budget=128,beta=8,grace=0"), ModelShape{5, 2, 16, 0});
  const auto b = m.layer_budgets();
  ASSERT_EQ(b.size(), 5u);
  for (std::size_t l = 1; l < b.size(); ++l) EXPECT_LT(b[l], b[l - 1]);
  EXPECT_EQ(m.mean_budget(), 128.0);
  // max = 2 * 128 - 128 / 8 = 240, min = 128 / 8 = 16, a step of 56 per layer.
  EXPECT_EQ(b, (std::vector<std::int64_t>{240, 184, 128, 72, 16}));
  // Rounding: C = 64, beta 20, floor 5: the line 124.8, 94.4, 64, 33.6, 3.2 rounds down to
  // 124, 94, 64, 33, 3 (318); the 2 missing rows go to the largest fractions (.8 layer 0, .6
  // layer 3): 125, 94, 64, 34, 3; layer 4 is raised to the floor 5 (+2) and the 2 rows come off
  // the largest budget: 123, 94, 64, 34, 5 = 320 = 5 * 64.
  EXPECT_EQ(detail::pyramid_budgets(64, 5, 20.0, 0, 5),
            (std::vector<std::int64_t>{123, 94, 64, 34, 5}));
  // Floors bind hard: C = 16, floor 9: the line 31.2, 23.6, 16, 8.4, 0.8 -> 31, 24, 16, 8, 1
  // after rounding; layers 3 and 4 are raised to 9 (+9 rows), taken one at a time from the
  // largest budget (ties to the higher layer): 31 -> 24 (7 rows), then layer 1 and layer 0
  // give one each.
  const auto tight = detail::pyramid_budgets(16, 5, 20.0, 0, 9);
  EXPECT_EQ(tight, (std::vector<std::int64_t>{23, 23, 16, 9, 9}));
  EXPECT_EQ(detail::mean_of(tight), 16.0);
  // Impossible floors are a validation error (the floor is n_sink + grace + 1).
  test::expect_error([] { CacheConfig::parse("pyramidkv:budget=8,n_sink=4,grace=4"); },
                     ErrorCode::kInvalidConfig, {"pyramid_n_sink + pyramid_grace must be < pyramid_budget"});
  // Each layer holds its own budget.
  for (std::int64_t l = 0; l < 5; ++l) {
    KV kv(1, 2, 260, 16, 30);
    test::feed(m.layer(l), kv, 20);
    EXPECT_EQ(m.layer(l).tokens_kept(), b[static_cast<std::size_t>(l)]);
  }
}

TEST(Squeeze, KMeansAndBudgetAllocation) {
  EXPECT_EQ(detail::kmeans_1d({0.1, 0.11, 0.5, 0.52, 0.9}), (std::vector<int>{0, 0, 1, 1, 2}));
  EXPECT_EQ(detail::kmeans_1d({3, 3, 3}), (std::vector<int>{0, 0, 0}));
  const auto b = detail::squeeze_budgets({0.1, 0.11, 0.5, 0.52, 0.9}, 100, 1.0, 0.3, 5);
  EXPECT_EQ(b[0], 30);
  EXPECT_EQ(b[1], 30);
  EXPECT_EQ(b[2] + b[3] + b[4], 500 - 60);
  EXPECT_LE(std::max({b[2], b[3], b[4]}) - std::min({b[2], b[3], b[4]}), 1);
  const auto half = detail::squeeze_budgets({0.1, 0.11, 0.5, 0.52, 0.9}, 100, 0.5, 0.3, 5);
  EXPECT_EQ(half[0], 65);
  EXPECT_EQ(detail::squeeze_budgets({0.1, 0.11, 0.5}, 100, 0.0, 0.3, 5),
            (std::vector<std::int64_t>{100, 100, 100}));
}

TEST(Squeeze, LayersGetDifferentBudgetsOnceEveryLayerHasReported) {
  ModelCache m(CacheConfig::parse("squeeze:budget=32,grace=4,decay=0.98"), ModelShape{4, 2, 16, 0});
  // Layer l's keys are scaled by (l + 1): peakier attention, lower entropy, less important.
  std::vector<KV> data;
  for (int l = 0; l < 4; ++l) {
    KV kv(1, 2, 200, 16, 40);
    for (auto& x : kv.k) x *= 0.3f * static_cast<float>(l + 1);
    data.push_back(kv);
  }
  for (std::int64_t t = 0; t < 200; ++t) {
    for (std::int64_t l = 0; l < 4; ++l) test::feed(m.layer(l), data[static_cast<std::size_t>(l)], 1, t, t + 1);
  }
  const auto b = m.layer_budgets();
  EXPECT_EQ(b[0] + b[1] + b[2] + b[3], 4 * 32);
  EXPECT_LT(b[3], 32) << "the peakiest layer should be cut";
  EXPECT_GT(b[0], 32);
  for (std::int64_t l = 0; l < 4; ++l) EXPECT_EQ(m.layer(l).tokens_kept(), b[static_cast<std::size_t>(l)]);
  // reset() forgets the decision.
  m.reset();
  EXPECT_EQ(m.layer_budgets(), (std::vector<std::int64_t>{32, 32, 32, 32}));
}

// ---- KIVI ----

struct Quantized {
  std::vector<float> k, v;  // stored (dequantized) rows [S][D] of head 0
};

Quantized stored(const LayerCache& c, std::int64_t D) {
  const HeadRows r = c.stored(0, 0);
  Quantized q;
  for (std::int64_t i = 0; i < r.n_rows; ++i) {
    for (std::int64_t d = 0; d < D; ++d) {
      q.k.push_back(r.key(i, d));
      q.v.push_back(r.value(i, d));
    }
  }
  return q;
}

TEST(Kivi, RoundTripWithinHalfAStepPerGroup) {
  const std::int64_t S = 200, D = 64, G = 32;
  KV kv(1, 1, S, D, 50);
  for (int bits : {2, 4}) {
    LayerCache c = test::make_cache("kivi:bit_width_inlier=" + std::to_string(bits) +
                                    ",kivi_group_size=32,residual_length=40,kv_dtype=f32");
    test::feed(c, kv, 1);
    const Quantized q = stored(c, D);
    const float levels = static_cast<float>((1 << bits) - 1);
    // Quantized rows: the oldest multiple of G leaving at least residual_length rows.
    const std::int64_t n_quant = ((S - 40) / G) * G;
    EXPECT_EQ(n_quant, 160);
    for (std::int64_t g = 0; g < n_quant / G; ++g) {
      for (std::int64_t d = 0; d < D; ++d) {  // keys: per channel over G tokens
        float lo = INFINITY, hi = -INFINITY;
        for (std::int64_t t = g * G; t < (g + 1) * G; ++t) {
          lo = std::min(lo, kv.k[t * D + d]);
          hi = std::max(hi, kv.k[t * D + d]);
        }
        // fp16 parameters: zero rounded down (by at most |lo| * 2^-10) and the step rounded up
        // (by at most a factor 1 + 2^-10).
        const float step = (hi - lo + std::fabs(lo) / 1024) / levels * (1 + 1.0f / 1024);
        for (std::int64_t t = g * G; t < (g + 1) * G; ++t) {
          ASSERT_LE(std::fabs(q.k[t * D + d] - kv.k[t * D + d]), step / 2 * (1 + 1e-5f) + 1e-6f);
        }
      }
    }
    for (std::int64_t t = 0; t < n_quant; ++t) {  // values: per token over G channels
      for (std::int64_t g = 0; g < D / G; ++g) {
        float lo = INFINITY, hi = -INFINITY;
        for (std::int64_t d = g * G; d < (g + 1) * G; ++d) {
          lo = std::min(lo, kv.v[t * D + d]);
          hi = std::max(hi, kv.v[t * D + d]);
        }
        const float step = (hi - lo + std::fabs(lo) / 1024) / levels * (1 + 1.0f / 1024);
        for (std::int64_t d = g * G; d < (g + 1) * G; ++d) {
          ASSERT_LE(std::fabs(q.v[t * D + d] - kv.v[t * D + d]), step / 2 * (1 + 1e-5f) + 1e-6f);
        }
      }
    }
    // The residual rows are exact (fp32 tail here).
    for (std::int64_t i = n_quant * D; i < S * D; ++i) ASSERT_EQ(q.k[i], kv.k[i]);
  }
}

double mean_abs_error(const std::string& spec, const KV& kv) {
  LayerCache c = test::make_cache(spec);
  test::feed(c, kv, 16);
  const Quantized q = stored(c, kv.D);
  double e = 0;
  for (std::size_t i = 0; i < q.k.size(); ++i) e += std::fabs(q.k[i] - kv.k[i]) + std::fabs(q.v[i] - kv.v[i]);
  return e / static_cast<double>(q.k.size());
}

TEST(Kivi, FourBitsBeatTwoAndTheTailIsBitExact) {
  KV kv(1, 1, 256, 64, 51);
  const double e2 = mean_abs_error("kivi:bit_width_inlier=2,residual_length=32", kv);
  const double e4 = mean_abs_error("kivi:bit_width_inlier=4,residual_length=32", kv);
  EXPECT_LT(e4, e2 / 3);
  // fp16 tail: the newest rows equal a plain fp16 cache's rows bit for bit.
  LayerCache q = test::make_cache("kivi:residual_length=32"), f = test::make_cache("full");
  test::feed(q, kv, 16);
  test::feed(f, kv, 16);
  const HeadRows a = q.stored(0, 0), b = f.stored(0, 0);
  for (std::int64_t i = 256 - 32; i < 256; ++i) {
    for (std::int64_t d = 0; d < 64; ++d) {
      ASSERT_EQ(a.key(i, d), b.key(i, d));
      ASSERT_EQ(a.value(i, d), b.value(i, d));
    }
  }
}

// Bytes held by a KIVI head, from the layout: codes, fp16 scale + zero, fp16 tail.
std::int64_t kivi_bytes(std::int64_t n_quant, std::int64_t n_tail, std::int64_t D, std::int64_t G,
                        int bits) {
  const std::int64_t row_bytes = (D * bits + 7) / 8, n_groups = n_quant / G, n_vgroups = (D + G - 1) / G;
  return 2 * n_quant * row_bytes + n_groups * D * 4 + n_quant * n_vgroups * 4 + n_tail * D * 2 * 2;
}

TEST(Kivi, KeptBytesAreTheBytesHeldAndApproachTheTheoreticalRatio) {
  const std::int64_t S = 4096, D = 64;
  KV kv(1, 2, S, D, 52);
  for (int bits : {2, 4}) {
    LayerCache c = test::make_cache("kivi:bit_width_inlier=" + std::to_string(bits));
    test::feed(c, kv, 64);
    const std::int64_t n_quant = ((S - 128) / 32) * 32, n_tail = S - n_quant;
    const CacheStats s = c.stats();
    EXPECT_EQ(s.kept_bytes, 2 * kivi_bytes(n_quant, n_tail, D, 32, bits)) << bits;
    EXPECT_GE(s.allocated_bytes, s.kept_bytes);
    EXPECT_GE(s.resident_bytes, s.allocated_bytes);
    // Per token: 2 * D * bits / 8 code bytes + D * 4 / G key params + (D / G) * 4 value params.
    const double per_token = 2.0 * D * bits / 8 + D * 4.0 / 32 + (D / 32) * 4.0;
    const double theoretical = (4.0 * D) / per_token;  // fp16 K + V = 4 D bytes
    // The 128-row fp16 tail (256 bytes a row against 48 or 80 quantized) costs 10-15%.
    EXPECT_GT(s.compression_ratio, 0.85 * theoretical) << bits;
    EXPECT_LT(s.compression_ratio, theoretical) << bits;
  }
}

TEST(Kivi, RejectsOtherBitWidths) {
  test::expect_error([] { CacheConfig::parse("kivi:bit_width_inlier=3"); }, ErrorCode::kInvalidConfig,
                     {"bit_width_inlier must be 2 or 4, got 3"});
}

// ---- composition ----

TEST(Composition, MergingOnTovaAndStreamingHoldsTheBudgetAndChangesTheState) {
  KV kv = peaked(1, 2, 160, 16, 60);
  for (const char* base : {"tova:budget=32", "streaming_llm:n_sink=4,window_size=28"}) {
    LayerCache drop = test::make_cache(base);
    LayerCache merge = test::make_cache(std::string(base) + ",merge=sim_weighted");
    test::feed(drop, kv, 1);
    test::feed(merge, kv, 1);
    EXPECT_EQ(merge.tokens_kept(), 32) << base;
    EXPECT_GT(merge.stats().merges, 0) << base << ": the gate blocked every merge";
    EXPECT_LT(merge.stats().merges, merge.stats().evictions) << base << ": the gate let every merge through";
    EXPECT_FALSE(test::snapshot(drop, 1, 2) == test::snapshot(merge, 1, 2)) << base;
  }
}

TEST(Composition, QuantizedH2OHoldsTheBudgetWithFarFewerBytes) {
  // Budget 256 with a 32..63-row fp16 tail: about 200 rows at 40 bytes (codes + fp16 params)
  // instead of 256, plus the tail: under half of plain h2o's bytes.
  KV kv = peaked(1, 2, 500, 64, 61);
  const std::string spec = "h2o:budget=256,quantize=kivi2,residual_length=32,kivi_group_size=32";
  LayerCache plain = test::make_cache("h2o:budget=256");
  LayerCache quant = test::make_cache(spec);
  test::feed(plain, kv, 1);
  test::feed(quant, kv, 1);
  EXPECT_EQ(quant.tokens_kept(), 256);
  EXPECT_LT(static_cast<double>(quant.kept_bytes()), 0.5 * static_cast<double>(plain.kept_bytes()));
  // Chunked feeding makes the same decisions: quantization happens token by token.
  LayerCache chunked = test::make_cache(spec);
  test::feed(chunked, kv, 37);
  EXPECT_TRUE(test::snapshot(quant, 1, 2) == test::snapshot(chunked, 1, 2));
}

TEST(KiviStore, EvictionDoesNotLeaveSparseKeyGroups) {
  // D = 4, G = 4, no residual, fp32 tail: 16 rows become 4 key groups of 4. Keeping one row
  // of each group must leave one group (4 rows), not 4 groups of one row each paying D
  // scales and zeros.
  auto store = detail::make_kivi_store(2, 4, 0, DType::kF32, 4);
  std::vector<float> k = test::randn(16 * 4, 90), v = test::randn(16 * 4, 91);
  store->append(TensorRef::f32(k.data(), 1, 1, 16, 4), TensorRef::f32(v.data(), 1, 1, 16, 4), 0, 0, 0);
  std::vector<std::int64_t> all(16);
  for (std::int64_t i = 0; i < 16; ++i) all[static_cast<std::size_t>(i)] = i;
  store->settle(all.data(), 16);
  store->keep(all.data(), 16);
  // codes 1 byte a row for K and V; value params 4 bytes a row; key params 4 groups x 4 x 4.
  EXPECT_EQ(store->bytes(), 16 * 2 + 16 * 4 + 4 * 16);
  const std::vector<std::int64_t> one_each = {0, 4, 8, 12};
  store->settle(one_each.data(), 4);
  store->keep(one_each.data(), 4);
  EXPECT_EQ(store->bytes(), 4 * 2 + 4 * 4 + 1 * 16);
  // The re-quantized keys stay close to the originals (within a step of the merged range).
  float lo = INFINITY, hi = -INFINITY;
  for (std::int64_t r : one_each) {
    for (int d = 0; d < 4; ++d) lo = std::min(lo, k[r * 4 + d]), hi = std::max(hi, k[r * 4 + d]);
  }
  std::vector<float> row(4);
  for (std::int64_t i = 0; i < 4; ++i) {
    store->read_key(i, row.data());
    for (int d = 0; d < 4; ++d) EXPECT_NEAR(row[d], k[one_each[i] * 4 + d], (hi - lo) / 3 * 1.01f);
  }
}

TEST(Composition, MergingIntoQuantizedRowsStaysWithinTheBudget) {
  KV kv = peaked(1, 2, 200, 32, 62);
  LayerCache c = test::make_cache(
      "h2o:budget=64,grace=8,merge=sim_weighted,merge_gate=false,merge_keys=true,quantize=kivi4,"
      "residual_length=16,kivi_group_size=16");
  test::feed(c, kv, 5);
  EXPECT_EQ(c.tokens_kept(), 64);
  EXPECT_EQ(c.stats().merges, c.stats().evictions);
}

// ---- keyformer, knorm, keydiff, chunkkv ----

TEST(Keyformer, NoiseChangesDecisionsDeterministicallyPerSeed) {
  KV kv = peaked(1, 2, 150, 16, 70);
  auto run = [&](const std::string& spec) {
    LayerCache c = test::make_cache(spec);
    test::feed(c, kv, 1);
    return test::snapshot(c, 1, 2);
  };
  const auto h2o = run("h2o:budget=32,grace=0,decay=1");
  const auto k1 = run("keyformer:budget=32,recent=4,tau_init=1,tau_end=2,anneal_steps=100,seed=1");
  EXPECT_TRUE(k1 == run("keyformer:budget=32,recent=4,tau_init=1,tau_end=2,anneal_steps=100,seed=1"));
  EXPECT_FALSE(k1 == run("keyformer:budget=32,recent=4,tau_init=1,tau_end=2,anneal_steps=100,seed=2"));
  EXPECT_FALSE(k1 == h2o);
}

TEST(KeyScorers, KNormEvictsTheLargestKeyAndKeyDiffTheMostTypical) {
  // D = 2, fp32, budget 3, no sinks, no grace: four keys.
  std::vector<float> k = {1, 0, 0, 3, 0.5f, 0.5f, 0.9f, 0.1f}, v(8, 0.0f);
  LayerCache n = test::make_cache("knorm:budget=3,n_sink=0,grace=0,kv_dtype=f32");
  n.update(TensorRef::f32(k.data(), 1, 1, 4, 2), TensorRef::f32(v.data(), 1, 1, 4, 2));
  EXPECT_EQ(positions_of(n, 0, 0), (std::vector<std::int32_t>{0, 2, 3}));  // |(0,3)| = 3 leaves
  // keydiff: normalised keys (1,0), (0,1), (.71,.71), (.99,.11); their mean points at about
  // (0.67, 0.45); the closest key in direction is (0.5, 0.5).
  LayerCache d = test::make_cache("keydiff:budget=3,n_sink=0,grace=0,kv_dtype=f32");
  d.update(TensorRef::f32(k.data(), 1, 1, 4, 2), TensorRef::f32(v.data(), 1, 1, 4, 2));
  EXPECT_EQ(positions_of(d, 0, 0), (std::vector<std::int32_t>{0, 1, 3}));
}

TEST(ChunkKV, EvictsWholeChunksSharedByEveryHead) {
  KV kv = peaked(1, 3, 200, 16, 80);
  for (const char* score : {"attn_mass", "key_norm"}) {
    LayerCache c = test::make_cache(std::string("chunkkv:budget=40,chunk_size=4,grace=4,score=") + score);
    test::feed(c, kv, 1);
    const auto p0 = positions_of(c, 0, 0);
    for (std::int64_t h = 1; h < 3; ++h) EXPECT_EQ(positions_of(c, 0, h), p0) << score;
    EXPECT_LE(c.tokens_kept(), 40);
    EXPECT_GE(c.tokens_kept(), 37);
    EXPECT_EQ(c.stats().evictions % 4, 0) << "rows leave four at a time (per head)";
  }
}

TEST(FamilyGuards, RaiseNamingTheField) {
  test::expect_error([] { CacheConfig::parse("snapkv:budget=64,kernel=4"); }, ErrorCode::kInvalidConfig,
                     {"snap_kernel must be odd"});
  test::expect_error([] { CacheConfig::parse("snapkv:budget=36"); }, ErrorCode::kInvalidConfig,
                     {"snap_n_sink + snap_obs_window must be < snap_budget (36)"});
  test::expect_error([] { CacheConfig::parse("chunkkv:budget=16,chunk_size=8,grace=8"); },
                     ErrorCode::kInvalidConfig, {"chunkkv_n_sink + chunkkv_grace + chunkkv_chunk_size"});
  test::expect_error([] { CacheConfig::parse("pyramidkv:beta=0.5"); }, ErrorCode::kInvalidConfig,
                     {"pyramid_beta must be in [1, 1000000], got 0.5"});
  test::expect_error([] { CacheConfig::parse("squeeze:strength=2"); }, ErrorCode::kInvalidConfig,
                     {"squeeze_strength must be in [0, 1], got 2"});
  test::expect_error([] { CacheConfig::parse("keyformer:budget=10,recent=6"); }, ErrorCode::kInvalidConfig,
                     {"keyformer_n_sink + keyformer_recent must be < keyformer_budget (10)"});
  test::expect_error([] { CacheConfig::parse("knorm:budget=20"); }, ErrorCode::kInvalidConfig,
                     {"knorm_n_sink + knorm_grace must be < knorm_budget (20)"});
  test::expect_error([] { CacheConfig::parse("h2o:quantize=kivi3"); }, ErrorCode::kInvalidSpec,
                     {"quantize", "{none, kivi2, kivi4}"});
}

}  // namespace
}  // namespace vq
