// Engine pieces that need no model: kernels, the sampler, both tokenizers (tok512.bin from
// data/, and small tokenizer.json files written here).
#include <cmath>
#include <map>
#include <random>

#include "base/kernels.h"
#include "engine/compute/ops.h"
#include "engine/run/sampler.h"
#include "engine/tokenizers/tokenizer.h"
#include "engine_test_util.h"

namespace vq {
namespace {

// --- kernels --------------------------------------------------------------------------------

TEST(EngineOps, MatmulIsTheFixedOrderDotBitForBit) {
  for (const std::int64_t n_in : {1, 7, 8, 9, 16, 64, 172, 173}) {
    for (const std::int64_t n_out : {1, 3, 4, 5, 9}) {
      for (const std::int64_t S : {1, 3}) {
        const auto w = test::randn(static_cast<std::size_t>(n_in * n_out),
                                   11 + static_cast<std::uint64_t>(n_in));
        const auto x =
            test::randn(static_cast<std::size_t>(n_in * S), 12 + static_cast<std::uint64_t>(n_out));
        std::vector<float> out(static_cast<std::size_t>(S * n_out));
        engine::ops::matmul(out.data(), x.data(), w.data(), S, n_in, n_out);
        for (std::int64_t s = 0; s < S; ++s) {
          for (std::int64_t i = 0; i < n_out; ++i) {
            const float want = kernels::dot(w.data() + i * n_in, x.data() + s * n_in, n_in);
            const float got = out[static_cast<std::size_t>(s * n_out + i)];
            ASSERT_EQ(std::memcmp(&want, &got, 4), 0) << n_in << "x" << n_out << " S=" << S;
            ASSERT_EQ(engine::ops::dot(w.data() + i * n_in, x.data() + s * n_in, n_in), want);
          }
        }
      }
    }
  }
}

TEST(EngineOps, AttentionKernelsMatchTheScalarDefinitionBitForBit) {
  // Every SIMD path (8-row blocks, single rows, fp16 and fp32 rows) against the definition:
  // scores = dot in ops::dot's order, masked by position; values = four partial sums by row
  // index mod 4, combined (s0 + s2) + (s1 + s3).
  for (const std::int64_t D : {8, 16, 12, 64}) {
    for (const std::int64_t R : {1, 7, 8, 13, 40, 150}) {
      for (const DType dtype : {DType::kF32, DType::kF16}) {
        for (const std::int64_t nq : {1, 2, 3, 4, 6}) {
          const std::int64_t stride = D + 3, pos = R - 3;
          const auto kf = test::randn(static_cast<std::size_t>(R * stride),
                                      31 + static_cast<std::uint64_t>(D), 2.0f);
          const auto vf =
              test::randn(static_cast<std::size_t>(R * stride), 32 + static_cast<std::uint64_t>(R));
          const auto q = test::randn(static_cast<std::size_t>(nq * D), 33);
          std::vector<std::uint16_t> kh(kf.size()), vh(vf.size());
          for (std::size_t i = 0; i < kf.size(); ++i) {
            kh[i] = float_to_half(kf[i]);
            vh[i] = float_to_half(vf[i]);
          }
          const void* keys = dtype == DType::kF32 ? static_cast<const void*>(kf.data()) : kh.data();
          const void* values =
              dtype == DType::kF32 ? static_cast<const void*>(vf.data()) : vh.data();
          auto kval = [&](std::int64_t r, std::int64_t d) {
            return dtype == DType::kF32
                       ? kf[static_cast<std::size_t>(r * stride + d)]
                       : half_to_float(kh[static_cast<std::size_t>(r * stride + d)]);
          };
          auto vval = [&](std::int64_t r, std::int64_t d) {
            return dtype == DType::kF32
                       ? vf[static_cast<std::size_t>(r * stride + d)]
                       : half_to_float(vh[static_cast<std::size_t>(r * stride + d)]);
          };
          std::vector<std::int32_t> positions(static_cast<std::size_t>(R));
          for (std::int64_t r = 0; r < R; ++r)
            positions[static_cast<std::size_t>(r)] = static_cast<std::int32_t>((r * 7) % R);
          const std::int64_t ld = R + 5;
          std::vector<float> scores(static_cast<std::size_t>(nq * ld)),
              scratch(static_cast<std::size_t>(D));
          engine::ops::attention_scores(q.data(), nq, D, keys, dtype, stride, positions.data(), R,
                                        pos, scores.data(), ld, scratch.data());
          std::vector<float> row(static_cast<std::size_t>(D));
          for (std::int64_t j = 0; j < nq; ++j) {
            for (std::int64_t r = 0; r < R; ++r) {
              for (std::int64_t d = 0; d < D; ++d) row[static_cast<std::size_t>(d)] = kval(r, d);
              const float want = positions[static_cast<std::size_t>(r)] > pos
                                     ? -INFINITY
                                     : engine::ops::dot(q.data() + j * D, row.data(), D);
              const float got = scores[static_cast<std::size_t>(j * ld + r)];
              ASSERT_EQ(std::memcmp(&want, &got, 4), 0)
                  << "scores D=" << D << " R=" << R << " j=" << j << " r=" << r;
            }
          }
          for (std::int64_t j = 0; j < nq; ++j)
            engine::ops::softmax(scores.data() + j * ld, R, std::sqrt(static_cast<float>(D)));
          std::vector<float> out(static_cast<std::size_t>(nq * D)),
              sums(static_cast<std::size_t>(nq * 4 * D));
          engine::ops::attention_values(scores.data(), nq, ld, D, values, dtype, stride,
                                        positions.data(), R, pos, out.data(), sums.data());
          for (std::int64_t j = 0; j < nq; ++j) {
            for (std::int64_t d = 0; d < D; ++d) {
              float part[4] = {0, 0, 0, 0};
              for (std::int64_t r = 0; r < R; ++r) {
                if (positions[static_cast<std::size_t>(r)] > pos) continue;
                part[r & 3] =
                    std::fma(scores[static_cast<std::size_t>(j * ld + r)], vval(r, d), part[r & 3]);
              }
              const float want = (part[0] + part[2]) + (part[1] + part[3]);
              const float got = out[static_cast<std::size_t>(j * D + d)];
              ASSERT_EQ(std::memcmp(&want, &got, 4), 0)
                  << "values D=" << D << " R=" << R << " nq=" << nq;
            }
          }
          // The same sums added a block of rows at a time (blocks starting at multiples of 4,
          // the last one short) give the one-call result bit for bit.
          for (const std::int64_t block : {4, 12, 64}) {
            std::vector<float> parts(static_cast<std::size_t>(nq * 4 * D), 0.0f),
                blocked(static_cast<std::size_t>(nq * D));
            for (std::int64_t b0 = 0; b0 < R; b0 += block) {
              const std::int64_t n = std::min(block, R - b0);
              const void* vb = dtype == DType::kF32
                                   ? static_cast<const void*>(vf.data() + b0 * stride)
                                   : static_cast<const void*>(vh.data() + b0 * stride);
              engine::ops::attention_values_add(scores.data() + b0, nq, ld, D, vb, dtype, stride,
                                                positions.data() + b0, n, pos, parts.data());
            }
            engine::ops::attention_values_finish(parts.data(), nq, D, blocked.data());
            ASSERT_EQ(std::memcmp(blocked.data(), out.data(), blocked.size() * 4), 0)
                << "blocked values D=" << D << " R=" << R << " nq=" << nq << " block=" << block;
          }
        }
      }
    }
  }
}

// Distance in units in the last place between two finite floats of the same sign.
std::int64_t ulps(float a, float b) {
  std::int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  return std::llabs(static_cast<std::int64_t>(ia) - ib);
}

TEST(EngineOps, ExpIsWithinTwoUlpEverywhere) {
  std::vector<float> xs;
  for (float x = -110.0f; x < 90.0f; x += 0.0137f) xs.push_back(x);
  for (float x : {0.0f, -0.0f, 1e-30f, -1e-30f, 88.72f, 88.7228f, -87.33f, -87.34f, -100.0f,
                  -103.97f, 88.376f, 88.4f})
    xs.push_back(x);
  std::vector<float> got = xs;
  engine::ops::exp_inplace(got.data(), static_cast<std::int64_t>(got.size()));
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const double exact = std::exp(static_cast<double>(xs[i]));
    const float want = static_cast<float>(exact);  // e^x rounded once
    if (exact > 3.4028234663852886e38) {
      EXPECT_TRUE(std::isinf(got[i])) << xs[i];
    } else if (xs[i] < -104.0f) {
      EXPECT_EQ(got[i], 0.0f) << xs[i];
    } else {
      ASSERT_LE(ulps(got[i], want), want < 1.2e-38f ? 1 : 2)
          << "x = " << xs[i] << " got " << got[i] << " want " << want;
    }
  }
  std::vector<float> special = {-INFINITY, INFINITY, NAN};
  engine::ops::exp_inplace(special.data(), 3);
  EXPECT_EQ(special[0], 0.0f);
  EXPECT_TRUE(std::isinf(special[1]));
  EXPECT_TRUE(std::isnan(special[2]));
}

TEST(EngineOps, RmsnormSoftmaxSwiglu) {
  const auto x = test::randn(37, 3);
  const auto w = test::randn(37, 4);
  std::vector<float> out(37);
  engine::ops::rmsnorm(out.data(), x.data(), w.data(), 37, 1e-5f);
  const float inv = 1.0f / std::sqrt(kernels::dot(x.data(), x.data(), 37) / 37.0f + 1e-5f);
  for (int i = 0; i < 37; ++i)
    EXPECT_EQ(out[static_cast<std::size_t>(i)],
              w[static_cast<std::size_t>(i)] * (inv * x[static_cast<std::size_t>(i)]));
  std::vector<float> p = {1.0f, -INFINITY, 2.0f, -INFINITY};
  engine::ops::softmax(p.data(), 4);
  EXPECT_EQ(p[1], 0.0f);
  EXPECT_EQ(p[3], 0.0f);
  EXPECT_NEAR(p[0] + p[2], 1.0f, 1e-6f);
  EXPECT_NEAR(p[2] / p[0], std::exp(1.0f), 1e-5f);
  std::vector<float> g = {0.0f, 1.0f, -2.0f}, up = {5.0f, 2.0f, 3.0f};
  engine::ops::swiglu(g.data(), up.data(), 3);
  EXPECT_EQ(g[0], 0.0f);
  EXPECT_NEAR(g[1], 2.0f / (1.0f + std::exp(-1.0f)), 1e-6f);
  EXPECT_NEAR(g[2], 3.0f * -2.0f / (1.0f + std::exp(2.0f)), 1e-6f);
}

// --- sampler ----------------------------------------------------------------------------------

TEST(Sampler, TemperatureZeroIsArgmaxWithTheFirstMaximum) {
  engine::Sampler s(5, 0.0f, 0.9f, 1);
  std::vector<float> logits = {0.1f, 3.0f, -1.0f, 3.0f, 2.9f};
  EXPECT_EQ(s.sample(logits.data()), 1);
}

TEST(Sampler, XorshiftMatchesRunC) {
  // run.c: state ^= state >> 12; state ^= state << 25; state ^= state >> 27;
  // return (state * 0x2545F4914F6CDD1D) >> 32.  Checked here against 64-bit arithmetic done by
  // hand.
  engine::Sampler s(2, 1.0f, 0.0f, 133742);
  std::uint64_t st = 133742;
  for (int i = 0; i < 100; ++i) {
    st ^= st >> 12;
    st ^= st << 25;
    st ^= st >> 27;
    const auto want = static_cast<std::uint32_t>((st * 0x2545F4914F6CDD1Dull) >> 32);
    ASSERT_EQ(s.random_u32(), want) << i;
  }
  engine::Sampler t(2, 1.0f, 0.0f, 5), u(2, 1.0f, 0.0f, 5);
  EXPECT_EQ(t.random_f32(), static_cast<float>(u.random_u32() >> 8) / 16777216.0f);
}

// Probabilities for logits = ln(p) are p up to rounding.
std::vector<float> logits_of(const std::vector<float>& p) {
  std::vector<float> l;
  for (const float v : p) l.push_back(std::log(v));
  return l;
}

TEST(Sampler, TopPKeepsTheSmallestSetAboveTheThresholdAndRescalesTheCoin) {
  const std::vector<float> p = {0.05f, 0.3f, 0.5f, 0.15f};
  for (std::uint64_t seed = 1; seed < 400; ++seed) {
    engine::Sampler s(4, 1.0f, 0.7f, seed), coin_src(4, 1.0f, 0.7f, seed);
    auto logits = logits_of(p);
    const std::int32_t got = s.sample(logits.data());
    // Nucleus for 0.7: {0.5, 0.3} (cumulative 0.8 > 0.7); r = coin * 0.8.
    const float coin = coin_src.random_f32();
    const float r = coin * (logits[2] + logits[1]);
    const std::int32_t want = r < logits[2] ? 2 : 1;
    ASSERT_EQ(got, want) << "seed " << seed;
  }
  // top_p >= 1 samples the whole distribution (every token appears).
  std::vector<int> seen(4, 0);
  for (std::uint64_t seed = 1; seed < 2000; ++seed) {
    engine::Sampler s(4, 1.0f, 1.0f, seed);
    auto logits = logits_of(p);
    ++seen[static_cast<std::size_t>(s.sample(logits.data()))];
  }
  for (int c : seen) EXPECT_GT(c, 0);
  EXPECT_NEAR(seen[2] / 1999.0, 0.5, 0.05);
}

TEST(Sampler, RejectsBadSettings) {
  test::expect_error([] { engine::Sampler(4, -1.0f, 0.9f, 1); }, ErrorCode::kInvalidArgument,
                     {"temperature"});
  test::expect_error([] { engine::Sampler(4, NAN, 0.9f, 1); }, ErrorCode::kInvalidArgument,
                     {"temperature"});
  test::expect_error([] { engine::Sampler(4, 1.0f, 1.5f, 1); }, ErrorCode::kInvalidArgument,
                     {"top-p must be in [0, 1]"});
  test::expect_error([] { engine::Sampler(4, 1.0f, 0.9f, 0); }, ErrorCode::kInvalidArgument,
                     {"seed must be nonzero"});
}

// --- llama2.c tokenizer -------------------------------------------------------------------------

struct RawTok {
  std::vector<std::string> pieces;
  std::vector<float> scores;
};
RawTok read_tok512() {
  const std::string b = test::read_all(test::data("tok512.bin"));
  RawTok t;
  std::size_t at = 4;
  for (int i = 0; i < 512; ++i) {
    float s;
    std::int32_t len;
    std::memcpy(&s, b.data() + at, 4);
    std::memcpy(&len, b.data() + at + 4, 4);
    t.scores.push_back(s);
    t.pieces.push_back(b.substr(at + 8, static_cast<std::size_t>(len)));
    at += 8 + static_cast<std::size_t>(len);
  }
  return t;
}

// run.c's encode() as written there: quadratic rescans after every merge.
std::vector<std::int32_t> naive_runc_encode(const RawTok& t, const std::string& text) {
  std::map<std::string, std::int32_t> ids;  // first id of each piece (tok512 has no duplicates)
  for (std::size_t i = t.pieces.size(); i-- > 0;) ids[t.pieces[i]] = static_cast<std::int32_t>(i);
  auto lookup = [&](const std::string& s) -> std::int32_t {
    const auto it = ids.find(s);
    return it == ids.end() ? -1 : it->second;
  };
  std::vector<std::int32_t> tok = {1};
  if (!text.empty()) tok.push_back(lookup(" "));
  std::string buf;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if ((c & 0xC0) != 0x80) buf.clear();
    buf.push_back(static_cast<char>(c));
    const unsigned char next = i + 1 < text.size() ? static_cast<unsigned char>(text[i + 1]) : 0;
    if ((next & 0xC0) == 0x80 && buf.size() < 4) continue;
    const std::int32_t id = lookup(buf);
    if (id != -1) {
      tok.push_back(id);
    } else {
      for (const char b : buf) tok.push_back(static_cast<unsigned char>(b) + 3);
    }
    buf.clear();
  }
  while (true) {
    float best = -1e10f;
    std::int32_t best_id = -1;
    std::int64_t best_i = -1;
    for (std::size_t i = 0; i + 1 < tok.size(); ++i) {
      const std::int32_t id = lookup(t.pieces[static_cast<std::size_t>(tok[i])] +
                                     t.pieces[static_cast<std::size_t>(tok[i + 1])]);
      if (id != -1 && t.scores[static_cast<std::size_t>(id)] > best) {
        best = t.scores[static_cast<std::size_t>(id)];
        best_id = id;
        best_i = static_cast<std::int64_t>(i);
      }
    }
    if (best_i < 0) break;
    tok[static_cast<std::size_t>(best_i)] = best_id;
    tok.erase(tok.begin() + best_i + 1);
  }
  return tok;
}

