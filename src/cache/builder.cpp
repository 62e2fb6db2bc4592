#include "veloxquant/builder.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <string_view>

#include "base/step_input.h"
#include "policies/policy.h"
#include "veloxquant/errors.h"
#include "veloxquant/registry.h"

namespace vq {

ModelCache::ModelCache(const CacheConfig& config, const ModelShape& shape)
    : config_(config), shape_(shape) {
  // The API boundary: the config and the shape are validated here, once; the layers trust them.
  config.validate();
  auto bad = [](const std::string& msg) {
    throw Error(ErrorCode::kInvalidArgument, "[builder] " + msg);
  };
  if (shape.n_layers < 1) bad("n_layers must be >= 1, got " + std::to_string(shape.n_layers));
  if (shape.n_kv_heads < 1) bad("n_kv_heads must be >= 1, got " + std::to_string(shape.n_kv_heads));
  if (shape.head_dim < 1) bad("head_dim must be >= 1, got " + std::to_string(shape.head_dim));
  // Before anything is allocated: 10^8 layers would build 10^8 layer caches first.
  detail::check_shape_limits(shape.n_layers, shape.n_kv_heads, shape.head_dim,
                             shape.n_query_heads, "[builder]");
  const std::int64_t hq = shape.n_query_heads == 0 ? shape.n_kv_heads : shape.n_query_heads;
  if (hq < 1 || hq % shape.n_kv_heads != 0) {
    bad("n_query_heads must be a positive multiple of n_kv_heads (" +
        std::to_string(shape.n_kv_heads) + "), got " + std::to_string(hq));
  }
  shape_.n_query_heads = hq;
  // Layer i uses seed + i: the last layer's seed must be one the seed field allows (the error
  // names the first seed out of range, as validating that layer's config would).
  for (const FieldSpec& f : config.info().fields) {
    if (f.name != "seed") continue;
    const auto max_seed = static_cast<std::int64_t>(f.max);
    if (config.seed() > max_seed - (shape.n_layers - 1)) {
      CacheConfig first_bad = config;
      first_bad.set("seed", max_seed + 1);
      first_bad.validate();
    }
  }
  layers_.reserve(static_cast<std::size_t>(shape.n_layers));
  group_ = std::make_shared<detail::LayerGroup>(shape.n_layers);
  const std::int64_t seed = config.seed();
  for (std::int64_t i = 0; i < shape.n_layers; ++i) {
    CacheConfig layer_config = config;
    layer_config.set("seed", seed + i);
    LayerShape ls;
    ls.n_kv_heads = shape.n_kv_heads;
    ls.head_dim = shape.head_dim;
    ls.n_query_heads = hq;
    ls.layer = i;
    ls.n_layers = shape.n_layers;
    layers_.push_back(LayerCache(layer_config, ls, group_));
  }
}

LayerCache& ModelCache::layer(std::int64_t i) {
  if (i < 0 || i >= n_layers()) {
    throw Error(ErrorCode::kInvalidArgument, "[builder] layer must be in [0, " +
                                                 std::to_string(n_layers() - 1) + "], got " +
                                                 std::to_string(i));
  }
  return layers_[static_cast<std::size_t>(i)];
}

const LayerCache& ModelCache::layer(std::int64_t i) const {
  return const_cast<ModelCache*>(this)->layer(i);
}

CacheStats ModelCache::stats() const {
  CacheStats s;
  for (const LayerCache& l : layers_) {
    const CacheStats ls = l.stats();
    if (&l == &layers_.front()) {
      s.tokens_seen = ls.tokens_seen;
      s.tokens_kept = ls.tokens_kept;
      s.tokens_kept_per_head = ls.tokens_kept_per_head;
    }
    s.kept_bytes += ls.kept_bytes;
    s.full_bytes += ls.full_bytes;
    s.allocated_bytes += ls.allocated_bytes;
    s.resident_bytes += ls.resident_bytes;
    s.evictions += ls.evictions;
    s.merges += ls.merges;
    s.demoted_rows += ls.demoted_rows;
    s.retrieval_heads += ls.retrieval_heads;
    s.retrieval_bytes += ls.retrieval_bytes;
    s.streaming_heads += ls.streaming_heads;
    s.streaming_bytes += ls.streaming_bytes;
    if (&l == &layers_.front()) {
      s.score_source = ls.score_source;
    } else if (std::string_view(s.score_source) != ls.score_source) {
      s.score_source = "mixed";
    }
    if (&l == &layers_.front()) {
      s.value_norm = ls.value_norm;
    } else if (std::string_view(s.value_norm) != ls.value_norm) {
      s.value_norm = "mixed";
    }
  }
  s.compression_ratio =
      s.kept_bytes == 0 ? 1.0 : static_cast<double>(s.full_bytes) / static_cast<double>(s.kept_bytes);
  return s;
}

void ModelCache::set_head_pattern(const HeadPattern& pattern) {
  if (static_cast<std::int64_t>(pattern.size()) != n_layers()) {
    throw Error(ErrorCode::kInvalidArgument,
                "[" + config_.method() + "] set_head_pattern: expected " +
                    std::to_string(n_layers()) + " layers, found " + std::to_string(pattern.size()));
  }
  // Every layer's row is checked (on a layer that then takes it back) before any layer changes.
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    try {
      LayerCache probe(layers_[i].config(), layers_[i].shape());
      probe.set_head_pattern(pattern[i]);
    } catch (const Error& e) {
      throw Error(e.code(), "layer " + std::to_string(i) + ": " + e.what());
    }
    if (layers_[i].step_open() || layers_[i].tokens_seen() > 0) {
      throw Error(ErrorCode::kInvalidState,
                  "[" + config_.method() + "] set_head_pattern: layer " + std::to_string(i) +
                      " has seen tokens: the pattern must be set before the first step (call "
                      "reset() first)");
    }
  }
  for (std::size_t i = 0; i < pattern.size(); ++i) layers_[i].set_head_pattern(pattern[i]);
}

