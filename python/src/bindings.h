// The pieces of the `veloxquant` Python module (python/veloxquant/_core), one file per area.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

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

// Integer and real arguments from Python, checked by the shared validators (base/validate.h)
// so the messages read as the CLI's and the C API's do. Every integer argument of the module
// goes through these instead of pybind11's own casts, which refuse a Python int outside 64 bits
// with "Unable to cast Python instance to C++ type" (or a TypeError listing the signatures).
// `name` names the argument with its entry ("[python] LayerCache.stored: b").
//
// int_arg: anything with __index__ (int, bool, NumPy integers; not float or str) as an int64 in
// [lo, hi]; a value outside the range, or outside 64 bits, throws Error(kInvalidArgument)
// ("[python] budget must be an integer in [1, 16777216], got 1180591620717411303424 (out of
// range)"), raised as veloxquant.ArgumentError (a veloxquant.Error and a ValueError); a value
// of another kind raises TypeError "... must be an int, got float".
std::int64_t int_arg(const pybind11::handle& value, const std::string& name,
                     std::int64_t lo = INT64_MIN, std::int64_t hi = INT64_MAX);
// The same with the range check left to the library (CacheConfig.set: validate() checks the
// ranges): only a value outside 64 bits is refused here, its message showing [lo, hi].
std::int64_t int64_arg(const pybind11::handle& value, const std::string& name, std::int64_t lo,
                       std::int64_t hi);
// The same for an unsigned 64-bit argument (seeds) in [lo, hi].
std::uint64_t uint_arg(const pybind11::handle& value, const std::string& name,
                       std::uint64_t lo = 0, std::uint64_t hi = UINT64_MAX);
// An index in [0, n): as int_arg, but out of range (64 bits or not) raises IndexError with the
// same wording.
std::int64_t index_arg(const pybind11::handle& value, const std::string& name, std::int64_t n);
// A float or int argument as a finite double in [lo, hi] (an int too large for a double is
// refused naming the argument, as NaN and infinities are). `as_float`: the value is used in
// single precision, so 0 < |v| < 1e-30 is refused too (validate::kMinRealMagnitude, the CLI's
// rule).
double real_arg(const pybind11::handle& value, const std::string& name, double lo, double hi,
                bool as_float = false);
// A sequence of ints (list, tuple, NumPy array) as int64s, each checked as int_arg does and
// named by its position ("[python] run_forced: tokens[3]").
std::vector<std::int64_t> int_list_arg(const pybind11::handle& value, const std::string& name,
                                       std::int64_t lo, std::int64_t hi);

// Every byte the cache keeps between steps (CacheStats::resident_bytes).
inline std::int64_t resident_bytes(const CacheStats& s) { return s.resident_bytes; }

}  // namespace vq::python