TEST(Llama2cTokenizer, EncodesLikeRunC) {
  const auto tok = engine::load_llama2c_tokenizer(test::data("tok512.bin"), 512);
  EXPECT_EQ(tok->encode("Once upon a time"), (std::vector<std::int32_t>{1, 403, 407, 261, 378}));
  EXPECT_EQ(tok->encode(""), std::vector<std::int32_t>{1});
  EXPECT_EQ(tok->encode("", false), std::vector<std::int32_t>{});
  EXPECT_EQ(tok->encode("ab\0cd", false), tok->encode("ab", false)) << "a C string ends at NUL";
  // The heap-based merge makes run.c's choices: compare with run.c's quadratic loop on random
  // text mixing ASCII, multi-byte UTF-8, characters outside the vocabulary and stray bytes.
  const RawTok raw = read_tok512();
  const std::vector<std::string> alphabet = {
      "a",  "e", " ",  "t",  "he",   "Lily", ".",
      "\n", "é", "€",  "日", "\xC3", "\x80", "\xF0\x9F\x98\x80",
      "=",  "~", "ing"};
  std::mt19937 rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    std::string s;
    const int n = static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) s += alphabet[rng() % alphabet.size()];
    ASSERT_EQ(tok->encode(s), naive_runc_encode(raw, s)) << "text '" << s << "'";
  }
  const std::string text =
      test::read_all(test::data("tinystories_validation_excerpt.txt")).substr(0, 1500);
  EXPECT_EQ(tok->encode(text), naive_runc_encode(raw, text));
}

