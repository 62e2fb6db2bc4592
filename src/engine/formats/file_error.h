// Internal: the error every file reader throws, and the header-field limits the loaders share.
#pragma once

#include <cstdint>
#include <string>

#include "base/validate.h"
#include "veloxquant/errors.h"

namespace vq::engine {

// The path is shown as a printable excerpt (control, bidi and other non-ASCII bytes escaped:
// base/validate.h), so a shard or file name cannot rewrite the terminal; Error::path() keeps it
// exact.
[[noreturn]] inline void file_error(const std::string& path, const std::string& what) {
  throw Error(ErrorCode::kFileError, "'" + validate::excerpt(path, 300) + "': " + what, path);
}

// Limits that keep every size computation far from int64 overflow and reject garbage headers.
inline constexpr std::int64_t kMaxWidth = std::int64_t{1} << 20;  // dim, hidden, vocab, seq_len
inline constexpr std::int64_t kMaxCount = std::int64_t{1} << 12;  // layers, heads

}  // namespace vq::engine
