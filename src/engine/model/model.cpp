// Model loading: format dispatch, shared validation, and the llama2.c legacy checkpoint.
#include "engine/model/model.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>

#include "base/input_file.h"
#include "engine/model/model_builder.h"
#include "engine/model/weights_check.h"

namespace vq::engine {

const char* to_string(RopeStyle style) noexcept {
  return style == RopeStyle::kInterleaved ? "interleaved" : "rotate_half";
}

std::int64_t ModelConfig::n_params() const noexcept {
  const std::int64_t per_layer =
      2 * dim + q_dim() * dim * 2 + kv_dim() * dim * 2 + 3 * hidden_dim * dim +
      (qkv_bias ? q_dim() + 2 * kv_dim() : 0);
  return vocab_size * dim * (tied_classifier ? 1 : 2) + n_layers * per_layer + dim;
}

Model::Model() = default;
Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;
Model::~Model() = default;

std::int64_t Model::owned_bytes() const noexcept {
  std::int64_t total = 0;
  for (const std::int64_t b : owned_sizes_) total += b;
  return total;
}

std::int64_t Model::matrix_bytes() const noexcept {
  std::int64_t total = weights_.classifier.bytes();
  for (const LayerWeights& l : weights_.layers) {
    for (const WeightMatrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down})
      total += m->bytes();
  }
  return total + weights_.token_embedding.row_bytes();
}

void validate_shape(const std::string& path, const ModelConfig& c,
                    std::string (*name)(const char* field)) {
  auto positive = [&](const char* field, std::int64_t v, std::int64_t max) {
    if (v <= 0) file_error(path, name(field) + " must be > 0, found " + std::to_string(v));
    if (v > max) {
      file_error(path, name(field) + " = " + std::to_string(v) + " is implausibly large (at most " +
                           std::to_string(max) + " supported)");
    }
  };
  positive("dim", c.dim, kMaxWidth);
  positive("hidden_dim", c.hidden_dim, kMaxWidth);
  positive("n_layers", c.n_layers, kMaxCount);
  positive("n_heads", c.n_heads, kMaxCount);
  positive("n_kv_heads", c.n_kv_heads, kMaxCount);
  positive("head_dim", c.head_dim, kMaxWidth);
  positive("vocab_size", c.vocab_size, kMaxWidth);
  positive("seq_len", c.seq_len, kMaxWidth);
  if (c.n_heads % c.n_kv_heads != 0) {
    file_error(path, name("n_heads") + " (" + std::to_string(c.n_heads) +
                         ") must be a multiple of " + name("n_kv_heads") + " (" +
                         std::to_string(c.n_kv_heads) + ")");
  }
  if (c.head_dim % 2 != 0) {
    file_error(path, "head_dim must be even for RoPE, found " + std::to_string(c.head_dim));
  }
  if (c.q_dim() > kMaxWidth) {
    file_error(path, "n_heads * head_dim = " + std::to_string(c.q_dim()) + " is implausibly large");
  }
}

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string header_field(const char* field) { return std::string("header field ") + field; }

// llama2.c "version 1/2" exports start with this magic ("ak42" little-endian).
constexpr std::int32_t kLlama2cMagic = 0x616b3432;

// Opened like every input (base/input_file.h): a FIFO is refused here, never waited on.
bool has_gguf_magic(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;  // the loader names the missing file
  const InputFile f = InputFile::open(path);
  char magic[4] = {};
  return ::pread(f.fd(), magic, 4, 0) == 4 && std::memcmp(magic, "GGUF", 4) == 0;
}

}  // namespace

std::string Model::file_change() const {
  for (const auto& f : files_) {
    if (f == nullptr) continue;
    try {
      f->check_unchanged();
    } catch (const Error& e) {
      return e.what();
    }
  }
  return {};
}

Model Model::load(const std::string& path) {
  struct stat st {};
  const bool is_dir = ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  Model m = is_dir || ends_with(path, ".safetensors") || ends_with(path, ".json")
                ? load_hf(path)
                : (ends_with(path, ".gguf") || has_gguf_magic(path)) ? load_gguf(path)
                                                                     : load_llama2c(path);
  check_float32_settings(m);  // rope_theta 1e39, rms_norm_eps 1e-46: named, as float32
  check_finite_weights(m);  // a corrupt checkpoint is reported here, naming the tensor
  return m;
}

