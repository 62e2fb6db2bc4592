// Hugging Face Llama checkpoints: config.json + model.safetensors, or the shards named by
// model.safetensors.index.json (F32, F16 or BF16 tensors; formats/safetensors_set.h).
// RoPE scaling: none, "linear" or Llama 3.x's "llama3" (read_rope_scaling below).
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "engine/formats/json_limits.h"
#include "engine/formats/mapped_file.h"
#include "engine/model/model.h"
#include "engine/model/model_builder.h"
#include "engine/formats/safetensors.h"
#include "engine/formats/safetensors_set.h"
#include "veloxquant/types.h"

namespace vq::engine {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

std::string config_field(const char* field) {
  static const std::map<std::string, std::string> names = {{"dim", "hidden_size"},
                                                           {"hidden_dim", "intermediate_size"},
                                                           {"n_layers", "num_hidden_layers"},
                                                           {"n_heads", "num_attention_heads"},
                                                           {"n_kv_heads", "num_key_value_heads"},
                                                           {"head_dim", "head_dim"},
                                                           {"vocab_size", "vocab_size"},
                                                           {"seq_len", "max_position_embeddings"}};
  const auto it = names.find(field);
  return "config.json '" + (it == names.end() ? std::string(field) : it->second) + "'";
}

struct ConfigReader {
  const std::string& path;
  const json& j;

  [[noreturn]] void bad(const std::string& key, const std::string& expected) const {
    file_error(path, "'" + key + "' must be " + expected + ", found " + json_excerpt(j[key]));
  }
  std::int64_t integer(const std::string& key) const {
    if (!j.contains(key)) file_error(path, "missing required key '" + key + "'");
    if (j[key].is_null()) bad(key, "an integer");
    return integer_or(key, 0);
  }
  std::int64_t integer_or(const std::string& key, std::int64_t fallback) const {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_number_integer()) bad(key, "an integer");
    return exact(key, j[key]);
  }
  // An integer value as int64; one above 2^63 - 1 is an error, never wrapped.
  std::int64_t exact(const std::string& key, const json& v) const {
    if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX)) {
      bad(key, "an integer below 2^63");
    }
    return v.get<std::int64_t>();
  }
  double number_or(const std::string& key, double fallback) const {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_number()) bad(key, "a number");
    return j[key].get<double>();
  }
  // eos_token_id may be a list; the first entry stops generation.
  std::int64_t token_id(const std::string& key) const {
    if (!j.contains(key) || j[key].is_null()) return -1;
    const json& v = j[key];
    if (v.is_number_integer()) return exact(key, v);
    if (v.is_array() && !v.empty() && v[0].is_number_integer()) return exact(key, v[0]);
    bad(key, "an integer or a list of integers");
  }
  void require_value(const std::string& key, const json& allowed, const std::string& why) const {
    if (j.contains(key) && !j[key].is_null() && j[key] != allowed) {
      file_error(path, "'" + key + "' is " + json_excerpt(j[key]) + "; only " +
                           json_excerpt(allowed) + " is supported (" + why + ")");
    }
  }
};

