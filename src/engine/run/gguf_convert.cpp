// Model -> GGUF conversion (see gguf_convert.h).
#include "engine/run/gguf_convert.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "base/validate.h"
#include "engine/formats/mapped_file.h"
#include "engine/model/model.h"
#include "engine/model/model_builder.h"
#include "engine/tokenizers/tokenizer.h"

namespace vq::engine {
namespace {
using nlohmann::json;

// llama.cpp's token types.
enum TokenType : std::int32_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6
};

const std::string kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's visible space

bool is_byte_piece(const std::string& s) {
  auto hex = [](char c) { return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F'); };
  return s.size() == 6 && s.compare(0, 3, "<0x") == 0 && hex(s[3]) && hex(s[4]) && s[5] == '>';
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  std::string out;
  std::size_t at = 0;
  for (std::size_t hit; (hit = s.find(from, at)) != std::string::npos; at = hit + from.size()) {
    out.append(s, at, hit - at);
    out += to;
  }
  out.append(s, at, std::string::npos);
  return out;
}

// llama.cpp's general.file_type for a model stored mostly as `type`.
std::uint32_t file_type(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
      return 0;
    case GgmlType::kF16:
      return 1;
    case GgmlType::kQ8_0:
      return 7;
    case GgmlType::kBF16:
      return 32;
    default:
      return 0;
  }
}

}  // namespace

std::vector<float> rotate_half_to_interleaved(const float* w, std::int64_t n_heads,
                                              std::int64_t head_dim, std::int64_t cols) {
  std::vector<float> out(static_cast<std::size_t>(n_heads * head_dim * cols));
  const std::int64_t half = head_dim / 2;
  for (std::int64_t h = 0; h < n_heads; ++h) {
    for (std::int64_t i = 0; i < half; ++i) {
      for (std::int64_t j = 0; j < 2; ++j) {
        const float* src = w + (h * head_dim + j * half + i) * cols;
        float* dst = out.data() + (h * head_dim + 2 * i + j) * cols;
        std::memcpy(dst, src, static_cast<std::size_t>(cols) * 4);
      }
    }
  }
  return out;
}

void add_llama2c_vocab(GgufWriter& w, const std::string& path, std::int64_t vocab_size) {
  const std::string data = read_text_file(path);
  std::size_t at = 0;
  auto i32 = [&](const char* what) {
    if (data.size() - at < 4) {
      file_error(path, std::string("truncated llama2.c tokenizer: expected 4 bytes for ") + what +
                           " at offset " + std::to_string(at) + ", found " +
                           std::to_string(data.size() - at));
    }
    std::int32_t v;
    std::memcpy(&v, data.data() + at, 4);
    at += 4;
    return v;
  };
  i32("max_token_length");
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<std::int32_t> types;
  for (std::int64_t id = 0; id < vocab_size; ++id) {
    const std::int32_t bits = i32("a score");
    float score;
    std::memcpy(&score, &bits, 4);
    const std::int32_t len = i32("a piece length");
    if (len < 0 || static_cast<std::size_t>(len) > data.size() - at) {
      file_error(path, "piece " + std::to_string(id) + " has length " + std::to_string(len) +
                           " with " + std::to_string(data.size() - at) + " bytes left");
    }
    std::string piece = data.substr(at, static_cast<std::size_t>(len));
    at += static_cast<std::size_t>(len);
    std::int32_t type = kNormal;
    if (id == 0) {
      type = kUnknown;
    } else if (id == 1 || id == 2) {
      type = kControl;
      piece = id == 1 ? "<s>" : "</s>";  // llama2.c exports them as "\n<s>\n", "\n</s>\n"
    } else if (is_byte_piece(piece)) {
      type = kByte;
    }
    if (!std::isfinite(score))
      file_error(path, "the score of piece " + std::to_string(id) + " is not finite");
    tokens.push_back(type == kNormal ? replace_all(piece, " ", kSpace) : piece);
    scores.push_back(score);
    types.push_back(type);
  }
  if (at != data.size()) {
    file_error(path, "has " + std::to_string(data.size() - at) + " bytes after the " +
                         std::to_string(vocab_size) + " pieces the model's vocab_size calls for");
  }
  w.set("tokenizer.ggml.model", GgufValue::str("llama"));
  w.set("tokenizer.ggml.tokens", GgufValue::string_array(std::move(tokens)));
  w.set("tokenizer.ggml.scores", GgufValue::f32_array(scores));
  w.set("tokenizer.ggml.token_type", GgufValue::i32_array(types));
  w.set("tokenizer.ggml.bos_token_id", GgufValue::u32(1));
  w.set("tokenizer.ggml.eos_token_id", GgufValue::u32(2));
  w.set("tokenizer.ggml.unknown_token_id", GgufValue::u32(0));
  w.set("tokenizer.ggml.add_bos_token", GgufValue::boolean(true));
  w.set("tokenizer.ggml.add_eos_token", GgufValue::boolean(false));
}

