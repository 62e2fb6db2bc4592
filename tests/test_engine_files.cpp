// Checkpoint formats on small synthetic models written here (llama2.c v0, Hugging Face
// safetensors in F32 / F16 / BF16, tied and separate classifiers), and the errors every kind
// of corrupt, truncated or inconsistent file gives: Error(kFileError) naming the path and
// what was expected vs found, never a crash.
#include <cmath>

#include "engine/model/model.h"
#include "engine/tokenizers/tokenizer.h"
#include "engine/model/transformer.h"
#include "engine_test_util.h"
#include "veloxquant/builder.h"

namespace vq {
namespace {
using engine::Model;
using test::max_abs_diff;
using test::run_logits;
using test::TinyModel;

void write_hf(const test::TempDir& dir, const TinyModel& tm, const std::string& dtype,
              TinyModel::Head head, std::size_t pad = 0, nlohmann::json config = nullptr) {
  test::write_bytes(dir.path / "config.json", (config.is_null() ? tm.hf_config() : config).dump(2));
  test::write_bytes(dir.path / "model.safetensors", tm.hf_safetensors(dtype, head, pad));
}

TEST(EngineFormats, HfRotateHalfEqualsLlama2cInterleaved) {
  // The same weights in both formats (q/k rows permuted the way HF -> llama2.c export does)
  // give the same logits: the loaders and the two RoPE conventions agree.
  const test::TempDir dir("formats");
  const TinyModel tm;
  test::write_bytes(dir.path / "m.bin", tm.llama2c(true));
  write_hf(dir, tm, "F32", TinyModel::Head::kExplicit);
  const Model a = Model::load(dir / "m.bin");
  const Model b = Model::load(dir.path.string());
  EXPECT_EQ(a.config().format, "llama2c");
  EXPECT_EQ(b.config().format, "hf");
  EXPECT_EQ(b.config().rope, engine::RopeStyle::kRotateHalf);
  EXPECT_EQ(a.config().n_kv_heads, 2);
  const auto la = run_logits(a), lb = run_logits(b);
  EXPECT_LT(max_abs_diff(la, lb), 2e-5);
  EXPECT_GT(max_abs_diff(la, std::vector<float>(la.size(), 0.0f)), 0.1) << "logits are not trivial";
  // The same model loads from model.safetensors or config.json paths.
  EXPECT_EQ(run_logits(Model::load(dir / "model.safetensors")), lb);
  EXPECT_EQ(run_logits(Model::load(dir / "config.json")), lb);
}

TEST(EngineFormats, F16AndBf16WeightsConvertExactly) {
  for (const char* dtype : {"F16", "BF16"}) {
    const test::TempDir d32("f32"), dlo("lo");
    const TinyModel tm(9, std::string(dtype) == "F16" ? "f16" : "bf16");
    write_hf(d32, tm, "F32", TinyModel::Head::kExplicit);
    write_hf(dlo, tm, dtype, TinyModel::Head::kExplicit);
    const Model a = Model::load(d32.path.string()), b = Model::load(dlo.path.string());
    EXPECT_EQ(b.config().weights_dtype, std::string(dtype) == "F16" ? "f16" : "bf16");
    // Matrices stay in their stored type, read in place from the mapping; only the fp32 norm
    // vectors are converted (and owned).
    const engine::WeightType want =
        std::string(dtype) == "F16" ? engine::WeightType::kF16 : engine::WeightType::kBF16;
    EXPECT_EQ(b.weights().layers[0].wq.type, want);
    EXPECT_EQ(b.weights().classifier.type, want);
    const std::int64_t norms = (2 * b.config().n_layers + 1) * b.config().dim * 4;
    // Owned: the norms, plus matrices copied (same type) when the data section's offset is odd.
    EXPECT_GE(b.owned_bytes(), norms);
    EXPECT_LE(b.owned_bytes(), norms + b.matrix_bytes() + b.weights().token_embedding.bytes() -
                                   b.weights().token_embedding.row_bytes())
        << "never converted to fp32";
    EXPECT_EQ(run_logits(a), run_logits(b)) << dtype;
  }
}

TEST(EngineFormats, TiedAndSeparateClassifiers) {
  const TinyModel tm;
  const test::TempDir d1("tie1"), d2("tie2"), d3("tie3"), d4("sep");
  write_hf(d1, tm, "F32", TinyModel::Head::kExplicit);
  write_hf(d2, tm, "F32", TinyModel::Head::kMissing);
  write_hf(d3, tm, "F32", TinyModel::Head::kMetadataAlias);
  write_hf(d4, tm, "F32", TinyModel::Head::kSeparate);
  const Model m1 = Model::load(d1.path.string()), m2 = Model::load(d2.path.string()),
              m3 = Model::load(d3.path.string()), m4 = Model::load(d4.path.string());
  EXPECT_FALSE(m1.config().tied_classifier) << "stored twice: two tensors";
  EXPECT_TRUE(m2.config().tied_classifier) << "lm_head missing: tied to the embedding";
  EXPECT_TRUE(m3.config().tied_classifier) << "__metadata__ names the stored tensor";
  EXPECT_FALSE(m4.config().tied_classifier);
  const auto l1 = run_logits(m1);
  EXPECT_EQ(run_logits(m2), l1);
  EXPECT_EQ(run_logits(m3), l1);
  EXPECT_GT(max_abs_diff(run_logits(m4), l1), 1e-3);
  // llama2.c: a negative vocab_size stores a separate classifier after the RoPE tables.
  const test::TempDir dl("l2c");
  test::write_bytes(dl.path / "sep.bin", tm.llama2c(false));
  const Model s = Model::load(dl / "sep.bin");
  EXPECT_FALSE(s.config().tied_classifier);
  EXPECT_EQ(s.config().vocab_size, 40);
  EXPECT_LT(max_abs_diff(run_logits(s), run_logits(m4)), 2e-5);
}

TEST(EngineFormats, UnalignedTensorsAreCopiedNotMisread) {
  const TinyModel tm;
  const test::TempDir a("aligned"), u("unaligned");
  write_hf(a, tm, "F32", TinyModel::Head::kExplicit, 0);
  write_hf(u, tm, "F32", TinyModel::Head::kExplicit, 3);  // data section at an odd offset
  const Model ma = Model::load(a.path.string()), mu = Model::load(u.path.string());
  EXPECT_GT(mu.owned_bytes(), 0);
  EXPECT_EQ(run_logits(ma), run_logits(mu));
}

// --- corrupt llama2.c checkpoints ---------------------------------------------------------------

std::string with_header(std::string bytes, int field, std::int32_t value) {
  std::memcpy(bytes.data() + 4 * field, &value, 4);
  return bytes;
}

TEST(EngineErrors, Llama2cCheckpoints) {
  const test::TempDir dir("bad_l2c");
  const std::string good = TinyModel().llama2c(true);
  struct Case {
    std::string name, bytes;
    std::vector<std::string> fragments;
  };
  const std::vector<Case> cases = {
      {"empty.bin", "", {"truncated llama2.c header", "expected at least 28 bytes", "found 0"}},
      {"short.bin", good.substr(0, 20), {"found 20"}},
      {"dim0.bin", with_header(good, 0, 0), {"header field dim must be > 0, found 0"}},
      {"layers.bin", with_header(good, 2, -3), {"header field n_layers must be > 0, found -3"}},
      {"heads.bin", with_header(good, 3, 5), {"dim (16) must be a multiple of n_heads (5)"}},
      {"kv.bin", with_header(good, 4, 3), {"n_heads (4) must be a multiple of", "n_kv_heads (3)"}},
      {"huge.bin", with_header(good, 0, 1 << 30), {"implausibly large"}},
      {"trunc.bin",
       good.substr(0, good.size() - 100),
       {"truncated", "needs " + std::to_string(good.size()) + " bytes, found " +
                         std::to_string(good.size() - 100)}},
      {"extra.bin", good + std::string(8, '\0'), {"size mismatch", "8 extra"}},
      {"vocab.bin", with_header(good, 5, 41), {"needs"}},
      {"magic.bin",
       with_header(good, 0, 0x616b3432),
       {"versioned export", "only the legacy v0 format"}},
  };
  for (const Case& c : cases) {
    test::write_bytes(dir.path / c.name, c.bytes);
    auto frags = c.fragments;
    frags.push_back(dir / c.name);
    test::expect_error([&] { Model::load(dir / c.name); }, ErrorCode::kFileError, frags);
    try {
      Model::load(dir / c.name);
    } catch (const Error& e) {
      EXPECT_EQ(e.path(), dir / c.name);
    }
  }
  test::expect_error([&] { Model::load(dir / "missing.bin"); }, ErrorCode::kFileError,
                     {"missing.bin", "cannot open"});
  std::filesystem::create_directories(dir.path / "adir");
  test::expect_error([&] { Model::load_llama2c(dir / "adir"); }, ErrorCode::kFileError,
                     {"is a directory"});
}

// --- corrupt llama2.c tokenizers ----------------------------------------------------------------

TEST(EngineErrors, Llama2cTokenizers) {
  const test::TempDir dir("bad_tok");
  const std::string good = test::read_all(test::data("tok512.bin"));
  auto with_i32 = [](std::string b, std::size_t off, std::int32_t v) {
    std::memcpy(b.data() + off, &v, 4);
    return b;
  };
  struct Case {
    std::string bytes;
    std::int64_t vocab;
    std::vector<std::string> fragments;
  };
  const float nan = NAN;
  std::string nan_score = good;
  std::memcpy(nan_score.data() + 4, &nan, 4);
  const std::vector<Case> cases = {
      {"", 512, {"truncated llama2.c tokenizer", "max_token_length"}},
      {with_i32(good, 0, 0), 512, {"max_token_length must be in [1, 1048576], found 0"}},
      {good.substr(0, 3000),
       512,
       {"truncated llama2.c tokenizer", "does the model's vocab_size match"}},
      {good.substr(0, 3001),
       512,
       {"truncated llama2.c tokenizer", "does the model's vocab_size match"}},
      {with_i32(good, 8, -1), 512, {"the length of piece 0 of 512", "found -1"}},
      {with_i32(good, 8, 99),
       512,
       {"the length of piece 0 of 512 must be in [0, max_token_length = 7], found 99"}},
      {nan_score, 512, {"the score of piece 0 of 512 is not finite"}},
      {good, 500, {"bytes after the 500 pieces"}},
      {good, 600, {"truncated", "piece 512 of 600"}},
  };
  int i = 0;
  for (const Case& c : cases) {
    const std::string path = dir / ("t" + std::to_string(i++) + ".bin");
    test::write_bytes(path, c.bytes);
    auto frags = c.fragments;
    frags.push_back(path);
    test::expect_error([&] { engine::load_llama2c_tokenizer(path, c.vocab); },
                       ErrorCode::kFileError, frags);
  }
  // A tokenizer larger than the model's vocabulary, or none next to the model.
  const TinyModel tm;
  test::write_bytes(dir.path / "m" / "tiny.bin", tm.llama2c(true));
  const Model m = Model::load(dir / "m/tiny.bin");
  test::expect_error(
      [&] { engine::load_tokenizer("", m); }, ErrorCode::kFileError,
      {"no tokenizer found next to the model", "tok40.bin", "tokenizer.bin", "pass --tokenizer"});
  test::expect_error([&] { engine::load_tokenizer(test::data("tok512.bin"), m); },
                     ErrorCode::kFileError, {"tok512.bin", "bytes after the 40 pieces"});
}

// --- corrupt safetensors and config.json
// ----------------------------------------------------------

TEST(EngineErrors, SafetensorsHeaders) {
  const TinyModel tm;
  const test::TempDir dir("bad_st");
  test::write_bytes(dir.path / "config.json", tm.hf_config().dump());
  const std::string good = tm.hf_safetensors("F32", TinyModel::Head::kExplicit);
  std::uint64_t hl;
  std::memcpy(&hl, good.data(), 8);
  const std::string header = good.substr(8, hl), data = good.substr(8 + hl);
  auto edit = [&](const std::function<void(nlohmann::json&)>& f) {
    nlohmann::json h = nlohmann::json::parse(header);
    f(h);
    return test::safetensors_bytes(h.dump(), data);
  };
  const std::string q = "model.layers.0.self_attn.q_proj.weight";
  struct Case {
    std::string bytes;
    std::vector<std::string> fragments;
  };
  const std::vector<Case> cases = {
      {"abc", {"truncated safetensors file", "found 3"}},
      {test::safetensors_bytes("{}", "").replace(0, 8, std::string("\xff\xff\xff\x7f\0\0\0\0", 8)),
       {"header length", "exceeds"}},
      {test::safetensors_bytes("{\"a\": [1,", ""), {"not valid JSON"}},
      {test::safetensors_bytes("[1, 2]", ""), {"must be a JSON object, found array"}},
      {edit([&](auto& h) { h[q].erase("dtype"); }),
       {"tensor '" + q + "'", "missing string field 'dtype'"}},
      {edit([&](auto& h) { h[q]["dtype"] = "F33"; }), {"unknown dtype 'F33'"}},
      {edit([&](auto& h) {
         h[q]["shape"] = {16, -1};
       }),
       {"shape entries must be non-negative"}},
      {edit([&](auto& h) {
         h[q]["shape"] = {16, 8};
       }),
       {"span 1024 bytes", "F32 [16, 8] needs 512"}},
      {edit([&](auto& h) { h[q]["data_offsets"] = {0}; }), {"data_offsets"}},
      {edit([&](auto& h) { h[q]["data_offsets"][1] = 1u << 30; }),
       {"end past the data section", "truncated?"}},
      {test::safetensors_bytes(header, data.substr(0, data.size() - 4)),
       {"end past the data section"}},
      {test::safetensors_bytes(header, data + "xxxx"),
       {"cover", "expected them to cover it exactly"}},
      {edit([&](auto& h) { h.erase("model.norm.weight"); }), {"a gap before it"}},
      {edit([&](auto& h) {
         h["__metadata__"] = {{"format", 3}};
       }),
       {"__metadata__ entry 'format' must be a string"}},
      {edit([&](auto& h) { h[q]["dtype"] = "I32"; }),
       {"tensor '" + q + "' has dtype I32; supported: F32, F16, BF16"}},
  };
  int i = 0;
  for (const Case& c : cases) {
    const test::TempDir d("st" + std::to_string(i++));
    test::write_bytes(d.path / "config.json", tm.hf_config().dump());
    test::write_bytes(d.path / "model.safetensors", c.bytes);
    auto frags = c.fragments;
    frags.push_back(d / "model.safetensors");
    test::expect_error([&] { Model::load(d.path.string()); }, ErrorCode::kFileError, frags);
  }
  // Missing tensors and shapes that contradict config.json.
  const test::TempDir d("st_shape");
  test::write_bytes(d.path / "config.json", tm.hf_config().dump());
  test::write_bytes(d.path / "model.safetensors", edit([&](auto& h) {
                      auto e = h[q];
                      h.erase(q);
                      h["model.layers.0.self_attn.qq.weight"] = e;
                    }));
  test::expect_error([&] { Model::load(d.path.string()); }, ErrorCode::kFileError,
                     {"missing tensor '" + q + "'"});
  nlohmann::json cfg = tm.hf_config();
  cfg["num_key_value_heads"] = 4;
  test::write_bytes(d.path / "config.json", cfg.dump());
  test::write_bytes(d.path / "model.safetensors", good);
  test::expect_error([&] { Model::load(d.path.string()); }, ErrorCode::kFileError,
                     {"tensor 'model.layers.0.self_attn.k_proj.weight' has shape [8, 16], expected "
                      "[16, 16] from config.json"});
  // lm_head missing while config.json says the embeddings are not tied.
  cfg = tm.hf_config();
  cfg["tie_word_embeddings"] = false;
  test::write_bytes(d.path / "config.json", cfg.dump());
  test::write_bytes(d.path / "model.safetensors",
                    tm.hf_safetensors("F32", TinyModel::Head::kMissing));
  test::expect_error([&] { Model::load(d.path.string()); }, ErrorCode::kFileError,
                     {"missing tensor 'lm_head.weight'", "tie_word_embeddings to false"});
}

TEST(EngineErrors, ConfigJson) {
  const TinyModel tm;
  struct Case {
    std::string text;
    std::vector<std::string> fragments;
  };
  auto cfg = [&](const std::function<void(nlohmann::json&)>& f) {
    nlohmann::json j = tm.hf_config();
    f(j);
    return j.dump();
  };
  const std::vector<Case> cases = {
      {"{\"hidden_size\": ", {"not valid JSON"}},
      {"[]", {"must be a JSON object, found array"}},
      {cfg([](auto& j) { j.erase("hidden_size"); }), {"missing required key 'hidden_size'"}},
      {cfg([](auto& j) { j["hidden_size"] = "16"; }),
       {"'hidden_size' must be an integer, found \"16\""}},
      {cfg([](auto& j) { j["intermediate_size"] = 0; }),
       {"config.json 'intermediate_size' must be > 0, found 0"}},
      {cfg([](auto& j) { j["num_key_value_heads"] = 3; }),
       {"'num_attention_heads' (4) must be a multiple of", "(3)"}},
      {cfg([](auto& j) { j["model_type"] = "gpt2"; }),
       {"'model_type' is \"gpt2\"; only \"llama\" is supported"}},
      {cfg([](auto& j) {
         j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4}};
       }),
       {"'rope_scaling' type \"yarn\" is not supported", "\"llama3\""}},
      {cfg([](auto& j) {
         j["rope_scaling"] = {{"type", "linear"}};
       }),
       {"'rope_scaling' (\"linear\") is missing 'factor'"}},
      {cfg([](auto& j) {
         j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8}};
       }),
       {"'rope_scaling' (\"llama3\") is missing 'low_freq_factor'"}},
      {cfg([](auto& j) {
         j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8}, {"low_freq_factor", 4},
                              {"high_freq_factor", 1}, {"original_max_position_embeddings", 8192}};
       }),
       {"'high_freq_factor' (1) must be greater than 'low_freq_factor' (4)"}},
      {cfg([](auto& j) {
         j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 4}, {"beta_fast", 32}};
       }),
       {"key 'beta_fast' (32) is not read by the \"linear\" type"}},
      {cfg([](auto& j) {
         j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", -1}};
       }),
       {"'rope_scaling' 'factor' must be a finite number > 0, found -1"}},
      {cfg([](auto& j) {
         j["rope_scaling"] = {{"rope_type", "linear"}, {"type", "llama3"}, {"factor", 2}};
       }),
       {"has 'rope_type' \"linear\" and 'type' \"llama3\"; they must agree"}},
      {cfg([](auto& j) { j["rope_scaling"] = {{"factor", 2}}; }),
       {"'rope_scaling' names no 'rope_type'"}},
      {cfg([](auto& j) { j["rope_scaling"] = 5; }),
       {"'rope_scaling' must be an object or null, found 5"}},
      {cfg([](auto& j) { j["hidden_act"] = "gelu"; }), {"'hidden_act' is \"gelu\""}},
      {cfg([](auto& j) { j["rms_norm_eps"] = -1; }), {"'rms_norm_eps' must be in (0, 1)"}},
      {cfg([](auto& j) { j["eos_token_id"] = 99; }),
       {"'eos_token_id' = 99 is outside the vocabulary"}},
      {cfg([](auto& j) { j["tie_word_embeddings"] = "yes"; }),
       {"'tie_word_embeddings' must be true or false"}},
  };
  int i = 0;
  for (const Case& c : cases) {
    const test::TempDir d("cfg" + std::to_string(i++));
    test::write_bytes(d.path / "config.json", c.text);
    test::write_bytes(d.path / "model.safetensors",
                      tm.hf_safetensors("F32", TinyModel::Head::kExplicit));
    auto frags = c.fragments;
    frags.push_back(d / "config.json");
    test::expect_error([&] { Model::load(d.path.string()); }, ErrorCode::kFileError, frags);
  }
  const test::TempDir d("cfg_missing");
  test::expect_error([&] { Model::load(d.path.string()); }, ErrorCode::kFileError,
                     {"config.json", "cannot open"});
}

