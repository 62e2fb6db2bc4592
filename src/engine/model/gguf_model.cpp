// GGUF checkpoints: architecture `llama` (interleaved RoPE pairs, as llama.cpp's converters
// store it; Llama 2/3, Mistral-style files) and `qwen2` (rotate-half RoPE, q/k/v biases).
// Checked against the tensors: block_count equals the layers the tensors have, every tensor
// has the shape the metadata implies, and every tensor is used (any other is refused by name).
// RoPE: rope_freqs.weight (Llama 3.x) and linear rope.scaling are applied; any other
// '<arch>.rope.*' setting (YaRN, a factor without a type, unknown keys) is refused by name. Hyperparameters come from the
// metadata ("<arch>.embedding_length", ...); tensors follow llama.cpp's names
// (token_embd, blk.N.attn_q, ..., output_norm, output).
//
// Cost: every weight matrix is used in place from the read-only mapping in its stored type
// (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K; engine/weights.h and
// engine/block_matmul.h have their kernels), so a model's resident memory is the file's
// pages it touches plus the KV cache and scratch. Only 1-D norm vectors stored in another type
// than F32, and an F32/F16/BF16 tensor at an offset its type cannot be read from, are copied.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

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


// The RoPE pairing of a supported architecture; any other is refused.
RopeStyle rope_of(const std::string& path, const std::string& arch) {
  if (arch == "llama") return RopeStyle::kInterleaved;
  if (arch == "qwen2") return RopeStyle::kRotateHalf;
  file_error(path, "architecture '" + arch +
                       "' is not supported; expected 'llama' or 'qwen2' (Llama-shaped models)");
}

// The shape from the metadata ('<arch>.' keys, prefix `a`): widths, layers, heads, head
// dimension (key_length, else dim / heads; value_length must equal it), context, vocabulary
// (from the embedding when the metadata has none), checked by validate_shape; partial RoPE is
// refused.
void read_shape(const GgufFile& g, const std::string& path, const std::string& a, ModelConfig& c) {
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
}

// RoPE scaling: every '<arch>.rope.*' key is either applied or refused by name; 'linear'
// scaling sets rope_freq_scale = 1 / factor.
void read_rope_scaling(const GgufFile& g, const std::string& path, const std::string& a,
                       ModelConfig& c) {
  for (const auto& [key, value] : g.metadata()) {
    if (key.rfind(a + "rope.", 0) != 0) continue;
    const std::string k = key.substr(a.size());
    if (k != "rope.dimension_count" && k != "rope.freq_base" && k != "rope.scaling.type" &&
        k != "rope.scaling.factor" && k != "rope.scaling.original_context_length" &&
        k != "rope.scaling.finetuned") {
      file_error(path, "metadata '" + key + "' (" + value.describe() +
                           ") is a RoPE setting this engine does not implement");
    }
  }
  std::string scaling = "none";
  if (const GgufValue* s = g.find(a + "rope.scaling.type")) {
    if (s->type != GgufType::kString) {
      file_error(path, "metadata '" + a + "rope.scaling.type' must be a string, found " +
                           s->describe());
    }
    scaling = s->s;
    if (scaling != "none" && scaling != "linear") {
      file_error(path, "metadata '" + a + "rope.scaling.type' is " + s->describe() +
                           ": only 'none' and 'linear' RoPE scaling are implemented (YaRN and "
                           "others are not)");
    }
  }
  if (g.find(a + "rope.scaling.factor")) {
    const double factor = g.get_float(a + "rope.scaling.factor");
    if (!g.find(a + "rope.scaling.type")) {
      file_error(path, "metadata '" + a + "rope.scaling.factor' = " + std::to_string(factor) +
                           " without '" + a +
                           "rope.scaling.type': the scaling it asks for is ambiguous");
    }
    if (!std::isfinite(factor) || !(factor > 0)) {
      file_error(path, "metadata '" + a + "rope.scaling.factor' must be finite and > 0, found " +
                           std::to_string(factor));
    }
    // 'none' with a factor: llama.cpp ignores the factor; so does this engine (stated here).
    if (scaling == "linear") c.rope_freq_scale = 1.0 / factor;
  } else if (scaling == "linear") {
    file_error(path, "metadata '" + a + "rope.scaling.type' is 'linear' but '" + a +
                         "rope.scaling.factor' is missing");
  }
}