std::vector<std::int64_t> ModelCache::layer_budgets() const {
  std::vector<std::int64_t> out;
  for (const LayerCache& l : layers_) out.push_back(l.budget());
  return out;
}

double ModelCache::mean_budget() const {
  double sum = 0;
  for (const LayerCache& l : layers_) {
    if (l.budget() < 0) return -1.0;
    sum += static_cast<double>(l.budget());
  }
  return sum / static_cast<double>(layers_.size());
}

void ModelCache::expect_positions(std::int64_t n) {
  for (LayerCache& l : layers_) l.expect_positions(n);
}

void ModelCache::reset() {
  for (LayerCache& l : layers_) l.reset();
  std::fill(group_->external.begin(), group_->external.end(), 0.0);
  std::fill(group_->external_count.begin(), group_->external_count.end(), 0);
}

void ModelCache::set_key_filters(const float* filters, std::int64_t n) {
  const std::int64_t per_layer = shape_.n_kv_heads * shape_.head_dim;
  const std::int64_t want = n_layers() * per_layer;
  if (n != want) {
    throw Error(ErrorCode::kInvalidArgument,
                "[builder] set_key_filters: n must be n_layers x n_kv_heads x head_dim = " +
                    std::to_string(n_layers()) + " x " + std::to_string(shape_.n_kv_heads) +
                    " x " + std::to_string(shape_.head_dim) + " = " + std::to_string(want) +
                    ", got " + std::to_string(n));
  }
  if (filters == nullptr) {
    throw Error(ErrorCode::kInvalidArgument, "[builder] set_key_filters: filters must not be null");
  }
  for (std::int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(filters[i])) {
      throw Error(ErrorCode::kInvalidArgument,
                  "[builder] set_key_filters: value " + std::to_string(i) + " (layer " +
                      std::to_string(i / per_layer) + ") is not finite");
    }
  }
  for (std::int64_t l = 0; l < n_layers(); ++l) {
    layers_[static_cast<std::size_t>(l)].set_key_filters(filters + l * per_layer, per_layer);
  }
}

bool ModelCache::needs_key_filters() const noexcept {
  return !layers_.empty() && layers_.front().needs_key_filters();
}

void ModelCache::set_question_length(std::int64_t n) {
  // The first layer checks n (each layer would refuse alike) and every layer is checked for an
  // open step before any changes.
  for (const LayerCache& l : layers_) {
    if (l.step_open()) {
      throw Error(ErrorCode::kInvalidState,
                  "[builder] set_question_length called while a layer's step is open; call it "
                  "before the prompt's step");
    }
  }
  for (LayerCache& l : layers_) l.set_question_length(n);
}

bool ModelCache::reads_question() const noexcept {
  return !layers_.empty() && layers_.front().reads_question();
}

void ModelCache::observe_layer_similarity(std::int64_t layer, double cosine) {
  if (layer < 0 || layer >= n_layers()) {
    throw Error(ErrorCode::kInvalidArgument, "[builder] layer must be in [0, " +
                                                 std::to_string(n_layers() - 1) + "], got " +
                                                 std::to_string(layer));
  }
  if (!std::isfinite(cosine)) {
    throw Error(ErrorCode::kInvalidArgument,
                "[builder] observe_layer_similarity(layer " + std::to_string(layer) +
                    ", cosine): the cosine (of the layer's input and output hidden states) must "
                    "be a finite number, got " +
                    (std::isnan(cosine) ? "nan" : cosine > 0 ? "inf" : "-inf"));
  }
  group_->external[static_cast<std::size_t>(layer)] += cosine;
  ++group_->external_count[static_cast<std::size_t>(layer)];
}

void ModelCache::set_output_gram(std::int64_t layer, const float* gram,
                                 std::int64_t n_query_heads, std::int64_t head_dim) {
  this->layer(layer).set_output_gram(gram, n_query_heads, head_dim);
}

bool ModelCache::reads_output_gram() const noexcept {
  return std::any_of(layers_.begin(), layers_.end(),
                     [](const LayerCache& l) { return l.reads_output_gram(); });
}

bool ModelCache::has_output_gram() const noexcept {
  return std::all_of(layers_.begin(), layers_.end(),
                     [](const LayerCache& l) { return l.has_output_gram(); });
}

bool ModelCache::reads_reconstruction() const noexcept {
  return !layers_.empty() && layers_.front().reads_reconstruction();
}

std::int64_t ModelCache::reconstruction_chunk() const noexcept {
  return layers_.empty() ? 0 : layers_.front().reconstruction_chunk();
}

void ModelCache::set_reconstruction(bool on) {
  for (LayerCache& l : layers_) l.set_reconstruction(on);
}

void ModelCache::compress() {
  for (LayerCache& l : layers_) l.compress();
}

}  // namespace vq
