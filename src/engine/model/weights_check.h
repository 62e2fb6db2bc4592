// Non-finite weights are a corrupt checkpoint: found at load, named, never turned into "nan"
// perplexities later.
#pragma once

#include <cstdint>
#include <string>

#include "engine/model/model.h"

namespace vq::engine {

// Throws Error(kFileError) naming the model file, the tensor (its name in the checkpoint's
// format: "model.layers.3.self_attn.q_proj.weight" for Hugging Face, "layer 3 wq" for llama2.c)
// and the first element that is NaN or infinite. Reads every weight once, the q/k/v biases and
// the RoPE frequency factors included.
void check_finite_weights(const Model& model);

// The model's float settings as the forward uses them, in float32: the RMSNorm epsilon finite
// and > 0, the RoPE base finite and > 1, the linear RoPE scaling factor and its reciprocal, and
// every per-frequency RoPE factor, finite and > 0 (rms_norm_eps 1e-46 underflows to 0, rope_theta
// 1e39 overflows to inf, a factor of 1e-50 becomes 0: each makes the outputs NaN). Throws
// Error(kFileError) naming the model file, the setting and its float32 value.
void check_float32_settings(const Model& model);

// True when every one of the `n` values is finite (a fast, vectorised test).
bool all_finite(const float* values, std::int64_t n);

// Throws Error(kInvalidState) when any of the `n` values is NaN or infinite, naming `what`
// (e.g. "logits at position 17") and the first bad index and value.
void check_finite(const float* values, std::int64_t n, const std::string& what);

}  // namespace vq::engine
