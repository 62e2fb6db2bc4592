#include "engine/model/shapes.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/model/model_builder.h"
#include "engine/compute/parallel.h"
#include "veloxquant/errors.h"
#include "veloxquant/types.h"

namespace vq::engine {
namespace {

ModelConfig shape_config(std::int64_t dim, std::int64_t hidden, std::int64_t layers,
                         std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim,
                         std::int64_t vocab, double theta, float eps, bool tied, std::int32_t bos,
                         std::int32_t eos) {
  ModelConfig c;
  c.format = "random";
  c.dim = dim;
  c.hidden_dim = hidden;
  c.n_layers = layers;
  c.n_heads = heads;
  c.n_kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.vocab_size = vocab;
  c.seq_len = 131072;  // positions the engine accepts (random weights: no trained context)
  c.norm_eps = eps;
  c.rope_theta = theta;
  c.rope = RopeStyle::kRotateHalf;
  c.tied_classifier = tied;
  c.bos_id = bos;
  c.eos_id = eos;
  return c;
}

// splitmix64's finaliser: a counter RNG (every output depends only on its input).
inline std::uint64_t mix(std::uint64_t z) noexcept {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Uniform in [-a, a): 24 random bits scaled (exact in fp32).
inline float uniform(std::uint64_t key, std::int64_t k, float a) noexcept {
  const std::uint64_t r = mix(key ^ mix(static_cast<std::uint64_t>(k)));
  const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);  // [0, 1)
  return (2.0f * u - 1.0f) * a;
}

// A [rows][cols] matrix of `type` filled from tensor key `key`, rows in parallel.
WeightMatrix random_matrix(ModelBuilder& b, WeightType type, std::int64_t rows, std::int64_t cols,
                           std::uint64_t key, float a) {
  WeightMatrix m{type, rows, cols, nullptr};
  auto* data = static_cast<std::uint8_t*>(b.own_bytes(m.bytes()));
  m.data = data;
  const std::int64_t rb = m.row_bytes();
  parallel_for(rows, threads(), [&](std::int64_t r0, std::int64_t r1) {
    std::vector<float> tmp(static_cast<std::size_t>(cols));
    for (std::int64_t i = r0; i < r1; ++i) {
      for (std::int64_t j = 0; j < cols; ++j)
        tmp[static_cast<std::size_t>(j)] = uniform(key, i * cols + j, a);
      std::uint8_t* row = data + i * rb;
      switch (type) {
        case WeightType::kF32:
          std::memcpy(row, tmp.data(), static_cast<std::size_t>(rb));
          break;
        case WeightType::kF16:
        case WeightType::kBF16:
          for (std::int64_t j = 0; j < cols; ++j) {
            const float v = tmp[static_cast<std::size_t>(j)];
            const std::uint16_t h = type == WeightType::kF16 ? float_to_half(v) : float_to_bf16(v);
            std::memcpy(row + 2 * j, &h, 2);
          }
          break;
        case WeightType::kQ8_0:
          quantize_row_q8_0(tmp.data(), reinterpret_cast<BlockQ8_0*>(row), cols);
          break;
        default:  // refused by make_random_model before any matrix is made
          break;
      }
    }
  });
  return m;
}

const float* ones(ModelBuilder& b, std::int64_t n) {
  float* p = b.own(n);
  for (std::int64_t i = 0; i < n; ++i) p[i] = 1.0f;
  return p;
}

// n fp32 values uniform in [-a, a) from tensor key `key`.
const float* random_vector(ModelBuilder& b, std::int64_t n, std::uint64_t key, float a) {
  float* p = b.own(n);
  for (std::int64_t i = 0; i < n; ++i) p[i] = uniform(key, i, a);
  return p;
}

[[noreturn]] void io_error(const std::string& path, const std::string& what) {
  throw Error(ErrorCode::kIoError, "'" + path + "': " + what, path);
}

}  // namespace

const std::vector<NamedShape>& named_shapes() {
  static const std::vector<NamedShape> shapes = {
      {"llama-110m", shape_config(768, 2048, 12, 12, 12, 64, 32000, 10000.0, 1e-5f, true, 1, 2), 12,
       "llama2.c stories110M's shape (tied classifier)"},
      {"llama-3.2-1b",
       shape_config(2048, 8192, 16, 32, 8, 64, 128256, 500000.0, 1e-5f, true, 128000, 128001), 16,
       "Llama 3.2 1B's shape; plain RoPE (the published model's llama3 RoPE scaling, which the "
       "engine applies to real files, is not written)"},
      {"qwen2.5-0.5b",
       [] {
         ModelConfig c =
             shape_config(896, 4864, 24, 14, 2, 64, 151936, 1000000.0, 1e-6f, true, -1, 151643);
         c.qkv_bias = true;
         return c;
       }(),
       24,
       "Qwen2.5 0.5B's shape with its q/k/v biases (a Qwen2 model)", true},
      {"llama-3-8b",
       shape_config(4096, 14336, 32, 32, 8, 128, 128256, 500000.0, 1e-5f, false, 128000, 128001), 2,
       "Llama 3 8B's shape restricted to its first 2 of 32 layers by default (memory); "
       "head_dim 128"},
  };
  return shapes;
}

const NamedShape& find_shape(const std::string& name) {
  std::string known;
  for (const NamedShape& s : named_shapes()) {
    if (s.name == name) return s;
    known += (known.empty() ? "" : ", ") + s.name;
  }
  throw Error(ErrorCode::kInvalidArgument,
              "[shape] unknown model shape '" + name + "'; known: " + known);
}

Model make_random_model(const std::string& name, const RandomModelOptions& o) {
  const NamedShape& shape = find_shape(name);
  const std::int64_t layers = o.n_layers == 0 ? shape.default_layers : o.n_layers;
  if (layers < 1 || layers > shape.config.n_layers) {
    throw Error(ErrorCode::kInvalidArgument, "[shape] layers must be in [1, " +
                                                 std::to_string(shape.config.n_layers) + "] for " +
                                                 name + ", got " + std::to_string(layers));
  }
  if (o.vocab_size < 0 || o.vocab_size > shape.config.vocab_size) {
    throw Error(ErrorCode::kInvalidArgument, "[shape] vocab_size must be in [0, " +
                                                 std::to_string(shape.config.vocab_size) +
                                                 "] for " + name + " (0: the shape's), got " +
                                                 std::to_string(o.vocab_size));
  }
  if (o.type != WeightType::kF32 && o.type != WeightType::kF16 && o.type != WeightType::kBF16 &&
      o.type != WeightType::kQ8_0) {
    throw Error(ErrorCode::kInvalidArgument,
                std::string("[shape] random weights can be f32, f16, bf16 or q8_0, got ") +
                    to_string(o.type) + " (quantize a written model with llama-quantize instead)");
  }
  if (o.type == WeightType::kQ8_0 &&
      (shape.config.dim % kQ8_0BlockSize != 0 || shape.config.hidden_dim % kQ8_0BlockSize != 0 ||
       shape.config.q_dim() % kQ8_0BlockSize != 0)) {
    throw Error(ErrorCode::kInvalidArgument, "[shape] q8_0 needs widths divisible by 32");
  }
  ModelBuilder b;
  ModelConfig& c = b.config();
  c = shape.config;
  c.n_layers = layers;
  c.weights_dtype = to_string(o.type);
  if (o.vocab_size != 0) {
    c.vocab_size = o.vocab_size;
    if (c.bos_id >= c.vocab_size) c.bos_id = -1;
    if (c.eos_id >= c.vocab_size) c.eos_id = -1;
  }
  const std::int64_t dim = c.dim, hid = c.hidden_dim, qd = c.q_dim(), kvd = c.kv_dim();
  const auto scale = [](std::int64_t fan_in) {
    return static_cast<float>(std::sqrt(3.0 / static_cast<double>(fan_in)));
  };
  // Tensor keys: a fixed id per tensor, mixed with the seed.
  std::uint64_t next_id = 0;
  const auto key = [&]() { return mix(o.seed * 0x100000001b3ULL + (++next_id)); };
  Weights& w = b.weights();
  w.token_embedding = random_matrix(b, o.type, c.vocab_size, dim, key(), scale(dim));
  w.layers.resize(static_cast<std::size_t>(layers));
  for (LayerWeights& l : w.layers) {
    l.attn_norm = ones(b, dim);
    l.wq = random_matrix(b, o.type, qd, dim, key(), scale(dim));
    l.wk = random_matrix(b, o.type, kvd, dim, key(), scale(dim));
    l.wv = random_matrix(b, o.type, kvd, dim, key(), scale(dim));
    if (shape.qkv_bias) {
      l.bq = random_vector(b, qd, key(), 0.5f);
      l.bk = random_vector(b, kvd, key(), 0.5f);
      l.bv = random_vector(b, kvd, key(), 0.5f);
    }
    l.wo = random_matrix(b, o.type, dim, qd, key(), scale(qd));
    l.ffn_norm = ones(b, dim);
    l.w_gate = random_matrix(b, o.type, hid, dim, key(), scale(dim));
    l.w_up = random_matrix(b, o.type, hid, dim, key(), scale(dim));
    l.w_down = random_matrix(b, o.type, dim, hid, key(), scale(hid));
  }
  w.final_norm = ones(b, dim);
  w.classifier = c.tied_classifier ? w.token_embedding
                                   : random_matrix(b, o.type, c.vocab_size, dim, key(), scale(dim));
  b.set_paths("shape:" + name, ".");
  return b.finish();
}

namespace {

const char* st_dtype(WeightType t) {
  switch (t) {
    case WeightType::kF32:
      return "F32";
    case WeightType::kF16:
      return "F16";
    case WeightType::kBF16:
      return "BF16";
    default:
      break;
  }
  return nullptr;
}

// Writes `content` pieces to path via a temporary file in the same directory and a rename.
template <typename Fn>
void write_atomic(const std::string& path, Fn&& write) {
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) io_error(tmp, "cannot create file");
    write(out);
    out.flush();
    if (!out) {
      out.close();
      std::remove(tmp.c_str());
      io_error(path, "write failed (disk full?)");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    io_error(path, "cannot rename the temporary file into place");
  }
}

// A tensor of a safetensors file: a matrix read from `data` in its type, or a vector converted
// from fp32 `vec` on write.
struct StEntry {
  std::string name;
  WeightType type;
  std::vector<std::int64_t> shape;
  const void* data;   // matrices
  const float* vec;   // vectors (converted on write)
  std::int64_t bytes;
  std::int64_t n = 0;  // vectors: values
};

// The model's tensors under Hugging Face Llama names (Qwen2's q/k/v biases when it has them), in
// file order. Matrices keep their type (all must share it); norm vectors are written in that
// type when every value converts exactly, else F32; biases F32.
std::vector<StEntry> checkpoint_entries(const Model& model, WeightType type, bool qwen2) {
  const ModelConfig& c = model.config();
  const Weights& w = model.weights();
  auto norm_exact = [&](const float* v) {
    for (std::int64_t i = 0; i < c.dim; ++i) {
      float back = v[i];
      if (type == WeightType::kBF16) back = bf16_to_float(float_to_bf16(v[i]));
      if (type == WeightType::kF16) back = half_to_float(float_to_half(v[i]));
      if (back != v[i]) return false;
    }
    return true;
  };
  bool norms_typed = type != WeightType::kF32 && norm_exact(w.final_norm);
  for (const LayerWeights& l : w.layers)
    norms_typed = norms_typed && norm_exact(l.attn_norm) && norm_exact(l.ffn_norm);
  const WeightType norm_type = norms_typed ? type : WeightType::kF32;

  std::vector<StEntry> entries;
  auto add_matrix = [&](const std::string& name, const WeightMatrix& m) {
    if (m.type != type) {
      throw Error(ErrorCode::kInvalidArgument,
                  "[make-model] mixed weight types are not written ('" + name + "')");
    }
    entries.push_back({name, m.type, {m.rows, m.cols}, m.data, nullptr, m.bytes()});
  };
  auto add_norm = [&](const std::string& name, const float* v) {
    entries.push_back(
        {name, norm_type, {c.dim}, nullptr, v, weight_row_bytes(norm_type, c.dim), c.dim});
  };
  auto add_bias = [&](const std::string& name, const float* v, std::int64_t n) {
    entries.push_back({name, WeightType::kF32, {n}, nullptr, v, 4 * n, n});
  };
  add_matrix("model.embed_tokens.weight", w.token_embedding);
  for (std::size_t i = 0; i < w.layers.size(); ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    const LayerWeights& l = w.layers[i];
    add_norm(p + "input_layernorm.weight", l.attn_norm);
    add_matrix(p + "self_attn.q_proj.weight", l.wq);
    add_matrix(p + "self_attn.k_proj.weight", l.wk);
    add_matrix(p + "self_attn.v_proj.weight", l.wv);
    if (qwen2) {
      add_bias(p + "self_attn.q_proj.bias", l.bq, c.q_dim());
      add_bias(p + "self_attn.k_proj.bias", l.bk, c.kv_dim());
      add_bias(p + "self_attn.v_proj.bias", l.bv, c.kv_dim());
    }
    add_matrix(p + "self_attn.o_proj.weight", l.wo);
    add_norm(p + "post_attention_layernorm.weight", l.ffn_norm);
    add_matrix(p + "mlp.gate_proj.weight", l.w_gate);
    add_matrix(p + "mlp.up_proj.weight", l.w_up);
    add_matrix(p + "mlp.down_proj.weight", l.w_down);
  }
  add_norm("model.norm.weight", w.final_norm);
  if (!c.tied_classifier) add_matrix("lm_head.weight", w.classifier);
  return entries;
}

// path: the safetensors file of `entries` (header, data section 64-byte aligned), written
// atomically.
void write_safetensors(const std::string& path, const std::vector<StEntry>& entries) {
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}, {"generator", "veloxquant make-model"}};
  std::int64_t offset = 0;
  for (const StEntry& e : entries) {
    header[e.name] = {{"dtype", st_dtype(e.type)},
                      {"shape", e.shape},
                      {"data_offsets", {offset, offset + e.bytes}}};
    offset += e.bytes;
  }
  std::string text = header.dump();
  while ((8 + text.size()) % 64 != 0) text += ' ';  // data section 64-byte aligned
  const std::uint64_t header_len = text.size();

  write_atomic(path, [&](std::ofstream& out) {
    out.write(reinterpret_cast<const char*>(&header_len), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    std::vector<std::uint8_t> buf;
    for (const StEntry& e : entries) {
      if (e.data != nullptr) {
        out.write(static_cast<const char*>(e.data), static_cast<std::streamsize>(e.bytes));
        continue;
      }
      buf.resize(static_cast<std::size_t>(e.bytes));
      for (std::int64_t i = 0; i < e.n; ++i) {
        if (e.type == WeightType::kF32) {
          std::memcpy(buf.data() + 4 * i, e.vec + i, 4);
        } else {
          const std::uint16_t h =
              e.type == WeightType::kBF16 ? float_to_bf16(e.vec[i]) : float_to_half(e.vec[i]);
          std::memcpy(buf.data() + 2 * i, &h, 2);
        }
      }
      out.write(reinterpret_cast<const char*>(buf.data()),
                static_cast<std::streamsize>(buf.size()));
    }
  });
}

