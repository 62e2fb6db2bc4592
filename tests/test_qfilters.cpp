// qfilters (Q-Filters, Godey et al. 2025): the calibrated directions against np.linalg.svd
// (tests/qfilters_reference.py), kept rows of a case derived by hand, the setters' and the filter
// file's errors, and calibration on the shipped model.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "engine/formats/mapped_file.h"
#include "engine/model/model.h"
#include "engine/run/qfilters_file.h"
#include "engine/tokenizers/tokenizer.h"
#include "engine_test_util.h"
#include "test_util.h"

namespace vq {
namespace {

namespace fs = std::filesystem;

std::vector<std::int32_t> positions_of(const LayerCache& c, std::int64_t b, std::int64_t h) {
  const HeadRows r = c.stored(b, h);
  return std::vector<std::int32_t>(r.positions, r.positions + r.n_rows);
}

// The synthetic queries of tests/qfilters_reference.py (T = 64, D = 6):
// q_t[i] = s (2 + sin(0.37 t)) p[i] + 0.6 cos(0.9 t (i + 1) + 0.4 i), in double, then float.
constexpr std::int64_t kT = 64, kD = 6;
std::vector<double> unit(std::vector<double> v) {
  double n = 0;
  for (double x : v) n += x * x;
  for (double& x : v) x /= std::sqrt(n);
  return v;
}
const std::vector<double> kPA = unit({3, -1, 2, 0.5, -2, 1});
const std::vector<double> kPC = unit({1, 2, -1, 0, 1, -3});

// Writes head `h` of Hq heads of q ([T][Hq * D]).
void fill_head(std::vector<float>& q, std::int64_t Hq, std::int64_t h, const std::vector<double>& p,
               double s) {
  for (std::int64_t t = 0; t < kT; ++t) {
    for (std::int64_t i = 0; i < kD; ++i) {
      const double v = s * (2 + std::sin(0.37 * t)) * p[static_cast<std::size_t>(i)] +
                       0.6 * std::cos(0.9 * static_cast<double>(t) * static_cast<double>(i + 1) +
                                      0.4 * static_cast<double>(i));
      q[static_cast<std::size_t>((t * Hq + h) * kD + i)] = static_cast<float>(v);
    }
  }
}

engine::ModelConfig config_of(std::int64_t Hq, std::int64_t Hkv) {
  engine::ModelConfig c;
  c.n_layers = 1;
  c.n_heads = Hq;
  c.n_kv_heads = Hkv;
  c.head_dim = kD;
  return c;
}

void expect_near(const std::vector<float>& got, std::int64_t at, const std::vector<double>& want) {
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[static_cast<std::size_t>(at) + i], want[i], 2e-6) << "component " << i;
  }
}

TEST(QFilters, CalibratedDirectionsMatchNumpySvd) {
  // Expected: /usr/bin/python3 tests/qfilters_reference.py (np.linalg.svd of the float32
  // queries, first right singular vector, sign by the mean projection; s2/s1 about 0.26, so the
  // direction is well defined). A: s = +1 along p_A; B: s = -1 along p_A (the sign must flip to
  // keep the mean projection positive: u_B is about -p_A, and not -u_A exactly: the noise
  // differs); C: s = +1 along p_C.
  const std::vector<double> uA = {0.6903896, -0.2146645, 0.4619356, 0.1025152, -0.4563328, 0.2124801};
  const std::vector<double> uB = {-0.6894393, 0.2197994, -0.4607787, -0.1015984, 0.4586112, -0.2083223};
  const std::vector<double> meanAC = {0.4820361, 0.1395384, 0.1076385, 0.0552676, -0.1112096, -0.2698241};
  {
    // Two KV heads, one query head each: the filters are the heads' own directions.
    std::vector<float> q(static_cast<std::size_t>(kT * 2 * kD));
    fill_head(q, 2, 0, kPA, 1.0);
    fill_head(q, 2, 1, kPA, -1.0);
    engine::QueryStats stats(config_of(2, 2));
    stats.add(0, q.data(), kT);
    const std::vector<float> f = stats.filters();
    ASSERT_EQ(f.size(), static_cast<std::size_t>(2 * kD));
    expect_near(f, 0, uA);
    expect_near(f, kD, uB);
    EXPECT_EQ(stats.tokens(), static_cast<std::uint64_t>(kT));
  }
  {
    // GQA: two query heads (A, C) share one KV head, whose filter is their directions' mean.
    // Fed in two steps of 40 and 24 tokens: the statistics are sums, the result the same.
    std::vector<float> q(static_cast<std::size_t>(kT * 2 * kD));
    fill_head(q, 2, 0, kPA, 1.0);
    fill_head(q, 2, 1, kPC, 1.0);
    engine::QueryStats stats(config_of(2, 1));
    stats.add(0, q.data(), 40);
    stats.add(0, q.data() + 40 * 2 * kD, kT - 40);
    const std::vector<float> f = stats.filters();
    ASSERT_EQ(f.size(), static_cast<std::size_t>(kD));
    expect_near(f, 0, meanAC);
  }
}

