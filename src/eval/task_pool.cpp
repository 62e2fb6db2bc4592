#include "eval/task_pool.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <vector>

#include "engine/compute/parallel.h"

namespace vq::eval {

void run_tasks(std::int64_t n, int n_threads, const std::function<void(std::int64_t)>& fn) {
  if (n <= 0) return;
  const int T = static_cast<int>(std::clamp<std::int64_t>(n_threads, 1, n));
  std::atomic<std::int64_t> next{0};
  std::mutex m;
  std::int64_t failed_at = n;
  std::exception_ptr failure;
  engine::parallel_for(T, T, [&](std::int64_t, std::int64_t) {
    for (std::int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) {
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lk(m);
        if (i < failed_at) {
          failed_at = i;
          failure = std::current_exception();
        }
      }
    }
  });
  if (failure) std::rethrow_exception(failure);
}

}  // namespace vq::eval
