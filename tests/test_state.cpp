// Cache state save / restore (LayerCache::save_state, ModelCache::save_state; docs/api.md,
// "Saving and restoring a cache"). The reference for every expectation is the uninterrupted
// run: a cache saved at some step and restored into a freshly built one must, fed the same
// inputs afterwards, hold bit-identical rows, positions, row scores and stats after every step.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "attention_util.h"
#include "base/state_io.h"
#include "test_util.h"
#include "veloxquant/builder.h"
#include "veloxquant/registry.h"

namespace vq {
namespace {

using test::KV;

constexpr std::int64_t kB = 2, kH = 2, kHq = 4, kD = 32, kBudget = 40;
// The step sizes: a prompt (cut to the budget), decode steps, a second chunk, more decode.
const std::vector<std::int64_t> kSteps = {64, 1, 1, 1, 24, 1, 1, 1, 1, 1};
// Save after these steps (-1: before any step).
const std::vector<int> kSavePoints = {-1, 0, 2, 4, 6};

std::int64_t total_tokens() {
  std::int64_t n = 0;
  for (std::int64_t s : kSteps) n += s;
  return n;
}

std::vector<float> rope_freqs() {
  std::vector<float> f(kD / 2);
  for (std::int64_t p = 0; p < kD / 2; ++p) {
    f[static_cast<std::size_t>(p)] = static_cast<float>(std::pow(10000.0, -2.0 * double(p) / kD));
  }
  return f;
}

// One run's inputs: keys/values for every token and the queries the engine would have.
struct Inputs {
  KV kv{kB, kH, total_tokens(), kD, 7};
  std::vector<float> q = test::randn(static_cast<std::size_t>(kB * kHq * total_tokens() * kD), 99);
  std::vector<float> freqs = rope_freqs();
};

// How a test drives a cache: the engine (RoPE set, probabilities and queries passed every step)
// or update() (nothing passed: the proxy and key fallbacks).
enum class Drive { kEngine, kUpdate };

LayerCache build(const CacheConfig& config, const Inputs& in, Drive drive) {
  LayerCache c(config, LayerShape{kH, kD, kHq, 0, 1});
  test::give_key_filters(c, kH, kD);
  if (drive == Drive::kEngine) c.set_rope(RopeRef{in.freqs.data(), kD / 2, RopePairing::kInterleaved});
  return c;
}

// Step `k` of the schedule.
void step(LayerCache& c, const Inputs& in, Drive drive, std::size_t k) {
  std::int64_t t = 0;
  for (std::size_t i = 0; i < k; ++i) t += kSteps[i];
  const std::int64_t n = kSteps[k];
  if (drive == Drive::kUpdate) {
    c.update(in.kv.keys(t, n), in.kv.values(t, n));
    return;
  }
  const std::int64_t S = in.kv.S;
  std::vector<float> qs(static_cast<std::size_t>(kB * kHq * n * kD));
  for (std::int64_t b = 0; b < kB; ++b) {
    for (std::int64_t h = 0; h < kHq; ++h) {
      for (std::int64_t s = 0; s < n; ++s) {
        for (std::int64_t d = 0; d < kD; ++d) {
          qs[static_cast<std::size_t>(((b * kHq + h) * n + s) * kD + d)] =
              in.q[static_cast<std::size_t>(((b * kHq + h) * S + t + s) * kD + d)];
        }
      }
    }
  }
  const StepView view = c.begin_step(in.kv.keys(t, n), in.kv.values(t, n));
  const std::vector<float> probs = test::attend(view, qs, kHq, t);
  const AttentionRef ref{probs.data(), kB, kHq, n, view.n_rows()};
  const TensorRef queries = TensorRef::f32(qs.data(), kB, kHq, n, kD);
  c.end_step(&ref, &queries);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

// Everything observable, bit for bit (capacities aside: allocated_bytes and resident_bytes
// count container capacity, which a restored store sizes to its rows).
void expect_same(const LayerCache& a, const LayerCache& b, const std::string& where) {
  ASSERT_EQ(a.tokens_seen(), b.tokens_seen()) << where;
  EXPECT_STREQ(a.score_source(), b.score_source()) << where;
  EXPECT_EQ(a.budget(), b.budget()) << where;
  EXPECT_EQ(a.head_types(), b.head_types()) << where;
  EXPECT_EQ(a.reads_attention(), b.reads_attention()) << where;
  EXPECT_EQ(a.reads_queries(), b.reads_queries()) << where;
  const CacheStats sa = a.stats(), sb = b.stats();
  EXPECT_EQ(sa.tokens_seen, sb.tokens_seen) << where;
  EXPECT_EQ(sa.tokens_kept, sb.tokens_kept) << where;
  EXPECT_EQ(sa.tokens_kept_per_head, sb.tokens_kept_per_head) << where;
  EXPECT_EQ(sa.kept_bytes, sb.kept_bytes) << where;
  EXPECT_EQ(sa.full_bytes, sb.full_bytes) << where;
  EXPECT_EQ(std::memcmp(&sa.compression_ratio, &sb.compression_ratio, sizeof(double)), 0) << where;
  EXPECT_EQ(sa.evictions, sb.evictions) << where;
  EXPECT_EQ(sa.merges, sb.merges) << where;
  EXPECT_EQ(sa.demoted_rows, sb.demoted_rows) << where;
  EXPECT_STREQ(sa.score_source, sb.score_source) << where;
  EXPECT_EQ(sa.retrieval_heads, sb.retrieval_heads) << where;
  EXPECT_EQ(sa.retrieval_bytes, sb.retrieval_bytes) << where;
  EXPECT_EQ(sa.streaming_heads, sb.streaming_heads) << where;
  EXPECT_EQ(sa.streaming_bytes, sb.streaming_bytes) << where;
  EXPECT_STREQ(sa.value_norm, sb.value_norm) << where;
  if (a.tokens_seen() == 0) return;
  EXPECT_TRUE(test::snapshot(a, kB, kH) == test::snapshot(b, kB, kH)) << where << ": stored rows";
  for (std::int64_t bb = 0; bb < kB; ++bb) {
    for (std::int64_t h = 0; h < kH; ++h) {
      EXPECT_TRUE(same_bits(a.row_scores(bb, h), b.row_scores(bb, h)))
          << where << ": row scores of (" << bb << ", " << h << ")";
    }
  }
}

// The schedule run whole, and saved at `save_after` then restored into a fresh cache, both
// continued with the same inputs. Returns false when the config cannot run this drive (a
// combination a method refuses at its first step).
void round_trip(const CacheConfig& config, Drive drive, const std::string& label) {
  const Inputs in;
  for (int save_after : kSavePoints) {
    LayerCache orig = build(config, in, drive);
    for (int k = 0; k <= save_after; ++k) step(orig, in, drive, static_cast<std::size_t>(k));
    const std::vector<std::uint8_t> saved = orig.save_state();
    LayerCache restored = build(config, in, drive);
    restored.load_state(saved.data(), saved.size());
    const std::string where = label + ", saved after step " + std::to_string(save_after);
    // save(load(save(x))) == save(x)
    ASSERT_EQ(restored.save_state(), saved) << where;
    expect_same(orig, restored, where + ", restored");
    for (std::size_t k = static_cast<std::size_t>(save_after + 1); k < kSteps.size(); ++k) {
      step(orig, in, drive, k);
      step(restored, in, drive, k);
      expect_same(orig, restored, where + ", step " + std::to_string(k));
      if (::testing::Test::HasFailure()) return;
    }
    EXPECT_EQ(restored.save_state(), orig.save_state()) << where << ", at the end";
  }
}

// The shared options every method that has them is run with (a combination the method
// refuses is skipped; each method runs at least its defaults).
const std::vector<std::string> kVariants = {
    "",                    "headwise=true",       "demote=kivi4",        "kv_dtype=q8_0",
    "kv_dtype=q4_0",       "kv_dtype=f32",        "quantize=kivi2",      "think=0.5",
    "compress_interval=4", "merge=mean",          "source=attention",    "source=proxy",
    "demote=kivi2,merge=mean"};

class StateRoundTrip : public ::testing::TestWithParam<std::string> {};

TEST_P(StateRoundTrip, RestoredCacheContinuesBitIdentically) {
  int ran = 0;
  for (const std::string& extra : kVariants) {
    CacheConfig config("full");
    try {
      config = extra.empty() ? CacheConfig(GetParam()) : CacheConfig::parse(GetParam() + ":" + extra);
      if (has_token_budget(config)) config = with_token_budget(config, kBudget);
      config.validate();
    } catch (const Error&) {
      continue;  // the method has no such option, or refuses the combination
    }
    for (Drive drive : {Drive::kEngine, Drive::kUpdate}) {
      if (drive == Drive::kUpdate && extra == "source=attention") continue;  // needs probabilities
      const std::string label = config.spec() + (drive == Drive::kEngine ? " (engine)" : " (update)");
      round_trip(config, drive, label);
      if (HasFailure()) return;
      ++ran;
    }
  }
  RecordProperty("configurations", ran);
  EXPECT_GE(ran, 2) << "at least the defaults, driven both ways";
}

INSTANTIATE_TEST_SUITE_P(EveryMethod, StateRoundTrip, ::testing::ValuesIn(method_ids()),
                         [](const auto& p) { return p.param; });

// kvzip with the engine's reconstruction pass: no state while the prompt waits for compress();
// after compress() the state round-trips.
TEST(State, KvzipReconstructionWaitsForCompress) {
  const Inputs in;
  auto make = [&] {
    LayerCache c = build(CacheConfig::parse("kvzip:budget=8,n_sink=2,chunk=4"), in, Drive::kEngine);
    c.set_reconstruction(true);
    return c;
  };
  LayerCache orig = make();
  step(orig, in, Drive::kEngine, 0);  // the prompt: its rows wait for the pass
  test::expect_error([&] { (void)orig.save_state(); }, ErrorCode::kInvalidState,
                     {"reconstruction", "compress"});
  // The pass: the prompt's tokens again, as reconstruction steps.
  for (std::int64_t t = 0; t < kSteps[0]; t += 4) {
    const StepView view = orig.begin_step(in.kv.keys(t, 4), in.kv.values(t, 4));
    std::vector<float> qs(static_cast<std::size_t>(kB * kHq * 4 * kD), 0.125f);
    const std::vector<float> probs = test::attend(view, qs, kHq, 1 << 20);
    const AttentionRef ref{probs.data(), kB, kHq, 4, view.n_rows()};
    orig.end_reconstruction_step(&ref);
  }
  orig.compress();
  const std::vector<std::uint8_t> saved = orig.save_state();
  LayerCache restored = make();
  restored.load_state(saved.data(), saved.size());
  expect_same(orig, restored, "after compress");
  for (std::size_t k = 1; k < kSteps.size(); ++k) {
    if (kSteps[k] > 1) continue;  // decode steps only (a new prompt would wait for a pass again)
    step(orig, in, Drive::kEngine, k);
    step(restored, in, Drive::kEngine, k);
    expect_same(orig, restored, "decode step " + std::to_string(k));
  }
}

TEST(State, SaveWithAStepOpenIsRefused) {
  const Inputs in;
  LayerCache c = build(CacheConfig::parse("h2o:budget=8"), in, Drive::kUpdate);
  c.begin_step(in.kv.keys(0, 4), in.kv.values(0, 4));
  test::expect_error([&] { (void)c.save_state(); }, ErrorCode::kInvalidState, {"step is open"});
  std::vector<std::uint8_t> bytes;
  {
    LayerCache other = build(CacheConfig::parse("h2o:budget=8"), in, Drive::kUpdate);
    bytes = other.save_state();
  }
  test::expect_error([&] { c.load_state(bytes.data(), bytes.size()); }, ErrorCode::kInvalidState,
                     {"step is open"});
  c.end_step();
}

// ModelCache: several layers and the layers' shared state (SqueezeAttention's signals and
// budgets, decided once every layer reported; PyramidKV's per-layer schedule).
void model_step(ModelCache& m, const Inputs& in, std::size_t k, bool similarity) {
  std::int64_t t = 0;
  for (std::size_t i = 0; i < k; ++i) t += kSteps[i];
  const std::int64_t n = kSteps[k];
  for (std::int64_t l = 0; l < m.n_layers(); ++l) {
    if (similarity) m.observe_layer_similarity(l, 0.5 + 0.1 * double(l) + 0.01 * double(k));
    m.layer(l).update(in.kv.keys(t, n), in.kv.values(t, n));
  }
}

void expect_same_model(const ModelCache& a, const ModelCache& b, const std::string& where) {
  EXPECT_EQ(a.layer_budgets(), b.layer_budgets()) << where;
  for (std::int64_t l = 0; l < a.n_layers(); ++l) {
    expect_same(a.layer(l), b.layer(l), where + ", layer " + std::to_string(l));
  }
}

TEST(State, ModelCacheWithGroupStateRoundTrips) {
  const Inputs in;
  const ModelShape shape{4, kH, kD, kHq};
  for (const char* spec : {"squeeze:budget=10,n_sink=1", "pyramidkv:budget=10", "h2o:budget=10"}) {
    for (int save_after : kSavePoints) {
      ModelCache orig(CacheConfig::parse(spec), shape);
      for (int k = 0; k <= save_after; ++k) model_step(orig, in, static_cast<std::size_t>(k), true);
      const std::vector<std::uint8_t> saved = orig.save_state();
      ModelCache restored(CacheConfig::parse(spec), shape);
      restored.load_state(saved.data(), saved.size());
      const std::string where = std::string(spec) + ", saved after step " + std::to_string(save_after);
      ASSERT_EQ(restored.save_state(), saved) << where;
      expect_same_model(orig, restored, where);
      for (std::size_t k = static_cast<std::size_t>(save_after + 1); k < kSteps.size(); ++k) {
        model_step(orig, in, k, true);
        model_step(restored, in, k, true);
        expect_same_model(orig, restored, where + ", step " + std::to_string(k));
        if (HasFailure()) return;
      }
    }
  }
  // SqueezeAttention decides its budgets once every layer saw `budget` tokens: a state saved
  // before that holds no budgets, one saved after holds the reallocated ones.
  ModelCache m(CacheConfig::parse("squeeze:budget=10,n_sink=1"), shape);
  model_step(m, in, 0, true);
  const std::vector<std::int64_t> decided = m.layer_budgets();
  ModelCache r(CacheConfig::parse("squeeze:budget=10,n_sink=1"), shape);
  const std::vector<std::uint8_t> saved = m.save_state();
  r.load_state(saved.data(), saved.size());
  EXPECT_EQ(r.layer_budgets(), decided);
}

// ---------------------------------------------------------------------------------------------
// Corruption: every error is clear and leaves the target as it was.

std::vector<std::uint8_t> small_state(const char* spec = "h2o:budget=6,n_sink=1") {
  const Inputs in;
  LayerCache c(CacheConfig::parse(spec), LayerShape{1, kD, 1, 0, 1});
  KV kv(1, 1, 10, kD, 5);
  test::feed(c, kv, 3);
  return c.save_state();
}

// A target that holds tokens of its own, and what it holds.
struct Target {
  LayerCache cache{CacheConfig::parse("h2o:budget=6,n_sink=1"), LayerShape{1, kD, 1, 0, 1}};
  std::vector<std::uint8_t> before;
  Target() {
    KV kv(1, 1, 7, kD, 6);
    test::feed(cache, kv, 2);
    before = cache.save_state();
  }
  void expect_unchanged(const std::string& where) {
    EXPECT_EQ(cache.save_state(), before) << where << ": the target changed";
  }
};

void put_u32(std::vector<std::uint8_t>& b, std::size_t at, std::uint32_t v) {
  std::memcpy(b.data() + at, &v, 4);
}
void fix_checksum(std::vector<std::uint8_t>& b) {
  put_u32(b, b.size() - 4, detail::crc32c(b.data(), b.size() - 4));
}

TEST(State, Crc32cMatchesTheStandardCheckValue) {
  // The CRC-32C catalogue's check value (Castagnoli; RFC 3720 B.4 lists the same polynomial).
  const char* s = "123456789";
  EXPECT_EQ(detail::crc32c(reinterpret_cast<const std::uint8_t*>(s), 9), 0xE3069283u);
  // RFC 3720 B.4: 32 bytes of zeros -> 0x8A9136AA, of 0xFF -> 0x62A8AB43.
  std::vector<std::uint8_t> zeros(32, 0), ones(32, 0xFF);
  EXPECT_EQ(detail::crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(detail::crc32c(ones.data(), 32), 0x62A8AB43u);
}

TEST(State, EveryTruncationIsAnErrorAndLeavesTheTargetUnchanged) {
  const std::vector<std::uint8_t> good = small_state();
  Target t;
  for (std::size_t n = 0; n < good.size(); ++n) {
    try {
      t.cache.load_state(good.data(), n);
      ADD_FAILURE() << "a state cut to " << n << " of " << good.size() << " bytes loaded";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << n << ": " << e.what();
      EXPECT_EQ(std::string(e.what()).rfind("[state] ", 0), 0u) << e.what();
      if (n >= 24) {  // past the header: its size names the truncation
        EXPECT_NE(std::string(e.what()).find("truncated: the header gives a size of " +
                                             std::to_string(good.size()) + " bytes, found " +
                                             std::to_string(n)),
                  std::string::npos)
            << e.what();
      }
    }
    if (n % 97 == 0) t.expect_unchanged("truncated to " + std::to_string(n));
  }
  t.expect_unchanged("after every truncation");
}

TEST(State, AFlippedByteFailsTheChecksum) {
  const std::vector<std::uint8_t> good = small_state();
  Target t;
  const std::size_t step = std::max<std::size_t>(1, good.size() / 400);
  for (std::size_t at = 24; at < good.size(); at += step) {
    std::vector<std::uint8_t> bad = good;
    bad[at] ^= 0x5A;
    test::expect_error([&] { t.cache.load_state(bad.data(), bad.size()); },
                       ErrorCode::kInvalidArgument, {"checksum mismatch"});
  }
  t.expect_unchanged("after the flipped bytes");
  // And the state itself still loads.
  t.cache.load_state(good.data(), good.size());
  EXPECT_EQ(t.cache.save_state(), good);
}

TEST(State, WrongMagicFutureVersionOtherKind) {
  const std::vector<std::uint8_t> good = small_state();
  Target t;
  std::vector<std::uint8_t> bad = good;
  bad[0] = 'X';
  test::expect_error([&] { t.cache.load_state(bad.data(), bad.size()); }, ErrorCode::kInvalidArgument,
                     {"not a VeloxQuant cache state", "VQSTATE"});
  bad = good;
  put_u32(bad, 8, 2);
  fix_checksum(bad);
  test::expect_error([&] { t.cache.load_state(bad.data(), bad.size()); }, ErrorCode::kInvalidArgument,
                     {"format version 2 is not supported", "reads version 1"});
  // A ModelCache state offered to a LayerCache and back.
  ModelCache m(CacheConfig::parse("h2o:budget=6,n_sink=1"), ModelShape{1, 1, kD, 1});
  const std::vector<std::uint8_t> model = m.save_state();
  test::expect_error([&] { t.cache.load_state(model.data(), model.size()); },
                     ErrorCode::kInvalidArgument, {"ModelCache state", "LayerCache"});
  test::expect_error([&] { m.load_state(good.data(), good.size()); }, ErrorCode::kInvalidArgument,
                     {"LayerCache state", "ModelCache"});
  t.expect_unchanged("after the bad headers");
}

TEST(State, AnotherConfigOrShapeIsNamed) {
  Target t;
  const std::vector<std::uint8_t> other_spec = small_state("h2o:budget=7,n_sink=1");
  test::expect_error([&] { t.cache.load_state(other_spec.data(), other_spec.size()); },
                     ErrorCode::kInvalidArgument, {"h2o_budget=7", "h2o_budget=6", "config"});
  const std::vector<std::uint8_t> other_method = small_state("tova:budget=6,n_sink=1");
  test::expect_error([&] { t.cache.load_state(other_method.data(), other_method.size()); },
                     ErrorCode::kInvalidArgument, {"tova:", "h2o:"});
  {
    LayerCache c(CacheConfig::parse("h2o:budget=6,n_sink=1"), LayerShape{1, 64, 1, 0, 1});
    test::feed(c, KV(1, 1, 4, 64, 3), 2);
    const std::vector<std::uint8_t> s = c.save_state();
    test::expect_error([&] { t.cache.load_state(s.data(), s.size()); }, ErrorCode::kInvalidArgument,
                       {"head_dim is 64", "this cache's is 32"});
  }
  {
    LayerCache c(CacheConfig::parse("h2o:budget=6,n_sink=1"), LayerShape{1, kD, 1, 1, 2});
    const std::vector<std::uint8_t> s = c.save_state();
    test::expect_error([&] { t.cache.load_state(s.data(), s.size()); }, ErrorCode::kInvalidArgument,
                       {"n_layers is 2", "this cache's is 1"});
  }
  ModelCache m(CacheConfig::parse("h2o:budget=6"), ModelShape{2, 2, kD, 2});
  ModelCache m3(CacheConfig::parse("h2o:budget=6"), ModelShape{3, 2, kD, 2});
  const std::vector<std::uint8_t> s3 = m3.save_state();
  test::expect_error([&] { m.load_state(s3.data(), s3.size()); }, ErrorCode::kInvalidArgument,
                     {"model n_layers is 3", "this cache's is 2"});
  t.expect_unchanged("after the other configs");
}

// A state that claims more than it holds: with a valid checksum (the fuzz target's path), a
// count of 2^60 rows is an error naming what was expected, never an allocation.
TEST(State, HugeCountsAreErrorsNotAllocations) {
  std::vector<std::uint8_t> good = small_state();
  // The first store's positions count follows the layer header: find it by its value (10 rows
  // seen, 6 kept: the count is 6) after the spec.
  Target t;
  int tried = 0;
  for (std::size_t at = 24; at + 8 <= good.size() - 4; ++at) {
    std::uint64_t v;
    std::memcpy(&v, good.data() + at, 8);
    if (v != 6) continue;
    std::vector<std::uint8_t> bad = good;
    const std::uint64_t huge = 1ull << 60;
    std::memcpy(bad.data() + at, &huge, 8);
    fix_checksum(bad);
    test::expect_error([&] { t.cache.load_state(bad.data(), bad.size()); },
                       ErrorCode::kInvalidArgument, {"[state]", "expected"});
    ++tried;
  }
  EXPECT_GE(tried, 1);
  t.expect_unchanged("after the huge counts");
  // A 28-byte state (a header and a checksum, nothing between): an error.
  std::vector<std::uint8_t> tiny(good.begin(), good.begin() + 24);
  tiny.resize(28);
  const std::uint64_t n = tiny.size();
  std::memcpy(tiny.data() + 16, &n, 8);
  fix_checksum(tiny);
  test::expect_error([&] { t.cache.load_state(tiny.data(), tiny.size()); },
                     ErrorCode::kInvalidArgument, {"[state] spec", "ends early"});
}

// ---------------------------------------------------------------------------------------------
// Files

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "vq_state_" + name;
}

TEST(State, FileRoundTripIsAtomicAndErrorsNameThePath) {
  const Inputs in;
  LayerCache c = build(CacheConfig::parse("tova:budget=8"), in, Drive::kUpdate);
  for (std::size_t k = 0; k < 3; ++k) step(c, in, Drive::kUpdate, k);
  const std::string path = temp_path("layer.bin");
  c.save_state_file(path);
  c.save_state_file(path);  // over an existing file
  LayerCache r = build(CacheConfig::parse("tova:budget=8"), in, Drive::kUpdate);
  r.load_state_file(path);
  expect_same(c, r, "from the file");
  {
    std::ifstream f(path, std::ios::binary);
    std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_EQ(bytes, c.save_state());
    // Truncated and corrupt files: kFileError with the path.
    std::ofstream(path + ".cut", std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size() / 2));
    bytes[bytes.size() / 2] ^= 1;
    std::ofstream(path + ".bad", std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  const std::vector<std::uint8_t> before = r.save_state();
  for (const std::string& p : {path + ".missing", path + ".cut", path + ".bad"}) {
    try {
      r.load_state_file(p);
      ADD_FAILURE() << p << " loaded";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kFileError) << e.what();
      EXPECT_EQ(e.path(), p);
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(r.save_state(), before);
  // A valid file of another config: kInvalidArgument, as for a buffer.
  LayerCache other = build(CacheConfig::parse("tova:budget=9"), in, Drive::kUpdate);
  test::expect_error([&] { other.load_state_file(path); }, ErrorCode::kInvalidArgument,
                     {"tova_budget=8", "tova_budget=9"});
  // A directory that does not exist: kIoError naming the path, nothing written.
  test::expect_error([&] { c.save_state_file(temp_path("no/such/dir/x.bin")); }, ErrorCode::kIoError,
                     {"no/such/dir/x.bin"});
  std::remove(path.c_str());
  std::remove((path + ".cut").c_str());
  std::remove((path + ".bad").c_str());
}

TEST(State, ModelCacheFileRoundTrip) {
  const Inputs in;
  const ModelShape shape{3, kH, kD, kHq};
  ModelCache m(CacheConfig::parse("squeeze:budget=10,n_sink=1"), shape);
  for (std::size_t k = 0; k < 4; ++k) model_step(m, in, k, false);
  const std::string path = temp_path("model.bin");
  m.save_state_file(path);
  ModelCache r(CacheConfig::parse("squeeze:budget=10,n_sink=1"), shape);
  r.load_state_file(path);
  expect_same_model(m, r, "from the file");
  std::remove(path.c_str());
}

}  // namespace
}  // namespace vq