// tokenizer.json with a BPE model. Byte-level BPE (a ByteLevel pre-tokenizer) is written as
// model "gpt2" (tokens, merges, and tokenizer.ggml.pre named after the Split regex: "llama-bpe"
// for Llama 3's, "qwen2" for Qwen2's, "gpt-2" for ByteLevel's own); SentencePiece-style BPE
// (byte_fallback, "▁" spaces) as model "llama" with scores -(rank of the first merge that
// forms the token), which makes llama.cpp's score-ordered merging follow the merge ranks.
// Added tokens marked special become CONTROL tokens, the others USER_DEFINED.
std::string add_hf_vocab(GgufWriter& w, const std::string& path, std::int64_t vocab_size,
                         std::int32_t bos_id, std::int32_t eos_id) {
  json j;
  try {
    j = json::parse(read_text_file(path));
  } catch (const json::exception& e) {
    file_error(path, std::string("not valid JSON: ") + e.what());
  }
  try {
    const json& m = j.at("model");
    if (m.value("type", std::string("BPE")) != "BPE") {
      file_error(path, "model type '" + m.value("type", std::string()) +
                           "' cannot be written to GGUF (only BPE)");
    }
    std::vector<std::string> tokens(static_cast<std::size_t>(vocab_size));
    std::vector<std::int32_t> types(static_cast<std::size_t>(vocab_size), kUnused);
    for (std::int64_t id = 0; id < vocab_size; ++id)
      tokens[static_cast<std::size_t>(id)] = "[PAD" + std::to_string(id) + "]";
    std::map<std::string, std::int64_t> ids;
    auto put = [&](const std::string& text, std::int64_t id, std::int32_t type) {
      if (id < 0 || id >= vocab_size) {
        file_error(path, "token '" + text + "' has id " + std::to_string(id) +
                             ", outside the model's vocabulary [0, " + std::to_string(vocab_size) +
                             ")");
      }
      tokens[static_cast<std::size_t>(id)] = text;
      types[static_cast<std::size_t>(id)] = type;
      ids[text] = id;
    };
    for (const auto& [text, id] : m.at("vocab").items()) {
      put(text, id.get<std::int64_t>(), is_byte_piece(text) ? kByte : kNormal);
    }
    const std::string unk = m.contains("unk_token") && m["unk_token"].is_string()
                                ? m["unk_token"].get<std::string>()
                                : "";
    if (!unk.empty() && ids.count(unk)) types[static_cast<std::size_t>(ids[unk])] = kUnknown;
    for (const json& a : j.value("added_tokens", json::array())) {
      put(a.at("content").get<std::string>(), a.at("id").get<std::int64_t>(),
          a.value("special", false) ? kControl : kUserDefined);
    }
    std::vector<std::string> merges;
    for (const json& mg : m.value("merges", json::array())) {
      merges.push_back(mg.is_string()
                           ? mg.get<std::string>()
                           : mg.at(0).get<std::string>() + " " + mg.at(1).get<std::string>());
    }
    // Byte-level when a ByteLevel pre-tokenizer appears (alone or in a Sequence).
    bool byte_level = false;
    std::string split_regex;
    std::function<void(const json&)> scan = [&](const json& p) {
      if (!p.is_object()) return;
      const std::string type = p.value("type", std::string());
      if (type == "ByteLevel") byte_level = true;
      if (type == "Split" && p.contains("pattern") && p["pattern"].contains("Regex")) {
        split_regex = p["pattern"]["Regex"].get<std::string>();
      }
      if (type == "Sequence") {
        for (const json& q : p.value("pretokenizers", json::array())) scan(q);
      }
    };
    if (j.contains("pre_tokenizer")) scan(j["pre_tokenizer"]);
    std::string model;
    if (byte_level) {
      model = "gpt2";
      std::string pre = "gpt-2";
      if (split_regex.find("\\p{N}{1,3}") != std::string::npos) {
        pre = "llama-bpe";
      } else if (split_regex.find("\\p{N}|") != std::string::npos ||
                 split_regex.find("\\p{N}| ?") != std::string::npos) {
        pre = "qwen2";
      } else if (!split_regex.empty()) {
        file_error(path,
                   "the pre_tokenizer's Split regex is not one llama.cpp names (expected "
                   "Llama 3's or Qwen2's): " +
                       split_regex);
      }
      w.set("tokenizer.ggml.model", GgufValue::str("gpt2"));
      w.set("tokenizer.ggml.pre", GgufValue::str(pre));
      w.set("tokenizer.ggml.tokens", GgufValue::string_array(std::move(tokens)));
      w.set("tokenizer.ggml.token_type", GgufValue::i32_array(types));
      w.set("tokenizer.ggml.merges", GgufValue::string_array(std::move(merges)));
    } else {
      model = "llama";
      std::vector<float> scores(static_cast<std::size_t>(vocab_size), 0.0f);
      std::vector<bool> scored(static_cast<std::size_t>(vocab_size), false);
      for (std::size_t r = 0; r < merges.size(); ++r) {
        const std::size_t sp = merges[r].find(' ');
        if (sp == std::string::npos)
          file_error(path, "merge " + std::to_string(r) + " '" + merges[r] + "' has no space");
        const auto it = ids.find(merges[r].substr(0, sp) + merges[r].substr(sp + 1));
        if (it == ids.end()) continue;
        const auto id = static_cast<std::size_t>(it->second);
        if (!scored[id]) {
          scores[id] = -static_cast<float>(r + 1);
          scored[id] = true;
        }
      }
      // SentencePiece's dummy prefix: a Prepend("▁") normalizer, or a Metaspace pre-tokenizer
      // that prepends.
      bool space_prefix = false;
      std::function<void(const json&)> scan_norm = [&](const json& n) {
        if (!n.is_object()) return;
        const std::string type = n.value("type", std::string());
        if (type == "Prepend" && n.value("prepend", std::string()) == kSpace) space_prefix = true;
        if (type == "Sequence") {
          for (const json& q : n.value("normalizers", json::array())) scan_norm(q);
        }
      };
      if (j.contains("normalizer")) scan_norm(j["normalizer"]);
      if (j.contains("pre_tokenizer") && j["pre_tokenizer"].is_object() &&
          j["pre_tokenizer"].value("type", std::string()) == "Metaspace") {
        const json& p = j["pre_tokenizer"];
        space_prefix = p.value("prepend_scheme", std::string("always")) != "never" &&
                       p.value("add_prefix_space", true);
      }
      w.set("tokenizer.ggml.model", GgufValue::str("llama"));
      w.set("tokenizer.ggml.add_space_prefix", GgufValue::boolean(space_prefix));
      w.set("tokenizer.ggml.tokens", GgufValue::string_array(std::move(tokens)));
      w.set("tokenizer.ggml.scores", GgufValue::f32_array(scores));
      w.set("tokenizer.ggml.token_type", GgufValue::i32_array(types));
      if (!unk.empty() && ids.count(unk)) {
        w.set("tokenizer.ggml.unknown_token_id",
              GgufValue::u32(static_cast<std::uint32_t>(ids[unk])));
      }
    }
    if (bos_id >= 0)
      w.set("tokenizer.ggml.bos_token_id", GgufValue::u32(static_cast<std::uint32_t>(bos_id)));
    if (eos_id >= 0)
      w.set("tokenizer.ggml.eos_token_id", GgufValue::u32(static_cast<std::uint32_t>(eos_id)));
    return model;
  } catch (const json::exception& e) {
    file_error(path, std::string("malformed tokenizer.json: ") + e.what());
  }
}