// config.json of a Llama (or Qwen2) checkpoint of `c` with matrices of `type`.
std::string hf_config_text(const ModelConfig& c, WeightType type, bool qwen2) {
  nlohmann::ordered_json cj;
  cj["architectures"] = {qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM"};
  cj["model_type"] = qwen2 ? "qwen2" : "llama";
  cj["hidden_size"] = c.dim;
  cj["intermediate_size"] = c.hidden_dim;
  cj["num_hidden_layers"] = c.n_layers;
  cj["num_attention_heads"] = c.n_heads;
  cj["num_key_value_heads"] = c.n_kv_heads;
  cj["head_dim"] = c.head_dim;
  cj["vocab_size"] = c.vocab_size;
  cj["max_position_embeddings"] = c.seq_len;
  cj["rms_norm_eps"] = c.norm_eps;
  cj["rope_theta"] = c.rope_theta;
  cj["rope_scaling"] = nullptr;
  cj["hidden_act"] = "silu";
  if (!qwen2) {
    cj["attention_bias"] = false;
    cj["mlp_bias"] = false;
  } else {
    cj["use_sliding_window"] = false;
  }
  cj["tie_word_embeddings"] = c.tied_classifier;
  if (c.bos_id >= 0) cj["bos_token_id"] = c.bos_id;
  if (c.eos_id >= 0) cj["eos_token_id"] = c.eos_id;
  cj["torch_dtype"] = type == WeightType::kBF16  ? "bfloat16"
                      : type == WeightType::kF16 ? "float16"
                                                 : "float32";
  return cj.dump(2) + "\n";
}

}  // namespace

void write_hf_checkpoint(const Model& model, const std::string& dir) {
  namespace fs = std::filesystem;
  const Weights& w = model.weights();
  const WeightType type = w.token_embedding.type;
  if (st_dtype(type) == nullptr) {
    throw Error(ErrorCode::kInvalidArgument,
                "[make-model] q8_0 weights have no safetensors type; write f32, f16 or bf16");
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) io_error(dir, "cannot create directory: " + ec.message());

  const bool qwen2 = !w.layers.empty() && w.layers[0].bq != nullptr;
  write_safetensors((fs::path(dir) / "model.safetensors").string(),
                    checkpoint_entries(model, type, qwen2));
  const std::string cfg = hf_config_text(model.config(), type, qwen2);
  write_atomic((fs::path(dir) / "config.json").string(), [&](std::ofstream& out) {
    out.write(cfg.data(), static_cast<std::streamsize>(cfg.size()));
  });
}

}  // namespace vq::engine
