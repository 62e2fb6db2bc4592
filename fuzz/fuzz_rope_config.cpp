// config.json's RoPE and norm settings (issue 33): the input's first line is the rope_theta
// literal, its second the rms_norm_eps literal, the rest the rope_scaling value, set into an
// otherwise valid config.json beside a valid one-layer checkpoint, then loaded in full.
// Oracle: a model the loader accepts has settings that are usable in float32 (epsilon > 0, base
// finite, every RoPE frequency multiplier finite and > 0); anything else must be a vq::Error.
#include <cmath>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "engine/model/model.h"
#include "fuzz_util.h"

namespace {

constexpr int kDim = 8, kHidden = 16, kVocab = 16;

// A safetensors file of zero-valued F32 tensors (norm weights are 1).
std::string checkpoint() {
  const std::map<std::string, std::vector<int>> shapes = {
      {"model.embed_tokens.weight", {kVocab, kDim}},
      {"model.norm.weight", {kDim}},
      {"model.layers.0.input_layernorm.weight", {kDim}},
      {"model.layers.0.post_attention_layernorm.weight", {kDim}},
      {"model.layers.0.self_attn.q_proj.weight", {kDim, kDim}},
      {"model.layers.0.self_attn.k_proj.weight", {kDim, kDim}},
      {"model.layers.0.self_attn.v_proj.weight", {kDim, kDim}},
      {"model.layers.0.self_attn.o_proj.weight", {kDim, kDim}},
      {"model.layers.0.mlp.gate_proj.weight", {kHidden, kDim}},
      {"model.layers.0.mlp.up_proj.weight", {kHidden, kDim}},
      {"model.layers.0.mlp.down_proj.weight", {kDim, kHidden}},
  };
  std::string header = "{", body;
  for (const auto& [name, shape] : shapes) {
    std::size_t n = 1;
    for (const int d : shape) n *= static_cast<std::size_t>(d);
    const float v = name.find("norm") != std::string::npos ? 1.0f : 0.0f;
    const std::size_t begin = body.size();
    for (std::size_t i = 0; i < n; ++i) body.append(reinterpret_cast<const char*>(&v), 4);
    header += std::string(header.size() > 1 ? "," : "") + "\"" + name +
              "\":{\"dtype\":\"F32\",\"shape\":[" + std::to_string(shape[0]) +
              (shape.size() > 1 ? "," + std::to_string(shape[1]) : "") +
              "],\"data_offsets\":[" + std::to_string(begin) + "," +
              std::to_string(body.size()) + "]}";
  }
  header += "}";
  while (header.size() % 8 != 0) header += ' ';
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + body;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const bool weights = [] {
    vq::fuzz::write_file("model.safetensors", checkpoint());
    return true;
  }();
  (void)weights;
  const std::string in(reinterpret_cast<const char*>(data), size);
  const std::size_t a = in.find('\n');
  const std::size_t b = a == std::string::npos ? a : in.find('\n', a + 1);
  if (b == std::string::npos) return 0;
  const std::string config =
      "{\"model_type\":\"llama\",\"hidden_size\":8,\"intermediate_size\":16,"
      "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"num_key_value_heads\":2,"
      "\"vocab_size\":16,\"max_position_embeddings\":64,\"tie_word_embeddings\":true,"
      "\"rope_theta\":" + in.substr(0, a) + ",\"rms_norm_eps\":" + in.substr(a + 1, b - a - 1) +
      ",\"rope_scaling\":" + in.substr(b + 1) + "}";
  vq::fuzz::write_file("config.json", config);
  vq::fuzz::expect_clean([&] {
    const vq::engine::Model m = vq::engine::Model::load(vq::fuzz::scratch_dir());
    const vq::engine::ModelConfig& c = m.config();
    const auto theta = static_cast<float>(c.rope_theta);
    if (!(c.norm_eps > 0.0f) || !std::isfinite(c.norm_eps) || !std::isfinite(theta)) std::abort();
    for (const float f : c.rope_freq_factors) {
      const double mul = c.rope_freq_scale / static_cast<double>(f);
      if (!(f > 0.0f) || !std::isfinite(f) || !(mul > 0) || !std::isfinite(mul)) std::abort();
    }
    if (!(c.rope_freq_scale > 0) || !std::isfinite(static_cast<float>(1.0 / c.rope_freq_scale)))
      std::abort();
  });
  return 0;
}
