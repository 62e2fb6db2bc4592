// One cache per layer for a model shape.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <memory>
#include <vector>

#include "veloxquant/cache.h"

namespace vq::detail {
struct LayerGroup;
}
#include "veloxquant/config.h"

namespace vq {

struct ModelShape {
  std::int64_t n_layers = 0;
  std::int64_t n_kv_heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t n_query_heads = 0;  // 0 means n_kv_heads
};

// The caches of every layer of one model. Layer i gets the config with seed = seed + i and
// LayerShape{layer = i, n_layers}, so per-layer schedules (PyramidKV) come from the layer index.
class VQ_API ModelCache {
 public:
  // Validates `config` (Error(kInvalidConfig)) and `shape` (Error(kInvalidArgument), before any
  // layer is built): n_layers in [1, kMaxLayers], n_kv_heads in [1, kMaxHeads], head_dim in
  // [1, kMaxHeadDim], n_query_heads 0 or a multiple of n_kv_heads up to kMaxHeads (types.h).
  ModelCache(const CacheConfig& config, const ModelShape& shape);
  std::int64_t n_layers() const noexcept { return static_cast<std::int64_t>(layers_.size()); }
  LayerCache& layer(std::int64_t i);
  const LayerCache& layer(std::int64_t i) const;
  const ModelShape& shape() const noexcept { return shape_; }
  const CacheConfig& config() const noexcept { return config_; }

  // Sums over layers (tokens_seen and tokens_kept are layer 0's).
  CacheStats stats() const;
  // Each layer's current budget (-1: keeps everything). PyramidKV's schedule is fixed at
  // construction; SqueezeAttention's changes once, after every layer has seen `budget` tokens.
  std::vector<std::int64_t> layer_budgets() const;
  // Mean of layer_budgets(): the realised average (it can exceed the requested one where a
  // schedule's floors bind). -1 when the method keeps everything.
  double mean_budget() const;
  void reset();
  // LayerCache::expect_positions on every layer: a memory hint that at most `n` positions will
  // be fed (0: unknown). Throws Error(kInvalidArgument) for n < 0.
  void expect_positions(std::int64_t n);

  // The engine's per-layer signal for SqueezeAttention (source=attention): the cosine between
  // the hidden state entering `layer` and the hidden state after its attention residual add,
  // averaged over the step's tokens. Call it for each step before that layer's end_step; the
  // layers average what they received until their budgets are decided. Other methods ignore
  // it. Throws Error(kInvalidArgument) for a bad layer index or a non-finite value.
  void observe_layer_similarity(std::int64_t layer, double cosine);

  // LayerCache::set_head_pattern on every layer: pattern[i] goes to layer i. Throws
  // Error(kInvalidArgument) when pattern has other than n_layers rows, or a layer's row is
  // refused (its message names the layer), before any layer changes.
  void set_head_pattern(const HeadPattern& pattern);
  // LayerCache::set_key_filters on every layer: `filters` holds n = n_layers x n_kv_heads x
  // head_dim floats, layer-major ([n_layers][Hkv][D]; the layout of a `veloxquant calibrate`
  // file). Throws Error(kInvalidArgument) for another n (naming both), a null `filters` or a
  // non-finite value, before any layer changes.
  void set_key_filters(const float* filters, std::int64_t n);
  // Whether the method needs them (LayerCache::needs_key_filters).
  bool needs_key_filters() const noexcept;
  // LayerCache::set_question_length on every layer: the last n tokens of the next step are the
  // prompt's question (finch). Throws as LayerCache::set_question_length, before any layer
  // changes.
  void set_question_length(std::int64_t n);
  // Whether the method reads it (LayerCache::reads_question).
  bool reads_question() const noexcept;
  // LayerCache::set_output_gram on layer `layer` (gram: [n_query_heads][head_dim][head_dim] of
  // that layer's output projection); the engine calls it for every layer when
  // reads_output_gram() is true. Throws Error(kInvalidArgument) for a bad layer index, and as
  // LayerCache::set_output_gram.
  void set_output_gram(std::int64_t layer, const float* gram, std::int64_t n_query_heads,
                       std::int64_t head_dim);
  // Whether the method reads the output projection's Gram matrices (any layer), and whether
  // every layer holds them.
  bool reads_output_gram() const noexcept;
  bool has_output_gram() const noexcept;

  // Context reconstruction (kvzip; LayerCache::set_reconstruction and its neighbours): whether
  // the method reads it, its chunk of context tokens per reconstruction step, and the calls on
  // every layer (set_reconstruction before the prompt; compress after the pass, layer by layer:
  // each layer's errors as LayerCache::compress, the layers before a failing one already cut).
  bool reads_reconstruction() const noexcept;
  std::int64_t reconstruction_chunk() const noexcept;
  void set_reconstruction(bool on);
  void compress();

  // Saving and restoring every layer and the layers' shared state (SqueezeAttention's signals
  // and budgets) in one state: as LayerCache::save_state and its neighbours, for a cache built
  // from the same config and shape and set up as the saved one was (the engine's per-layer
  // similarity reports are state and are saved). Errors as LayerCache's; a failed load leaves
  // every layer as it was.
  std::vector<std::uint8_t> save_state() const;
  void load_state(const std::uint8_t* data, std::size_t size);
  void save_state_file(const std::string& path) const;
  void load_state_file(const std::string& path);

 private:
  // load_state's body (state.cpp); path: the file, for its errors (null for a buffer).
  void load_state_impl(const std::uint8_t* data, std::size_t size, const std::string* path);
  CacheConfig config_;
  ModelShape shape_;
  std::vector<LayerCache> layers_;
  std::shared_ptr<detail::LayerGroup> group_;
};

struct KVCacheBuilder {
  // Validates config and shape (throws Error(kInvalidConfig) / kInvalidArgument).
  static ModelCache for_model(const CacheConfig& config, const ModelShape& shape) {
    return ModelCache(config, shape);
  }
};

}  // namespace vq