// llama2.c legacy (v0) checkpoint: 7 little-endian int32 (dim, hidden_dim, n_layers, n_heads,
// n_kv_heads, vocab_size, seq_len), then fp32 tensors in a fixed order, each [out][in]:
// token_embedding, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, two legacy RoPE
// tables (seq_len * head_size / 2 each; unused, RoPE is computed), and the classifier when
// vocab_size is negative (a positive vocab_size means the classifier is the embedding).
Model Model::load_llama2c(const std::string& path) {
  auto file = std::make_unique<MappedFile>(path);
  const std::size_t size = file->size();
  constexpr std::size_t kHeader = 7 * sizeof(std::int32_t);
  if (size < kHeader) {
    file_error(path, "truncated llama2.c header: expected at least " + std::to_string(kHeader) +
                         " bytes (7 int32), found " + std::to_string(size));
  }
  std::int32_t h[7];
  std::memcpy(h, file->data(), kHeader);
  if (h[0] == kLlama2cMagic) {
    file_error(path, "is a llama2.c versioned export (magic \"ak42\", version " +
                         std::to_string(h[1]) + "); only the legacy v0 format is supported");
  }
  ModelBuilder b;
  ModelConfig& c = b.config();
  c.format = "llama2c";
  c.dim = h[0];
  c.hidden_dim = h[1];
  c.n_layers = h[2];
  c.n_heads = h[3];
  c.n_kv_heads = h[4];
  c.tied_classifier = h[5] > 0;
  c.vocab_size = h[5] < 0 ? -static_cast<std::int64_t>(h[5]) : h[5];
  c.seq_len = h[6];
  c.head_dim = c.n_heads > 0 && c.dim % c.n_heads == 0 ? c.dim / c.n_heads : 0;
  if (c.n_heads > 0 && c.dim > 0 && c.dim % c.n_heads != 0) {
    file_error(path, "header field dim (" + std::to_string(c.dim) +
                         ") must be a multiple of n_heads (" + std::to_string(c.n_heads) + ")");
  }
  validate_shape(path, c, header_field);
  c.norm_eps = 1e-5f;  // run.c's RMSNorm epsilon
  c.rope_theta = 10000.0;
  c.rope = RopeStyle::kInterleaved;
  c.weights_dtype = "f32";
  c.bos_id = 1;
  c.eos_id = 2;

  const std::int64_t L = c.n_layers, dim = c.dim, hid = c.hidden_dim;
  const std::int64_t qd = c.q_dim(), kvd = c.kv_dim();
  const std::int64_t n_floats = c.vocab_size * dim + L * dim + L * dim * qd + 2 * L * dim * kvd +
                                L * qd * dim + L * dim + 3 * L * dim * hid + dim +
                                c.seq_len * c.head_dim +
                                (c.tied_classifier ? 0 : c.vocab_size * dim);
  const std::int64_t expected = static_cast<std::int64_t>(kHeader) + 4 * n_floats;
  const std::string dims =
      "dim=" + std::to_string(dim) + ", hidden_dim=" + std::to_string(hid) +
      ", n_layers=" + std::to_string(L) + ", n_heads=" + std::to_string(c.n_heads) +
      ", n_kv_heads=" + std::to_string(c.n_kv_heads) + ", vocab_size=" + std::to_string(h[5]) +
      ", seq_len=" + std::to_string(c.seq_len);
  if (static_cast<std::int64_t>(size) < expected) {
    file_error(path, "truncated: the header (" + dims + ") needs " + std::to_string(expected) +
                         " bytes, found " + std::to_string(size));
  }
  if (static_cast<std::int64_t>(size) > expected) {
    file_error(path, "size mismatch: the header (" + dims + ") needs exactly " +
                         std::to_string(expected) + " bytes, found " + std::to_string(size) + " (" +
                         std::to_string(static_cast<std::int64_t>(size) - expected) +
                         " extra; a different format or wrong header?)");
  }

  // The mapping is page-aligned and the header is 28 bytes, so every tensor is 4-byte aligned.
  const float* p = reinterpret_cast<const float*>(file->data() + kHeader);
  auto take = [&p](std::int64_t n) {
    const float* t = p;
    p += n;
    return t;
  };
  auto matrix = [&take](std::int64_t rows, std::int64_t cols) {
    return WeightMatrix{WeightType::kF32, rows, cols, take(rows * cols)};
  };
  Weights& w = b.weights();
  w.token_embedding = matrix(c.vocab_size, dim);
  w.layers.resize(static_cast<std::size_t>(L));
  for (auto& l : w.layers) l.attn_norm = take(dim);
  for (auto& l : w.layers) l.wq = matrix(qd, dim);
  for (auto& l : w.layers) l.wk = matrix(kvd, dim);
  for (auto& l : w.layers) l.wv = matrix(kvd, dim);
  for (auto& l : w.layers) l.wo = matrix(dim, qd);
  for (auto& l : w.layers) l.ffn_norm = take(dim);
  for (auto& l : w.layers) l.w_gate = matrix(hid, dim);
  for (auto& l : w.layers) l.w_down = matrix(dim, hid);
  for (auto& l : w.layers) l.w_up = matrix(hid, dim);
  w.final_norm = take(dim);
  take(c.seq_len * c.head_dim);  // freq_cis_real and freq_cis_imag (legacy, unused)
  w.classifier = c.tied_classifier ? w.token_embedding : matrix(c.vocab_size, dim);

  const std::string dir = std::filesystem::path(path).parent_path().string();
  b.set_paths(path, dir.empty() ? "." : dir);
  b.set_file(std::move(file));
  return b.finish();
}

}  // namespace vq::engine
