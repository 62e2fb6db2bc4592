// tokenizer.json pre-tokenizers, normalizers and decoders beyond plain BPE (Metaspace,
// ByteLevel, Split, Sequence, NFC), on tiny hand-made vocabularies whose expected ids are
// worked out by hand from the components' definitions, and the errors unsupported components
// give (naming the component).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "engine/formats/gguf.h"
#include "engine/run/gguf_convert.h"
#include "engine/tokenizers/gguf_tokenizer.h"
#include "engine/formats/gguf_writer.h"
#include "engine/tokenizers/pretokenize.h"
#include "engine/tokenizers/tokenizer.h"
#include "engine_test_util.h"
#include "tokenizer_scaling.h"
#include "veloxquant/errors.h"

namespace vq {
namespace {
using nlohmann::json;

const std::string kMeta = "\xE2\x96\x81";  // U+2581
const std::string kG = "\xC4\xA0";         // U+0120: ' ' in the byte-level alphabet

std::unique_ptr<engine::Tokenizer> load(const json& j) {
  const test::TempDir dir("hf_pre");
  test::write_bytes(dir.path / "tokenizer.json", j.dump());
  return engine::load_hf_tokenizer(dir / "tokenizer.json");
}

json bpe(json vocab, json merges) {
  return {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"unk_token", nullptr}};
}

TEST(HfPreTokenizers, Metaspace) {
  const json model = bpe({{"<unk>", 0},
                          {kMeta, 1},
                          {"a", 2},
                          {"b", 3},
                          {kMeta + "a", 4},
                          {kMeta + "ab", 5},
                          {"ab", 6}},
                         {kMeta + " a", "a b", kMeta + "a b"});
  auto tok = [&](const std::string& scheme, bool split) {
    return load(
        {{"model", model},
         {"pre_tokenizer",
          {{"type", "Metaspace"},
           {"replacement", kMeta},
           {"prepend_scheme", scheme},
           {"split", split}}},
         {"decoder", {{"type", "Metaspace"}, {"replacement", kMeta}, {"prepend_scheme", scheme}}}});
  };
  // "b ab" -> "▁b▁ab" (spaces replaced, ▁ prepended) -> split before each ▁: "▁b", "▁ab".
  // "▁b": no merge ▁+b -> 1, 3. "▁ab": ▁+a (rank 0) before a+b (1) -> ▁a, b -> ▁a+b (2) -> 5.
  EXPECT_EQ(tok("always", true)->encode("b ab", false), (std::vector<std::int32_t>{1, 3, 5}));
  // Never prepending: "b▁ab" -> "b", "▁ab".
  EXPECT_EQ(tok("never", true)->encode("b ab", false), (std::vector<std::int32_t>{3, 5}));
  // Without split the word is "▁b▁ab": the merges happen the same way inside it.
  EXPECT_EQ(tok("first", false)->encode("b ab", false), (std::vector<std::int32_t>{1, 3, 5}));
  // The decoder turns ▁ back into spaces and drops the prepended one.
  EXPECT_EQ(tok("always", true)->decode({1, 3, 5}), "b ab");
}

TEST(HfPreTokenizers, ByteLevelAndSplitRegexes) {
  // ByteLevel alone: " a b" (prefix space added) -> GPT-2 regex " a", " b" -> "Ġa", "Ġb".
  const json bl_model = bpe({{"a", 0}, {"b", 1}, {kG, 2}, {kG + "a", 3}}, {kG + " a"});
  const auto bl = load({{"model", bl_model},
                        {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", true}}},
                        {"decoder", {{"type", "ByteLevel"}}}});
  EXPECT_EQ(bl->encode("a b", false), (std::vector<std::int32_t>{3, 2, 1}));
  EXPECT_EQ(bl->decode({3, 2, 1}), " a b");
  // Split with Llama 3's regex (digits in runs of at most three) vs Qwen2's (one digit each),
  // then ByteLevel without its own regex: "a1234" -> "a", "123", "4" vs "a", "1", "2", "3", "4".
  const json digits = bpe({{"a", 0}, {"1", 1}, {"2", 2}, {"3", 3}, {"4", 4}, {"12", 5}, {"123", 6}},
                          {"1 2", "12 3"});
  auto split = [&](const char* regex) {
    return load(
        {{"model", digits},
         {"pre_tokenizer",
          {{"type", "Sequence"},
           {"pretokenizers",
            {{{"type", "Split"},
              {"pattern", {{"Regex", regex}}},
              {"behavior", "Isolated"},
              {"invert", false}},
             {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}}});
  };
  EXPECT_EQ(split(engine::kLlama3SplitRegex)->encode("a1234", false),
            (std::vector<std::int32_t>{0, 6, 4}));
  EXPECT_EQ(split(engine::kQwen2SplitRegex)->encode("a1234", false),
            (std::vector<std::int32_t>{0, 1, 2, 3, 4}));
}

TEST(HfPreTokenizers, SplitThenByteLevelIsLinearInTheText) {
  // Llama 3's Split regex then ByteLevel (as Llama 3's tokenizer.json), over a byte-level
  // vocabulary of the ASCII letters with a few merges.
  json vocab = json::object();
  for (int c = 33; c < 127; ++c) vocab[std::string(1, static_cast<char>(c))] = c - 33;
  vocab[kG] = 94;
  vocab["th"] = 95;
  vocab["the"] = 96;
  vocab[kG + "the"] = 97;
  const auto tok = load(
      {{"model", bpe(vocab, {"t h", "th e", kG + " the"})},
       {"pre_tokenizer",
        {{"type", "Sequence"},
         {"pretokenizers",
          {{{"type", "Split"},
            {"pattern", {{"Regex", engine::kLlama3SplitRegex}}},
            {"behavior", "Isolated"},
            {"invert", false}},
           {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}}});
  test::expect_linear_encode(*tok);
}

TEST(HfPreTokenizers, NfcNormalizer) {
  // "e" + U+0301 (combining acute) composes to U+00E9 under NFC: one token instead of an
  // unknown character.
  const json model = bpe({{"<unk>", 0}, {"e", 1}, {"\xC3\xA9", 2}}, json::array());
  json j = {{"model", model}, {"normalizer", {{"type", "NFC"}}}};
  j["model"]["unk_token"] = "<unk>";
  EXPECT_EQ(load(j)->encode("e\xCC\x81", false), (std::vector<std::int32_t>{2}));
  j["normalizer"] = nullptr;
  EXPECT_EQ(load(j)->encode("e\xCC\x81", false), (std::vector<std::int32_t>{1, 0}));
}

TEST(HfPreTokenizers, UnsupportedComponentsAreNamed) {
  const json model = bpe({{"a", 0}}, json::array());
  auto error = [&](const json& extra) {
    json j = {{"model", model}};
    j.update(extra);
    try {
      load(j);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kFileError);
      return std::string(e.what());
    }
    return std::string("(loaded)");
  };
  EXPECT_NE(
      error({{"pre_tokenizer", {{"type", "Whitespace"}}}}).find("'Whitespace' is not supported"),
      std::string::npos);
  EXPECT_NE(error({{"pre_tokenizer",
                    {{"type", "Split"}, {"pattern", {{"Regex", "a"}}}, {"behavior", "Removed"}}}})
                .find("Split behavior 'Removed'"),
            std::string::npos);
  EXPECT_NE(error({{"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "("}}}}}})
                .find("does not compile"),
            std::string::npos);
  EXPECT_NE(error({{"normalizer", {{"type", "Lowercase"}}}}).find("'Lowercase'"),
            std::string::npos);
  EXPECT_NE(error({{"decoder", {{"type", "WordPiece"}}}}).find("'WordPiece'"), std::string::npos);
}

}  // namespace
}  // namespace vq

namespace vq {
namespace {

TEST(HfPreTokenizers, ByteLevelTokenizerJsonExportsAsGgufGpt2) {
  // A byte-level tokenizer.json (Llama 3's Split regex + ByteLevel) written into GGUF metadata
  // becomes model "gpt2" with pre "llama-bpe", and the GGUF tokenizer (llama.cpp's algorithm)
  // encodes as the tokenizer.json reader (the tokenizers library's algorithm) does.
  json vocab = json::object();
  std::vector<std::string> alphabet;
  for (int b = 0; b < 256; ++b) {
    alphabet.push_back(engine::byte_level_encode(std::string(1, static_cast<char>(b))));
    vocab[alphabet.back()] = b;
  }
  const std::vector<std::string> merges = {kG + " a", "a b", kG + "a b", "1 2", "12 3"};
  int id = 256;
  for (const std::string& m : merges) {
    const std::size_t sp = m.find(' ');
    vocab[m.substr(0, sp) + m.substr(sp + 1)] = id++;
  }
  const json j = {
      {"model", bpe(vocab, merges)},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", engine::kLlama3SplitRegex}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
      {"decoder", {{"type", "ByteLevel"}}}};
  const test::TempDir dir("hf_export");
  test::write_bytes(dir.path / "tokenizer.json", j.dump());
  engine::GgufWriter w;
  EXPECT_EQ(engine::add_hf_vocab(w, dir / "tokenizer.json", id, -1, -1), "gpt2");
  const auto bytes = w.serialize();
  const engine::GgufFile g = engine::GgufFile::parse(bytes.data(), bytes.size(), "export.gguf");
  EXPECT_EQ(g.get_string("tokenizer.ggml.pre"), "llama-bpe");
  const auto from_gguf = engine::load_gguf_tokenizer(g);
  const auto from_json = engine::load_hf_tokenizer(dir / "tokenizer.json");
  for (const std::string text :
       {"ab ab abc", "x 12345 ab\n\n  ab!", "caf\xC3\xA9 \xF0\x9F\xA6\x99"}) {
    EXPECT_EQ(from_gguf->encode(text, false), from_json->encode(text, false)) << text;
    EXPECT_EQ(from_gguf->decode(from_gguf->encode(text, false)), text);
  }
  // " ab" -> Ġ a b: a+b (rank 1) loses to Ġ+a (rank 0), then Ġa+b (rank 2): one token.
  EXPECT_EQ(from_gguf->encode(" ab", false), (std::vector<std::int32_t>{258}));
}

}  // namespace
}  // namespace vq