TEST(Llama2cTokenizer, EncodeFirstEqualsTheWholeTextsPrefix) {
  const auto tok = engine::load_llama2c_tokenizer(test::data("tok512.bin"), 512);
  for (const char* file : {"tinystories_validation_excerpt.txt", "wikitext2_test_excerpt.txt"}) {
    const std::string text = test::read_all(test::data(file));
    const auto whole = tok->encode(text);
    for (const std::int64_t n : {1, 10, 512, 2000}) {
      const auto first = engine::encode_first(*tok, text, n);
      ASSERT_EQ(first, std::vector<std::int32_t>(whole.begin(), whole.begin() + n))
          << file << " n=" << n;
    }
    EXPECT_EQ(engine::encode_first(*tok, text, 1 << 20), whole)
        << "asking for more returns everything";
  }
}

TEST(Llama2cTokenizer, DecodesLikeRunC) {
  const auto tok = engine::load_llama2c_tokenizer(test::data("tok512.bin"), 512);
  EXPECT_EQ(tok->piece(1, 403), "Once") << "the leading space is dropped after BOS";
  EXPECT_EQ(tok->piece(403, 407), " upon");
  EXPECT_EQ(tok->piece(5, 3 + 'A'), "A") << "<0x41> is the byte 'A'";
  EXPECT_EQ(tok->piece(5, 3 + 0x07), "") << "unprintable single bytes print as nothing";
  EXPECT_EQ(tok->piece(5, 3 + 0xC3), "") << "a lone high byte is not printable in the C locale";
  EXPECT_EQ(tok->piece(5, 3 + '\n'), "\n");
  EXPECT_EQ(tok->decode({1, 403, 407, 261, 378}), "Once upon a time");
  EXPECT_EQ(tok->token_text(2), "\n</s>\n");
  EXPECT_EQ(tok->token_text(512), "");
  EXPECT_EQ(tok->bos_id(), 1);
}