TEST(QFilters, DominantDirectionOfADegenerateHead) {
  // No queries: the zero vector (a head that never saw a query scores every key 0).
  EXPECT_EQ(engine::dominant_direction(std::vector<double>(9, 0.0), std::vector<double>(3, 0.0), 3),
            std::vector<double>(3, 0.0));
  // One query (0, -2, 0): Q^T Q = diag(0, 4, 0), the direction is the y axis, and the sign makes
  // the projection of the query positive: (0, -1, 0).
  const std::vector<double> g = {0, 0, 0, 0, 4, 0, 0, 0, 0};
  EXPECT_EQ(engine::dominant_direction(g, {0, -2, 0}, 3), (std::vector<double>{0, -1, 0}));
}

// Keys [T][2] of one KV head, derived by hand below.
const std::vector<float> kKeys = {1, 0, 0, 1, 1, 1, -1, 0, 0, -1, 2, 0, 0, 0.5f, 0.5f, 0.5f};

std::vector<std::vector<std::int32_t>> kept_two_heads(std::int64_t chunk) {
  // The same 8 keys in two KV heads; head 0's filter (0.6, 0.8), head 1's (-0.6, -0.8).
  const std::int64_t T = 8, D = 2, H = 2;
  std::vector<float> k(static_cast<std::size_t>(H * T * D)), v(k.size(), 1.0f);
  for (std::int64_t h = 0; h < H; ++h) std::copy(kKeys.begin(), kKeys.end(), k.begin() + h * T * D);
  LayerCache c = test::make_cache("qfilters:budget=4,n_sink=1,grace=1,kv_dtype=f32", H, D);
  const std::vector<float> filters = {0.6f, 0.8f, -0.6f, -0.8f};
  EXPECT_TRUE(c.needs_key_filters());
  c.set_key_filters(filters.data(), 4);
  // keys [B=1, Hkv=2, S, D] with head stride T * D.
  for (std::int64_t t = 0; t < T; t += chunk) {
    const std::int64_t n = std::min(chunk, T - t);
    const TensorRef kr{k.data() + t * D, DType::kF32, {1, H, n, D}, {H * T * D, T * D, D, 1}};
    const TensorRef vr{v.data() + t * D, DType::kF32, {1, H, n, D}, {H * T * D, T * D, D, 1}};
    c.update(kr, vr);
  }
  return {positions_of(c, 0, 0), positions_of(c, 0, 1)};
}

TEST(QFilters, KeepsTheHandDerivedRows) {
  // budget 4, n_sink 1 (position 0), grace 1 (the newest row). Scores <k, u>:
  //   head 0, u = (0.6, 0.8): t0 (1,0) .6, t1 (0,1) .8, t2 (1,1) 1.4, t3 (-1,0) -.6,
  //     t4 (0,-1) -.8, t5 (2,0) 1.2, t6 (0,.5) .4, t7 (.5,.5) .7
  //   t4 arrives: rows 0..4, candidates 1 .8, 2 1.4, 3 -.6 -> 3 leaves; rows 0 1 2 4
  //   t5: candidates 1 .8, 2 1.4, 4 -.8 -> 4 leaves; rows 0 1 2 5
  //   t6: candidates 1 .8, 2 1.4, 5 1.2 -> 1 leaves; rows 0 2 5 6
  //   t7: candidates 2 1.4, 5 1.2, 6 .4 -> 6 leaves; rows 0 2 5 7
  //   head 1, u = -(0.6, 0.8): every score negated
  //   t4: candidates 1 -.8, 2 -1.4, 3 .6 -> 2 leaves; rows 0 1 3 4
  //   t5: candidates 1 -.8, 3 .6, 4 .8 -> 1 leaves; rows 0 3 4 5
  //   t6: candidates 3 .6, 4 .8, 5 -1.2 -> 5 leaves; rows 0 3 4 6
  //   t7: candidates 3 .6, 4 .8, 6 -.4 -> 6 leaves; rows 0 3 4 7
  const std::vector<std::vector<std::int32_t>> want = {{0, 2, 5, 7}, {0, 3, 4, 7}};
  EXPECT_EQ(kept_two_heads(1), want);
  // A chunk is its tokens one at a time (contract 4).
  EXPECT_EQ(kept_two_heads(8), want);
  EXPECT_EQ(kept_two_heads(3), want);
}

