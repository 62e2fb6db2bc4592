// The LayerCache contract: deferred eviction, positions, shapes, dtypes, step protocol, bytes.
#include <gtest/gtest.h>

#include <limits>

#include <set>

#include "base/kernels.h"
#include "test_util.h"

namespace vq {
namespace {

using test::expect_error;
using test::KV;

TEST(Cache, UpdateReturnsKeptRowsFollowedByNewRowsExactly) {
  KV kv(1, 2, 80, 8, 1);
  LayerCache c = test::make_cache("h2o:budget=16,n_sink=2,grace=4", 2, 8);
  test::feed(c, kv, 1, 0, 40);
  for (std::int64_t chunk : {1, 5}) {
    const test::Snapshot before = test::snapshot(c, 1, 2);
    const std::int64_t t0 = c.tokens_seen();
    const KVRows rows = c.update(kv.keys(t0, chunk), kv.values(t0, chunk));
    ASSERT_EQ(rows.n_rows, 16 + chunk);
    for (std::int64_t h = 0; h < 2; ++h) {
      const std::int64_t kept = 16;
      for (std::int64_t r = 0; r < kept; ++r) {
        for (std::int64_t d = 0; d < 8; ++d) {
          ASSERT_EQ(rows.key(0, h, r)[d], before.keys[h][r * 8 + d]);
          ASSERT_EQ(rows.value(0, h, r)[d], before.values[h][r * 8 + d]);
        }
        ASSERT_EQ(rows.position(0, h, r), before.positions[h][r]);
      }
      for (std::int64_t s = 0; s < chunk; ++s) {
        for (std::int64_t d = 0; d < 8; ++d) {
          // New rows come back as stored: fp16-rounded inputs.
          const float k = kv.k[(h * 80 + t0 + s) * 8 + d];
          ASSERT_EQ(rows.key(0, h, kept + s)[d], half_to_float(float_to_half(k)));
        }
        ASSERT_EQ(rows.position(0, h, kept + s), t0 + s);
      }
    }
    EXPECT_EQ(c.tokens_kept(), 16);  // cut only after the call
  }
}

TEST(Cache, PositionsAreTrueUniqueAndInRange) {
  for (const auto& id : method_ids()) {
    CacheConfig config(id);
    if (has_token_budget(config)) config = with_token_budget(config, 48);
    LayerCache c(config, LayerShape{3, 8, 0, 0, 1});
    test::give_key_filters(c, 3, 8);
    KV kv(2, 3, 100, 8, 11);
    test::feed(c, kv, 7);
    for (std::int64_t b = 0; b < 2; ++b) {
      for (std::int64_t h = 0; h < 3; ++h) {
        const HeadRows r = c.stored(b, h);
        std::set<std::int32_t> seen;
        for (std::int64_t i = 0; i < r.n_rows; ++i) {
          EXPECT_GE(r.positions[i], 0) << id;
          EXPECT_LT(r.positions[i], c.tokens_seen()) << id;
          EXPECT_TRUE(seen.insert(r.positions[i]).second) << id << " duplicate position";
        }
      }
    }
  }
}

TEST(Cache, ZeroTokenUpdateIsANoOp) {
  KV kv(1, 2, 30, 8, 2);
  LayerCache c = test::make_cache("h2o:budget=16,n_sink=2,grace=4");
  // Before any data: an empty update does nothing and fixes nothing.
  KVRows empty = c.update(kv.keys(0, 0), kv.values(0, 0));
  EXPECT_EQ(empty.n_rows, 0);
  EXPECT_EQ(c.tokens_seen(), 0);
  test::feed(c, kv, 3);
  const test::Snapshot before = test::snapshot(c, 1, 2);
  const CacheStats s0 = c.stats();
  const KVRows rows = c.update(kv.keys(0, 0), kv.values(0, 0));
  EXPECT_EQ(rows.n_rows, 16);
  EXPECT_TRUE(test::snapshot(c, 1, 2) == before);
  EXPECT_EQ(c.stats().tokens_seen, s0.tokens_seen);
  EXPECT_EQ(c.stats().kept_bytes, s0.kept_bytes);
}

TEST(Cache, ShapeChangeRaisesAndLeavesStateUntouched) {
  KV kv(2, 3, 20, 8, 3);
  LayerCache c = test::make_cache("h2o:budget=12,n_sink=2,grace=2");
  test::feed(c, kv, 4);
  const test::Snapshot before = test::snapshot(c, 2, 3);
  const std::int64_t seen = c.tokens_seen();
  KV other_b(1, 3, 4, 8, 4), other_h(2, 2, 4, 8, 5), other_d(2, 3, 4, 16, 6);
  expect_error([&] { c.update(other_b.keys(0, 4), other_b.values(0, 4)); },
               ErrorCode::kShapeMismatch, {"batch 1", "holds 2"});
  expect_error([&] { c.update(other_h.keys(0, 4), other_h.values(0, 4)); },
               ErrorCode::kShapeMismatch, {"n_kv_heads 2", "holds 3"});
  expect_error([&] { c.update(other_d.keys(0, 4), other_d.values(0, 4)); },
               ErrorCode::kShapeMismatch, {"head_dim 16", "holds 8"});
  EXPECT_TRUE(test::snapshot(c, 2, 3) == before);
  EXPECT_EQ(c.tokens_seen(), seen);
  EXPECT_FALSE(c.step_open());
  // Still usable afterwards.
  EXPECT_NO_THROW(c.update(kv.keys(4, 2), kv.values(4, 2)));
}

TEST(Cache, ShapeGivenAtConstructionIsEnforced) {
  KV kv(1, 3, 4, 8, 3);
  LayerCache c = test::make_cache("full", 4, 8);
  expect_error([&] { c.update(kv.keys(0, 4), kv.values(0, 4)); }, ErrorCode::kShapeMismatch,
               {"n_kv_heads 3", "holds 4"});
  LayerCache d = test::make_cache("full", 3, 16);
  expect_error([&] { d.update(kv.keys(0, 4), kv.values(0, 4)); }, ErrorCode::kShapeMismatch,
               {"head_dim 8", "holds 16"});
}

TEST(Cache, BadTensorsAreRejected) {
  KV kv(1, 2, 4, 8, 3);
  LayerCache c = test::make_cache("full");
  TensorRef k = kv.keys(0, 4), v = kv.values(0, 3);
  expect_error([&] { c.update(k, v); }, ErrorCode::kShapeMismatch, {"same shape"});
  TensorRef strided = kv.keys(0, 4);
  strided.stride[3] = 2;
  expect_error([&] { c.update(strided, strided); }, ErrorCode::kShapeMismatch,
               {"contiguous along head_dim"});
  TensorRef null_k = kv.keys(0, 4);
  null_k.data = nullptr;
  expect_error([&] { c.update(null_k, kv.values(0, 4)); }, ErrorCode::kShapeMismatch,
               {"no data pointer"});
  TensorRef neg = kv.keys(0, 4);
  neg.shape[2] = -1;
  expect_error([&] { c.update(neg, neg); }, ErrorCode::kShapeMismatch, {"negative"});
}

TEST(Cache, StepProtocolErrors) {
  KV kv(1, 2, 4, 8, 3);
  LayerCache c = test::make_cache("full");
  expect_error([&] { c.end_step(); }, ErrorCode::kInvalidState, {"without an open step"});
  c.begin_step(kv.keys(0, 2), kv.values(0, 2));
  expect_error([&] { c.begin_step(kv.keys(2, 1), kv.values(2, 1)); }, ErrorCode::kInvalidState,
               {"step is open"});
  c.end_step();
  EXPECT_EQ(c.tokens_seen(), 2);
}

TEST(Cache, AttentionInputShapeIsChecked) {
  KV kv(1, 2, 6, 8, 3);
  // source=proxy: the first step (update) passes no probabilities and the later one does,
  // which source=auto would reject as a switch (tests/test_defaults.cpp).
  LayerCache c(CacheConfig::parse("h2o:budget=8,n_sink=1,grace=1,source=proxy"),
               LayerShape{2, 8, 4, 0, 1});
  c.update(kv.keys(0, 3), kv.values(0, 3));
  const StepView view = c.begin_step(kv.keys(3, 2), kv.values(3, 2));
  EXPECT_EQ(view.n_rows(), 5);
  EXPECT_EQ(view.n_new(), 2);
  std::vector<float> probs(1 * 4 * 2 * 5, 0.2f);
  AttentionRef bad{probs.data(), 1, 2, 2, 5};  // Hq is 4
  expect_error([&] { c.end_step(&bad); }, ErrorCode::kShapeMismatch,
               {"[B, Hq, S, R] = [1, 4, 2, 5]", "got [1, 2, 2, 5]"});
  EXPECT_TRUE(c.step_open());
  AttentionRef good{probs.data(), 1, 4, 2, 5};
  EXPECT_NO_THROW(c.end_step(&good));
}

TEST(Cache, Fp16AndFp32InputsAndStorage) {
  KV kv(1, 2, 10, 8, 9);
  std::vector<std::uint16_t> kh(kv.k.size()), vh(kv.v.size());
  kernels::f32_to_f16(kv.k.data(), kh.data(), static_cast<std::int64_t>(kh.size()));
  kernels::f32_to_f16(kv.v.data(), vh.data(), static_cast<std::int64_t>(vh.size()));
  // fp16 input into fp16 storage == fp32 input into fp16 storage (rounded the same way).
  LayerCache a = test::make_cache("full"), b = test::make_cache("full");
  a.update(kv.keys(0, 10), kv.values(0, 10));
  b.update(TensorRef::f16(kh.data(), 1, 2, 10, 8), TensorRef::f16(vh.data(), 1, 2, 10, 8));
  EXPECT_TRUE(test::snapshot(a, 1, 2) == test::snapshot(b, 1, 2));
  // fp32 storage keeps fp32 inputs exactly.
  LayerCache f = test::make_cache("full:kv_dtype=f32");
  f.update(kv.keys(0, 10), kv.values(0, 10));
  const HeadRows r = f.stored(0, 1);
  EXPECT_EQ(r.dtype, DType::kF32);
  for (std::int64_t i = 0; i < 10; ++i) {
    for (std::int64_t d = 0; d < 8; ++d) EXPECT_EQ(r.key(i, d), kv.k[(10 + i) * 8 + d]);
  }
  EXPECT_EQ(f.kept_bytes(), 2 * 10 * 8 * 2 * 4);
  EXPECT_EQ(f.full_bytes(), 2 * 10 * 8 * 2 * 2);
  EXPECT_DOUBLE_EQ(f.compression_ratio(), 0.5);
}

TEST(Cache, StridedInputEqualsContiguousInput) {
  // Engine layout [S][H][D] handed over without a copy.
  const std::int64_t H = 3, S = 12, D = 8;
  KV kv(1, H, S, D, 21);
  std::vector<float> k_shd(static_cast<std::size_t>(S * H * D)), v_shd(k_shd.size());
  for (std::int64_t h = 0; h < H; ++h) {
    for (std::int64_t s = 0; s < S; ++s) {
      for (std::int64_t d = 0; d < D; ++d) {
        k_shd[(s * H + h) * D + d] = kv.k[(h * S + s) * D + d];
        v_shd[(s * H + h) * D + d] = kv.v[(h * S + s) * D + d];
      }
    }
  }
  TensorRef k = TensorRef::f32(k_shd.data(), 1, H, S, D), v = TensorRef::f32(v_shd.data(), 1, H, S, D);
  k.stride[1] = v.stride[1] = D;
  k.stride[2] = v.stride[2] = H * D;
  LayerCache a = test::make_cache("tova:budget=6,n_sink=1"), b = test::make_cache("tova:budget=6,n_sink=1");
  a.update(k, v);
  test::feed(b, kv, S);
  EXPECT_TRUE(test::snapshot(a, 1, H) == test::snapshot(b, 1, H));
}

TEST(Cache, PrefillThenDecode) {
  KV kv(1, 2, 200, 16, 31);
  LayerCache c = test::make_cache("h2o:budget=32,n_sink=4,grace=8");
  const KVRows prefill = c.update(kv.keys(0, 150), kv.values(0, 150));
  EXPECT_EQ(prefill.n_rows, 150);  // the prefill attends over everything
  EXPECT_EQ(c.tokens_kept(), 32);
  for (std::int64_t t = 150; t < 200; ++t) {
    const KVRows r = c.update(kv.keys(t, 1), kv.values(t, 1));
    EXPECT_EQ(r.n_rows, 33);
    EXPECT_EQ(r.position(0, 0, 32), t);
    EXPECT_EQ(c.tokens_kept(), 32);
  }
  EXPECT_EQ(c.tokens_seen(), 200);
}

TEST(Cache, ByteAccountingEqualsHeldBytes) {
  for (const char* spec : {"full", "full:kv_dtype=f32", "h2o:budget=20,n_sink=2,grace=2",
                           "cam:budget=20", "morphkv:budget=20,window=4,kv_dtype=f32"}) {
    KV kv(2, 3, 64, 8, 5);
    LayerCache c = test::make_cache(spec);
    test::feed(c, kv, 5);
    // Held bytes counted independently from the stored rows.
    std::int64_t held = 0;
    for (std::int64_t b = 0; b < 2; ++b) {
      for (std::int64_t h = 0; h < 3; ++h) {
        const HeadRows r = c.stored(b, h);
        held += r.n_rows * 8 * 2 * static_cast<std::int64_t>(dtype_size(r.dtype));
      }
    }
    const CacheStats s = c.stats();
    EXPECT_EQ(s.kept_bytes, held) << spec;
    EXPECT_GE(s.allocated_bytes, s.kept_bytes) << spec;
    EXPECT_EQ(s.full_bytes, 64 * 2 * 3 * 8 * 2 * 2) << spec;
    EXPECT_DOUBLE_EQ(s.compression_ratio, static_cast<double>(s.full_bytes) / held) << spec;
    ASSERT_EQ(s.tokens_kept_per_head.size(), 6u);
    EXPECT_EQ(s.tokens_kept, s.tokens_kept_per_head[0]);
  }
}

TEST(Cache, MemoryStaysFlatAtAFixedBudget) {
  KV kv(1, 2, 2000, 16, 8);
  LayerCache c = test::make_cache("h2o:budget=64,n_sink=4,grace=8");
  test::feed(c, kv, 1, 0, 500);
  const CacheStats at500 = c.stats();
  test::feed(c, kv, 1, 500, 2000);
  const CacheStats at2000 = c.stats();
  EXPECT_EQ(at500.kept_bytes, at2000.kept_bytes);
  EXPECT_EQ(at500.allocated_bytes, at2000.allocated_bytes);
  EXPECT_LE(at2000.allocated_bytes, 2 * at2000.kept_bytes + 2 * 2 * 16 * 2 * 2);
}

TEST(Cache, LayerShapeIsValidated) {
  expect_error([] { LayerCache c(CacheConfig("full"), LayerShape{4, 8, 6, 0, 1}); },
               ErrorCode::kInvalidArgument, {"n_query_heads (6) must be a multiple of n_kv_heads (4)"});
  expect_error([] { LayerCache c(CacheConfig("full"), LayerShape{4, 8, 8, 3, 2}); },
               ErrorCode::kInvalidArgument, {"layer must be in [0, 1], got 3"});
}

// Scores that overflow to +inf rank as the highest data score, never as the protected mark
// (+inf in eviction_scores). Found by fuzz_capi_steps: probabilities near FLT_MAX summed by H2O
// made every unprotected row look protected and the cut aborted (VQ_ASSERT). By hand, for
// h2o:budget=4,n_sink=1,grace=1, one head, one token a step, every probability 3e38: row r's
// score after step t is (t - r + 1) * 3e38, +inf from two terms on. At step 4 (five rows) row 0
// is the sink and row 4 the grace row; rows 1-3 hold +inf, a three-way tie at the top, and ties
// evict the lowest index: row 1 goes, positions 0, 2, 3, 4 stay.
TEST(Cache, OverflowedScoresAreRankedNotProtected) {
  KV kv(1, 1, 5, 4, 21);
  LayerCache c(CacheConfig::parse("h2o:budget=4,n_sink=1,grace=1,source=attention"),
               LayerShape{1, 4, 1, 0, 1});
  for (std::int64_t t = 0; t < 5; ++t) {
    const StepView view = c.begin_step(kv.keys(t, 1), kv.values(t, 1));
    std::vector<float> probs(static_cast<std::size_t>(view.n_rows()), 3e38f);
    AttentionRef a{probs.data(), 1, 1, 1, view.n_rows()};
    ASSERT_NO_THROW(c.end_step(&a)) << "step " << t;
  }
  const HeadRows r = c.stored(0, 0);
  ASSERT_EQ(r.n_rows, 4);
  EXPECT_EQ(std::vector<std::int32_t>(r.positions, r.positions + r.n_rows),
            (std::vector<std::int32_t>{0, 2, 3, 4}));
  // TOVA ranks by the last query's probabilities: +inf for rows 1 and 2 ranks them highest,
  // tied, so at step 3 (four rows, budget 3, row 0 the sink) row 3 (probability 0.5) goes.
  LayerCache t(CacheConfig::parse("tova:budget=3,n_sink=1,source=attention"),
               LayerShape{1, 4, 1, 0, 1});
  for (std::int64_t s = 0; s < 4; ++s) {
    const StepView view = t.begin_step(kv.keys(s, 1), kv.values(s, 1));
    std::vector<float> probs(static_cast<std::size_t>(view.n_rows()), 0.5f);
    for (std::int64_t i = 1; i < std::min<std::int64_t>(3, view.n_rows()); ++i)
      probs[static_cast<std::size_t>(i)] = std::numeric_limits<float>::infinity();
    AttentionRef a{probs.data(), 1, 1, 1, view.n_rows()};
    ASSERT_NO_THROW(t.end_step(&a)) << "step " << s;
  }
  const HeadRows tr = t.stored(0, 0);
  EXPECT_EQ(std::vector<std::int32_t>(tr.positions, tr.positions + tr.n_rows),
            (std::vector<std::int32_t>{0, 1, 2}));
}

}  // namespace
}  // namespace vq
