// GGUF checkpoints: architecture `llama` (interleaved RoPE pairs, as llama.cpp's converters
// store it) and `qwen2` (rotate-half RoPE) without biases. Hyperparameters come from the
// metadata ("<arch>.embedding_length", ...); tensors follow llama.cpp's names
// (token_embd, blk.N.attn_q, ..., output_norm, output).
//
// Cost: every weight matrix is used in place from the read-only mapping in its stored type
// (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K; engine/weights.h and
// engine/block_matmul.h have their kernels), so a model's resident memory is the file's
// pages it touches plus the KV cache and scratch. Only 1-D norm vectors stored in another type
// than F32, and an F32/F16/BF16 tensor at an offset its type cannot be read from, are copied.
#include <filesystem>

#include "engine/formats/gguf.h"
#include "engine/formats/mapped_file.h"
#include "engine/model/model.h"
#include "engine/model/model_builder.h"
#include "engine/compute/quants.h"

namespace vq::engine {
namespace {

std::string key_field(const char* field) {
  static const std::pair<const char*, const char*> names[] = {
      {"dim", "embedding_length"},
      {"hidden_dim", "feed_forward_length"},
      {"n_layers", "block_count"},
      {"n_heads", "attention.head_count"},
      {"n_kv_heads", "attention.head_count_kv"},
      {"head_dim", "attention.key_length"},
      {"vocab_size", "vocab_size"},
      {"seq_len", "context_length"}};
  for (const auto& [f, k] : names) {
    if (std::string(f) == field) return std::string("metadata '<arch>.") + k + "'";
  }
  return std::string("metadata ") + field;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  return s;
}

}  // namespace

Model Model::load_gguf(const std::string& path) {
  auto file = std::make_unique<MappedFile>(path);
  const GgufFile g = GgufFile::parse(file->data(), file->size(), path);

  const std::string arch = g.get_string("general.architecture");
  RopeStyle rope;
  if (arch == "llama") {
    rope = RopeStyle::kInterleaved;
  } else if (arch == "qwen2") {
    rope = RopeStyle::kRotateHalf;
  } else {
    file_error(path, "architecture '" + arch +
                         "' is not supported; expected 'llama' or 'qwen2' (Llama-shaped models)");
  }
  const std::string a = arch + ".";

  ModelBuilder b;
  ModelConfig& c = b.config();
  c.format = "gguf";
  c.rope = rope;
  c.dim = g.get_int(a + "embedding_length");
  c.hidden_dim = g.get_int(a + "feed_forward_length");
  c.n_layers = g.get_int(a + "block_count");
  c.n_heads = g.get_int(a + "attention.head_count");
  c.n_kv_heads = g.get_int_or(a + "attention.head_count_kv", c.n_heads);
  c.seq_len = g.get_int(a + "context_length");
  if (c.n_heads <= 0) {
    file_error(path, "metadata '" + a + "attention.head_count' must be > 0, found " +
                         std::to_string(c.n_heads));
  }
  if (g.find(a + "attention.key_length")) {
    c.head_dim = g.get_int(a + "attention.key_length");
  } else {
    if (c.dim % c.n_heads != 0) {
      file_error(path, "metadata '" + a + "embedding_length' (" + std::to_string(c.dim) +
                           ") must be a multiple of '" + a + "attention.head_count' (" +
                           std::to_string(c.n_heads) + ") when 'attention.key_length' is absent");
    }
    c.head_dim = c.dim / c.n_heads;
  }
  const std::int64_t value_length = g.get_int_or(a + "attention.value_length", c.head_dim);
  if (value_length != c.head_dim) {
    file_error(path, "metadata '" + a + "attention.value_length' (" + std::to_string(value_length) +
                         ") must equal the key length (" + std::to_string(c.head_dim) + ")");
  }
  const GgufTensor* embed = g.find_tensor("token_embd.weight");
  if (!embed) file_error(path, "missing tensor 'token_embd.weight'");
  if (embed->dims.size() != 2) {
    file_error(path,
               "tensor 'token_embd.weight' must be 2-D [dim, vocab], found " + embed->shape_text());
  }
  c.vocab_size = g.get_int_or(a + "vocab_size", embed->dims[1]);
  validate_shape(path, c, key_field);
  const std::int64_t rope_dims = g.get_int_or(a + "rope.dimension_count", c.head_dim);
  if (rope_dims != c.head_dim) {
    file_error(path, "metadata '" + a + "rope.dimension_count' = " + std::to_string(rope_dims) +
                         ": partial RoPE is not supported (expected the head dimension, " +
                         std::to_string(c.head_dim) + ")");
  }
  if (const GgufValue* s = g.find(a + "rope.scaling.type")) {
    if (s->type != GgufType::kString || s->s != "none") {
      file_error(path, "metadata '" + a + "rope.scaling.type' is " + s->describe() +
                           "; RoPE scaling is not implemented (expected 'none' or absent)");
    }
  }
  const double eps = g.get_float(a + "attention.layer_norm_rms_epsilon");
  const double theta = g.get_float_or(a + "rope.freq_base", 10000.0);
  if (!(eps > 0 && eps < 1)) {
    file_error(path, "metadata '" + a +
                         "attention.layer_norm_rms_epsilon' must be in (0, 1), "
                         "found " +
                         std::to_string(eps));
  }
  if (!(theta > 1)) {
    file_error(path,
               "metadata '" + a + "rope.freq_base' must be > 1, found " + std::to_string(theta));
  }
  c.norm_eps = static_cast<float>(eps);
  c.rope_theta = theta;
  for (const char* key : {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"}) {
    const std::int64_t id = g.get_int_or(key, -1);
    if (id < -1 || id >= c.vocab_size) {
      file_error(path, std::string("metadata '") + key + "' = " + std::to_string(id) +
                           " is outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
    }
    (std::string(key).find("bos") != std::string::npos ? c.bos_id : c.eos_id) =
        static_cast<std::int32_t>(id);
  }
  for (const GgufTensor& t : g.tensors()) {
    if (t.name.size() > 5 && t.name.compare(t.name.size() - 5, 5, ".bias") == 0) {
      file_error(path, "tensor '" + t.name + "': biases are not supported by this engine (" + arch +
                           " models with attention biases cannot run here)");
    }
  }

  std::string matrix_type;
  bool mixed = false;
  // Checks a tensor's presence and shape (GGUF dims: innermost first).
  auto find = [&](const std::string& name, const std::vector<std::int64_t>& dims) {
    const GgufTensor* t = g.find_tensor(name);
    if (!t) file_error(path, "missing tensor '" + name + "'");
    if (t->dims != dims) {
      GgufTensor want;
      want.dims = dims;
      file_error(path, "tensor '" + name + "' has shape " + t->shape_text() + ", expected " +
                           want.shape_text() + " from the metadata");
    }
    return t;
  };
  // A 1-D tensor (norm weights) as fp32: F32 in place (the mapping is page-aligned and tensor
  // data 32-byte aligned), any other type dequantized once into an owned buffer.
  auto vec = [&](const std::string& name, std::int64_t n) -> const float* {
    const GgufTensor* t = find(name, {n});
    if (t->type == GgmlType::kF32 && reinterpret_cast<std::uintptr_t>(t->data) % 4 == 0) {
      return reinterpret_cast<const float*>(t->data);
    }
    float* out = b.own(t->n_values);
    dequantize(t->type, t->data, out, t->n_values);
    return out;
  };
  // A 2-D tensor [rows][cols] (GGUF dims {cols, rows}) as a WeightMatrix, read in place from
  // the mapping in its stored type (engine/weights.h has a matmul kernel for each); only a
  // misaligned F32/F16/BF16 tensor is converted into an owned fp32 copy.
  auto mat = [&](const std::string& name, std::int64_t cols, std::int64_t rows) -> WeightMatrix {
    const GgufTensor* t = find(name, {cols, rows});
    const std::string ty = lower(type_info(t->type).name);
    if (matrix_type.empty()) matrix_type = ty;
    mixed = mixed || matrix_type != ty;
    WeightMatrix m;
    m.rows = rows;
    m.cols = cols;
    const auto addr = reinterpret_cast<std::uintptr_t>(t->data);
    switch (t->type) {
      case GgmlType::kF32:
        if (addr % 4 == 0) {
          m.type = WeightType::kF32;
          m.data = t->data;
          return m;
        }
        break;
      case GgmlType::kF16:
      case GgmlType::kBF16:
        if (addr % 2 == 0) {
          m.type = t->type == GgmlType::kF16 ? WeightType::kF16 : WeightType::kBF16;
          m.data = t->data;
          return m;
        }
        break;
      default:
        // Every block type is read in place, in its stored blocks (the reader checked that
        // a row is a whole number of blocks).
        m.type = weight_type_of(t->type);
        m.data = t->data;
        return m;
    }
    float* out = b.own(t->n_values);
    dequantize(t->type, t->data, out, t->n_values);
    m.type = WeightType::kF32;
    m.data = out;
    return m;
  };

  const std::int64_t dim = c.dim, hid = c.hidden_dim, qd = c.q_dim(), kvd = c.kv_dim();
  Weights& w = b.weights();
  w.token_embedding = mat("token_embd.weight", dim, c.vocab_size);
  w.layers.resize(static_cast<std::size_t>(c.n_layers));
  for (std::int64_t i = 0; i < c.n_layers; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    LayerWeights& l = w.layers[static_cast<std::size_t>(i)];
    l.attn_norm = vec(p + "attn_norm.weight", dim);
    l.wq = mat(p + "attn_q.weight", dim, qd);
    l.wk = mat(p + "attn_k.weight", dim, kvd);
    l.wv = mat(p + "attn_v.weight", dim, kvd);
    l.wo = mat(p + "attn_output.weight", qd, dim);
    l.ffn_norm = vec(p + "ffn_norm.weight", dim);
    l.w_gate = mat(p + "ffn_gate.weight", dim, hid);
    l.w_up = mat(p + "ffn_up.weight", dim, hid);
    l.w_down = mat(p + "ffn_down.weight", hid, dim);
  }
  w.final_norm = vec("output_norm.weight", dim);
  c.tied_classifier = g.find_tensor("output.weight") == nullptr;
  w.classifier = c.tied_classifier ? w.token_embedding : mat("output.weight", dim, c.vocab_size);
  c.weights_dtype = mixed ? "mixed" : matrix_type;

  const std::string dir = std::filesystem::path(path).parent_path().string();
  b.set_paths(path, dir.empty() ? "." : dir);
  b.set_file(std::move(file));
  return b.finish();
}

}  // namespace vq::engine
