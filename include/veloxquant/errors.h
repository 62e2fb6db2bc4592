// VeloxQuant error types.
//
// Two channels (see docs/design.md):
//  - vq::Error: a user-caused problem (bad config or spec, wrong tensor shape, bad file, call
//    out of order). It carries an ErrorCode and, for file problems, the path. Messages start
//    with the component in brackets and name the bad value and what is allowed, e.g.
//    "[morphkv] morphkv_window must be in [1, 64], got 0".
//  - VQ_ASSERT: a broken internal invariant (a bug in VeloxQuant). Always on, also in release
//    builds; prints file:line and aborts.
#pragma once

#include <stdexcept>
#include <string>

#include "veloxquant/export.h"

namespace vq {

enum class ErrorCode {
  kInvalidConfig,    // a field out of range, or fields inconsistent with each other
  kInvalidSpec,      // a method spec string that does not parse
  kUnknownMethod,    // a method id the registry does not know
  kShapeMismatch,    // tensor shapes or dtypes that do not fit the cache
  kInvalidState,     // calls out of order (e.g. end_step without begin_step)
  kInvalidArgument,  // any other bad argument (CLI flags, ranges)
  kFileError,        // a missing, truncated or corrupt file; path() names it
  kIoError,          // an I/O failure while writing results
};

VQ_API const char* to_string(ErrorCode code) noexcept;

class VQ_API Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message, std::string path = {});
  ErrorCode code() const noexcept { return code_; }
  // The file the error is about, for kFileError / kIoError; empty otherwise.
  const std::string& path() const noexcept { return path_; }

 private:
  ErrorCode code_;
  std::string path_;
};

namespace detail {
[[noreturn]] VQ_API void assert_fail(const char* expr, const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace vq

// Always-on internal invariant check. `msg` is any expression convertible to std::string.
#define VQ_ASSERT(cond, msg)                                          \
  do {                                                                \
    if (!(cond)) ::vq::detail::assert_fail(#cond, __FILE__, __LINE__, (msg)); \
  } while (0)
