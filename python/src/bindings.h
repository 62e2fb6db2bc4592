// The pieces of the `veloxquant` Python module (python/veloxquant/_core), one file per area.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "veloxquant/cache.h"
#include "veloxquant/errors.h"

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

// A Python int as int64 (the one conversion every integer argument of the module that takes
// arbitrary Python values goes through): an int outside [-2^63, 2^63) throws
// Error(kInvalidArgument) "[python] budget must be an integer in [-9223372036854775808,
// 9223372036854775807], got 1180591620717411303424" instead of pybind11's cast error.
inline std::int64_t int64_of(const pybind11::handle& value, const std::string& what) {
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
  if (overflow != 0 || (v == -1 && PyErr_Occurred())) {
    PyErr_Clear();
    throw Error(ErrorCode::kInvalidArgument,
                "[python] " + what +
                    " must be an integer in [-9223372036854775808, 9223372036854775807], got " +
                    std::string(pybind11::str(value)).substr(0, 60));
  }
  return static_cast<std::int64_t>(v);
}

// Every byte the cache keeps between steps (CacheStats::resident_bytes).
inline std::int64_t resident_bytes(const CacheStats& s) { return s.resident_bytes; }

}  // namespace vq::python