// The RMSNorm epsilon and the RoPE base, range-checked.
void read_norm_and_theta(const GgufFile& g, const std::string& path, const std::string& a,
                         ModelConfig& c) {
  const double eps = g.get_float(a + "attention.layer_norm_rms_epsilon");
  const double theta = g.get_float_or(a + "rope.freq_base", 10000.0);
  if (!(eps > 0 && eps < 1)) {
    file_error(path, "metadata '" + a +
                         "attention.layer_norm_rms_epsilon' must be in (0, 1), "
                         "found " +
                         std::to_string(eps));
  }
  if (!(theta > 1) || !std::isfinite(theta)) {
    file_error(path, "metadata '" + a + "rope.freq_base' must be finite and > 1, found " +
                         std::to_string(theta));
  }
  c.norm_eps = static_cast<float>(eps);
  c.rope_theta = theta;
}

// The layer count against the tensors: the largest 'blk.N.' must be block_count - 1.
void check_layer_count(const GgufFile& g, const std::string& path, const std::string& a,
                       std::int64_t n_layers) {
  std::int64_t tensor_layers = 0;
  for (const GgufTensor& t : g.tensors()) {
    if (t.name.rfind("blk.", 0) != 0) continue;
    std::int64_t n = 0;
    std::size_t at = 4;
    while (at < t.name.size() && t.name[at] >= '0' && t.name[at] <= '9' && n < (1 << 20))
      n = n * 10 + (t.name[at++] - '0');
    if (at > 4) tensor_layers = std::max(tensor_layers, n + 1);
  }
  if (tensor_layers != n_layers) {
    file_error(path, "metadata '" + a + "block_count' = " + std::to_string(n_layers) +
                         " but the file has tensors for " + std::to_string(tensor_layers) +
                         " layers (blk.0 .. blk." + std::to_string(tensor_layers - 1) + ")");
  }
}

