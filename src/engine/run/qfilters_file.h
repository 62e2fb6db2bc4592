// Q-Filters' key filters (method qfilters, src/policies/methods/qfilters.cpp): calibration from a
// model's queries, the filter file, and loading it into a model's caches.
//
// The file (`veloxquant calibrate` writes it, by default next to the model as
// `<model path>.qfilters`), little-endian, every field fixed-size:
//
//   offset  size  field
//   0       8     magic "VQQFILT1"
//   8       4     u32 version = 1
//   12      4     u32 n_layers
//   16      4     u32 n_kv_heads
//   20      4     u32 head_dim
//   24      8     u64 model fingerprint (model_fingerprint below)
//   32      8     u64 calibration tokens (how many query rows each head's direction was fitted on)
//   40      4 N   f32 filters [n_layers][n_kv_heads][head_dim], N = n_layers x n_kv_heads x head_dim
//   40+4N   8     u64 FNV-1a 64 of the N filter floats' bytes (a truncated or altered file is
//                 refused)
//
// The file is exactly 48 + 4N bytes; it is written to a temporary file in the same directory and
// renamed into place, so a reader never sees a partial file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/model.h"
#include "veloxquant/builder.h"
#include "veloxquant/config.h"

namespace vq::engine {

inline constexpr std::uint32_t kQFiltersVersion = 1;

struct KeyFilters {
  std::int64_t n_layers = 0, n_kv_heads = 0, head_dim = 0;
  std::uint64_t fingerprint = 0;
  std::uint64_t tokens = 0;
  std::vector<float> values;  // [n_layers][n_kv_heads][head_dim]
};

// FNV-1a 64 over the model's shape (dim, hidden_dim, n_layers, n_heads, n_kv_heads, head_dim,
// vocab_size, seq_len as int64) and the first 4096 bytes (or all, when smaller) of every layer's
// wq and wk as stored: it tells apart two models of one shape (a retrained or re-quantized
// checkpoint) without reading every weight. Not a cryptographic check.
std::uint64_t model_fingerprint(const Model& model);

// Throws Error(kFileError) naming the path for a file that cannot be read, is shorter or longer
// than its header says, has another magic or version, a zero or too large count, or a checksum
// that does not match; and for a non-finite filter value.
KeyFilters read_key_filters(const std::string& path);
// Atomic write (temporary file + rename; Error(kFileError) naming the path on failure, nothing
// left behind).
void write_key_filters(const std::string& path, const KeyFilters& filters);

// The dominant direction of a head's queries: the unit eigenvector of the largest eigenvalue of
// the D x D matrix gram = sum_t q_t q_t^T (row-major), oriented so that <sum_q, u> >= 0 (when it
// is 0, the first nonzero component is positive). Computed in double: repeated squaring of the
// trace-normalised matrix (G <- G^2 / tr(G^2), 8 times: G^256), then power iteration from sum_q
// (or the largest diagonal's axis) until the direction moves less than 1e-13. A zero matrix gives
// the zero vector.
std::vector<double> dominant_direction(const std::vector<double>& gram,
                                       const std::vector<double>& sum_q, std::int64_t D);

// Accumulates each (layer, query head)'s sum_t q_t q_t^T and sum_t q_t from the engine's query
// tap (Transformer::set_query_tap), then gives the KV heads' filters: the mean over each KV
// head's group of its query heads' dominant directions (the authors' GQA rule).
class QueryStats {
 public:
  explicit QueryStats(const ModelConfig& config);
  // q: [T][Hq * D] of one layer (post-RoPE).
  void add(std::int64_t layer, const float* q, std::int64_t T);
  std::uint64_t tokens() const noexcept { return tokens_; }
  // [n_layers][n_kv_heads][head_dim].
  std::vector<float> filters() const;

 private:
  std::int64_t L_, Hq_, Hkv_, D_;
  std::vector<double> gram_;  // [L][Hq][D][D]
  std::vector<double> sum_;   // [L][Hq][D]
  std::uint64_t tokens_ = 0;  // rows seen by layer 0
};

// Runs `tokens` through the model in chunks of `chunk` over a full cache, in consecutive windows
// of at most the model's context (seq_len; the cache is reset between windows), and returns the
// filters with the model's fingerprint (the `veloxquant calibrate` computation). The result does
// not depend on `chunk` or the thread count.
KeyFilters calibrate_key_filters(const Model& model, const std::vector<std::int32_t>& tokens,
                                 std::int64_t chunk);

// Random unit filters, `count` of head_dim D each (xorshift64 from `seed`, uniform components
// normalised): what qfilters gets in runs with no model to calibrate (synthetic K/V: `demo`,
// `bench perturb`, `bench decode --shape`, the cache microbenchmarks), whose results do not
// claim to be Q-Filters' on a real model.
std::vector<float> random_key_filters(std::int64_t count, std::int64_t D, std::uint64_t seed);
// random_key_filters for every layer of `cache` when its method needs key filters.
void give_random_key_filters(LayerCache& cache, std::uint64_t seed);
void give_random_key_filters(ModelCache& cache, std::uint64_t seed);

// The filter file a model's caches load: model.qfilters_path().
// Loads it into `cache` when the cache's method needs key filters (ModelCache::
// needs_key_filters); nothing otherwise. Throws Error(kFileError) naming the file and the
// calibrate command when it does not exist, and naming both shapes (or both fingerprints) when it
// was made for another model.
void attach_key_filters(ModelCache& cache, const Model& model);
// KVCacheBuilder::for_model for the model's shape, then attach_key_filters: how the engine's runs
// (evaluate, generate, the task and decode benches, serve) make a cache.
ModelCache make_model_cache(const CacheConfig& method, const Model& model);

}  // namespace vq::engine
