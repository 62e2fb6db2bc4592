// Reading safetensors files: an 8-byte little-endian header length, a JSON header naming each
// tensor's dtype, shape and [begin, end) byte range in the data section, then the data.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/formats/mapped_file.h"

namespace vq::engine {

struct SafeTensor {
  std::string name;
  std::string dtype;  // "F32", "F16", "BF16", ... as written in the header
  std::vector<std::int64_t> shape;
  std::int64_t begin = 0, end = 0;  // byte range within the data section
  std::int64_t numel() const noexcept;
};

// Bytes per element of a safetensors dtype name; 0 for names this reader does not know.
std::int64_t safetensors_dtype_size(const std::string& dtype) noexcept;

class SafetensorsFile {
 public:
  // Maps the file and validates the header: JSON syntax, every entry's dtype, shape and
  // offsets (inside the data section, size = numel * dtype size, contiguous and covering the
  // data section exactly, as the format requires). Throws Error(kFileError) naming the path,
  // the tensor and what was expected vs found.
  explicit SafetensorsFile(const std::string& path);

  const std::string& path() const noexcept { return file_->path(); }
  // nullptr when absent.
  const SafeTensor* find(const std::string& name) const;
  const std::vector<SafeTensor>& tensors() const noexcept { return tensors_; }
  // The "__metadata__" entry (string to string); empty when absent.
  const std::map<std::string, std::string>& metadata() const noexcept { return metadata_; }
  // The first byte of a tensor's data (not necessarily aligned).
  const std::uint8_t* data(const SafeTensor& t) const noexcept { return data_ + t.begin; }
  std::int64_t header_bytes() const noexcept { return header_len_; }

  // Hands over the mapping (the model keeps fp32 tensors in place).
  std::unique_ptr<MappedFile> release() { return std::move(file_); }

 private:
  std::unique_ptr<MappedFile> file_;
  const std::uint8_t* data_ = nullptr;
  std::int64_t header_len_ = 0;
  std::vector<SafeTensor> tensors_;
  std::map<std::string, std::size_t> index_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace vq::engine
