// A session's largest cache footprint: the most bytes ModelCache::stats().resident_bytes reports
// between steps, for a method, a model shape, the server's prefill chunk and the most positions
// a session may hold (--max-context). The server admits a session only when this fits beside the
// others' in --kv-memory.
//
// The bound is measured, not guessed: the method's own cache is driven with synthetic rows
// (a fixed-seed pattern; uniform attention probabilities) through the step patterns a session
// goes through -- prefill chunks of `chunk` tokens, single decode steps, and turns alternating
// the two -- up to max_positions, and the largest resident_bytes seen after any step is the
// footprint. resident_bytes counts container capacity, which depends on the sequence of step
// sizes and the budget, not on the values of the rows (tests/test_serve.cpp checks real model
// sessions against it). The server also checks each session after every step and counts any
// excess (veloxquant_kv_footprint_exceeded_total in /metrics).
#pragma once

#include <cstdint>

#include "veloxquant/builder.h"
#include "veloxquant/config.h"

namespace vq::serve {

// `limit` > 0 stops the measurement as soon as the cache holds more than `limit` bytes (so
// measuring never holds much more than the server's --kv-memory) and returns what it held then,
// a value above `limit`. Throws Error(kInvalidArgument) for max_positions < 1 or chunk outside
// [1, max_positions]; the config's own errors for a method that does not fit the shape.
std::int64_t session_footprint(const CacheConfig& method, const ModelShape& shape,
                               std::int64_t max_positions, std::int64_t chunk,
                               std::int64_t limit = 0);

}  // namespace vq::serve
