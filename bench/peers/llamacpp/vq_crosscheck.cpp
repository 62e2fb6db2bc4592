// vq_crosscheck: the VeloxQuant side of scripts/crosscheck_llamacpp.sh, with the same modes and
// output as llamacpp_driver.c so the script can diff them line by line:
//   vq_crosscheck tokenize MODEL TEXT_FILE       ids of the text (the model's tokenizer, BOS added)
//   vq_crosscheck tokenize-tests VOCAB INP       llama.cpp's tokenizer test format (see
//                                                llamacpp_driver.c), no special tokens; VOCAB
//                                                is a GGUF file or a tokenizer.json
//   vq_crosscheck synth TOKENIZER.bin OUT.gguf   a random Llama (dim 256, hidden 768, 2 layers,
//                                                4 query / 2 KV heads of 64, vocab 512, context
//                                                512, f32) with the llama2.c tokenizer's
//                                                vocabulary: rows of 256 and 768 values fit
//                                                llama.cpp's K-quant blocks, so its Q4_K / Q6_K
//                                                quantizer output can be read back
//   vq_crosscheck dequant MODEL.gguf              per tensor "name type_id n_values hash" of
//                                                VeloxQuant's dequantization (as the driver)
//   vq_crosscheck tokenizer-bin VOCAB.gguf OUT.bin
//                                                writes a SentencePiece ("llama") GGUF
//                                                vocabulary as a llama2.c tokenizer.bin (pieces
//                                                with U+2581 as ' ', scores), which `veloxquant
//                                                convert --tokenizer` reads: how
//                                                bench/peers/run_llamacpp.sh gives the 32000-id
//                                                llama-110m shape Llama 2's vocabulary
//   vq_crosscheck hf-json VOCAB.gguf llama3|qwen2 OUT.json
//                                                writes the GGUF's byte-level vocabulary as a
//                                                Hugging Face tokenizer.json with that model's
//                                                normalizer / pre-tokenizer / decoder, so the
//                                                HF reader can be run on llama.cpp's tests
//   vq_crosscheck greedy   MODEL STEPS [KV]      BOS, then argmax until STEPS positions or EOS
//   vq_crosscheck nll      MODEL TEXT_FILE N [KV] per-token -ln p(next) of the first N tokens,
//                                                then "mean M over P predictions"
// KV is the full cache's storage: f32 (default) or f16. With VQ_CROSSCHECK_Q8_0_ACTIVATIONS=f32
// in the environment, Q8_0 weights multiply fp32 activations (engine/matmul.h's kF32) instead of
// the default Q8_0-quantized ones, to report what the activation rounding costs.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/run/evaluate.h"
#include "engine/formats/gguf.h"
#include "engine/run/gguf_convert.h"
#include "engine/tokenizers/gguf_tokenizer.h"
#include "engine/formats/gguf_writer.h"
#include "engine/formats/mapped_file.h"
#include "engine/compute/matmul.h"
#include "engine/model/model.h"
#include "engine/tokenizers/pretokenize.h"
#include "engine/tokenizers/tokenizer.h"
#include "engine/model/transformer.h"
#include "veloxquant/builder.h"
#include "veloxquant/config.h"
#include "veloxquant/errors.h"