TEST(QFilters, NoFiltersIsAnErrorNamingTheSetterAndTheStepRollsBack) {
  // (test::make_cache would give it filters.)
  LayerCache c(CacheConfig::parse("qfilters:budget=4,n_sink=1,grace=1"), LayerShape{1, 2, 0, 0, 1});
  std::vector<float> k = {1, 0, 0, 1}, v = {1, 1, 1, 1};
  const TensorRef kr = TensorRef::f32(k.data(), 1, 1, 2, 2), vr = TensorRef::f32(v.data(), 1, 1, 2, 2);
  test::expect_error([&] { c.update(kr, vr); }, ErrorCode::kInvalidState,
                     {"set_key_filters", "veloxquant calibrate", "rolled back"});
  EXPECT_EQ(c.tokens_seen(), 0);
  EXPECT_FALSE(c.step_open());
  const std::vector<float> f = {1, 0};
  c.set_key_filters(f.data(), 2);
  c.update(kr, vr);
  EXPECT_EQ(c.tokens_seen(), 2);
  // Other methods need none and ignore them.
  EXPECT_FALSE(test::make_cache("knorm", 1, 2).needs_key_filters());
}

TEST(QFilters, SettersCheckTheirInput) {
  LayerCache c = test::make_cache("qfilters", 2, 4);
  const std::vector<float> f(8, 0.5f);
  test::expect_error([&] { c.set_key_filters(f.data(), 6); }, ErrorCode::kInvalidArgument,
                     {"set_key_filters", "2 x 4 = 8", "got 6"});
  test::expect_error([&] { c.set_key_filters(nullptr, 8); }, ErrorCode::kInvalidArgument,
                     {"must not be null"});
  std::vector<float> nan = f;
  nan[5] = std::nanf("");
  test::expect_error([&] { c.set_key_filters(nan.data(), 8); }, ErrorCode::kInvalidArgument,
                     {"value 5 (head 1) is not finite"});
  // A cache whose shape comes with its first step checks the size there.
  LayerCache open = test::make_cache("qfilters:budget=4,n_sink=1,grace=1");
  open.set_key_filters(f.data(), 6);
  std::vector<float> k(8, 1.0f);
  test::expect_error(
      [&] { open.update(TensorRef::f32(k.data(), 1, 2, 1, 4), TensorRef::f32(k.data(), 1, 2, 1, 4)); },
      ErrorCode::kInvalidState, {"6 floats", "2 x 4 = 8"});

  ModelCache m(CacheConfig::parse("qfilters"), ModelShape{3, 2, 4, 4});
  EXPECT_TRUE(m.needs_key_filters());
  std::vector<float> all(24);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<float>(i);
  test::expect_error([&] { m.set_key_filters(all.data(), 16); }, ErrorCode::kInvalidArgument,
                     {"3 x 2 x 4 = 24", "got 16"});
  m.set_key_filters(all.data(), 24);
  // Layer 2 got floats 16..23: its head 1's filter (20, 21, 22, 23) scores a key (1, 0, 0, 0)
  // 20, which row_scores shows.
  std::vector<float> kk = {0, 0, 0, 0, 1, 0, 0, 0}, vv(8, 1.0f);
  m.layer(2).update(TensorRef::f32(kk.data(), 1, 2, 1, 4), TensorRef::f32(vv.data(), 1, 2, 1, 4));
  EXPECT_EQ(m.layer(2).row_scores(0, 1), std::vector<float>{20.0f});
  EXPECT_EQ(m.layer(2).row_scores(0, 0), std::vector<float>{0.0f});

  // The C API: tests/capi/test_capi.c (test_key_filters).
}

TEST(QFilters, FileRoundTripAndItsErrors) {
  test::TempDir dir("qfilters");
  engine::KeyFilters f;
  f.n_layers = 2;
  f.n_kv_heads = 1;
  f.head_dim = 3;
  f.fingerprint = 0x0123456789abcdefull;
  f.tokens = 77;
  f.values = {0.5f, -1.0f, 0.25f, 3.0f, 0.0f, -0.125f};
  const std::string path = dir / "m.qfilters";
  engine::write_key_filters(path, f);
  EXPECT_EQ(fs::file_size(path), 48u + 4u * 6u);
  EXPECT_FALSE(fs::exists(path + ".tmp-" + std::to_string(::getpid())));
  const engine::KeyFilters g = engine::read_key_filters(path);
  EXPECT_EQ(g.n_layers, 2);
  EXPECT_EQ(g.n_kv_heads, 1);
  EXPECT_EQ(g.head_dim, 3);
  EXPECT_EQ(g.fingerprint, f.fingerprint);
  EXPECT_EQ(g.tokens, 77u);
  EXPECT_EQ(g.values, f.values);

  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  test::write_bytes(dir / "short.qfilters", bytes.substr(0, bytes.size() - 4));
  test::expect_error([&] { engine::read_key_filters(dir / "short.qfilters"); },
                     ErrorCode::kFileError, {"short.qfilters", "is 68 bytes", "says 72"});
  std::string flipped = bytes;
  flipped[44] = static_cast<char>(flipped[44] ^ 1);
  test::write_bytes(dir / "flip.qfilters", flipped);
  test::expect_error([&] { engine::read_key_filters(dir / "flip.qfilters"); },
                     ErrorCode::kFileError, {"checksum"});
  test::write_bytes(dir / "other.qfilters", "GGUF" + bytes.substr(4));
  test::expect_error([&] { engine::read_key_filters(dir / "other.qfilters"); },
                     ErrorCode::kFileError, {"not a Q-Filters file"});
}

