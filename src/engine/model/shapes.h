// Named model shapes with deterministic random weights, so the engine can run and be measured
// at real model sizes without downloading a checkpoint, and the same weights can be written
// as a Hugging Face checkpoint (config.json + model.safetensors) that other engines load.
//
// Weights: element k of tensor t is uniform in [-a, a) from a counter RNG keyed by
// (seed, t, k), so generation is threaded and the result does not depend on the thread count.
// a = sqrt(3 / fan_in) for layer matrices (standard deviation 1/sqrt(fan_in): each projection
// of a unit-RMS input has unit-scale outputs) and sqrt(3 / dim) for the embedding and
// classifier (unit-scale logits); norm weights are 1; q/k/v biases (shapes with qkv_bias) are
// uniform in [-0.5, 0.5) and stay fp32. Values are rounded to the requested weight type (bf16 by
// default).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/model.h"
#include "engine/compute/weights.h"

namespace vq::engine {

struct NamedShape {
  std::string name;
  ModelConfig config;           // format "random"; weights_dtype set by make_random_model
  std::int64_t default_layers;  // layers built when not asked otherwise (< n_layers: restricted)
  std::string note;             // how it differs from the published model
  bool qkv_bias = false;        // q/k/v biases (random, fp32), written as a Qwen2 checkpoint
};

// Every named shape, in a fixed order.
const std::vector<NamedShape>& named_shapes();
// Throws Error(kInvalidArgument) naming the known shapes when `name` is not one.
const NamedShape& find_shape(const std::string& name);

struct RandomModelOptions {
  std::uint64_t seed = 1;
  WeightType type = WeightType::kBF16;  // kF32, kF16, kBF16 or kQ8_0
  std::int64_t n_layers = 0;            // 0: the shape's default_layers; at most its n_layers
  // 0: the shape's vocabulary; else a smaller one (the first rows of the shape's embedding and
  // classifier; a BOS or EOS id past it becomes -1, none): the layers of a large shape at a
  // fraction of its embedding's memory and classifier's time (tests).
  std::int64_t vocab_size = 0;
};

// Builds the shape's model in memory (the Model owns every buffer). Throws
// Error(kInvalidArgument) for an unknown shape, a layer count outside [1, n_layers] or a
// vocab_size outside [0, the shape's vocabulary].
Model make_random_model(const std::string& shape, const RandomModelOptions& options);

// Writes `model` as a Hugging Face Llama checkpoint (a Qwen2 one when it has q/k/v biases,
// written as F32): dir/config.json and dir/model.safetensors
// (each written to a temporary file and renamed, so a failed write leaves no partial file;
// `dir` is created when missing). Matrices keep their type (F32, F16 or BF16; Q8_0 has no
// safetensors type and is refused); norm vectors are written in the matrices' type when every
// value converts exactly, else F32. Throws Error(kIoError) naming the path.
void write_hf_checkpoint(const Model& model, const std::string& dir);

}  // namespace vq::engine
