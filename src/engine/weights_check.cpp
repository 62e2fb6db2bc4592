#include "engine/weights_check.h"

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
  const bool hf = c.format == "hf";
  struct Tensor {
    std::string name;
    const float* data;
    std::int64_t n;
  };
  std::vector<Tensor> tensors;
  const std::int64_t dim = c.dim, hid = c.hidden_dim, qd = c.q_dim(), kvd = c.kv_dim();
  tensors.push_back({hf ? "model.embed_tokens.weight" : "token_embedding", w.token_embedding,
                     c.vocab_size * dim});
  for (std::size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& l = w.layers[i];
    const std::string p =
        hf ? "model.layers." + std::to_string(i) + "." : "layer " + std::to_string(i) + " ";
    tensors.push_back({p + (hf ? "input_layernorm.weight" : "rms_att"), l.attn_norm, dim});
    tensors.push_back({p + (hf ? "self_attn.q_proj.weight" : "wq"), l.wq, qd * dim});
    tensors.push_back({p + (hf ? "self_attn.k_proj.weight" : "wk"), l.wk, kvd * dim});
    tensors.push_back({p + (hf ? "self_attn.v_proj.weight" : "wv"), l.wv, kvd * dim});
    tensors.push_back({p + (hf ? "self_attn.o_proj.weight" : "wo"), l.wo, dim * qd});
    tensors.push_back({p + (hf ? "post_attention_layernorm.weight" : "rms_ffn"), l.ffn_norm, dim});
    tensors.push_back({p + (hf ? "mlp.gate_proj.weight" : "w1"), l.w_gate, hid * dim});
    tensors.push_back({p + (hf ? "mlp.up_proj.weight" : "w3"), l.w_up, hid * dim});
    tensors.push_back({p + (hf ? "mlp.down_proj.weight" : "w2"), l.w_down, dim * hid});
  }
  tensors.push_back({hf ? "model.norm.weight" : "rms_final", w.final_norm, dim});
  if (!c.tied_classifier) {
    tensors.push_back({hf ? "lm_head.weight" : "wcls", w.classifier, c.vocab_size * dim});
  }
  for (const Tensor& t : tensors) {
    if (t.data == nullptr) continue;
    const std::int64_t i = first_non_finite(t.data, t.n);
    if (i >= 0) {
      throw Error(ErrorCode::kFileError,
                  "'" + model.path() + "': weight tensor '" + t.name + "' holds " +
                      value_text(t.data[i]) + " at element " + std::to_string(i) + " of " +
                      std::to_string(t.n) + " (a corrupt checkpoint; weights must be finite)",
                  model.path());
    }
  }
}

}  // namespace vq::engine
