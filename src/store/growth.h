// How the stores' per-row containers grow (the plain store's rows, KIVI's unquantized tails and
// positions): in bounded steps at every size, never by doubling.
#pragma once

#include <algorithm>
#include <cstddef>

namespace vq::detail {

// The fewest rows one growth step adds (so a cache fed one token a step reallocates once per
// 16 tokens while it is short).
inline constexpr std::size_t kMinGrowthRows = 16;

// The capacity, in rows, a container that holds room for `have` rows takes when it must hold
// `need` > `have` rows: have + max(have / 8, kMinGrowthRows), or `need` when that is more.
// `ceiling` > 0 (the most rows the caller expects the container to hold, a hint) caps the step
// at `ceiling` while `need` fits in it: a container fed exactly `ceiling` rows ends with exactly
// that capacity. Past the ceiling the steps are the unhinted ones (a wrong hint costs no
// quadratic copying).
//
// Bounds (by hand): every step multiplies the capacity by at least 9/8 or reaches `need`, so
// filling a container to n rows copies fewer than 9 n rows in all (amortised O(1) per row), and
// after rows were appended up to n the capacity is below n + max(n / 8, kMinGrowthRows) (the
// last step started from a capacity below n). std::vector's doubling held up to 2 n.
inline std::size_t grown_rows(std::size_t have, std::size_t need,
                              std::size_t ceiling = 0) noexcept {
  std::size_t cap = have + std::max(have / 8, kMinGrowthRows);
  if (need <= ceiling) cap = std::min(cap, ceiling);
  return std::max(cap, need);
}

}  // namespace vq::detail
