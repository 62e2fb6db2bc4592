// A read-only memory mapping of a whole file (model weights are read in place, never copied).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace vq::engine {

class MappedFile {
 public:
  // Maps `path` read-only. Throws Error(kFileError) naming the path when it cannot be opened,
  // is not a regular file, or cannot be mapped. An empty file maps to size() == 0.
  explicit MappedFile(std::string path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::uint8_t* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
  const std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
};

// Largest text file read whole (eval texts, config.json, tokenizer.json, result files).
inline constexpr std::size_t kMaxTextFileBytes = std::size_t{64} << 20;  // 64 MiB

// The whole file as a string (tokenizers and JSON). Throws Error(kFileError) naming the path,
// also when it holds more than `max_bytes` (checked while reading, so /dev/zero or a FIFO
// cannot exhaust memory).
std::string read_text_file(const std::string& path, std::size_t max_bytes = kMaxTextFileBytes);

}  // namespace vq::engine
