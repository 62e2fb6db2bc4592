// Overflow-safe size arithmetic for sizes that come from files and flags.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>

namespace vq::detail {

// The product of non-negative factors, or nullopt when it overflows int64 (or a factor is
// negative).
inline std::optional<std::int64_t> checked_product(std::initializer_list<std::int64_t> factors) {
  std::int64_t out = 1;
  for (const std::int64_t f : factors) {
    if (f < 0 || __builtin_mul_overflow(out, f, &out)) return std::nullopt;
  }
  return out;
}

// a + b for non-negative values, or nullopt on overflow.
inline std::optional<std::int64_t> checked_sum(std::int64_t a, std::int64_t b) {
  std::int64_t out = 0;
  if (a < 0 || b < 0 || __builtin_add_overflow(a, b, &out)) return std::nullopt;
  return out;
}

}  // namespace vq::detail
