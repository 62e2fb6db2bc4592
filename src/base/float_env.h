// Scoring must not depend on a host application's floating-point environment: with
// flush-to-zero or denormals-are-zero set, tiny softmax weights become exactly 0 and change
// which token wins a tie. FloatEnvGuard clears FTZ/DAZ for its scope and restores them.
#pragma once

#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
#define VQ_HAVE_MXCSR 1
#endif

namespace vq {

class FloatEnvGuard {
 public:
#ifdef VQ_HAVE_MXCSR
  static constexpr unsigned kFtz = 1u << 15, kDaz = 1u << 6;
  FloatEnvGuard() noexcept : saved_(_mm_getcsr()) {
    if (saved_ & (kFtz | kDaz)) _mm_setcsr(saved_ & ~(kFtz | kDaz));
  }
  ~FloatEnvGuard() {
    if (saved_ & (kFtz | kDaz)) _mm_setcsr(saved_);
  }

 private:
  unsigned saved_;
#else
  FloatEnvGuard() noexcept = default;
#endif
 public:
  FloatEnvGuard(const FloatEnvGuard&) = delete;
  FloatEnvGuard& operator=(const FloatEnvGuard&) = delete;
};

}  // namespace vq
