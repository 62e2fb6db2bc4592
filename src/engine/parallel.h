// The engine's thread count. Work is split over output rows (matmuls) and KV heads
// (attention) in fixed, thread-count-independent units: each output element is computed by
// exactly one thread with the same code, so results are bit-identical for every thread count.
// OpenMP when the build has it (CMake finds Debian's libgomp); otherwise one thread.
#pragma once

#include <cstdint>

namespace vq::engine {

// Threads for the engine's parallel loops; n >= 1 (throws Error(kInvalidArgument) otherwise).
// Default: the number of cores the process may use.
void set_threads(int n);
int threads() noexcept;
// The cores available to the process (1 without OpenMP).
int available_cores() noexcept;
// True when the build runs parallel loops (OpenMP).
bool parallel_build() noexcept;

}  // namespace vq::engine
