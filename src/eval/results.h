// Writing result files: whole or not at all.
#pragma once

#include <string>

namespace vq::eval {

// Writes `content` to `path` atomically: a temporary file in the same directory, flushed, then
// renamed over `path`. Creates missing parent directories. Throws Error(kIoError) naming the
// path; on failure nothing is left at `path` (an earlier file there stays as it was).
void write_file_atomic(const std::string& path, const std::string& content);

// Checks up front that `path` can be written (its directory exists or can be created and is
// writable), so a long run fails before it starts. Throws Error(kIoError).
void check_writable(const std::string& path);

// The git commit of the source tree the binary was built from ("unknown" when not built from
// a git checkout), and a short machine description (CPU model, cores).
std::string build_commit();
std::string machine_description();

}  // namespace vq::eval
