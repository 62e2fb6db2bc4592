// A read-only memory mapping of a whole file (model weights are read in place, never copied).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace vq::engine {

class MappedFile {
 public:
  // Maps `path` read-only (opened non-blocking and checked as a regular file first, and recorded
  // as an input: base/input_file.h). Throws Error(kFileError) naming the path when it cannot be
  // opened, is not a regular file (a FIFO, a device), or cannot be mapped. An empty file maps to
  // size() == 0. The descriptor is kept to notice a file that changes under the mapping.
  explicit MappedFile(std::string path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::uint8_t* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  const std::string& path() const noexcept { return path_; }

  // A file truncated under a mapping kills the process with SIGBUS at the next touch of a lost
  // page. VeloxQuant refuses to use a file that changed instead: a long-running user (the
  // server) calls check_unchanged() before each use. change() returns "" when the file's size
  // and modification time are those seen at load, else what changed ("its size changed from A
  // to B bytes since it was loaded"); check_unchanged() throws Error(kFileError) naming the
  // path with that text. (A change after the check and during the use is not caught: replace
  // model files by renaming a new file into place, which never affects a mapping.)
  std::string change() const;
  void check_unchanged() const;

 private:
  std::string path_;
  const std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
  std::int64_t mtime_ns_ = 0;
  int fd_ = -1;
};

// Largest text file read whole (eval texts, config.json, tokenizer.json, result files).
inline constexpr std::size_t kMaxTextFileBytes = std::size_t{64} << 20;  // 64 MiB

// The whole file as a string (tokenizers and JSON). Throws Error(kFileError) naming the path,
// also when it is not a regular file (a FIFO or /dev/zero is refused before any read, without
// blocking: base/input_file.h) or holds more than `max_bytes`.
std::string read_text_file(const std::string& path, std::size_t max_bytes = kMaxTextFileBytes);

}  // namespace vq::engine
