// Methods registered from outside the library (register_method, scored_method) and the shape
// limits of the API (issue 33). This binary registers methods, so it runs in a process of its
// own (veloxquant_api_tests): the main test binary's registry stays the library's.
//
//  - register_method validates everything it accepts: a malformed prefix, field, range, choice
//    or doc, a scored method without a scorer, a short key naming two fields.
//  - A scorer that throws rolls its step back: the error names the method and the scorer's
//    message, the cache is usable, and what it holds afterwards equals what a fresh cache fed
//    only the successful steps holds (C++ and C API), for plain, merged, demoted, KIVI- and
//    q8_0-stored rows. A hand-derived case pins the rows kept.
//  - Shapes past the limits of types.h and steps whose rows overlap are refused before any
//    allocation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

#include "veloxquant/veloxquant.h"
#include "veloxquant/veloxquant_c.h"

using namespace vq;

namespace {

template <typename F>
void expect_error(F&& f, ErrorCode code, std::initializer_list<const char*> parts) {
  try {
    f();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const char* p : parts) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "message lacks '" << p << "': " << e.what();
    }
  }
}

RowScorer constant_scorer(const CacheConfig&) {
  return [](const float*, const float*, std::int64_t) { return 0.0f; };
}

// ---- register_method's validation -----------------------------------------------------------

TEST(RegisterMethod, RefusesMalformedEntries) {
  const std::size_t before = registry().size();
  const auto refused = [](MethodInfo m, std::initializer_list<const char*> parts) {
    expect_error([&] { register_method(m); }, ErrorCode::kInvalidArgument, parts);
  };
  // Prefixes: empty for a scored method, upper case, a separator, a trailing '_'.
  refused(scored_method("nopre", "", "s", constant_scorer),
          {"register_method('nopre')", "the prefix is empty"});
  refused(scored_method("upper", "Up", "s", constant_scorer), {"prefix 'Up' must be"});
  refused(scored_method("comma", "a,b", "s", constant_scorer), {"prefix 'a,b' must be"});
  refused(scored_method("trail", "tr_", "s", constant_scorer), {"not ending in '_'"});
  refused(scored_method("ctrl", "c\x01", "s", constant_scorer), {"prefix 'c\\x01'"});
  // No scorer: before, this registered and threw std::bad_function_call at the first step.
  refused(scored_method("noscorer", "ns", "s", nullptr),
          {"register_method('noscorer')", "has no make_scorer"});
  // Fields: names and aliases that are not keys, a group, ranges, choices, docs.
  MethodInfo m = scored_method("fields", "fd", "s", constant_scorer);
  m.fields.push_back(FieldSpec{"fd_x=1", FieldType::kInt, std::int64_t{0}, 0, 1, {}, "d"});
  refused(m, {"field 'fd_x=1': a field name must be a lower-case letter"});
  m.fields.back() = FieldSpec{"", FieldType::kInt, std::int64_t{0}, 0, 1, {}, "d"};
  refused(m, {"a field has no name"});
  m.fields.back() = FieldSpec{"fd_x", FieldType::kInt, std::int64_t{0}, 0, 1, {}, "d", {}, {"X"}};
  refused(m, {"field 'fd_x': alias 'X' must be"});
  m.fields.back() = FieldSpec{"fd_x", FieldType::kInt, std::int64_t{0}, 0, 1, {}, "d", "merge"};
  refused(m, {"field 'fd_x' sets group 'merge'"});
  m.fields.back() = FieldSpec{"fd_x", FieldType::kFloat, 0.5, NAN, 1.0, {}, "d"};
  refused(m, {"field 'fd_x': its range [nan, 1] must be finite numbers, min <= max"});
  m.fields.back() = FieldSpec{"fd_x", FieldType::kInt, std::int64_t{0}, 3, 1, {}, "d"};
  refused(m, {"field 'fd_x': its range [3, 1] must be whole numbers"});
  // An int bound of 1e300 was printed through a cast to long long (undefined behaviour).
  m.fields.back() = FieldSpec{"fd_x", FieldType::kInt, std::int64_t{0}, 0, 1e300, {}, "d"};
  refused(m, {"must be whole numbers in [-2^53, 2^53]"});
  m.fields.back() = FieldSpec{"fd_x", FieldType::kFloat, 0.5, 0, INFINITY, {}, "d"};
  refused(m, {"must be finite numbers"});
  m.fields.back() = FieldSpec{"fd_x", FieldType::kEnum, std::string("a"), 0, 0, {}, "d"};
  refused(m, {"field 'fd_x' is an enum without choices"});
  m.fields.back() = FieldSpec{"fd_x", FieldType::kEnum, std::string("a"), 0, 0, {"a", "a"}, "d"};
  refused(m, {"field 'fd_x' lists choice 'a' twice"});
  m.fields.back() = FieldSpec{"fd_x", FieldType::kEnum, std::string("a"), 0, 0, {"a", "b,c"}, "d"};
  refused(m, {"choice 'b,c' must be non-empty, printable"});
  m.fields.back() = FieldSpec{"fd_x", FieldType::kInt, std::int64_t{0}, 0, 1, {}, "two\nlines"};
  refused(m, {"field 'fd_x': its doc must be one line"});
  // Duplicates: two fields of one name, and a short key that names another field: fd_power
  // answers to `power`, which is already the name of the second field.
  m.fields.back() = FieldSpec{"fd_power", FieldType::kInt, std::int64_t{0}, 0, 1, {}, "d"};
  m.fields.push_back(FieldSpec{"fd_power", FieldType::kInt, std::int64_t{0}, 0, 1, {}, "d"});
  refused(m, {"two fields are named 'fd_power'"});
  m.fields.back() = FieldSpec{"power", FieldType::kInt, std::int64_t{0}, 0, 1, {}, "d"};
  refused(m, {"field 'fd_power' answers to 'power' without its prefix"});
  MethodInfo summary = scored_method("summary", "sm", "one\nline", constant_scorer);
  refused(summary, {"the summary must be one line"});
  // Malformed and already registered: the malformation is reported.
  refused(scored_method("h2o", "", "s", constant_scorer), {"the prefix is empty"});
  EXPECT_EQ(registry().size(), before);
}