ConvertReport convert_to_gguf(const Model& model, const std::string& tokenizer_path, GgmlType type,
                              const std::string& out_path) {
  const ModelConfig& c = model.config();
  const Weights& wt = model.weights();
  GgufWriter w;
  ConvertReport report;
  // A model with q/k/v biases is written as llama.cpp's 'qwen2' (rotate-half RoPE, biases);
  // any other as 'llama' (interleaved RoPE: rotate-half checkpoints are permuted below).
  const bool qwen2 = c.qkv_bias;
  const std::string arch = qwen2 ? "qwen2" : "llama";
  const std::string A = arch + ".";
  w.set("general.architecture", GgufValue::str(arch));
  // The checkpoint file's stem; a sharded HF checkpoint's model.safetensors.index.json names
  // the model as its model.safetensors would ("model").
  std::string file = std::filesystem::path(model.path()).filename().string();
  const std::string index_suffix = ".index.json";
  if (c.format == "hf" && file.size() > index_suffix.size() && file.ends_with(index_suffix)) {
    file.resize(file.size() - index_suffix.size());
  }
  w.set("general.name", GgufValue::str(std::filesystem::path(file).stem().string()));
  w.set("general.file_type", GgufValue::u32(file_type(type)));
  w.set(A + "context_length", GgufValue::u32(static_cast<std::uint32_t>(c.seq_len)));
  w.set(A + "embedding_length", GgufValue::u32(static_cast<std::uint32_t>(c.dim)));
  w.set(A + "block_count", GgufValue::u32(static_cast<std::uint32_t>(c.n_layers)));
  w.set(A + "feed_forward_length", GgufValue::u32(static_cast<std::uint32_t>(c.hidden_dim)));
  w.set(A + "rope.dimension_count", GgufValue::u32(static_cast<std::uint32_t>(c.head_dim)));
  w.set(A + "attention.head_count", GgufValue::u32(static_cast<std::uint32_t>(c.n_heads)));
  w.set(A + "attention.head_count_kv", GgufValue::u32(static_cast<std::uint32_t>(c.n_kv_heads)));
  if (c.head_dim * c.n_heads != c.dim) {
    w.set(A + "attention.key_length", GgufValue::u32(static_cast<std::uint32_t>(c.head_dim)));
    w.set(A + "attention.value_length", GgufValue::u32(static_cast<std::uint32_t>(c.head_dim)));
  }
  w.set(A + "attention.layer_norm_rms_epsilon", GgufValue::f32(c.norm_eps));
  w.set(A + "rope.freq_base", GgufValue::f32(static_cast<float>(c.rope_theta)));
  w.set(A + "vocab_size", GgufValue::u32(static_cast<std::uint32_t>(c.vocab_size)));
  // RoPE scaling as llama.cpp's converter writes it: linear as rope.scaling.type/factor, Llama
  // 3.x's per-frequency divisors as the rope_freqs.weight tensor (below).
  if (c.rope_freq_scale != 1.0) {
    w.set(A + "rope.scaling.type", GgufValue::str("linear"));
    w.set(A + "rope.scaling.factor", GgufValue::f32(static_cast<float>(1.0 / c.rope_freq_scale)));
  }

  if (c.format == "gguf") {
    file_error(model.path(), "is already GGUF; converting GGUF to GGUF is not supported");
  }
  const std::string tok = tokenizer_path.empty() ? default_tokenizer_path(model) : tokenizer_path;
  const bool json_tok = tok.size() >= 5 && tok.compare(tok.size() - 5, 5, ".json") == 0;
  if (json_tok) {
    // BOS as the tokenizer's post-processor adds it (none when it adds nothing).
    const std::int32_t bos = load_hf_tokenizer(tok)->bos_id();
    report.vocab_model = add_hf_vocab(w, tok, c.vocab_size, bos, c.eos_id);
    w.set("tokenizer.ggml.add_bos_token", GgufValue::boolean(bos >= 0));
  } else {
    add_llama2c_vocab(w, tok, c.vocab_size);
    report.vocab_model = "llama";
  }

  // A weight matrix in its stored type (engine/weights.h) as fp32 rows (exact), for the writer,
  // which converts to the target type at once: one matrix at a time is held as fp32.
  auto f32 = [](const WeightMatrix& m) {
    std::vector<float> out(static_cast<std::size_t>(m.rows * m.cols));
    for (std::int64_t i = 0; i < m.rows; ++i) dequantize_row(m, i, out.data() + i * m.cols);
    return out;
  };
  auto matrix = [&](const std::string& name, const float* data, std::int64_t rows,
                    std::int64_t cols) {
    GgmlType t = type;
    if (cols % type_info(type).block_size != 0) {
      t = GgmlType::kF32;
      report.kept_as_f32.push_back(name);
    }
    w.add_tensor(name, {cols, rows}, t, data);
  };
  if (qwen2 && c.rope != RopeStyle::kRotateHalf) {
    throw Error(ErrorCode::kInvalidArgument,
                "[convert] a model with q/k/v biases must use rotate-half RoPE (qwen2)");
  }
  const bool permute = !qwen2 && c.rope == RopeStyle::kRotateHalf;
  const std::int64_t dim = c.dim, hid = c.hidden_dim, qd = c.q_dim(), kvd = c.kv_dim();
  matrix("token_embd.weight", f32(wt.token_embedding).data(), c.vocab_size, dim);
  for (std::int64_t i = 0; i < c.n_layers; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    const LayerWeights& l = wt.layers[static_cast<std::size_t>(i)];
    w.add_tensor(p + "attn_norm.weight", {dim}, GgmlType::kF32, l.attn_norm);
    if (permute) {
      matrix(p + "attn_q.weight",
             rotate_half_to_interleaved(f32(l.wq).data(), c.n_heads, c.head_dim, dim).data(), qd, dim);
      matrix(p + "attn_k.weight",
             rotate_half_to_interleaved(f32(l.wk).data(), c.n_kv_heads, c.head_dim, dim).data(), kvd, dim);
    } else {
      matrix(p + "attn_q.weight", f32(l.wq).data(), qd, dim);
      matrix(p + "attn_k.weight", f32(l.wk).data(), kvd, dim);
    }
    matrix(p + "attn_v.weight", f32(l.wv).data(), kvd, dim);
    if (qwen2) {
      w.add_tensor(p + "attn_q.bias", {qd}, GgmlType::kF32, l.bq);
      w.add_tensor(p + "attn_k.bias", {kvd}, GgmlType::kF32, l.bk);
      w.add_tensor(p + "attn_v.bias", {kvd}, GgmlType::kF32, l.bv);
    }
    matrix(p + "attn_output.weight", f32(l.wo).data(), dim, qd);
    w.add_tensor(p + "ffn_norm.weight", {dim}, GgmlType::kF32, l.ffn_norm);
    matrix(p + "ffn_gate.weight", f32(l.w_gate).data(), hid, dim);
    matrix(p + "ffn_up.weight", f32(l.w_up).data(), hid, dim);
    matrix(p + "ffn_down.weight", f32(l.w_down).data(), dim, hid);
  }
  w.add_tensor("output_norm.weight", {dim}, GgmlType::kF32, wt.final_norm);
  if (!c.rope_freq_factors.empty()) {
    w.add_tensor("rope_freqs.weight", {c.head_dim / 2}, GgmlType::kF32, c.rope_freq_factors.data());
  }
  if (!c.tied_classifier) matrix("output.weight", f32(wt.classifier).data(), c.vocab_size, dim);
  // The round trip: the written file is loaded with the model loader's own checks before it is
  // renamed into place, so convert never leaves a GGUF file that veloxquant itself refuses
  // (a setting that overflows float32, a tensor the loader does not accept).
  w.write(out_path, [&](const std::string& temporary) {
    try {
      const Model back = Model::load(temporary);
    } catch (const Error& e) {
      throw Error(ErrorCode::kFileError,
                  "[convert] the GGUF file written for '" + validate::excerpt(out_path, 300) +
                      "' fails the loader's checks, so it is not written (nothing was replaced): " +
                      e.what(),
                  out_path);
    }
  });
  report.n_tensors = static_cast<std::int64_t>(w.tensor_count());
  report.file_bytes = static_cast<std::int64_t>(std::filesystem::file_size(out_path));
  return report;
}

}  // namespace vq::engine
