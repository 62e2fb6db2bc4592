// Non-finite data refused at the API entries (C API, Python): keys and values handed to a
// cache, and attention probabilities handed back. A NaN key would otherwise be stored and
// every score computed from it would read NaN with status OK.
//
// The checks read exactly the elements the cache would read, so they run only on a tensor whose
// shape the cache accepts (non-negative sizes, stride[3] == 1, data set); a malformed tensor is
// left to the cache's own shape check, which reports it.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include "base/validate.h"
#include "veloxquant/errors.h"
#include "veloxquant/rows.h"
#include "veloxquant/types.h"

namespace vq::detail {

inline std::string finite_value_text(float x) {
  return std::isnan(x) ? "nan" : x > 0 ? "inf" : "-inf";
}

// A value as printed in messages: "nan", "inf", "-inf", or %.9g ("3.00000005e+38", "-0.5").
inline std::string value_text_9g(float x) {
  if (!std::isfinite(x)) return finite_value_text(x);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(x));
  return buf;
}

// Throws Error(kInvalidArgument) "<where>: <what> element (b, h, s, d) = (0, 1, 3, 5) is nan;
// keys, values and attention probabilities must be finite".
inline void check_finite(const TensorRef& t, const std::string& where, const std::string& what) {
  if (t.data == nullptr || t.stride[3] != 1) return;
  for (const std::int64_t n : t.shape)
    if (n < 0) return;
  for (std::int64_t b = 0; b < t.shape[0]; ++b)
    for (std::int64_t h = 0; h < t.shape[1]; ++h)
      for (std::int64_t s = 0; s < t.shape[2]; ++s)
        for (std::int64_t d = 0; d < t.shape[3]; ++d) {
          const float x = t.at(b, h, s, d);
          if (!std::isfinite(x)) {
            throw Error(ErrorCode::kInvalidArgument,
                        where + ": " + what + " element (b, h, s, d) = (" + std::to_string(b) +
                            ", " + std::to_string(h) + ", " + std::to_string(s) + ", " +
                            std::to_string(d) + ") is " + finite_value_text(x) +
                            "; keys, values and attention probabilities must be finite");
          }
        }
}

// The same for attention probabilities [batch, n_query_heads, n_queries, n_rows] (contiguous),
// which must also lie in [0, 1] (a softmax's outputs do, exactly): a "probability" of 3e38 is
// finite, but summed into a heavy-hitter score it overflows to +inf and every decision read
// from it is noise.
inline void check_finite(const AttentionRef& a, const std::string& where) {
  if (a.data == nullptr || a.batch < 0 || a.n_query_heads < 0 || a.n_queries < 0 || a.n_rows < 0)
    return;
  // Overflow-safe: a caller's shape could claim more elements than 64 bits count.
  const std::int64_t n = validate::checked_size({a.batch, a.n_query_heads, a.n_queries, a.n_rows},
                                                where + ": the attention's shape");
  for (std::int64_t i = 0; i < n; ++i) {
    const float p = a.data[i];
    if (!std::isfinite(p) || p < 0.0f || p > 1.0f) {
      const std::int64_t r = i % a.n_rows, q = i / a.n_rows % a.n_queries,
                         hq = i / (a.n_rows * a.n_queries) % a.n_query_heads,
                         b = i / (a.n_rows * a.n_queries * a.n_query_heads);
      throw Error(ErrorCode::kInvalidArgument,
                  where + ": attention probability (b, query head, query, row) = (" +
                      std::to_string(b) + ", " + std::to_string(hq) + ", " + std::to_string(q) +
                      ", " + std::to_string(r) + ") is " +
                      value_text_9g(p) +
                      "; attention probabilities must be finite and in [0, 1]");
    }
  }
}

}  // namespace vq::detail
