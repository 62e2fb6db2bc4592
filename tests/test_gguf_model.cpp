// GGUF models: `veloxquant convert` output loaded back (every writable weight type, llama2.c
// and Hugging Face sources, both vocabulary kinds), checked against the source checkpoints
// loaded by the other loaders, and the errors of GGUF files that parse but do not describe a
// usable model.
#include <cmath>
#include <limits>

#include "engine/formats/gguf.h"
#include "engine/run/gguf_convert.h"
#include "engine/tokenizers/gguf_tokenizer.h"
#include "engine/formats/gguf_writer.h"
#include "engine/model/model.h"
#include "engine/tokenizers/tokenizer.h"
#include "engine/model/shapes.h"
#include "engine/model/transformer.h"
#include "engine_test_util.h"
#include "veloxquant/builder.h"

namespace vq {
namespace {
using engine::GgmlType;
using engine::Model;
using test::max_abs_diff;
using test::run_logits;
using test::TinyModel;

// A llama2.c tokenizer.bin of `n` pieces: <unk>, BOS, EOS, then single letters.
std::string tiny_tokenizer_bin(int n) {
  std::string s;
  test::append_pod(s, std::int32_t{8});
  for (int i = 0; i < n; ++i) {
    const std::string piece = i == 0   ? "<unk>"
                              : i == 1 ? "\n<s>\n"
                              : i == 2 ? "\n</s>\n"
                                       : std::string(1, static_cast<char>('A' + i));
    test::append_pod(s, static_cast<float>(-i));
    test::append_pod(s, static_cast<std::int32_t>(piece.size()));
    s += piece;
  }
  return s;
}

// A tokenizer.json with a BPE model over single letters (no merges).
std::string tiny_tokenizer_json(int n) {
  nlohmann::json vocab = nlohmann::json::object();
  vocab["<unk>"] = 0;
  vocab["<s>"] = 1;
  vocab["</s>"] = 2;
  for (int i = 3; i < n; ++i) vocab[std::string(1, static_cast<char>('A' + i))] = i;
  nlohmann::json j = {{"model",
                       {{"type", "BPE"},
                        {"vocab", vocab},
                        {"merges", nlohmann::json::array()},
                        {"unk_token", "<unk>"},
                        {"byte_fallback", false}}},
                      {"added_tokens",
                       {{{"id", 1}, {"content", "<s>"}, {"special", true}},
                        {{"id", 2}, {"content", "</s>"}, {"special", true}}}}};
  return j.dump();
}

TEST(GgufModel, ConvertedLlama2cAndHfGiveTheSourceLogits) {
  // The same random weights as llama2.c (interleaved RoPE) and HF (rotate-half) checkpoints;
  // both convert to GGUF `llama` (interleaved: the converter permutes HF's q/k rows), and the
  // GGUF models compute the sources' logits.
  const test::TempDir dir("gguf_formats");
  const TinyModel tm;
  test::write_bytes(dir.path / "m.bin", tm.llama2c(true));
  test::write_bytes(dir.path / "tokenizer.bin", tiny_tokenizer_bin(tm.vocab));
  std::filesystem::create_directories(dir.path / "hf");
  test::write_bytes(dir.path / "hf" / "config.json", tm.hf_config().dump());
  test::write_bytes(dir.path / "hf" / "model.safetensors",
                    tm.hf_safetensors("F32", TinyModel::Head::kMissing));
  test::write_bytes(dir.path / "hf" / "tokenizer.json", tiny_tokenizer_json(tm.vocab));
  const Model a = Model::load(dir / "m.bin");
  const Model h = Model::load((dir.path / "hf").string());
  const auto la = run_logits(a);
  EXPECT_LT(max_abs_diff(la, run_logits(h)), 2e-5);

  engine::convert_to_gguf(a, "", GgmlType::kF32, dir / "a.gguf");
  const auto rep = engine::convert_to_gguf(h, "", GgmlType::kF32, dir / "h.gguf");
  EXPECT_EQ(rep.vocab_model, "llama");
  const Model ga = Model::load(dir / "a.gguf");
  const Model gh = Model::load(dir / "h.gguf");
  EXPECT_EQ(ga.config().format, "gguf");
  EXPECT_EQ(ga.config().rope, engine::RopeStyle::kInterleaved);
  EXPECT_EQ(ga.config().n_kv_heads, tm.kv_heads);
  EXPECT_EQ(ga.config().seq_len, tm.seq_len);
  EXPECT_EQ(ga.owned_bytes(), 0) << "F32 tensors are used in place";
  EXPECT_EQ(run_logits(ga), la) << "same weights, same engine: bit-identical";
  EXPECT_LT(max_abs_diff(run_logits(gh), la), 2e-5);
  // F16 and BF16 files hold the weights rounded (TinyModel's values are exact in f16).
  engine::convert_to_gguf(a, "", GgmlType::kF16, dir / "a16.gguf");
  const Model g16 = Model::load(dir / "a16.gguf");
  EXPECT_EQ(g16.config().weights_dtype, "f16");
  EXPECT_EQ(g16.owned_bytes(), 0) << "F16 matrices are read in their stored type, in place";
  EXPECT_EQ(run_logits(g16), la);
  // The tokenizer comes from the file's metadata.
  const auto tok = engine::load_tokenizer("", gh);
  EXPECT_EQ(tok->kind(), "gguf-llama");
  // No post-processor in the tokenizer.json: no BOS, as the HF tokenizer itself encodes.
  EXPECT_EQ(tok->encode("DEF", true), (std::vector<std::int32_t>{3, 4, 5}));
  EXPECT_EQ(engine::load_hf_tokenizer(dir / "hf/tokenizer.json")->encode("DEF", true),
            tok->encode("DEF", true));
}

TEST(GgufModel, Stories260KEveryWeightType) {
  const test::TempDir dir("gguf_260k");
  const Model src = Model::load(test::data("stories260K.bin"));
  const auto src_tok = engine::load_tokenizer(test::data("tok512.bin"), src);
  const std::string text = test::read_all(test::data("tinystories_validation_excerpt.txt"));
  const auto want_ids = engine::encode_first(*src_tok, text, 400);
  const auto& s = src.weights();
  for (const auto& [name, type] :
       std::vector<std::pair<std::string, GgmlType>>{{"f32", GgmlType::kF32},
                                                     {"f16", GgmlType::kF16},
                                                     {"bf16", GgmlType::kBF16},
                                                     {"q8_0", GgmlType::kQ8_0}}) {
    SCOPED_TRACE(name);
    const std::string path = dir / (name + ".gguf");
    const auto rep = engine::convert_to_gguf(src, test::data("tok512.bin"), type, path);
    // dim 64 rows fit 32-value blocks; ffn_down's rows of 172 do not and stay F32.
    EXPECT_EQ(rep.kept_as_f32.size(), type == GgmlType::kQ8_0 ? 5u : 0u);
    const Model m = Model::load(path);
    const auto& c = m.config();
    EXPECT_EQ(c.dim, 64);
    EXPECT_EQ(c.hidden_dim, 172);
    EXPECT_EQ(c.n_layers, 5);
    EXPECT_EQ(c.n_heads, 8);
    EXPECT_EQ(c.n_kv_heads, 4);
    EXPECT_EQ(c.vocab_size, 512);
    EXPECT_EQ(c.bos_id, 1);
    EXPECT_EQ(c.eos_id, 2);
    EXPECT_TRUE(c.tied_classifier);
    EXPECT_EQ(c.weights_dtype, type == GgmlType::kQ8_0 ? "mixed" : name);
    // Every weight of layer 3's wq as stored: exact (f32), rounded to nearest (f16, bf16), or
    // within half a Q8_0 step d = max |block| / 127, plus the step's own f16 rounding (relative
    // 2^-11) times |q| <= 127.
    // Both as fp32 (engine/weights.h's exact element values): the GGUF model keeps F16, BF16 and
    // Q8_0 in their stored type; the source checkpoint is fp32.
    std::vector<float> wv(64 * 64), ov(64 * 64);
    for (std::int64_t r = 0; r < 64; ++r) {
      dequantize_row(m.weights().layers[3].wq, r, wv.data() + r * 64);
      dequantize_row(s.layers[3].wq, r, ov.data() + r * 64);
    }
    const float* w = wv.data();
    const float* o = ov.data();
    for (std::int64_t b = 0; b < 64 * 64 / 32; ++b) {
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(o[b * 32 + j]));
      for (int j = 0; j < 32; ++j) {
        const std::int64_t i = b * 32 + j;
        if (type == GgmlType::kF32) {
          ASSERT_EQ(w[i], o[i]);
        }
        if (type == GgmlType::kF16) {
          ASSERT_EQ(w[i], half_to_float(float_to_half(o[i])));
        }
        if (type == GgmlType::kBF16) {
          ASSERT_LE(std::fabs(w[i] - o[i]), std::fabs(o[i]) / 256);
        }
        if (type == GgmlType::kQ8_0) {
          ASSERT_LE(std::fabs(w[i] - o[i]), amax / 127 * (0.5f + 127.0f / 2048));
        }
      }
    }
    // The vocabulary in the file encodes like llama2.c's tokenizer (run.c's algorithm, an
    // independent implementation).
    const auto tok = engine::load_tokenizer("", m);
    EXPECT_EQ(engine::encode_first(*tok, text, 400), want_ids);
    if (type == GgmlType::kF32) {
      EXPECT_EQ(run_logits(m), run_logits(src));
    }
  }
}

TEST(GgufModel, UnusableModelsNameTheProblem) {
  const test::TempDir dir("gguf_bad");
  const Model src = Model::load(test::data("stories260K.bin"));
  const std::string good = dir / "good.gguf";
  engine::convert_to_gguf(src, test::data("tok512.bin"), GgmlType::kF32, good);
  const engine::GgufFile g = engine::GgufFile::open(good);
  // Rewrites `good` with one metadata value replaced (or removed) / one tensor dropped.
  auto variant = [&](const std::string& key, const engine::GgufValue* value,
                     const std::string& drop_tensor = "") {
    engine::GgufWriter w;
    for (const auto& [k, v] : g.metadata()) {
      if (k != key) w.set(k, v);
    }
    if (value) w.set(key, *value);
    for (const engine::GgufTensor& t : g.tensors()) {
      if (t.name == drop_tensor) continue;
      w.add_raw_tensor(t.name, t.dims, t.type,
                       std::vector<std::uint8_t>(t.data, t.data + t.n_bytes));
    }
    const std::string path = dir / "bad.gguf";
    w.write(path);
    return path;
  };
  auto expect = [](const std::string& path, const std::string& needle) {
    try {
      Model::load(path);
      ADD_FAILURE() << "loaded; expected an error containing: " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kFileError);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("bad.gguf"), std::string::npos) << e.what();
    }
  };
  const auto arch = engine::GgufValue::str("gptneox");
  expect(variant("general.architecture", &arch), "architecture 'gptneox' is not supported");
  expect(variant("llama.block_count", nullptr), "missing metadata key 'llama.block_count'");
  const auto heads = engine::GgufValue::str("8");
  expect(variant("llama.attention.head_count", &heads), "must be an integer, found string");
  const auto kv = engine::GgufValue::u32(3);
  expect(variant("llama.attention.head_count_kv", &kv), "must be a multiple of");
  const auto rope = engine::GgufValue::u32(4);
  expect(variant("llama.rope.dimension_count", &rope), "partial RoPE");
  expect(variant("", nullptr, "blk.2.ffn_up.weight"), "missing tensor 'blk.2.ffn_up.weight'");
  const auto ffn = engine::GgufValue::u32(100);
  expect(variant("llama.feed_forward_length", &ffn), "has shape [64, 172], expected [64, 100]");
  const auto bos = engine::GgufValue::u32(600);
  expect(variant("tokenizer.ggml.bos_token_id", &bos), "outside the vocabulary");
  // Metadata checked against the tensors (stories260K has 5 layers) and every RoPE field
  // applied or refused by name.
  const auto four = engine::GgufValue::u32(4);
  expect(variant("llama.block_count", &four),
         "'llama.block_count' = 4 but the file has tensors for 5 layers");
  const auto inf = engine::GgufValue::f32(std::numeric_limits<float>::infinity());
  expect(variant("llama.rope.freq_base", &inf), "'llama.rope.freq_base' must be finite");
  const auto factor = engine::GgufValue::f32(4.0f);
  expect(variant("llama.rope.scaling.factor", &factor),
         "'llama.rope.scaling.factor' = 4.000000 without 'llama.rope.scaling.type'");
  const auto yarn = engine::GgufValue::str("yarn");
  expect(variant("llama.rope.scaling.type", &yarn), "only 'none' and 'linear' RoPE scaling");
  const auto linear = engine::GgufValue::str("linear");
  expect(variant("llama.rope.scaling.type", &linear), "'llama.rope.scaling.factor' is missing");
  const auto beta = engine::GgufValue::f32(32.0f);
  expect(variant("llama.rope.scaling.yarn_beta_fast", &beta),
         "'llama.rope.scaling.yarn_beta_fast' (float32 32.000000) is a RoPE setting this engine "
         "does not implement");
  {
    // A tensor the model does not use (e.g. a Qwen3 q-norm) is refused, not ignored.
    engine::GgufWriter w;
    for (const auto& [k, v] : g.metadata()) w.set(k, v);
    for (const engine::GgufTensor& t : g.tensors()) {
      w.add_raw_tensor(t.name, t.dims, t.type, std::vector<std::uint8_t>(t.data, t.data + t.n_bytes));
    }
    const std::vector<float> qn(8, 1.0f);
    w.add_tensor("blk.0.attn_q_norm.weight", {8}, GgmlType::kF32, qn.data());
    w.write(dir / "bad.gguf");
    expect(dir / "bad.gguf", "tensor 'blk.0.attn_q_norm.weight' ([8]) is not used");
  }
  // A tokenizer array that does not match the token count.
  const auto scores = engine::GgufValue::f32_array({1.0f, 2.0f});
  const std::string p = variant("tokenizer.ggml.scores", &scores);
  EXPECT_THROW(engine::load_gguf_tokenizer(p), Error);
}

}  // namespace
}  // namespace vq