// BOS and EOS ids (-1: none), inside the vocabulary.
void read_special_ids(const GgufFile& g, const std::string& path, ModelConfig& c) {
  for (const char* key : {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"}) {
    const std::int64_t id = g.get_int_or(key, -1);
    if (id < -1 || id >= c.vocab_size) {
      file_error(path, std::string("metadata '") + key + "' = " + std::to_string(id) +
                           " is outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
    }
    (std::string(key).find("bos") != std::string::npos ? c.bos_id : c.eos_id) =
        static_cast<std::int32_t>(id);
  }
}

// Reads tensors for the model: each checked for presence and shape and recorded as used (any
// tensor not used is refused at the end), matrices in place in their stored type.
class TensorReader {
 public:
  TensorReader(const GgufFile& g, const std::string& path, ModelBuilder& b)
      : g_(g), path_(path), b_(b) {}

  // Checks a tensor's presence and shape (GGUF dims: innermost first).
  const GgufTensor* find(const std::string& name, const std::vector<std::int64_t>& dims) {
    const GgufTensor* t = g_.find_tensor(name);
    if (!t) file_error(path_, "missing tensor '" + name + "'");
    used_.insert(name);
    if (t->dims != dims) {
      GgufTensor want;
      want.dims = dims;
      file_error(path_, "tensor '" + name + "' has shape " + t->shape_text() + ", expected " +
                            want.shape_text() + " from the metadata");
    }
    return t;
  }

  // A 1-D tensor (norm weights) as fp32: F32 in place (the mapping is page-aligned and tensor
  // data 32-byte aligned), any other type dequantized once into an owned buffer.
  const float* vec(const std::string& name, std::int64_t n) {
    const GgufTensor* t = find(name, {n});
    if (t->type == GgmlType::kF32 && reinterpret_cast<std::uintptr_t>(t->data) % 4 == 0) {
      return reinterpret_cast<const float*>(t->data);
    }
    float* out = b_.own(t->n_values);
    dequantize(t->type, t->data, out, t->n_values);
    return out;
  }

  // A 2-D tensor [rows][cols] (GGUF dims {cols, rows}) as a WeightMatrix, read in place from
  // the mapping in its stored type (engine/weights.h has a matmul kernel for each); only a
  // misaligned F32/F16/BF16 tensor is converted into an owned fp32 copy.
  WeightMatrix mat(const std::string& name, std::int64_t cols, std::int64_t rows) {
    const GgufTensor* t = find(name, {cols, rows});
    const std::string ty = lower(type_info(t->type).name);
    if (matrix_type_.empty()) matrix_type_ = ty;
    mixed_ = mixed_ || matrix_type_ != ty;
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
    float* out = b_.own(t->n_values);
    dequantize(t->type, t->data, out, t->n_values);
    m.type = WeightType::kF32;
    m.data = out;
    return m;
  }

  // The matrices' type name ("q4_k"), or "mixed" when they differ.
  std::string matrix_type() const { return mixed_ ? "mixed" : matrix_type_; }

  // Refuses any tensor of the file that no read used.
  void check_all_used(const std::string& arch) const {
    for (const GgufTensor& t : g_.tensors()) {
      if (!used_.count(t.name)) {
        file_error(path_, "tensor '" + t.name + "' (" + t.shape_text() +
                              ") is not used by the '" + arch +
                              "' model this engine runs (its weights would be ignored)");
      }
    }
  }

 private:
  const GgufFile& g_;
  const std::string& path_;
  ModelBuilder& b_;
  std::set<std::string> used_;  // tensors the model reads
  std::string matrix_type_;
  bool mixed_ = false;
};

// One layer's tensors ('blk.N.'), q/k/v biases where the file has them (Qwen2 has them;
// llama.cpp's llama architecture allows them too).
LayerWeights read_layer(TensorReader& r, const GgufFile& g, const ModelConfig& c, std::int64_t i) {
  const std::int64_t dim = c.dim, hid = c.hidden_dim, qd = c.q_dim(), kvd = c.kv_dim();
  const std::string p = "blk." + std::to_string(i) + ".";
  LayerWeights l;
  l.attn_norm = r.vec(p + "attn_norm.weight", dim);
  l.wq = r.mat(p + "attn_q.weight", dim, qd);
  l.wk = r.mat(p + "attn_k.weight", dim, kvd);
  l.wv = r.mat(p + "attn_v.weight", dim, kvd);
  if (g.find_tensor(p + "attn_q.bias")) l.bq = r.vec(p + "attn_q.bias", qd);
  if (g.find_tensor(p + "attn_k.bias")) l.bk = r.vec(p + "attn_k.bias", kvd);
  if (g.find_tensor(p + "attn_v.bias")) l.bv = r.vec(p + "attn_v.bias", kvd);
  l.wo = r.mat(p + "attn_output.weight", qd, dim);
  l.ffn_norm = r.vec(p + "ffn_norm.weight", dim);
  l.w_gate = r.mat(p + "ffn_gate.weight", dim, hid);
  l.w_up = r.mat(p + "ffn_up.weight", dim, hid);
  l.w_down = r.mat(p + "ffn_down.weight", hid, dim);
  return l;
}

// Llama 3.x's per-frequency RoPE divisors (tensor rope_freqs.weight), each finite and > 0.
void read_rope_freqs(TensorReader& r, const std::string& path, ModelConfig& c) {
  const float* f = r.vec("rope_freqs.weight", c.head_dim / 2);
  for (std::int64_t i = 0; i < c.head_dim / 2; ++i) {
    if (!std::isfinite(f[i]) || !(f[i] > 0)) {
      file_error(path, "tensor 'rope_freqs.weight' value " + std::to_string(i) +
                           " must be finite and > 0, found " + std::to_string(f[i]));
    }
  }
  c.rope_freq_factors.assign(f, f + c.head_dim / 2);
}

}  // namespace

Model Model::load_gguf(const std::string& path) {
  auto file = std::make_unique<MappedFile>(path);
  const GgufFile g = GgufFile::parse(file->data(), file->size(), path);

  const std::string arch = g.get_string("general.architecture");
  const RopeStyle rope = rope_of(path, arch);
  const std::string a = arch + ".";

  // Hyperparameters from the metadata, each checked where it is read.
  ModelBuilder b;
  ModelConfig& c = b.config();
  c.format = "gguf";
  c.rope = rope;
  read_shape(g, path, a, c);
  read_rope_scaling(g, path, a, c);
  read_norm_and_theta(g, path, a, c);
  check_layer_count(g, path, a, c.n_layers);
  read_special_ids(g, path, c);

  // The tensors: every one the model needs, with the metadata's shape; no other.
  TensorReader r(g, path, b);
  Weights& w = b.weights();
  w.token_embedding = r.mat("token_embd.weight", c.dim, c.vocab_size);
  w.layers.resize(static_cast<std::size_t>(c.n_layers));
  for (std::int64_t i = 0; i < c.n_layers; ++i) {
    LayerWeights& l = w.layers[static_cast<std::size_t>(i)];
    l = read_layer(r, g, c, i);
    c.qkv_bias = c.qkv_bias || l.bq != nullptr || l.bk != nullptr || l.bv != nullptr;
  }
  w.final_norm = r.vec("output_norm.weight", c.dim);
  if (g.find_tensor("rope_freqs.weight")) read_rope_freqs(r, path, c);
  c.tied_classifier = g.find_tensor("output.weight") == nullptr;
  w.classifier =
      c.tied_classifier ? w.token_embedding : r.mat("output.weight", c.dim, c.vocab_size);
  c.weights_dtype = r.matrix_type();
  r.check_all_used(arch);

  const std::string dir = std::filesystem::path(path).parent_path().string();
  b.set_paths(path, dir.empty() ? "." : dir);
  b.set_file(std::move(file));
  return b.finish();
}

}  // namespace vq::engine