// --- tokenizer.json ---------------------------------------------------------------------------

nlohmann::json small_tokenizer_json() {
  nlohmann::json vocab = {{"<unk>", 0}, {"<s>", 1},     {"</s>", 2},    {"\u2581", 3}, {"a", 4},
                          {"b", 5},     {"c", 6},       {"\u2581a", 7}, {"ab", 8},     {"abc", 9},
                          {"bc", 10},   {"<0xC3>", 11}, {"<0xA9>", 12}, {"<", 13},     {"|", 14},
                          {"e", 15},    {">", 16}};
  return {
      {"version", "1.0"},
      {"added_tokens",
       {{{"id", 0}, {"content", "<unk>"}, {"special", true}, {"normalized", true}},
        {{"id", 1}, {"content", "<s>"}, {"special", true}, {"normalized", true}},
        {{"id", 2}, {"content", "</s>"}, {"special", true}, {"normalized", true}},
        {{"id", 17}, {"content", "<|e|>"}, {"special", true}, {"normalized", true}},
        {{"id", 18}, {"content", "[X]"}, {"special", false}, {"normalized", false}}}},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         {{{"type", "Prepend"}, {"prepend", "\u2581"}},
          {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}}}}},
      {"pre_tokenizer", nullptr},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single",
         {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
          {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         {{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
          {{"type", "ByteFallback"}},
          {{"type", "Fuse"}},
          {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", "<unk>"},
        {"fuse_unk", true},
        {"byte_fallback", true},
        {"vocab", vocab},
        {"merges", {"a b", "\u2581 a", "b c", "ab c"}}}},
  };
}

std::unique_ptr<engine::Tokenizer> write_and_load(const test::TempDir& dir,
                                                  const nlohmann::json& j) {
  test::write_bytes(dir / "tokenizer.json", j.dump());
  return engine::load_hf_tokenizer(dir / "tokenizer.json");
}

TEST(HfTokenizer, NormalizesMergesByRankAndFallsBackToBytes) {
  const test::TempDir dir("hf_tok");
  const auto tok = write_and_load(dir, small_tokenizer_json());
  EXPECT_EQ(tok->vocab_size(), 19);
  EXPECT_EQ(tok->bos_id(), 1);
  // "abc" -> a b c: (a,b) has rank 0, then (ab,c) rank 3. The prepended ▁ stays alone because
  // (▁,a) (rank 1) lost to (a,b).
  EXPECT_EQ(tok->encode("abc"), (std::vector<std::int32_t>{1, 3, 9}));
  EXPECT_EQ(tok->encode("a"), (std::vector<std::int32_t>{1, 7}));
  EXPECT_EQ(tok->encode("a", false), (std::vector<std::int32_t>{7}));
  EXPECT_EQ(tok->encode("", true), (std::vector<std::int32_t>{1}));
  // Spaces become ▁ (no pre-tokenizer: one word, merges cross spaces).
  EXPECT_EQ(tok->encode("a a", false), (std::vector<std::int32_t>{7, 7}));
  // "é" is not in the vocab: its UTF-8 bytes have <0xNN> pieces. "ü" (C3 BC) lacks <0xBC>:
  // unk, and consecutive unknown characters fuse into one.
  EXPECT_EQ(tok->encode("é", false), (std::vector<std::int32_t>{3, 11, 12}));
  EXPECT_EQ(tok->encode("aüüb", false), (std::vector<std::int32_t>{7, 0, 5}));
}

TEST(HfTokenizer, SplitsAddedTokensOnRawAndNormalizedText) {
  const test::TempDir dir("hf_added");
  const auto tok = write_and_load(dir, small_tokenizer_json());
  // <|e|> is normalized=true: its pattern is normalized too ("▁<|e|>"), so it matches after a
  // space (or at the start) but not glued to a word, where it is spelled with plain pieces.
  EXPECT_EQ(tok->encode("a <|e|>", false), (std::vector<std::int32_t>{7, 17}));
  EXPECT_EQ(tok->encode("<|e|>", false), (std::vector<std::int32_t>{17}));
  EXPECT_EQ(tok->encode("a<|e|>", false), (std::vector<std::int32_t>{7, 13, 14, 15, 14, 16}));
  // [X] is normalized=false: matched on the raw text; each side is normalized on its own.
  EXPECT_EQ(tok->encode("a[X]b", false), (std::vector<std::int32_t>{7, 18, 3, 5}));
}

TEST(HfTokenizer, DecodesWithItsDecoderChain) {
  const test::TempDir dir("hf_dec");
  const auto tok = write_and_load(dir, small_tokenizer_json());
  // Specials skipped; ▁ -> space; byte pieces joined into UTF-8; one leading space stripped.
  EXPECT_EQ(tok->decode({1, 7, 11, 12, 3, 5, 2}), "a\xC3\xA9 b");
  EXPECT_EQ(tok->decode({7, 11}), "a\xEF\xBF\xBD")
      << "an incomplete UTF-8 byte run decodes to U+FFFD";
  EXPECT_EQ(tok->piece(1, 7), "a") << "the text's first piece loses its leading space";
  EXPECT_EQ(tok->piece(7, 7), " a");
  EXPECT_EQ(tok->piece(7, 11), "\xC3") << "streamed byte pieces are raw bytes";
  EXPECT_EQ(tok->piece(7, 2), "") << "special tokens print nothing";
  EXPECT_EQ(tok->token_text(17), "<|e|>");
  // Round trip through the model's view of the text.
  EXPECT_EQ(tok->decode(tok->encode("a abc é b")), "a abc é b");
}

TEST(HfTokenizer, HonoursIgnoreMergesAndArrayMerges) {
  const test::TempDir dir("hf_opts");
  nlohmann::json j = small_tokenizer_json();
  using nlohmann::json;
  j["model"]["merges"] = json::array({json::array({"a", "b"}), json::array({"\u2581", "a"}),
                                      json::array({"b", "c"}), json::array({"ab", "c"})});
  EXPECT_EQ(write_and_load(dir, j)->encode("abc", false), (std::vector<std::int32_t>{3, 9}));
  j["model"]["vocab"]["\u2581abc"] = 19;
  j["model"]["ignore_merges"] = true;
  EXPECT_EQ(write_and_load(dir, j)->encode("abc", false), (std::vector<std::int32_t>{19}))
      << "whole word in vocab";
  j["post_processor"] = nullptr;
  EXPECT_EQ(write_and_load(dir, j)->encode("abc", true), (std::vector<std::int32_t>{19}))
      << "no template, no BOS";
}

}  // namespace
}  // namespace vq