namespace {

vq::CacheConfig full_cache(const char* kv) {
  return vq::CacheConfig::parse(std::string("full:kv_dtype=") + kv);
}

// The tokenizer.json the Llama 3 / Qwen2 Hugging Face repositories ship, rebuilt from a GGUF
// vocabulary (tokens, merges, control tokens as special added tokens).
int write_hf_json(const std::string& gguf, const std::string& which, const std::string& out) {
  using nlohmann::json;
  const vq::engine::GgufVocab v = vq::engine::read_gguf_vocab(vq::engine::GgufFile::open(gguf));
  json vocab = json::object();
  json added = json::array();
  for (std::size_t i = 0; i < v.tokens.size(); ++i) {
    const std::int32_t type = v.types.empty() ? 1 : v.types[i];
    if (type == 3 || type == 4) {
      added.push_back({{"id", i},
                       {"content", v.tokens[i]},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", type == 3}});
    }
    vocab[v.tokens[i]] = i;
  }
  const bool llama3 = which == "llama3";
  const std::string regex = llama3 ? vq::engine::kLlama3SplitRegex : vq::engine::kQwen2SplitRegex;
  json j = {{"version", "1.0"},
            {"added_tokens", added},
            {"normalizer", llama3 ? json(nullptr) : json({{"type", "NFC"}})},
            {"pre_tokenizer",
             {{"type", "Sequence"},
              {"pretokenizers",
               {{{"type", "Split"},
                 {"pattern", {{"Regex", regex}}},
                 {"behavior", "Isolated"},
                 {"invert", false}},
                {{"type", "ByteLevel"},
                 {"add_prefix_space", false},
                 {"trim_offsets", true},
                 {"use_regex", false}}}}}},
            {"post_processor", nullptr},
            {"decoder", {{"type", "ByteLevel"}}},
            {"model",
             {{"type", "BPE"},
              {"vocab", vocab},
              {"merges", v.merges},
              {"ignore_merges", llama3},
              {"byte_fallback", false},
              {"fuse_unk", false},
              {"unk_token", nullptr}}}};
  std::ofstream(out) << j.dump();
  return 0;
}

// llama2.c's tokenizer.bin: i32 max_token_length, then per id: f32 score, i32 length, bytes.
int write_tokenizer_bin(const std::string& gguf, const std::string& out) {
  const vq::engine::GgufVocab v = vq::engine::read_gguf_vocab(vq::engine::GgufFile::open(gguf));
  if (v.model != "llama" || v.scores.size() != v.tokens.size()) {
    std::fprintf(stderr,
                 "vq_crosscheck: %s: expected a \"llama\" vocabulary with scores, got \"%s\"\n",
                 gguf.c_str(), v.model.c_str());
    return 1;
  }
  const std::string space = "\xe2\x96\x81";  // U+2581, SentencePiece's word boundary
  std::vector<std::string> pieces;
  std::int32_t max_len = 0;
  for (const std::string& t : v.tokens) {
    std::string p;
    for (std::size_t i = 0; i < t.size();) {
      if (t.compare(i, space.size(), space) == 0) {
        p += ' ';
        i += space.size();
      } else {
        p += t[i++];
      }
    }
    max_len = std::max(max_len, static_cast<std::int32_t>(p.size()));
    pieces.push_back(std::move(p));
  }
  std::ofstream f(out, std::ios::binary);
  f.write(reinterpret_cast<const char*>(&max_len), 4);
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const std::int32_t len = static_cast<std::int32_t>(pieces[i].size());
    f.write(reinterpret_cast<const char*>(&v.scores[i]), 4);
    f.write(reinterpret_cast<const char*>(&len), 4);
    f.write(pieces[i].data(), len);
  }
  if (!f) {
    std::fprintf(stderr, "vq_crosscheck: cannot write %s\n", out.c_str());
    return 1;
  }
  return 0;
}

int write_synth(const std::string& tokenizer, const std::string& out) {
  const std::int64_t dim = 256, hid = 768, layers = 2, heads = 4, kv_heads = 2, hd = 64,
                     vocab = 512;
  std::uint64_t state = 0x9E3779B97F4A7C15ull;
  auto randn = [&](std::int64_t n, float scale) {  // xorshift64*, sums of 4 uniforms
    std::vector<float> v(static_cast<std::size_t>(n));
    for (float& x : v) {
      float acc = 0;
      for (int k = 0; k < 4; ++k) {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        acc += static_cast<float>((state * 2685821657736338717ull) >> 40) / 16777216.0f - 0.5f;
      }
      x = acc * scale * 1.7f;
    }
    return v;
  };
  auto ones = [](std::int64_t n) { return std::vector<float>(static_cast<std::size_t>(n), 1.0f); };
  vq::engine::GgufWriter w;
  using V = vq::engine::GgufValue;
  w.set("general.architecture", V::str("llama"));
  w.set("general.name", V::str("synthetic-256"));
  w.set("llama.context_length", V::u32(512));
  w.set("llama.embedding_length", V::u32(dim));
  w.set("llama.block_count", V::u32(layers));
  w.set("llama.feed_forward_length", V::u32(hid));
  w.set("llama.rope.dimension_count", V::u32(hd));
  w.set("llama.attention.head_count", V::u32(heads));
  w.set("llama.attention.head_count_kv", V::u32(kv_heads));
  w.set("llama.attention.layer_norm_rms_epsilon", V::f32(1e-5f));
  w.set("llama.rope.freq_base", V::f32(10000.0f));
  vq::engine::add_llama2c_vocab(w, tokenizer, vocab);
  const auto f32 = vq::engine::GgmlType::kF32;
  w.add_tensor("token_embd.weight", {dim, vocab}, f32, randn(dim * vocab, 1.0f).data());
  for (std::int64_t l = 0; l < layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const float s = 1.0f / 16;  // 1/sqrt(dim)
    w.add_tensor(p + "attn_norm.weight", {dim}, f32, ones(dim).data());
    w.add_tensor(p + "attn_q.weight", {dim, heads * hd}, f32, randn(dim * heads * hd, s).data());
    w.add_tensor(p + "attn_k.weight", {dim, kv_heads * hd}, f32,
                 randn(dim * kv_heads * hd, s).data());
    w.add_tensor(p + "attn_v.weight", {dim, kv_heads * hd}, f32,
                 randn(dim * kv_heads * hd, s).data());
    w.add_tensor(p + "attn_output.weight", {heads * hd, dim}, f32,
                 randn(dim * heads * hd, s).data());
    w.add_tensor(p + "ffn_norm.weight", {dim}, f32, ones(dim).data());
    w.add_tensor(p + "ffn_gate.weight", {dim, hid}, f32, randn(dim * hid, s).data());
    w.add_tensor(p + "ffn_up.weight", {dim, hid}, f32, randn(dim * hid, s).data());
    w.add_tensor(p + "ffn_down.weight", {hid, dim}, f32, randn(dim * hid, s * 0.6f).data());
  }
  w.add_tensor("output_norm.weight", {dim}, f32, ones(dim).data());
  w.add_tensor("output.weight", {dim, vocab}, f32, randn(dim * vocab, 0.25f).data());
  w.write(out);
  return 0;
}

int run(int argc, char** argv) {
  const std::string mode = argv[1];
  if (mode == "tokenizer-bin" && argc >= 4) return write_tokenizer_bin(argv[2], argv[3]);
  if (mode == "hf-json" && argc >= 5) return write_hf_json(argv[2], argv[3], argv[4]);
  if (mode == "synth" && argc >= 4) return write_synth(argv[2], argv[3]);
  if (mode == "dequant") {
    const vq::engine::GgufFile g = vq::engine::GgufFile::open(argv[2]);
    for (const vq::engine::GgufTensor& t : g.tensors()) {
      std::vector<float> out(static_cast<std::size_t>(t.n_values));
      vq::engine::dequantize(t.type, t.data, out.data(), t.n_values);
      std::uint64_t h = 1469598103934665603ull;
      const auto* b = reinterpret_cast<const unsigned char*>(out.data());
      for (std::size_t i = 0; i < out.size() * 4; ++i) h = (h ^ b[i]) * 1099511628211ull;
      std::printf("%s %u %lld %016llx\n", t.name.c_str(), static_cast<unsigned>(t.type),
                  static_cast<long long>(t.n_values), static_cast<unsigned long long>(h));
    }
    return 0;
  }
  if (mode == "tokenize" || mode == "tokenize-tests") {
    // From the GGUF metadata alone (vocab-only files have no tensors), or a tokenizer.json.
    const std::string vocab = argv[2];
    const bool json = vocab.size() > 5 && vocab.compare(vocab.size() - 5, 5, ".json") == 0;
    const auto tok =
        json ? vq::engine::load_hf_tokenizer(vocab) : vq::engine::load_gguf_tokenizer(vocab);
    if (argc < 4) return 2;
    const std::string text = vq::engine::read_text_file(argv[3]);
    if (mode == "tokenize") {
      for (const std::int32_t id : tok->encode(text, true)) std::printf("%d\n", id);
      return 0;
    }
    const std::string sep = "\n__ggml_vocab_test__\n";
    for (std::size_t at = 0; at < text.size();) {
      const std::size_t next = text.find(sep, at);
      const std::size_t end = next == std::string::npos ? text.size() : next;
      for (const std::int32_t id :
           tok->encode(std::string_view(text).substr(at, end - at), false)) {
        std::printf(" %d", id);
      }
      std::printf("\n");
      if (next == std::string::npos) break;
      at = next + sep.size();
    }
    return 0;
  }
  const vq::engine::Model model = vq::engine::Model::load(argv[2]);
  const auto tokenizer = vq::engine::load_tokenizer("", model);
  if (mode == "greedy" && argc >= 4) {
    const std::int64_t steps = std::stoll(argv[3]);
    const vq::CacheConfig method = full_cache(argc >= 5 ? argv[4] : "f32");
    const auto& c = model.config();
    vq::engine::Transformer tf(model);
    vq::ModelCache cache = vq::KVCacheBuilder::for_model(
        method, vq::ModelShape{c.n_layers, c.n_kv_heads, c.head_dim, c.n_heads});
    std::int32_t tok = c.bos_id;
    std::printf("%d\n", tok);
    for (std::int64_t pos = 0; pos + 1 < steps; ++pos) {
      const float* logits = tf.forward(&tok, 1, cache, vq::engine::Logits::kLast);
      std::int32_t best = 0;
      for (std::int32_t v = 1; v < c.vocab_size; ++v) best = logits[v] > logits[best] ? v : best;
      tok = best;
      std::printf("%d\n", tok);
      if (tok == c.eos_id) break;
    }
    return 0;
  }
  if (mode == "nll" && argc >= 5) {
    const std::string text = vq::engine::read_text_file(argv[3]);
    const auto ids = vq::engine::encode_first(*tokenizer, text, std::stoll(argv[4]), true);
    const vq::engine::ForcedRun r =
        vq::engine::run_forced(model, ids, full_cache(argc >= 6 ? argv[5] : "f32"));
    double total = 0;
    for (const double x : r.nll) {
      std::printf("%.9f\n", x);
      total += x;
    }
    std::printf("mean %.9f over %zu predictions\n", total / static_cast<double>(r.nll.size()),
                r.nll.size());
    return 0;
  }
  std::fprintf(stderr, "vq_crosscheck: unknown mode or missing arguments (see the source)\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: vq_crosscheck tokenize|greedy|nll MODEL ...\n");
    return 2;
  }
  try {
    if (const char* acts = std::getenv("VQ_CROSSCHECK_Q8_0_ACTIVATIONS")) {
      if (std::string(acts) != "f32" && std::string(acts) != "q8_0") {
        std::fprintf(stderr, "VQ_CROSSCHECK_Q8_0_ACTIVATIONS must be f32 or q8_0, got '%s'\n",
                     acts);
        return 2;
      }
      vq::engine::set_q8_0_activations(std::string(acts) == "f32"
                                           ? vq::engine::Q8_0Activations::kF32
                                           : vq::engine::Q8_0Activations::kQ8_0);
    }
    return run(argc, argv);
  } catch (const vq::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