// make_scorer's own failures surface where the cache is built, as Error(kInvalidArgument)
// naming the method (before: an empty scorer threw std::bad_function_call at the first row).
TEST(RegisterMethod, ScorerFactoryFailuresNameTheMethod) {
  register_method(scored_method("emptyscorer", "es", "s",
                                [](const CacheConfig&) { return RowScorer(); }));
  expect_error([] { LayerCache(CacheConfig("emptyscorer"), LayerShape{1, 4}); },
               ErrorCode::kInvalidArgument,
               {"[emptyscorer] make_scorer returned an empty RowScorer"});
  register_method(scored_method("badfactory", "bf", "s", [](const CacheConfig&) -> RowScorer {
    throw std::runtime_error("no weights file");
  }));
  expect_error([] { ModelCache(CacheConfig("badfactory"), ModelShape{2, 1, 4, 0}); },
               ErrorCode::kInvalidArgument, {"[badfactory] make_scorer threw: no weights file"});
}

// ---- a scorer that throws ---------------------------------------------------------------------

constexpr std::int64_t kD = 32;  // a multiple of 32: kv_dtype=q8_0 takes it
constexpr std::int64_t kH = 2;
bool g_armed = false;  // the next row marked (value[1] = 99) throws, once

// flaky: a row's score is value[0]; budget 6, 1 sink.
void register_flaky() {
  static const bool done = [] {
    MethodInfo m = scored_method(
        "flaky", "fl", "scores value[0]; throws once on a marked row when armed",
        [](const CacheConfig&) -> RowScorer {
          return [](const float*, const float* value, std::int64_t) {
            if (g_armed && value[1] > 50.0f) {  // 99 as stored (q8_0 rounds it)
              g_armed = false;
              throw std::runtime_error("scorer failure on purpose");
            }
            return value[0];
          };
        },
        /*default_budget=*/6);
    m.fields[1].default_value = std::int64_t{1};  // fl_n_sink
    register_method(m);
    return true;
  }();
  (void)done;
}

// One step of S tokens: (b=0, h, s) has key (h + 1) * (first + s) / 8 in every channel and
// value (score, 0, h, 0.25 * d ...) with score from `scores`; `marked` marks (h = 1, s = 1).
struct Step {
  std::vector<float> k, v;
  std::int64_t S;
};

Step make_step(std::int64_t first, const std::vector<float>& scores, bool marked) {
  Step st;
  st.S = static_cast<std::int64_t>(scores.size());
  st.k.resize(static_cast<std::size_t>(kH * st.S * kD));
  st.v.resize(st.k.size());
  for (std::int64_t h = 0; h < kH; ++h) {
    for (std::int64_t s = 0; s < st.S; ++s) {
      for (std::int64_t d = 0; d < kD; ++d) {
        const std::size_t i = static_cast<std::size_t>((h * st.S + s) * kD + d);
        st.k[i] = static_cast<float>((h + 1) * (first + s)) / 8.0f + 0.125f * static_cast<float>(d);
        st.v[i] = d == 0   ? scores[static_cast<std::size_t>(s)] + static_cast<float>(h)
                  : d == 1 ? (marked && h == 1 && s == 1 ? 99.0f : 0.0f)
                           : 0.25f * static_cast<float>(d);
      }
    }
  }
  return st;
}

