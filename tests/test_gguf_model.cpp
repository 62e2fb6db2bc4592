// GGUF models: `veloxquant convert` output loaded back (every writable weight type, llama2.c
// and Hugging Face sources, both vocabulary kinds), checked against the source checkpoints
// loaded by the other loaders, and the errors of GGUF files that parse but do not describe a
// usable model.
#include <cmath>

#include "engine/formats/gguf.h"
#include "engine/run/gguf_convert.h"
#include "engine/tokenizers/gguf_tokenizer.h"
#include "engine/formats/gguf_writer.h"
#include "engine/model/model.h"
#include "engine/tokenizers/tokenizer.h"
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
  // A tokenizer array that does not match the token count.
  const auto scores = engine::GgufValue::f32_array({1.0f, 2.0f});
  const std::string p = variant("tokenizer.ggml.scores", &scores);
  EXPECT_THROW(engine::load_gguf_tokenizer(p), Error);
}

}  // namespace
}  // namespace vq