std::string shape_text(const std::vector<std::int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// Turns safetensors entries into weights: matrices keep their stored type and are read in
// place from the file (or shard) that holds them (copied, same type, into a buffer the model
// owns only when the offset is not aligned for the type); norm vectors are converted once to
// fp32.
class TensorLoader {
 public:
  TensorLoader(const SafetensorsSet& st, ModelBuilder& b) : st_(st), b_(b) {}

  WeightMatrix matrix(const SafeTensor* t, std::int64_t rows, std::int64_t cols) {
    check(t, {rows, cols});
    WeightType type = WeightType::kF32;
    if (t->dtype == "F16") {
      type = WeightType::kF16;
    } else if (t->dtype == "BF16") {
      type = WeightType::kBF16;
    } else if (t->dtype != "F32") {
      unsupported(t);
    }
    dtypes_[t->dtype] = true;
    if (const auto it = matrices_.find(t->name); it != matrices_.end()) return it->second;
    const std::uint8_t* src = st_.file_of(*t).data(*t);
    const void* data = src;
    const std::size_t align = type == WeightType::kF32 ? 4 : 2;
    if (reinterpret_cast<std::uintptr_t>(src) % align != 0) {
      const std::int64_t bytes = t->end - t->begin;
      void* dst = b_.own_bytes(bytes);
      std::memcpy(dst, src, static_cast<std::size_t>(bytes));
      data = dst;
    }
    const WeightMatrix m{type, rows, cols, data};
    matrices_[t->name] = m;
    return m;
  }

  const float* vector(const SafeTensor* t, std::int64_t n) {
    check(t, {n});
    dtypes_[t->dtype] = true;
    const std::uint8_t* src = st_.file_of(*t).data(*t);
    if (t->dtype == "F32" && reinterpret_cast<std::uintptr_t>(src) % alignof(float) == 0)
      return reinterpret_cast<const float*>(src);
    if (t->dtype != "F32" && t->dtype != "F16" && t->dtype != "BF16") unsupported(t);
    float* dst = b_.own(n);
    for (std::int64_t i = 0; i < n; ++i) {
      if (t->dtype == "F32") {
        std::memcpy(dst + i, src + 4 * i, 4);
        continue;
      }
      std::uint16_t bits;
      std::memcpy(&bits, src + 2 * i, 2);
      dst[i] = t->dtype == "BF16" ? bf16_to_float(bits) : half_to_float(bits);
    }
    return dst;
  }

  std::string dtype_summary() const {
    if (dtypes_.size() != 1) return "mixed";
    const std::string& d = dtypes_.begin()->first;
    return d == "F32" ? "f32" : d == "F16" ? "f16" : "bf16";
  }

 private:
  const SafetensorsSet& st_;
  ModelBuilder& b_;
  std::map<std::string, WeightMatrix> matrices_;

  void check(const SafeTensor* t, const std::vector<std::int64_t>& shape) const {
    if (t->shape != shape) {
      file_error(st_.file_of(*t).path(), "tensor '" + text_excerpt(t->name, 120) + "' has shape " +
                                             shape_text(t->shape) + ", expected " +
                                             shape_text(shape) + " from config.json");
    }
  }
  [[noreturn]] void unsupported(const SafeTensor* t) const {
    file_error(st_.file_of(*t).path(),
               "tensor '" + text_excerpt(t->name, 120) + "' has dtype " + t->dtype + "; supported: F32, F16, BF16");
  }
  std::map<std::string, bool> dtypes_;
};

// config.json's rope_scaling, as Hugging Face's rope utilities define it:
//  - null, absent or rope_type "default": none;
//  - "linear": every frequency divided by factor (rope_freq_scale = 1 / factor);
//  - "llama3" (Llama 3.1-3.3): per-frequency divisors, as llama.cpp writes them to a GGUF's
//    rope_freqs.weight. With wavelength w_i = 2 pi / freq_i, L = original_max_position_embeddings:
//    w_i < L / high_freq_factor keeps freq_i; w_i > L / low_freq_factor divides it by factor;
//    between, s = (L / w_i - low_freq_factor) / (high_freq_factor - low_freq_factor) and the
//    divisor is 1 / ((1 - s) / factor + s).
// Any other type (dynamic, yarn, longrope) or key is an error naming it, never ignored.
void read_rope_scaling(const std::string& path, const json& cj, ModelConfig& c) {
  if (!cj.contains("rope_scaling") || cj["rope_scaling"].is_null()) return;
  const json& rs = cj["rope_scaling"];
  if (!rs.is_object()) {
    file_error(path, "'rope_scaling' must be an object or null, found " + json_excerpt(rs));
  }
  const std::string where = "'rope_scaling'";
  std::string type;
  for (const char* key : {"rope_type", "type"}) {
    if (!rs.contains(key)) continue;
    if (!rs[key].is_string()) {
      file_error(path, where + " '" + key + "' must be a string, found " + json_excerpt(rs[key]));
    }
    const std::string t = rs[key].get<std::string>();
    if (!type.empty() && t != type) {
      file_error(path, where + " has 'rope_type' \"" + type + "\" and 'type' \"" + t +
                           "\"; they must agree");
    }
    type = t;
  }
  if (type.empty()) file_error(path, where + " names no 'rope_type'");
  std::vector<std::string> keys;  // the keys the type reads, besides rope_type / type
  if (type == "default") {
  } else if (type == "linear") {
    keys = {"factor"};
  } else if (type == "llama3") {
    keys = {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"};
  } else {
    file_error(path, where + " type \"" + type +
                         "\" is not supported (supported: \"default\", \"linear\", \"llama3\")");
  }
  for (auto it = rs.begin(); it != rs.end(); ++it) {
    if (it.key() == "rope_type" || it.key() == "type") continue;
    if (std::find(keys.begin(), keys.end(), it.key()) == keys.end()) {
      file_error(path, where + " key '" + it.key() + "' (" + json_excerpt(it.value()) +
                           ") is not read by the \"" + type +
                           "\" type; this engine would ignore it, so the file is refused");
    }
  }
  auto number = [&](const std::string& key) {
    if (!rs.contains(key)) file_error(path, where + " (\"" + type + "\") is missing '" + key + "'");
    const json& v = rs[key];
    if (!v.is_number() || !std::isfinite(v.get<double>()) || !(v.get<double>() > 0)) {
      file_error(path, where + " '" + key + "' must be a finite number > 0, found " +
                           json_excerpt(v));
    }
    // RoPE factors are used and stored as float32: 1e39 overflows, 1e-46 becomes 0.
    const auto as_float = static_cast<float>(v.get<double>());
    const auto inverse = static_cast<float>(1.0 / v.get<double>());
    if (!std::isfinite(as_float) || !(as_float > 0) || !std::isfinite(inverse) || !(inverse > 0)) {
      file_error(path, where + " '" + key + "' " + json_excerpt(v) +
                           " is outside float32's range as a factor (it or its reciprocal "
                           "becomes 0 or inf), the precision RoPE factors are used in");
    }
    return v.get<double>();
  };
  if (type == "default") return;
  const double factor = number("factor");
  if (type == "linear") {
    c.rope_freq_scale = 1.0 / factor;
    return;
  }
  const double low = number("low_freq_factor"), high = number("high_freq_factor");
  const double old_len = number("original_max_position_embeddings");
  if (!(high > low)) {
    file_error(path, where + " 'high_freq_factor' (" + json_excerpt(rs["high_freq_factor"]) +
                         ") must be greater than 'low_freq_factor' (" +
                         json_excerpt(rs["low_freq_factor"]) + ")");
  }
  const double pi = 3.14159265358979323846;
  const double low_wavelen = old_len / low, high_wavelen = old_len / high;
  c.rope_freq_factors.resize(static_cast<std::size_t>(c.head_dim / 2));
  for (std::int64_t i = 0; i < c.head_dim / 2; ++i) {
    const double freq =
        std::pow(c.rope_theta, -static_cast<double>(2 * i) / static_cast<double>(c.head_dim));
    const double wavelen = 2 * pi / freq;
    double divisor = 1.0;
    if (wavelen > low_wavelen) {
      divisor = factor;
    } else if (!(wavelen < high_wavelen)) {
      const double smooth = (old_len / wavelen - low) / (high - low);
      divisor = 1.0 / ((1.0 - smooth) / factor + smooth);
    }
    c.rope_freq_factors[static_cast<std::size_t>(i)] = static_cast<float>(divisor);
  }
}

// The weights `path` names (Model::load_hf's contract), opened after config.json is read:
//  - an index file (*.safetensors.index.json): its shards;
//  - a *.safetensors file: that file, unless its directory's model.safetensors.index.json
//    lists it as a shard (then the whole sharded checkpoint);
//  - a directory or config.json: DIR/model.safetensors;
// and a missing X.safetensors with an X.safetensors.index.json beside it: that index's shards.
SafetensorsSet open_weights(const std::string& path, bool is_dir, const std::string& dir) {
  auto exists = [](const std::string& p) {
    struct stat st {};
    return ::stat(p.c_str(), &st) == 0;
  };
  if (!is_dir && path.ends_with(".safetensors.index.json")) {
    return SafetensorsSet::sharded(read_safetensors_index(path));
  }
  std::string file = (fs::path(dir) / "model.safetensors").string();
  if (!is_dir && path.ends_with(".safetensors")) {
    file = path;
    const std::string name = fs::path(path).filename().string();
    const std::string index_path = (fs::path(dir) / kSafetensorsIndexName).string();
    if (name != "model.safetensors" && exists(file) && exists(index_path)) {
      const SafetensorsIndex index = read_safetensors_index(index_path);
      const std::vector<std::string> shards = index.shards();
      if (std::find(shards.begin(), shards.end(), name) != shards.end()) {
        return SafetensorsSet::sharded(index);
      }
    }
  }
  if (!exists(file) && exists(file + ".index.json")) {
    return SafetensorsSet::sharded(read_safetensors_index(file + ".index.json"));
  }
  return SafetensorsSet::single(file);
}

// What config.json says beyond the ModelConfig.
struct HfFlags {
  bool qwen2 = false;   // model_type "qwen2": q/k/v biases
  bool untied = false;  // tie_word_embeddings is false: lm_head.weight must exist
};

// config.json (at config_path) into `c`: the architecture (Llama, or Qwen2: a Llama with q/k/v
// biases; its sliding window, when enabled, is not), the shape (validate_shape), the norm
// epsilon and RoPE (base, scaling), BOS/EOS ids inside the vocabulary, the tie flag.
HfFlags read_hf_config(const std::string& config_path, ModelConfig& c) {
  json cj = parse_json_limited(read_text_file(config_path), config_path, "config.json");
  if (!cj.is_object()) {
    file_error(config_path, "must be a JSON object, found " + std::string(cj.type_name()));
  }
  const ConfigReader r{config_path, cj};
  HfFlags flags;
  flags.qwen2 = cj.contains("model_type") && cj["model_type"] == "qwen2";
  if (!flags.qwen2) r.require_value("model_type", "llama", "a Llama-architecture model or 'qwen2'");
  r.require_value("hidden_act", "silu", "SwiGLU");
  if (flags.qwen2) {
    r.require_value("use_sliding_window", false, "no sliding-window attention");
  } else {
    r.require_value("attention_bias", false, "no attention biases");
  }
  r.require_value("mlp_bias", false, "no MLP biases");

  c.format = "hf";
  c.qkv_bias = flags.qwen2;
  c.dim = r.integer("hidden_size");
  c.hidden_dim = r.integer("intermediate_size");
  c.n_layers = r.integer("num_hidden_layers");
  c.n_heads = r.integer("num_attention_heads");
  c.n_kv_heads = r.integer_or("num_key_value_heads", c.n_heads);
  c.vocab_size = r.integer("vocab_size");
  c.seq_len = r.integer("max_position_embeddings");
  if (c.n_heads <= 0)
    file_error(config_path,
               "'num_attention_heads' must be > 0, found " + std::to_string(c.n_heads));
  if (cj.contains("head_dim") && !cj["head_dim"].is_null()) {
    c.head_dim = r.integer("head_dim");
  } else {
    if (c.dim % c.n_heads != 0) {
      file_error(config_path, "'hidden_size' (" + std::to_string(c.dim) +
                                  ") must be a multiple of 'num_attention_heads' (" +
                                  std::to_string(c.n_heads) + ") when 'head_dim' is absent");
    }
    c.head_dim = c.dim / c.n_heads;
  }
  validate_shape(config_path, c, config_field);
  const double eps = r.number_or("rms_norm_eps", 1e-6);
  const double theta = r.number_or("rope_theta", 10000.0);
  if (!(eps > 0 && eps < 1))
    file_error(config_path,
               "'rms_norm_eps' must be in (0, 1), found " + json_excerpt(cj["rms_norm_eps"]));
  // Both are used (and written by convert) as float32: a value that rounds to 0 or overflows
  // there is refused by name, not turned into NaN outputs.
  if (!(static_cast<float>(eps) > 0))
    file_error(config_path, "'rms_norm_eps' " + json_excerpt(cj["rms_norm_eps"]) +
                                " becomes 0 as float32, the precision it is used in (the "
                                "smallest positive float32 is 1.4e-45)");
  if (!(theta > 1))
    file_error(config_path, "'rope_theta' must be > 1, found " + json_excerpt(cj["rope_theta"]));
  if (!std::isfinite(static_cast<float>(theta)))
    file_error(config_path, "'rope_theta' " + json_excerpt(cj["rope_theta"]) +
                                " is beyond float32's range (3.4e38), the precision it is used "
                                "and stored in");
  c.norm_eps = static_cast<float>(eps);
  c.rope_theta = theta;
  c.rope = RopeStyle::kRotateHalf;
  read_rope_scaling(config_path, cj, c);
  c.bos_id = static_cast<std::int32_t>(r.token_id("bos_token_id"));
  c.eos_id = static_cast<std::int32_t>(r.token_id("eos_token_id"));
  for (const auto* key : {"bos_token_id", "eos_token_id"}) {
    const std::int64_t id = r.token_id(key);
    if (id < -1 || id >= c.vocab_size) {
      file_error(config_path, std::string("'") + key + "' = " + std::to_string(id) +
                                  " is outside the vocabulary [0, " + std::to_string(c.vocab_size) +
                                  ")");
    }
  }
  if (cj.contains("tie_word_embeddings") && !cj["tie_word_embeddings"].is_null()) {
    if (!cj["tie_word_embeddings"].is_boolean()) r.bad("tie_word_embeddings", "true or false");
    flags.untied = !cj["tie_word_embeddings"].get<bool>();
  }
  return flags;
}

// Tensors by name in a checkpoint: tied tensors are stored once, and __metadata__ maps the
// missing name to the stored one.
// Every tensor found is recorded, so the checkpoint's other tensors can be refused by name
// (check_all_used), as the GGUF loader refuses tensors it does not read.
class TensorNames {
 public:
  explicit TensorNames(const SafetensorsSet& st) : st_(st) {}
  const SafeTensor* find(const std::string& name) const {
    if (const SafeTensor* t = st_.find(name)) return used(t);
    if (const std::string* alias = st_.metadata(name)) {
      if (const SafeTensor* t = st_.find(*alias)) return used(t);
    }
    return nullptr;
  }
  // A tensor the model does not read (a third layer with two declared, a q bias with
  // attention_bias false, a misspelt name) would be ignored silently, and `convert` would drop
  // it: refused, naming the tensor and its file. Known harmless extras are tolerated: the RoPE
  // frequency table some exports keep (model.layers.N.self_attn.rotary_emb.inv_freq; RoPE is
  // computed from config.json).
  void check_all_used() const {
    for (const std::string& name : st_.tensor_names()) {
      if (used_.count(name) != 0 || name.ends_with(".rotary_emb.inv_freq")) continue;
      const SafeTensor* t = st_.find(name);
      file_error(st_.file_of(*t).path(),
                 "holds tensor '" + text_excerpt(name, 120) +
                     "', which this model does not use (config.json declares " +
                     std::to_string(n_layers_) +
                     " layer(s); a tensor of another layer, a bias the configuration does not "
                     "enable or a misspelt name is refused rather than ignored)");
    }
  }
  void set_layers(std::int64_t n) { n_layers_ = n; }
  const SafeTensor* need(const std::string& name) const {
    const SafeTensor* t = find(name);
    if (t == nullptr) file_error(st_.path(), "missing tensor '" + name + "'");
    return t;
  }

 private:
  const SafeTensor* used(const SafeTensor* t) const {
    used_.insert(t->name);
    return t;
  }
  const SafetensorsSet& st_;
  mutable std::set<std::string> used_;
  std::int64_t n_layers_ = 0;
};

// One layer's tensors ('model.layers.N.'), with Qwen2's q/k/v biases.
LayerWeights read_layer(const TensorNames& t, TensorLoader& load, const ModelConfig& c,
                        std::int64_t i, bool qwen2) {
  const std::int64_t dim = c.dim, hid = c.hidden_dim, qd = c.q_dim(), kvd = c.kv_dim();
  const std::string p = "model.layers." + std::to_string(i) + ".";
  LayerWeights l;
  l.attn_norm = load.vector(t.need(p + "input_layernorm.weight"), dim);
  l.wq = load.matrix(t.need(p + "self_attn.q_proj.weight"), qd, dim);
  l.wk = load.matrix(t.need(p + "self_attn.k_proj.weight"), kvd, dim);
  l.wv = load.matrix(t.need(p + "self_attn.v_proj.weight"), kvd, dim);
  if (qwen2) {
    l.bq = load.vector(t.need(p + "self_attn.q_proj.bias"), qd);
    l.bk = load.vector(t.need(p + "self_attn.k_proj.bias"), kvd);
    l.bv = load.vector(t.need(p + "self_attn.v_proj.bias"), kvd);
  }
  l.wo = load.matrix(t.need(p + "self_attn.o_proj.weight"), dim, qd);
  l.ffn_norm = load.vector(t.need(p + "post_attention_layernorm.weight"), dim);
  l.w_gate = load.matrix(t.need(p + "mlp.gate_proj.weight"), hid, dim);
  l.w_up = load.matrix(t.need(p + "mlp.up_proj.weight"), hid, dim);
  l.w_down = load.matrix(t.need(p + "mlp.down_proj.weight"), dim, hid);
  return l;
}

}  // namespace

Model Model::load_hf(const std::string& path) {
  struct stat st {};
  const bool is_dir = ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  const fs::path dir = is_dir ? fs::path(path) : fs::path(path).parent_path();
  const std::string dir_s = dir.empty() ? "." : dir.string();

  ModelBuilder b;
  ModelConfig& c = b.config();
  const HfFlags flags = read_hf_config((fs::path(dir_s) / "config.json").string(), c);

  // model.safetensors, or the shards an index names
  SafetensorsSet stf = open_weights(path, is_dir, dir_s);
  TensorLoader load(stf, b);
  TensorNames names(stf);
  names.set_layers(c.n_layers);
  Weights& w = b.weights();
  const SafeTensor* embed = names.need("model.embed_tokens.weight");
  w.token_embedding = load.matrix(embed, c.vocab_size, c.dim);
  w.layers.resize(static_cast<std::size_t>(c.n_layers));
  for (std::int64_t i = 0; i < c.n_layers; ++i)
    w.layers[static_cast<std::size_t>(i)] = read_layer(names, load, c, i, flags.qwen2);
  w.final_norm = load.vector(names.need("model.norm.weight"), c.dim);
  const SafeTensor* head = names.find("lm_head.weight");
  if (head == nullptr) {
    if (flags.untied) {
      file_error(stf.path(),
                 "missing tensor 'lm_head.weight' and config.json sets "
                 "tie_word_embeddings to false");
    }
    head = embed;
  }
  w.classifier = load.matrix(head, c.vocab_size, c.dim);
  c.tied_classifier = head == embed;
  names.check_all_used();
  c.weights_dtype = load.dtype_summary();

  b.set_paths(stf.path(), dir_s);
  b.set_files(stf.release());
  return b.finish();
}

}  // namespace vq::engine