TensorRef ref(const std::vector<float>& x, std::int64_t S) {
  return TensorRef::f32(x.data(), 1, kH, S, kD);
}

// Everything a cache holds that a later step could read: per head, positions, keys and values
// (fp32, packed or not) and the rows' scores; plus tokens_seen and the eviction counts.
struct Snapshot {
  std::vector<std::int32_t> positions;
  std::vector<float> rows, scores;
  std::int64_t tokens_seen = 0, evictions = 0, merges = 0, kept_bytes = 0;
  bool operator==(const Snapshot&) const = default;
};

Snapshot snapshot(const LayerCache& c) {
  Snapshot s;
  std::vector<float> kbuf(kD), vbuf(kD);
  for (std::int64_t h = 0; h < kH; ++h) {
    const HeadRows r = c.stored(0, h);
    for (std::int64_t i = 0; i < r.n_rows; ++i) {
      s.positions.push_back(r.positions[i]);
      for (std::int64_t d = 0; d < kD; ++d) {
        s.rows.push_back(r.key(i, d));
        s.rows.push_back(r.value(i, d));
      }
    }
    const std::vector<float> sc = c.row_scores(0, h);
    s.scores.insert(s.scores.end(), sc.begin(), sc.end());
    s.positions.push_back(-1);  // head separator
  }
  const CacheStats st = c.stats();
  s.tokens_seen = st.tokens_seen;
  s.evictions = st.evictions;
  s.merges = st.merges;
  s.kept_bytes = st.kept_bytes;
  return s;
}

// The successful steps (score lists) and the failing one, fed between steps 1 and 2.
const std::vector<std::vector<float>> kGood = {
    {5, 9, 2, 7, 3}, {8}, {1, 6}, {4}, {10}, {0.5f}, {11, 3.5f, 12}, {2.5f}};
const std::vector<float> kFailing = {20, 21, 22};
constexpr std::size_t kFailAfter = 2;  // steps fed before the failing one

class ScorerThrows : public ::testing::TestWithParam<const char*> {};

