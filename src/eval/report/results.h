// Writing result files: whole or not at all.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "veloxquant/config.h"

namespace vq::eval {

// The results schema shared by every result file (docs/results.md).
inline constexpr const char* kResultsSchema = "veloxquant.results/1";

// The envelope: schema, kind ("perturb", "eval"), version, git commit, machine, the command
// line, and `settings` (the run's own parameters). Rows go in "rows".
nlohmann::json results_envelope(const std::string& kind, const std::string& command,
                                nlohmann::json settings);

// The method part of a row: "method" (canonical spec of non-default fields), "method_id",
// "params" (every field, resolved) and "budget" (null for methods without one).
nlohmann::json method_json(const CacheConfig& config);

// argv joined with spaces, quoting arguments that need it.
std::string command_line(int argc, const char* const* argv);
// The same with the arguments a caller kept (for commands run through CLI11).
std::string command_line(const std::vector<std::string>& args);

// Writes `content` to `path` atomically: a one-output OutputSet (eval/report/output_set.h), so the
// target must be absent or a regular file (not a device, FIFO, directory or symbolic link),
// missing parent directories are created, and on failure nothing is left behind (an earlier
// file at `path` stays as it was). Throws Error(kIoError) naming the path. A command with more
// than one output should use OutputSet directly, so they are committed together.
void write_file_atomic(const std::string& path, const std::string& content);

// Checks up front, creating nothing, that `path` can be written: the checks of
// OutputSet::declare (eval/report/output_set.h). Throws Error(kIoError).
void check_writable(const std::string& path);
// The same (kept for callers written before check_writable stopped creating directories).
void check_creatable(const std::string& path);

// The git commit of the source tree the binary was built from ("unknown" when not built from
// a git checkout), and a short machine description (CPU model, cores).
std::string build_commit();
std::string machine_description();

}  // namespace vq::eval
