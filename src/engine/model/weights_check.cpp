#include "engine/model/weights_check.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "engine/formats/json_limits.h"
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
    // Biases (Qwen2): checked like the weights, so a NaN is named here rather than found later
    // as a non-finite logit with no tensor named.
    if (l.bq != nullptr) {
      tensors.push_back({p + name("self_attn.q_proj.bias", "attn_q.bias", "bq"), l.bq, c.q_dim(), nullptr});
    }
    if (l.bk != nullptr) {
      tensors.push_back({p + name("self_attn.k_proj.bias", "attn_k.bias", "bk"), l.bk, c.kv_dim(), nullptr});
    }
    if (l.bv != nullptr) {
      tensors.push_back({p + name("self_attn.v_proj.bias", "attn_v.bias", "bv"), l.bv, c.kv_dim(), nullptr});
    }
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
                "'" + text_excerpt(model.path(), 200) + "': weight tensor '" + text_excerpt(tensor, 120) + "' holds " + value_text(v) +
                    " at element " + std::to_string(at) + " of " + std::to_string(n) +
                    " (a corrupt checkpoint; weights must be finite)",
                model.path());
  };
  if (!c.rope_freq_factors.empty()) {
    tensors.push_back({name("rope_scaling (as per-frequency factors)", "rope_freqs.weight",
                            "rope_freqs"),
                       c.rope_freq_factors.data(),
                       static_cast<std::int64_t>(c.rope_freq_factors.size()), nullptr});
  }
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

void check_float32_settings(const Model& model) {
  const ModelConfig& c = model.config();
  auto fail = [&](const std::string& setting, const std::string& problem) {
    throw Error(ErrorCode::kFileError,
                "'" + text_excerpt(model.path(), 200) + "': " + setting + " " + problem +
                    " as float32, the precision it is used in (the outputs would be NaN or "
                    "meaningless)",
                model.path());
  };
  auto shown = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", v);
    return std::string(buf);
  };
  // The RMSNorm epsilon is added in float32: 0 (an underflow) lets an all-zero row divide by 0.
  if (!(std::isfinite(c.norm_eps) && c.norm_eps > 0.0f)) {
    fail("the RMSNorm epsilon (rms_norm_eps / layer_norm_rms_epsilon)",
         "is " + shown(c.norm_eps) + ", expected a finite value > 0");
  }
  // The RoPE base is raised to powers in float32 (interleaved RoPE) and written as float32 to
  // GGUF: beyond float32's range it is infinite.
  const auto theta32 = static_cast<float>(c.rope_theta);
  if (!(std::isfinite(theta32) && theta32 > 1.0f)) {
    fail("the RoPE base (rope_theta / rope.freq_base) " + shown(c.rope_theta),
         "becomes " + shown(theta32) + ", expected a finite value > 1");
  }
  // Linear RoPE scaling divides every frequency by its factor; both it and 1 / factor must be
  // finite and non-zero in float32 (GGUF stores the factor as float32).
  const auto scale32 = static_cast<float>(c.rope_freq_scale);
  const auto factor32 = static_cast<float>(1.0 / c.rope_freq_scale);
  if (!(std::isfinite(scale32) && scale32 > 0.0f && std::isfinite(factor32) && factor32 > 0.0f)) {
    fail("the linear RoPE scaling factor " + shown(1.0 / c.rope_freq_scale),
         "becomes " + shown(factor32) + " (its reciprocal " + shown(scale32) +
             "), expected finite values > 0");
  }
  for (std::size_t i = 0; i < c.rope_freq_factors.size(); ++i) {
    const float f = c.rope_freq_factors[i];
    const double mul = c.rope_freq_scale / static_cast<double>(f);
    if (!(std::isfinite(f) && f > 0.0f && std::isfinite(mul) && mul > 0)) {
      fail("RoPE frequency factor " + std::to_string(i) + " of " +
               std::to_string(c.rope_freq_factors.size()) +
               " (rope_scaling / rope_freqs.weight)",
           "is " + shown(f) + ", expected a finite value > 0");
    }
  }
}

}  // namespace vq::engine
