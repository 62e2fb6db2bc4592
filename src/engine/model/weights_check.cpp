#include "engine/model/weights_check.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "veloxquant/errors.h"

namespace vq::engine {
namespace {

// Index of the first non-finite value, or -1.
std::int64_t first_non_finite(const float* p, std::int64_t n) {
  // x * 0 is 0 for finite x and NaN for NaN or infinity, so a block's sum of x * 0 is NaN
  // exactly when the block holds a non-finite value (a vectorisable test); only then search.
  constexpr std::int64_t kBlock = 4096;
  for (std::int64_t at = 0; at < n; at += kBlock) {
    const std::int64_t end = std::min(n, at + kBlock);
    float acc = 0;
    for (std::int64_t i = at; i < end; ++i) acc += p[i] * 0.0f;  // 0 unless p[i] is NaN or Inf
    if (std::isnan(acc)) {
      for (std::int64_t i = at; i < end; ++i) {
        if (!std::isfinite(p[i])) return i;
      }
    }
  }
  return -1;
}

std::string value_text(float v) { return std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf"; }

}  // namespace

bool all_finite(const float* values, std::int64_t n) { return first_non_finite(values, n) < 0; }

void check_finite(const float* values, std::int64_t n, const std::string& what) {
  const std::int64_t i = first_non_finite(values, n);
  if (i >= 0) {
    throw Error(ErrorCode::kInvalidState, what + ": value " + std::to_string(i) + " of " +
                                              std::to_string(n) + " is " + value_text(values[i]) +
                                              " (expected finite numbers)");
  }
}

void check_finite_weights(const Model& model) {
  const ModelConfig& c = model.config();
  const Weights& w = model.weights();
  const bool hf = c.format == "hf", gguf = c.format == "gguf";
  // A tensor: a 1-D fp32 vector (norm weights) or a weight matrix in its stored type, scanned
  // row by row as fp32 (engine/weights.h's exact element values).
  struct Tensor {
    std::string name;
    const float* vec = nullptr;
    std::int64_t n = 0;
    const WeightMatrix* mat = nullptr;
  };
  std::vector<Tensor> tensors;
  auto name = [&](const char* h, const char* g, const char* l) {
    return std::string(hf ? h : gguf ? g : l);
  };
  const std::int64_t dim = c.dim;
  tensors.push_back({name("model.embed_tokens.weight", "token_embd.weight", "token_embedding"),
                     nullptr, 0, &w.token_embedding});
  for (std::size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& l = w.layers[i];
    const std::string p = hf     ? "model.layers." + std::to_string(i) + "."
                          : gguf ? "blk." + std::to_string(i) + "."
                                 : "layer " + std::to_string(i) + " ";
    tensors.push_back({p + name("input_layernorm.weight", "attn_norm.weight", "rms_att"),
                       l.attn_norm, dim, nullptr});
    tensors.push_back({p + name("self_attn.q_proj.weight", "attn_q.weight", "wq"), nullptr, 0, &l.wq});
    tensors.push_back({p + name("self_attn.k_proj.weight", "attn_k.weight", "wk"), nullptr, 0, &l.wk});
    tensors.push_back({p + name("self_attn.v_proj.weight", "attn_v.weight", "wv"), nullptr, 0, &l.wv});
    tensors.push_back(
        {p + name("self_attn.o_proj.weight", "attn_output.weight", "wo"), nullptr, 0, &l.wo});
    tensors.push_back({p + name("post_attention_layernorm.weight", "ffn_norm.weight", "rms_ffn"),
                       l.ffn_norm, dim, nullptr});
    tensors.push_back(
        {p + name("mlp.gate_proj.weight", "ffn_gate.weight", "w1"), nullptr, 0, &l.w_gate});
    tensors.push_back({p + name("mlp.up_proj.weight", "ffn_up.weight", "w3"), nullptr, 0, &l.w_up});
    tensors.push_back(
        {p + name("mlp.down_proj.weight", "ffn_down.weight", "w2"), nullptr, 0, &l.w_down});
  }
  tensors.push_back({name("model.norm.weight", "output_norm.weight", "rms_final"), w.final_norm,
                     dim, nullptr});
  if (!c.tied_classifier) {
    tensors.push_back({name("lm_head.weight", "output.weight", "wcls"), nullptr, 0, &w.classifier});
  }
  auto fail = [&](const std::string& tensor, float v, std::int64_t at, std::int64_t n) {
    throw Error(ErrorCode::kFileError,
                "'" + model.path() + "': weight tensor '" + tensor + "' holds " + value_text(v) +
                    " at element " + std::to_string(at) + " of " + std::to_string(n) +
                    " (a corrupt checkpoint; weights must be finite)",
                model.path());
  };
  std::vector<float> row;
  for (const Tensor& t : tensors) {
    if (t.vec != nullptr) {
      const std::int64_t i = first_non_finite(t.vec, t.n);
      if (i >= 0) fail(t.name, t.vec[i], i, t.n);
      continue;
    }
    if (t.mat == nullptr || t.mat->data == nullptr) continue;
    const WeightMatrix& m = *t.mat;
    row.resize(static_cast<std::size_t>(m.cols));
    for (std::int64_t r = 0; r < m.rows; ++r) {
      if (m.type == WeightType::kF32) {
        const float* p = reinterpret_cast<const float*>(m.row(r));
        const std::int64_t i = first_non_finite(p, m.cols);
        if (i >= 0) fail(t.name, p[i], r * m.cols + i, m.rows * m.cols);
        continue;
      }
      dequantize_row(m, r, row.data());
      const std::int64_t i = first_non_finite(row.data(), m.cols);
      if (i >= 0) fail(t.name, row[static_cast<std::size_t>(i)], r * m.cols + i, m.rows * m.cols);
    }
  }
}

}  // namespace vq::engine
