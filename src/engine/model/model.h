// A Llama-architecture model: its configuration and its weights, loaded from a llama2.c
// checkpoint or a Hugging Face Llama checkpoint (config.json + model.safetensors, or the
// shards model.safetensors.index.json names).
//
// Weight matrices keep the type the file stores (fp32, fp16, bf16, Q8_0 and, from GGUF, the
// block types Q4_0..Q6_K; engine/weights.h) and
// are read in place from the read-only memory mapping; only a tensor at an offset its type
// cannot be read from is copied (same type) into a buffer the Model owns. Norm vectors are
// small and always fp32 (converted once when stored otherwise). Every pointer is valid for the
// Model's lifetime (moving a Model keeps them valid); matrices are row-major [out][in].
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/compute/weights.h"

namespace vq::engine {

class MappedFile;

// How RoPE pairs the dimensions of a head (the checkpoint format decides; docs/design.md).
enum class RopeStyle {
  kInterleaved,  // llama2.c: pairs (2i, 2i+1), frequency theta^(-2i/head_dim)
  kRotateHalf,   // Hugging Face: pairs (i, i + head_dim/2), same frequencies
};
const char* to_string(RopeStyle style) noexcept;

struct ModelConfig {
  std::string format;           // "llama2c", "hf" or "gguf"
  std::int64_t dim = 0;         // residual stream width (hidden_size)
  std::int64_t hidden_dim = 0;  // SwiGLU width (intermediate_size)
  std::int64_t n_layers = 0;
  std::int64_t n_heads = 0;     // query heads (Hq)
  std::int64_t n_kv_heads = 0;  // key/value heads (Hkv); Hq % Hkv == 0
  std::int64_t head_dim = 0;    // D
  std::int64_t vocab_size = 0;
  std::int64_t seq_len = 0;  // trained context; positions must stay below it
  float norm_eps = 1e-5f;    // RMSNorm epsilon
  double rope_theta = 10000.0;
  RopeStyle rope = RopeStyle::kInterleaved;
  // Frequency i of a head (i < head_dim / 2) is theta^(-2i/head_dim) * rope_freq_scale /
  // rope_freq_factors[i] (llama.cpp's ggml_rope_ext with freq_factors, no YaRN):
  //  - rope_freq_factors: Llama 3.x's per-frequency divisors (GGUF tensor rope_freqs.weight);
  //    empty: all 1;
  //  - rope_freq_scale: linear RoPE scaling, 1 / rope.scaling.factor; 1: none.
  std::vector<float> rope_freq_factors;
  double rope_freq_scale = 1.0;
  bool tied_classifier = true;  // the classifier is the token embedding
  bool qkv_bias = false;        // q/k/v projections have biases (Qwen2): LayerWeights::bq/bk/bv
  std::string weights_dtype;    // as stored: "f32", "f16", "bf16" (or "mixed")
  std::int32_t bos_id = 1;      // -1 when the checkpoint names none
  std::int32_t eos_id = 2;

  std::int64_t q_dim() const noexcept { return n_heads * head_dim; }
  std::int64_t kv_dim() const noexcept { return n_kv_heads * head_dim; }
  std::int64_t n_params() const noexcept;  // trainable parameters (tied classifier once)
};

struct LayerWeights {
  const float* attn_norm = nullptr;  // [dim] fp32
  WeightMatrix wq;                   // [q_dim][dim]
  // Projection biases added after wq / wk / wv (Qwen2's q/k/v biases), fp32, or null: none.
  const float* bq = nullptr;  // [q_dim]
  const float* bk = nullptr;  // [kv_dim]
  const float* bv = nullptr;  // [kv_dim]
  WeightMatrix wk;                   // [kv_dim][dim]
  WeightMatrix wv;                   // [kv_dim][dim]
  WeightMatrix wo;                   // [dim][q_dim]
  const float* ffn_norm = nullptr;   // [dim] fp32
  WeightMatrix w_gate;               // [hidden_dim][dim]  (llama2.c w1)
  WeightMatrix w_up;                 // [hidden_dim][dim]  (llama2.c w3)
  WeightMatrix w_down;               // [dim][hidden_dim]  (llama2.c w2)
};

struct Weights {
  WeightMatrix token_embedding;       // [vocab_size][dim] (a row is read per token)
  std::vector<LayerWeights> layers;   // [n_layers]
  const float* final_norm = nullptr;  // [dim] fp32
  WeightMatrix classifier;            // [vocab_size][dim]
};

class Model {
 public:
  // Loads a checkpoint, choosing the format from the path:
  //  - a directory, a *.safetensors file or a *.json file: Hugging Face Llama (config.json and
  //    model.safetensors in that directory; without one, the shards named by
  //    model.safetensors.index.json there. A shard's path or the index's path loads the
  //    sharded checkpoint too);
  //  - a *.gguf file or any file starting with the magic "GGUF": GGUF (llama.cpp);
  //  - any other file: a llama2.c legacy (v0) checkpoint.
  // Throws Error(kFileError) naming the file and what is wrong (expected vs found).
  static Model load(const std::string& path);
  static Model load_llama2c(const std::string& path);
  static Model load_hf(const std::string& path);
  static Model load_gguf(const std::string& path);  // gguf_model.cpp

  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;
  ~Model();

  const ModelConfig& config() const noexcept { return config_; }
  const Weights& weights() const noexcept { return weights_; }
  // The checkpoint file (llama2.c .bin, model.safetensors, or a sharded HF checkpoint's
  // model.safetensors.index.json) and the directory (for HF, of config.json).
  const std::string& path() const noexcept { return path_; }
  const std::string& directory() const noexcept { return directory_; }
  // The key-filter file of method qfilters (engine/run/qfilters_file.h): the one set by
  // set_qfilters_path (the --qfilters flag), else path() + ".qfilters" (what `veloxquant
  // calibrate` writes by default); "" for a model without a file (a named random shape).
  void set_qfilters_path(std::string file) { qfilters_path_ = std::move(file); }
  std::string qfilters_path() const {
    if (!qfilters_path_.empty()) return qfilters_path_;
    return path_.empty() || config_.format == "random" ? "" : path_ + ".qfilters";
  }
  // Bytes of buffers this Model owns (converted norms, copied or generated tensors); 0 when
  // every weight is mapped in place.
  std::int64_t owned_bytes() const noexcept;
  // Bytes of weight matrices a forward step reads per token: every layer matrix and the
  // classifier (the embedding contributes one row; counted once when tied).
  std::int64_t matrix_bytes() const noexcept;
  // The weights are read in place from memory-mapped files; a file truncated under its mapping
  // would kill the process with SIGBUS. A long-running user (the server, per request) asks
  // first: "" when every mapped file still has the size and modification time it had at load,
  // else "'<file>': its size changed from A to B bytes since it was loaded; ..." (the first
  // changed file; formats/mapped_file.h MappedFile::check_unchanged).
  std::string file_change() const;

 private:
  Model();
  friend struct ModelBuilder;
  ModelConfig config_;
  Weights weights_;
  std::string path_, directory_;
  std::string qfilters_path_;  // set_qfilters_path
  std::vector<std::unique_ptr<MappedFile>> files_;  // every mapping the weights point into
  std::vector<std::unique_ptr<std::uint8_t[]>> owned_;
  std::vector<std::int64_t> owned_sizes_;
};

}  // namespace vq::engine
