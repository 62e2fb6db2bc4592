// Non-finite weights are a corrupt checkpoint: found at load, named, never turned into "nan"
// perplexities later.
#pragma once

#include <cstdint>
#include <string>

#include "engine/model/model.h"

namespace vq::engine {

// Throws Error(kFileError) naming the model file, the tensor (its name in the checkpoint's
// format: "model.layers.3.self_attn.q_proj.weight" for Hugging Face, "layer 3 wq" for llama2.c)
// and the first element that is NaN or infinite. Reads every weight once.
void check_finite_weights(const Model& model);

// True when every one of the `n` values is finite (a fast, vectorised test).
bool all_finite(const float* values, std::int64_t n);

// Throws Error(kInvalidState) when any of the `n` values is NaN or infinite, naming `what`
// (e.g. "logits at position 17") and the first bad index and value.
void check_finite(const float* values, std::int64_t n, const std::string& what);

}  // namespace vq::engine
