#include "veloxquant/errors.h"

#include <cstdio>
#include <cstdlib>

namespace vq {

const char* to_string(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kInvalidConfig: return "invalid_config";
    case ErrorCode::kInvalidSpec: return "invalid_spec";
    case ErrorCode::kUnknownMethod: return "unknown_method";
    case ErrorCode::kShapeMismatch: return "shape_mismatch";
    case ErrorCode::kInvalidState: return "invalid_state";
    case ErrorCode::kInvalidArgument: return "invalid_argument";
    case ErrorCode::kFileError: return "file_error";
    case ErrorCode::kIoError: return "io_error";
  }
  return "unknown";
}

Error::Error(ErrorCode code, const std::string& message, std::string path)
    : std::runtime_error(message), code_(code), path_(std::move(path)) {}

namespace detail {
void assert_fail(const char* expr, const char* file, int line, const std::string& msg) {
  std::fprintf(stderr, "veloxquant internal error at %s:%d: %s (%s)\n", file, line, msg.c_str(),
               expr);
  std::fflush(stderr);
  std::abort();
}
}  // namespace detail

}  // namespace vq
