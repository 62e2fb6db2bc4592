// Independent tasks spread over threads: the windows x configurations of `eval --windows`.
#pragma once

#include <cstdint>
#include <functional>

namespace vq::eval {

// Calls fn(i) once for every i in [0, n), on up to `n_threads` threads of the engine's pool
// (engine/compute/parallel.h), each thread taking the next unclaimed i. Inside fn the engine's
// own parallel loops run inline on the calling thread, so a task's results depend on i only,
// never on the thread count or the order. When tasks throw, every task still runs and the
// exception of the lowest failing i is rethrown.
void run_tasks(std::int64_t n, int n_threads, const std::function<void(std::int64_t)>& fn);

}  // namespace vq::eval
