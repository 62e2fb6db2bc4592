// Sharded Hugging Face checkpoints (model-0000K-of-0000N.safetensors +
// model.safetensors.index.json): the same weights split over two or three shards give the
// single-file model's logits bit for bit, from every path that names the checkpoint; every
// inconsistency between the index and the shards is an Error(kFileError) naming the file and what
// was expected vs found.
#include <filesystem>

#include "engine/model/model.h"
#include "engine_test_util.h"

namespace vq {
namespace {
using engine::Model;
using test::run_logits;
using test::ShardedSafetensors;
using test::TinyModel;
namespace fs = std::filesystem;

// config.json and model.safetensors in `dir` (the reference), and the same tensors split over
// `n` shards in `dir`/sharded (its own config.json).
ShardedSafetensors write_both(const test::TempDir& dir, const TinyModel& tm,
                              const std::string& dtype, TinyModel::Head head, int n) {
  test::write_bytes(dir.path / "config.json", tm.hf_config().dump(2));
  const std::string single = tm.hf_safetensors(dtype, head);
  test::write_bytes(dir.path / "model.safetensors", single);
  test::write_bytes(dir.path / "sharded" / "config.json", tm.hf_config().dump(2));
  ShardedSafetensors s(single, n);
  s.write(dir.path / "sharded");
  return s;
}

TEST(HfShards, LogitsAreTheSingleFileModelsFromEveryPath) {
  for (const char* dtype : {"F32", "BF16", "F16"}) {
    for (const int n : {2, 3}) {
      SCOPED_TRACE(std::string(dtype) + ", " + std::to_string(n) + " shards");
      const test::TempDir dir("shards_logits");
      const TinyModel tm(11, std::string(dtype) == "BF16" ? "bf16" : "f16");
      const ShardedSafetensors s = write_both(dir, tm, dtype, TinyModel::Head::kSeparate, n);
      ASSERT_EQ(s.shards.size(), static_cast<std::size_t>(n));
      for (const auto& [file, names] : s.shards) ASSERT_FALSE(names.empty()) << file;
      const Model single = Model::load(dir.path.string());
      const auto want = run_logits(single);
      EXPECT_GT(test::max_abs_diff(want, std::vector<float>(want.size(), 0.0f)), 0.1);
      const fs::path sh = dir.path / "sharded";
      std::vector<std::string> paths = {sh.string(), (sh / "model.safetensors.index.json").string(),
                                        (sh / "config.json").string(),
                                        (sh / "model.safetensors").string()};  // absent: its index
      for (const auto& [file, names] : s.shards) paths.push_back((sh / file).string());
      for (const std::string& p : paths) {
        SCOPED_TRACE(p);
        const Model m = Model::load(p);
        EXPECT_EQ(m.path(), (sh / "model.safetensors.index.json").string());
        EXPECT_EQ(m.directory(), sh.string());
        EXPECT_EQ(m.config().format, "hf");
        EXPECT_EQ(m.config().weights_dtype, single.config().weights_dtype);
        EXPECT_FALSE(m.config().tied_classifier);
        EXPECT_EQ(m.weights().layers[0].wq.type, single.weights().layers[0].wq.type);
        EXPECT_EQ(run_logits(m), want);
      }
    }
  }
}

TEST(HfShards, ModelKeepsEveryShardMappedForItsLifetime) {
  // The model is moved out of the loader and every file is deleted before it runs: the
  // mappings it holds are what the forward pass reads (unmapped ones would fault, and ASan
  // builds report them).
  const test::TempDir dir("shards_life");
  const TinyModel tm(12, "f16");
  write_both(dir, tm, "F16", TinyModel::Head::kSeparate, 3);
  const auto want = run_logits(Model::load(dir.path.string()));
  Model m = Model::load((dir.path / "sharded").string());
  fs::remove_all(dir.path);
  Model moved = std::move(m);
  EXPECT_EQ(run_logits(moved), want);
}

TEST(HfShards, TiedEmbeddingsAcrossShards) {
  // No lm_head (tied), and the __metadata__ alias for an embedding stored as lm_head.weight
  // (the alias is in every shard's metadata, as in the single file).
  for (const auto head : {TinyModel::Head::kMissing, TinyModel::Head::kMetadataAlias}) {
    const test::TempDir dir("shards_tied");
    const TinyModel tm(13, "f16");
    write_both(dir, tm, "F32", head, 2);
    const Model single = Model::load(dir.path.string());
    const Model m = Model::load((dir.path / "sharded").string());
    EXPECT_TRUE(m.config().tied_classifier);
    EXPECT_EQ(run_logits(m), run_logits(single));
  }
}

TEST(HfShards, SingleFileWinsAndOtherFilesLoadAlone) {
  // model.safetensors beside an index: the single file loads and the index is not read (here
  // it is not even JSON), as Transformers prefers model.safetensors. A .safetensors file the
  // index does not list loads alone, as before.
  const test::TempDir dir("shards_precedence");
  const TinyModel tm(14, "f16");
  write_both(dir, tm, "F32", TinyModel::Head::kExplicit, 2);
  test::write_bytes(dir.path / "model.safetensors.index.json", "not json");
  const Model a = Model::load(dir.path.string());
  EXPECT_EQ(a.path(), (dir.path / "model.safetensors").string());
  const auto want = run_logits(a);
  EXPECT_EQ(run_logits(Model::load(dir / "model.safetensors")), want);
  const fs::path sh = dir.path / "sharded";
  test::write_bytes(sh / "whole.safetensors", tm.hf_safetensors("F32", TinyModel::Head::kExplicit));
  const Model w = Model::load((sh / "whole.safetensors").string());
  EXPECT_EQ(w.path(), (sh / "whole.safetensors").string());
  EXPECT_EQ(run_logits(w), want);
}

// --- inconsistent indexes and shards -------------------------------------------------------

struct ShardedDir {
  test::TempDir dir;
  TinyModel tm;
  ShardedSafetensors s;
  ShardedDir(const std::string& name, int n = 2)
      : dir("shards_err_" + name),
        tm(15, "f16"),
        s(tm.hf_safetensors("F32", TinyModel::Head::kSeparate), n) {
    test::write_bytes(dir.path / "config.json", tm.hf_config().dump());
  }
  std::string index() const { return dir / "model.safetensors.index.json"; }
  std::string shard(std::size_t k) const { return dir / s.shards[k].first; }
  // Removes `tensor` from shard `from` (the files only; the index is unchanged).
  void take(std::size_t from, const std::string& tensor) {
    auto& v = s.shards[from].second;
    const auto it = std::find(v.begin(), v.end(), tensor);
    ASSERT_NE(it, v.end()) << tensor << " is not in " << s.shards[from].first;
    v.erase(it);
  }
  void expect(std::vector<std::string> fragments, const std::string& file) {
    s.write(dir.path);
    fragments.push_back("'" + file + "'");
    test::expect_error([&] { Model::load(dir.path.string()); }, ErrorCode::kFileError, fragments);
  }
};

const std::string kNorm = "model.norm.weight";           // in the last shard
const std::string kEmbed = "model.embed_tokens.weight";  // in the first shard

TEST(HfShardsErrors, IndexNotAnObjectWithAWeightMapOfStrings) {
  struct Case {
    std::string text;
    std::vector<std::string> fragments;
  };
  const std::vector<Case> cases = {
      {"{\"weight_map\": ", {"not valid JSON"}},
      {"[1, 2]", {"safetensors index must be a JSON object, found array"}},
      {"{\"metadata\": {\"total_size\": 4}}", {"has no 'weight_map' object"}},
      {"{\"weight_map\": [\"a\"]}", {"'weight_map' must be an object", "found [\"a\"]"}},
      {"{\"weight_map\": {}}", {"'weight_map' is empty"}},
      {"{\"weight_map\": {\"model.norm.weight\": 3}}",
       {"'weight_map' entry 'model.norm.weight' must be a string", "found 3"}},
      {std::string(200, '[') + std::string(200, ']'),
       {"safetensors index nests arrays/objects deeper than"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text.substr(0, 40));
    ShardedDir t("index");
    t.s.write(t.dir.path);
    test::write_bytes(t.index(), c.text);
    auto frags = c.fragments;
    frags.push_back("'" + t.index() + "'");
    test::expect_error([&] { Model::load(t.dir.path.string()); }, ErrorCode::kFileError, frags);
  }
}

TEST(HfShardsErrors, IndexSizeIsBoundedLikeConfigJson) {
  // One byte over read_text_file's 64 MiB cap (a sparse file: nothing is written).
  ShardedDir t("big");
  t.s.write(t.dir.path);
  fs::resize_file(t.index(), (std::uintmax_t{64} << 20) + 1);
  test::expect_error([&] { Model::load(t.dir.path.string()); }, ErrorCode::kFileError,
                     {"'" + t.index() + "'", "is larger than the 64"});
}

TEST(HfShardsErrors, ShardPathsMustStayInTheDirectory) {
  const std::vector<std::string> bads = {"../model-00001-of-00002.safetensors",
                                         "/etc/passwd",
                                         "sub/model-00001-of-00002.safetensors",
                                         "..",
                                         "",
                                         std::string("model-00001-of-00002.safetensors\0x", 34)};
  for (const std::string& bad : bads) {
    SCOPED_TRACE(bad);
    ShardedDir t("escape");
    t.s.index["weight_map"][kEmbed] = bad;
    t.expect({"'weight_map' entry '" + kEmbed + "' names shard",
              "expected a file name in the index's directory"},
             t.index());
  }
  // The NUL is shown escaped, not cut off.
  ShardedDir t("nul");
  t.s.index["weight_map"][kEmbed] = std::string("model-00001-of-00002.safetensors\0x", 34);
  t.expect({"safetensors\\x00x"}, t.index());
}

TEST(HfShardsErrors, MissingShardIsNamed) {
  ShardedDir t("missing", 3);
  t.s.write(t.dir.path);
  fs::remove(t.shard(1));
  test::expect_error(
      [&] { Model::load(t.dir.path.string()); }, ErrorCode::kFileError,
      {"'" + t.shard(1) + "'", "shard file not found", "the index '" + t.index() + "' maps",
       std::to_string(t.s.shards[1].second.size()) + " tensor(s) to it"});
}

TEST(HfShardsErrors, IndexedTensorAbsentFromItsShard) {
  ShardedDir t("absent");
  t.take(1, kNorm);
  t.expect(
      {"has no tensor '" + kNorm + "', which the index '" + t.index() + "' maps to this shard"},
      t.shard(1));
}

TEST(HfShardsErrors, TensorInAnotherShardThanTheIndexSays) {
  ShardedDir t("moved");
  t.take(1, kNorm);
  t.s.shards[0].second.push_back(kNorm);
  t.expect({"holds tensor '" + kNorm + "', which the index '" + t.index() + "' maps to \"" +
                t.s.shards[1].first + "\"",
            "ambiguous"},
           t.shard(0));
}

TEST(HfShardsErrors, TensorTheIndexDoesNotList) {
  ShardedDir t("unlisted");
  t.s.index["weight_map"].erase(kNorm);
  t.expect({"holds tensor '" + kNorm + "', which the index '" + t.index() + "' does not list",
            "ambiguous"},
           t.shard(1));
}

TEST(HfShardsErrors, TensorInTwoShards) {
  ShardedDir t("twice");
  t.s.shards[0].second.push_back(kNorm);  // and still in shard 1, where the index maps it
  t.expect(
      {"holds tensor '" + kNorm + "', which shard '" + t.shard(0) + "' holds too", "ambiguous"},
      t.shard(1));
}

TEST(HfShardsErrors, ShapeDtypeAndHeaderErrorsNameTheShard) {
  const std::string k = "model.layers.0.self_attn.k_proj.weight";  // the first k checked
  {
    ShardedDir t("shape");
    nlohmann::json cfg = t.tm.hf_config();
    cfg["num_key_value_heads"] = 4;
    test::write_bytes(t.dir.path / "config.json", cfg.dump());
    const std::size_t holder = t.s.index["weight_map"][k] == t.s.shards[0].first ? 0 : 1;
    t.expect({"tensor '" + k + "' has shape [8, 16], expected [16, 16] from config.json"},
             t.shard(holder));
  }
  {
    ShardedDir t("dtype");
    t.s.tensors[kNorm].entry["dtype"] = "I32";
    t.expect({"tensor '" + kNorm + "' has dtype I32; supported: F32, F16, BF16"}, t.shard(1));
  }
  {
    ShardedDir t("truncated");
    t.s.write(t.dir.path);
    const std::string bytes = t.s.shard_bytes(1);
    test::write_bytes(t.shard(1), bytes.substr(0, bytes.size() - 4));
    test::expect_error([&] { Model::load(t.dir.path.string()); }, ErrorCode::kFileError,
                       {"'" + t.shard(1) + "'", "end past the data section"});
  }
  {
    // The config.json names a tensor no shard has.
    ShardedDir t("missing_tensor");
    nlohmann::json cfg = t.tm.hf_config();
    cfg["num_hidden_layers"] = 3;
    test::write_bytes(t.dir.path / "config.json", cfg.dump());
    t.expect({"missing tensor 'model.layers.2.input_layernorm.weight'"}, t.index());
  }
}

TEST(HfShardsErrors, ShardsDisagreeOnATiedAlias) {
  ShardedDir t("alias");
  t.s.shard_metadata[0]["lm_head.weight"] = kEmbed;
  t.s.shard_metadata[1]["lm_head.weight"] = kNorm;
  t.take(1, "lm_head.weight");
  t.s.index["weight_map"].erase("lm_head.weight");
  t.expect({"__metadata__ 'lm_head.weight' is \"" + kNorm + "\", but shard '" + t.shard(0) +
            "' gives \"" + kEmbed + "\""},
           t.shard(1));
}

}  // namespace
}  // namespace vq