TEST(EngineErrors, TokenizerJson) {
  struct Case {
    std::string text;
    std::vector<std::string> fragments;
  };
  const nlohmann::json base = {
      {"model",
       {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}}}, {"merges", {"a b"}}}}};
  auto tj = [&](const std::function<void(nlohmann::json&)>& f) {
    nlohmann::json j = base;
    f(j);
    return j.dump();
  };
  const std::vector<Case> cases = {
      {"{\"model\": {", {"not valid JSON"}},
      {"{}", {"missing 'model'"}},
      {tj([](auto& j) { j["model"]["type"] = "Unigram"; }),
       {"model type 'Unigram' is not supported (only BPE)"}},
      {tj([](auto& j) { j["model"]["merges"] = {"a c"}; }),
       {"merge #0", "'c' is not in model.vocab"}},
      {tj([](auto& j) { j["model"]["merges"] = {"a b c"}; }),
       {"must be two pieces separated by one space"}},
      {tj([](auto& j) { j["model"]["vocab"]["c"] = 0; }), {"gives id 0 to both"}},
      {tj([](auto& j) { j["model"]["vocab"]["c"] = -4; }), {"model.vocab['c'] must be an id"}},
      {tj([](auto& j) { j["model"]["dropout"] = 0.1; }), {"model.dropout 0.1 is not supported"}},
      {tj([](auto& j) { j["model"]["unk_token"] = "<unk>"; }),
       {"model.unk_token '<unk>' is not in model.vocab"}},
      {tj([](auto& j) {
         j["normalizer"] = {{"type", 5}};
       }),
       {"malformed tokenizer.json", "type must be string"}},
      {tj([](auto& j) {
         j["normalizer"] = {{"type", "Lowercase"}};
       }),
       {"normalizer 'Lowercase' is not supported"}},
      {tj([](auto& j) {
         j["pre_tokenizer"] = {{"type", "Whitespace"}};
       }),
       {"pre_tokenizer: 'Whitespace' is not supported"}},
      {tj([](auto& j) {
         j["decoder"] = {{"type", "WordPiece"}};
       }),
       {"decoder 'WordPiece' is not supported"}},
      {tj([](auto& j) {
         j["post_processor"] = {{"type", "TemplateProcessing"},
                                {"single", {{{"SpecialToken", {{"id", "<s>"}}}}}},
                                {"special_tokens", nlohmann::json::object()}};
       }),
       {"names special token '<s>' but special_tokens has no ids"}},
      {tj([](auto& j) {
         j["added_tokens"] = {{{"id", 1}, {"content", "zz"}}};
       }),
       {"added token 'zz' has id 1, which model.vocab gives to 'b'"}},
  };
  int i = 0;
  for (const Case& c : cases) {
    const test::TempDir d("tj" + std::to_string(i++));
    test::write_bytes(d.path / "tokenizer.json", c.text);
    auto frags = c.fragments;
    frags.push_back(d / "tokenizer.json");
    test::expect_error([&] { engine::load_hf_tokenizer(d / "tokenizer.json"); },
                       ErrorCode::kFileError, frags);
  }
  // A tokenizer whose ids do not fit the model.
  const TinyModel tm;
  const test::TempDir d("tj_vocab");
  test::write_bytes(d.path / "config.json", tm.hf_config().dump());
  test::write_bytes(d.path / "model.safetensors",
                    tm.hf_safetensors("F32", TinyModel::Head::kExplicit));
  nlohmann::json big = base;
  big["model"]["vocab"]["zzz"] = 45;
  test::write_bytes(d.path / "tokenizer.json", big.dump());
  const Model m = Model::load(d.path.string());
  test::expect_error([&] { engine::load_tokenizer("", m); }, ErrorCode::kFileError,
                     {"has ids up to 45, but the model's vocab_size is 40"});
}

}  // namespace
}  // namespace vq
