// The pieces of the `veloxquant` Python module (python/veloxquant/_core), one file per area.
#pragma once

#include <pybind11/pybind11.h>

#include "veloxquant/cache.h"

namespace vq::python {

// The config, the registry and the error type (config_bindings.cpp).
void bind_config(pybind11::module_& m);
// LayerCache, ModelCache, step views and stats over NumPy arrays (cache_bindings.cpp).
void bind_cache(pybind11::module_& m);
// Model loading, tokenizers, generation and evaluation (engine_bindings.cpp).
void bind_engine(pybind11::module_& m);

// Cache statistics as a dict (tokens_seen, tokens_kept, tokens_kept_per_head, kept_bytes,
// full_bytes, compression_ratio, resident_bytes, allocated_bytes, evictions,
// merges).
pybind11::dict stats_dict(const CacheStats& s);

// Every byte the cache keeps between steps (CacheStats::resident_bytes).
inline std::int64_t resident_bytes(const CacheStats& s) { return s.resident_bytes; }

}  // namespace vq::python