TEST_P(ScorerThrows, StepRollsBackAndTheCacheGoesOn) {
  register_flaky();
  const CacheConfig config = CacheConfig::parse(std::string("flaky") + GetParam());
  LayerCache a(config, LayerShape{kH, kD});
  LayerCache fresh(config, LayerShape{kH, kD});
  std::int64_t pos = 0;
  for (std::size_t i = 0; i < kGood.size(); ++i) {
    if (i == kFailAfter) {
      const Snapshot before = snapshot(a);
      const Step bad = make_step(pos, kFailing, /*marked=*/true);
      g_armed = true;
      const StepView view = a.begin_step(ref(bad.k, bad.S), ref(bad.v, bad.S));
      EXPECT_EQ(view.n_new(), 3);
      expect_error([&] { a.end_step(); }, ErrorCode::kInvalidArgument,
                   {"[flaky] the scorer threw: scorer failure on purpose",
                    "the step was rolled back"});
      EXPECT_FALSE(g_armed);  // it did throw
      EXPECT_FALSE(a.step_open());
      EXPECT_EQ(snapshot(a), before);  // nothing of the failed step is left
    }
    const Step good = make_step(pos, kGood[i], false);
    a.update(ref(good.k, good.S), ref(good.v, good.S));
    fresh.update(ref(good.k, good.S), ref(good.v, good.S));
    pos += good.S;
    EXPECT_EQ(snapshot(a), snapshot(fresh)) << "after step " << i;
  }
  EXPECT_EQ(a.tokens_seen(), pos);
  // The storage under test was exercised: rows left, and merged or demoted where configured.
  const CacheStats st = fresh.stats();
  EXPECT_GT(st.evictions, 0);
  const std::string spec = GetParam();
  if (spec.find("merge=mean") != std::string::npos) {
    EXPECT_GT(st.merges, 0);
  }
  if (spec.find("demote=") != std::string::npos) {
    EXPECT_GT(st.demoted_rows, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Storage, ScorerThrows,
                         ::testing::Values("", ":kv_dtype=f32,merge=mean,merge_gate=false",
                                           ":demote=kivi4,demote_group=8",
                                           ":quantize=kivi4,kivi_group_size=2,residual_length=2",
                                           ":kv_dtype=q8_0"));

// By hand, for the plain config: scores are static, so the cache keeps the sink (position 0)
// and the 5 highest-scored later rows of each head (budget 6). Head 0's scores by position
// 0, 1, ..., 14, from kGood: 5 9 2 7 3 | 8 | 1 6 | 4 | 10 | 0.5 | 11 3.5 12 | 2.5 (head 1 adds 1
// to each: the same order). The 5 highest after position 0: 12 (position 13), 11 (11), 10 (9),
// 9 (1), 8 (5). The failed step between positions 5 and 6 takes no position.
TEST(ScorerThrowsByHand, KeepsTheRowsAFreshCacheKeeps) {
  register_flaky();
  LayerCache a(CacheConfig::parse("flaky"), LayerShape{kH, kD});
  std::int64_t pos = 0;
  for (std::size_t i = 0; i < kGood.size(); ++i) {
    if (i == kFailAfter) {
      const Step bad = make_step(pos, kFailing, true);
      g_armed = true;
      EXPECT_THROW(a.update(ref(bad.k, bad.S), ref(bad.v, bad.S)), Error);
    }
    const Step good = make_step(pos, kGood[i], false);
    a.update(ref(good.k, good.S), ref(good.v, good.S));
    pos += good.S;
  }
  for (std::int64_t h = 0; h < kH; ++h) {
    const HeadRows r = a.stored(0, h);
    std::vector<std::int32_t> got(r.positions, r.positions + r.n_rows);
    EXPECT_EQ(got, (std::vector<std::int32_t>{0, 1, 5, 9, 11, 13})) << "head " << h;
  }
}

// The same through the C API, on a method registered from C++: end_step reports
// VQ_ERR_INVALID_ARGUMENT with the scorer's message, the step is closed (before: every later
// call said VQ_ERR_INVALID_STATE), and the layer then holds what a fresh C++ cache holds.
TEST(ScorerThrowsCApi, ReportsAndRollsBack) {
  register_flaky();
  vq_config* c = nullptr;
  ASSERT_EQ(vq_config_parse("flaky:merge=mean,merge_gate=false", &c, nullptr), VQ_OK);
  const vq_layer_shape shape = {kH, kD, 0, 0, 1};
  vq_layer_cache* layer = nullptr;
  ASSERT_EQ(vq_layer_cache_create(c, &shape, &layer, nullptr), VQ_OK);
  LayerCache fresh(CacheConfig::parse("flaky:merge=mean,merge_gate=false"), LayerShape{kH, kD});
  const auto tensor = [](const std::vector<float>& x, std::int64_t S) {
    return vq_tensor{x.data(), VQ_DTYPE_F32, {1, kH, S, kD}, {kH * S * kD, S * kD, kD, 1}};
  };
  vq_step_view view{};
  std::int64_t pos = 0;
  for (std::size_t i = 0; i < kGood.size(); ++i) {
    if (i == kFailAfter) {
      const Step bad = make_step(pos, kFailing, true);
      const vq_tensor k = tensor(bad.k, bad.S), v = tensor(bad.v, bad.S);
      ASSERT_EQ(vq_layer_begin_step(layer, &k, &v, &view), VQ_OK);
      g_armed = true;
      EXPECT_EQ(vq_layer_end_step(layer, nullptr), VQ_ERR_INVALID_ARGUMENT);
      EXPECT_NE(std::string(vq_layer_last_error(layer)).find("scorer failure on purpose"),
                std::string::npos);
      EXPECT_EQ(vq_layer_step_open(layer), 0);
      vq_head_rows rows{};
      EXPECT_EQ(vq_layer_view_head(layer, 0, 0, &rows), VQ_ERR_INVALID_STATE);  // view closed
    }
    const Step good = make_step(pos, kGood[i], false);
    const vq_tensor k = tensor(good.k, good.S), v = tensor(good.v, good.S);
    ASSERT_EQ(vq_layer_begin_step(layer, &k, &v, &view), VQ_OK) << vq_layer_last_error(layer);
    ASSERT_EQ(vq_layer_end_step(layer, nullptr), VQ_OK) << vq_layer_last_error(layer);
    fresh.update(ref(good.k, good.S), ref(good.v, good.S));
    pos += good.S;
  }
  for (std::int64_t h = 0; h < kH; ++h) {
    vq_head_rows rows{};
    ASSERT_EQ(vq_layer_stored(layer, 0, h, &rows), VQ_OK);
    const HeadRows want = fresh.stored(0, h);
    ASSERT_EQ(rows.n_rows, want.n_rows);
    std::vector<float> key(kD), value(kD);
    for (std::int64_t r = 0; r < rows.n_rows; ++r) {
      EXPECT_EQ(rows.positions[r], want.positions[r]);
      ASSERT_EQ(vq_head_rows_load(&rows, r, key.data(), value.data()), VQ_OK);
      for (std::int64_t d = 0; d < kD; ++d) {
        EXPECT_EQ(key[static_cast<std::size_t>(d)], want.key(r, d));
        EXPECT_EQ(value[static_cast<std::size_t>(d)], want.value(r, d));
      }
    }
  }
  vq_cache_stats st{};
  ASSERT_EQ(vq_layer_stats(layer, &st), VQ_OK);
  EXPECT_EQ(st.tokens_seen, pos);
  EXPECT_EQ(st.merges, fresh.stats().merges);
  vq_layer_cache_free(layer);
  vq_config_free(c);
}

// ---- shape limits and overlapping rows (C++ API; the C API's are in tests/capi) ---------------

TEST(ShapeLimits, RefusedBeforeAllocation) {
  const CacheConfig c = CacheConfig::parse("streaming_llm:n_sink=1,window_size=3");
  expect_error([&] { ModelCache(c, ModelShape{100000000, 2, 8, 0}); }, ErrorCode::kInvalidArgument,
               {"[builder] n_layers must be at most 4096 (kMaxLayers", "got 100000000"});
  expect_error([&] { ModelCache(c, ModelShape{2, 2, 8, 8194}); }, ErrorCode::kInvalidArgument,
               {"n_query_heads must be at most 4096"});
  expect_error([&] { LayerCache(c, LayerShape{1, 65537}); }, ErrorCode::kInvalidArgument,
               {"[cache] head_dim must be at most 65536"});
  expect_error([&] { LayerCache(c, LayerShape{1, 4, 0, 0, 4097}); }, ErrorCode::kInvalidArgument,
               {"[cache] n_layers must be at most 4096"});
  EXPECT_EQ(ModelCache(c, ModelShape{kMaxLayers, 1, 4, 0}).n_layers(), kMaxLayers);
}

TEST(ShapeLimits, OverlappingRowsAreRefusedAndDistinctLayoutsTaken) {
  const CacheConfig c = CacheConfig::parse("streaming_llm:n_sink=1,window_size=3");
  std::vector<float> buf(64, 1.0f);
  LayerCache cache(c, LayerShape{});
  // 2^28 tokens of one row, zero strides: refused before a row is read.
  TensorRef t = TensorRef::f32(buf.data(), 1, 1, 1 << 28, 4);
  t.stride[0] = t.stride[1] = t.stride[2] = 0;
  expect_error([&] { cache.begin_step(t, t); }, ErrorCode::kInvalidArgument,
               {"[cache] begin_step: keys [1, 1, 268435456, 4] with strides [0, 0, 0, 1] has "
                "rows that overlap: along S (size 268435456) the stride is 0 elements"});
  EXPECT_FALSE(cache.step_open());
  EXPECT_EQ(cache.tokens_seen(), 0);
  // Heads 3 apart with rows of 4 overlap; the heads' own span decides the batch stride too.
  TensorRef heads = TensorRef::f32(buf.data(), 2, 2, 1, 4);
  heads.stride[1] = 3;
  expect_error([&] { cache.begin_step(heads, heads); }, ErrorCode::kInvalidArgument,
               {"along Hkv (size 2) the stride is 3 elements, less than the 4"});
  heads.stride[1] = 4;
  heads.stride[0] = 7;  // the two heads span 8 elements: a batch stride of 7 overlaps them
  expect_error([&] { cache.begin_step(heads, heads); }, ErrorCode::kInvalidArgument,
               {"along B (size 2) the stride is 7 elements, less than the 8"});
  // B x Hkv past kMaxBatchHeads, caught before the overlap (and any row store).
  TensorRef many = TensorRef::f32(buf.data(), kMaxBatchHeads + 1, 1, 1, 4);
  expect_error([&] { cache.begin_step(many, many); }, ErrorCode::kInvalidArgument,
               {"B x Hkv = 65537 x 1 row stores, past the limit 65536"});
  // Distinct rows in other orders are fine: [S][H][D] (a stride of -4 along S too).
  TensorRef shd = TensorRef::f32(buf.data() + 32, 1, 2, 3, 4);
  shd.stride[1] = 4;
  shd.stride[2] = -8;
  const StepView v = cache.begin_step(shd, shd);
  EXPECT_EQ(v.n_new(), 3);
  cache.end_step();
  EXPECT_EQ(cache.tokens_seen(), 3);
}

}  // namespace