const std::string kModel = VELOXQUANT_DATA_DIR "/stories260K.bin";

TEST(QFilters, TheEngineLoadsTheModelsFileAndRefusesAnother) {
  engine::Model model = engine::Model::load(kModel);
  // The shipped file (data/PROVENANCE.md) loads into a qfilters cache; a full cache loads none.
  ModelCache cache = engine::make_model_cache(CacheConfig::parse("qfilters"), model);
  EXPECT_FALSE(engine::make_model_cache(CacheConfig::parse("full"), model).needs_key_filters());

  test::TempDir dir("qfilters_engine");
  model.set_qfilters_path(dir / "missing.qfilters");
  test::expect_error([&] { engine::make_model_cache(CacheConfig::parse("qfilters"), model); },
                     ErrorCode::kFileError, {"missing.qfilters", "veloxquant calibrate"});
  const engine::ModelConfig& c = model.config();
  engine::KeyFilters other;
  other.n_layers = c.n_layers;
  other.n_kv_heads = c.n_kv_heads;
  other.head_dim = c.head_dim * 2;
  other.fingerprint = engine::model_fingerprint(model);
  other.values.assign(static_cast<std::size_t>(other.n_layers * other.n_kv_heads * other.head_dim), 0.1f);
  engine::write_key_filters(dir / "other.qfilters", other);
  model.set_qfilters_path(dir / "other.qfilters");
  const std::string theirs = std::to_string(c.n_layers) + " layers x " +
                             std::to_string(c.n_kv_heads) + " KV heads x head_dim ";
  test::expect_error([&] { engine::make_model_cache(CacheConfig::parse("qfilters"), model); },
                     ErrorCode::kFileError,
                     {theirs + std::to_string(c.head_dim * 2), theirs + std::to_string(c.head_dim)});
  other.head_dim = c.head_dim;
  other.values.resize(static_cast<std::size_t>(c.n_layers * c.n_kv_heads * c.head_dim));
  other.fingerprint ^= 1;
  engine::write_key_filters(dir / "other.qfilters", other);
  test::expect_error([&] { engine::make_model_cache(CacheConfig::parse("qfilters"), model); },
                     ErrorCode::kFileError, {"another model of this shape", "fingerprint"});
}

TEST(QFilters, CalibrationIsDeterministicAndReproducesTheShippedFile) {
  // data/PROVENANCE.md: veloxquant calibrate --model data/stories260K.bin --text
  // data/tasks/tinystories_train.txt --tokens 2048 (the default chunk 64).
  const engine::Model model = engine::Model::load(kModel);
  const auto tokenizer = engine::load_tokenizer("", model);
  const std::vector<std::int32_t> ids = engine::encode_first(
      *tokenizer, engine::read_text_file(VELOXQUANT_DATA_DIR "/tasks/tinystories_train.txt"), 2048);
  ASSERT_EQ(ids.size(), 2048u);
  const engine::KeyFilters a = engine::calibrate_key_filters(model, ids, 64);
  const engine::KeyFilters b = engine::calibrate_key_filters(model, ids, 17);
  EXPECT_EQ(a.values, b.values) << "the chunk changes nothing";
  const engine::KeyFilters shipped = engine::read_key_filters(kModel + ".qfilters");
  EXPECT_EQ(shipped.values, a.values);
  EXPECT_EQ(shipped.fingerprint, a.fingerprint);
  EXPECT_EQ(shipped.tokens, 2048u);
  // Each KV head's filter is a mean of unit vectors: norm at most 1, and (the query heads of a
  // group agreeing) well above 0.
  const std::int64_t D = a.head_dim;
  for (std::int64_t h = 0; h < a.n_layers * a.n_kv_heads; ++h) {
    double n2 = 0;
    for (std::int64_t i = 0; i < D; ++i) n2 += std::pow(a.values[static_cast<std::size_t>(h * D + i)], 2);
    EXPECT_LE(std::sqrt(n2), 1.0 + 1e-6) << "head " << h;
    EXPECT_GT(std::sqrt(n2), 0.1) << "head " << h;
  }
}

}  // namespace
}  // namespace vq