namespace vq {
namespace {

// stories260K converted to GGUF F32, rewritten with extra metadata / tensors.
struct Rewriter {
  test::TempDir dir{"gguf_rope"};
  std::string good;
  engine::GgufFile g;
  Rewriter()
      : good(dir / "good.gguf"),
        g((engine::convert_to_gguf(Model::load(test::data("stories260K.bin")),
                                   test::data("tok512.bin"), GgmlType::kF32, good),
           engine::GgufFile::open(good))) {}
  // Metadata keys renamed by `rename` (empty: dropped), extra keys, extra F32 tensors.
  std::string write(const std::string& name,
                    const std::vector<std::pair<std::string, engine::GgufValue>>& extra_kv,
                    const std::vector<std::pair<std::string, std::vector<float>>>& extra_t,
                    const std::string& arch = "llama") {
    engine::GgufWriter w;
    for (const auto& [k, v] : g.metadata()) {
      if (k == "general.architecture") {
        w.set(k, engine::GgufValue::str(arch));
      } else if (k.rfind("llama.", 0) == 0) {
        w.set(arch + k.substr(5), v);
      } else {
        w.set(k, v);
      }
    }
    for (const auto& [k, v] : extra_kv) w.set(k, v);
    for (const engine::GgufTensor& t : g.tensors()) {
      w.add_raw_tensor(t.name, t.dims, t.type, std::vector<std::uint8_t>(t.data, t.data + t.n_bytes));
    }
    for (const auto& [n, v] : extra_t) {
      w.add_tensor(n, {static_cast<std::int64_t>(v.size())}, GgmlType::kF32, v.data());
    }
    const std::string path = dir / name;
    w.write(path);
    return path;
  }
};

TEST(GgufModel, RopeFrequencyFactorsAndLinearScalingAreApplied) {
  // stories260K: head_dim 8, theta 10000. Expected angles pos * 10000^(-2i/8) * scale / f_i in
  // double (the engine's fp32 tables agree to a few ulps of the angle).
  Rewriter r;
  const std::vector<float> f = {1.0f, 2.0f, 4.0f, 8.0f};
  const Model a = Model::load(r.write("freqs.gguf", {}, {{"rope_freqs.weight", f}}));
  ASSERT_EQ(a.config().rope_freq_factors, f);
  const Model b = Model::load(r.write(
      "linear.gguf",
      {{"llama.rope.scaling.type", engine::GgufValue::str("linear")},
       {"llama.rope.scaling.factor", engine::GgufValue::f32(4.0f)}},
      {}));
  EXPECT_EQ(b.config().rope_freq_scale, 0.25);
  const Model plain = Model::load(r.good);
  for (const auto& [m, which] : {std::pair<const Model*, int>{&a, 0}, {&b, 1}, {&plain, 2}}) {
    const engine::Transformer t(*m, 1, 200);
    for (const std::int64_t pos : {1, 37, 199}) {
      for (int i = 0; i < 4; ++i) {
        const double mul = which == 0 ? 1.0 / f[static_cast<std::size_t>(i)] : which == 1 ? 0.25 : 1.0;
        const double angle = static_cast<double>(pos) * std::pow(10000.0, -2.0 * i / 8.0) * mul;
        const float got = t.state().rope_cos[static_cast<std::size_t>(pos * 4 + i)];
        EXPECT_NEAR(got, std::cos(angle), 2e-4 * std::max(1.0, angle)) << which << " " << pos << " " << i;
      }
    }
  }
  // Factors that are not finite and positive are refused by name.
  try {
    Model::load(r.write("badf.gguf", {}, {{"rope_freqs.weight", {1.0f, 0.0f, 1.0f, 1.0f}}}));
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'rope_freqs.weight' value 1 must be finite and > 0"),
              std::string::npos) << e.what();
  }
}

TEST(HfModel, Llama3RopeScalingGivesLlamaCppsFrequencyDivisors) {
  // TinyModel: head_dim 4, theta 10000, so two frequencies: 1 (wavelength 2 pi = 6.283) and
  // 10000^(-1/2) = 0.01 (wavelength 628.3). Llama 3's rule (Hugging Face's
  // _compute_llama3_parameters; llama.cpp's converter writes the same divisors as rope_freqs),
  // worked by hand for factor 8, low_freq_factor 1, high_freq_factor 4:
  //  - original_max_position_embeddings 1024: wavelengths below 1024 / 4 = 256 are kept (1), so
  //    frequency 0 keeps 1; 628.3 lies in [256, 1024]: s = (1024 / 628.3185 - 1) / (4 - 1) =
  //    0.2099155, divisor 1 / ((1 - s) / 8 + s) = 1 / 0.3086761 = 3.239642;
  //  - 256: 628.3 > 256 / 1 is a low frequency, divided by the factor: 8;
  //  - 8192 (Llama 3.1's): both wavelengths are below 8192 / 4: 1, 1.
  const test::TempDir dir("hf_rope");
  const TinyModel tm;
  auto load = [&](const std::string& name, const nlohmann::json& scaling) {
    nlohmann::json cfg = tm.hf_config();
    cfg["rope_scaling"] = scaling;
    std::filesystem::create_directories(dir.path / name);
    test::write_bytes(dir.path / name / "config.json", cfg.dump());
    test::write_bytes(dir.path / name / "model.safetensors",
                      tm.hf_safetensors("F32", TinyModel::Head::kMissing));
    test::write_bytes(dir.path / name / "tokenizer.json", tiny_tokenizer_json(tm.vocab));
    return Model::load((dir.path / name).string());
  };
  auto llama3 = [](int original) {
    return nlohmann::json{{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                          {"high_freq_factor", 4.0},
                          {"original_max_position_embeddings", original}};
  };
  const Model a = load("a", llama3(1024));
  ASSERT_EQ(a.config().rope_freq_factors.size(), 2u);
  EXPECT_EQ(a.config().rope_freq_factors[0], 1.0f);
  EXPECT_NEAR(a.config().rope_freq_factors[1], 3.239642, 1e-6);
  EXPECT_EQ(load("b", llama3(256)).config().rope_freq_factors, (std::vector<float>{1.0f, 8.0f}));
  EXPECT_EQ(load("c", llama3(8192)).config().rope_freq_factors, (std::vector<float>{1.0f, 1.0f}));
  const Model linear = load("linear", {{"type", "linear"}, {"factor", 4}});
  EXPECT_TRUE(linear.config().rope_freq_factors.empty());
  EXPECT_EQ(linear.config().rope_freq_scale, 0.25);
  const Model plain = load("plain", nullptr);
  EXPECT_TRUE(plain.config().rope_freq_factors.empty());
  EXPECT_EQ(plain.config().rope_freq_scale, 1.0);
  EXPECT_TRUE(load("default", {{"rope_type", "default"}}).config().rope_freq_factors.empty());

  // The engine's RoPE tables use them: angle = pos * freq_i * scale / divisor_i.
  const engine::Transformer t(a, 1, tm.seq_len);
  for (const std::int64_t pos : {1, 17, 31}) {
    const double angle = static_cast<double>(pos) * 0.01 / 3.239642;
    EXPECT_NEAR(t.state().rope_cos[static_cast<std::size_t>(pos * 2 + 1)], std::cos(angle), 1e-6);
    EXPECT_NEAR(t.state().rope_cos[static_cast<std::size_t>(pos * 2)], std::cos(pos * 1.0), 1e-6);
  }
  // A scaled model's logits differ from the plain one's, and converting to GGUF keeps them:
  // rope_freqs.weight (and linear scaling as rope.scaling.type/factor) as llama.cpp reads them.
  const auto la = run_logits(a);
  EXPECT_GT(max_abs_diff(la, run_logits(plain)), 1e-4);
  engine::convert_to_gguf(a, "", GgmlType::kF32, dir / "a.gguf");
  const Model ga = Model::load(dir / "a.gguf");
  EXPECT_EQ(ga.config().rope_freq_factors, a.config().rope_freq_factors);
  EXPECT_LT(max_abs_diff(run_logits(ga), la), 2e-5);
  engine::convert_to_gguf(linear, "", GgmlType::kF32, dir / "linear.gguf");
  const Model gl = Model::load(dir / "linear.gguf");
  EXPECT_EQ(gl.config().rope_freq_scale, 0.25);
  EXPECT_LT(max_abs_diff(run_logits(gl), run_logits(linear)), 2e-5);
}

TEST(GgufModel, Qwen2BiasesAreApplied) {
  // stories260K as a 'qwen2' file (rotate-half RoPE) with q/k/v biases. One token at position 0
  // attends to itself alone with probability exactly 1, so its output is its value row:
  // q/k biases leave the first token's logits bit for bit, a v bias changes them, and q/k
  // biases change the second token's.
  Rewriter r;
  const std::vector<float> zq(64, 0.0f), zk(32, 0.0f);
  std::vector<float> bq(64), bk(32), bv(32);
  for (std::size_t i = 0; i < 64; ++i) bq[i] = 0.05f * static_cast<float>(i % 7) - 0.1f;
  for (std::size_t i = 0; i < 32; ++i) bk[i] = 0.03f * static_cast<float>(i % 5) - 0.05f;
  for (std::size_t i = 0; i < 32; ++i) bv[i] = 0.2f * static_cast<float>(i % 3) - 0.2f;
  auto biases = [&](const std::vector<float>& q, const std::vector<float>& k,
                    const std::vector<float>& v) {
    std::vector<std::pair<std::string, std::vector<float>>> t;
    for (int l = 0; l < 5; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      t.push_back({p + "attn_q.bias", q});
      t.push_back({p + "attn_k.bias", k});
      t.push_back({p + "attn_v.bias", v});
    }
    return t;
  };
  const Model none = Model::load(r.write("none.gguf", {}, biases(zq, zk, zk), "qwen2"));
  const Model qk = Model::load(r.write("qk.gguf", {}, biases(bq, bk, zk), "qwen2"));
  const Model v = Model::load(r.write("v.gguf", {}, biases(zq, zk, bv), "qwen2"));
  EXPECT_TRUE(qk.config().qkv_bias);
  EXPECT_EQ(qk.config().rope, engine::RopeStyle::kRotateHalf);
  EXPECT_EQ(qk.config().n_params(), none.config().n_params());
  EXPECT_EQ(qk.config().n_params() - Model::load(r.good).config().n_params(), 5 * (64 + 32 + 32));
  auto logits = [](const Model& m, int n) {
    engine::Transformer t(m, 1, 8);
    ModelCache cache = KVCacheBuilder::for_model(CacheConfig::parse("full:kv_dtype=f32"),
                                                 engine::model_shape(m.config()));
    const std::int32_t toks[] = {1, 300};
    std::vector<float> out;
    for (int i = 0; i < n; ++i) {
      const float* lg = t.forward(toks + i, 1, cache);
      out.assign(lg, lg + m.config().vocab_size);
    }
    return out;
  };
  EXPECT_EQ(logits(none, 1), logits(qk, 1));
  EXPECT_NE(logits(none, 2), logits(qk, 2));
  EXPECT_NE(logits(none, 1), logits(v, 1));
}

TEST(GgufModel, Qwen25ShapeHasThePublishedParameterCount) {
  // Qwen2.5-0.5B: 494,032,768 parameters (its model card's 0.49B; q/k/v biases included, tied
  // embedding).
  EXPECT_EQ(engine::find_shape("qwen2.5-0.5b").config.n_params(), 494032768);
  EXPECT_TRUE(engine::find_shape("qwen2.5-0.5b").qkv_bias);
}

TEST(GgufModel, ShardedHfConvertsToTheSingleFilesBytes) {
  // The same tensors as one model.safetensors and split over three shards: convert writes the
  // same GGUF file, byte for byte (general.name "model" from both), for each stored and
  // written type.
  for (const char* dtype : {"F32", "BF16"}) {
    const test::TempDir dir("gguf_shards");
    const TinyModel tm(16, std::string(dtype) == "BF16" ? "bf16" : "f16");
    const std::string single = tm.hf_safetensors(dtype, TinyModel::Head::kSeparate);
    for (const char* sub : {"one", "sharded"}) {
      test::write_bytes(dir.path / sub / "config.json", tm.hf_config().dump());
      test::write_bytes(dir.path / sub / "tokenizer.json", tiny_tokenizer_json(tm.vocab));
    }
    test::write_bytes(dir.path / "one" / "model.safetensors", single);
    test::ShardedSafetensors(single, 3).write(dir.path / "sharded");
    const Model one = Model::load(dir / "one"), sharded = Model::load(dir / "sharded");
    for (const GgmlType type : {GgmlType::kF32, GgmlType::kBF16, GgmlType::kQ8_0}) {
      SCOPED_TRACE(std::string(dtype) + " -> type " + std::to_string(static_cast<int>(type)));
      engine::convert_to_gguf(one, "", type, dir / "one.gguf");
      engine::convert_to_gguf(sharded, "", type, dir / "sharded.gguf");
      const std::string a = test::read_all(dir / "one.gguf");
      EXPECT_GT(a.size(), static_cast<std::size_t>(tm.vocab * tm.dim));  // at least the embedding
      EXPECT_TRUE(a == test::read_all(dir / "sharded.gguf")) << "the GGUF files differ";
    }
  }
}

}  // namespace
}  // namespace vq
