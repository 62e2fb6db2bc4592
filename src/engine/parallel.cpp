#include "engine/parallel.h"

#include <string>

#include "veloxquant/errors.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace vq::engine {
namespace {
int& thread_setting() {
  static int n = available_cores();
  return n;
}
}  // namespace

int available_cores() noexcept {
#ifdef _OPENMP
  const int n = omp_get_num_procs();
  return n > 0 ? n : 1;
#else
  return 1;
#endif
}

bool parallel_build() noexcept {
#ifdef _OPENMP
  return true;
#else
  return false;
#endif
}

void set_threads(int n) {
  if (n < 1) {
    throw Error(ErrorCode::kInvalidArgument,
                "[engine] threads must be >= 1, got " + std::to_string(n));
  }
  thread_setting() = n;
}

int threads() noexcept { return thread_setting(); }

}  // namespace vq::engine
