// The engine's threads: a small pool that runs a loop over work units split statically over
// the threads (thread t of T gets units [n t / T, n (t+1) / T)). Work is split over output
// rows (matmuls) and KV heads (attention) in fixed, thread-count-independent units, each output
// element computed by exactly one thread with the same code, so results are bit-identical for
// every thread count. Idle workers spin briefly, then sleep on a condition variable, so a
// loaded (shared) machine is not slowed by busy-waiting threads.
#pragma once

#include <cstdint>
#include <type_traits>

namespace vq::engine {

// Threads for the engine's parallel loops; n >= 1 (throws Error(kInvalidArgument) otherwise).
// Default: the number of cores the process may use. Not to be called from inside a loop.
void set_threads(int n);
int threads() noexcept;
// The cores available to the process (its CPU affinity mask).
int available_cores() noexcept;

namespace detail {
using RangeFn = void (*)(void* ctx, std::int64_t begin, std::int64_t end);
void run_parallel(std::int64_t n, int n_threads, RangeFn fn, void* ctx);
}  // namespace detail

// Calls f(begin, end) over a static split of [0, n) into at most `n_threads` contiguous ranges,
// one per thread, the caller's thread taking the first. f must not throw. Nested calls run
// inline on the calling thread.
template <typename F>
void parallel_for(std::int64_t n, int n_threads, F&& f) {
  using Fn = std::remove_reference_t<F>;
  detail::run_parallel(
      n, n_threads,
      [](void* ctx, std::int64_t b, std::int64_t e) { (*static_cast<Fn*>(ctx))(b, e); }, &f);
}

}  // namespace vq::engine
