// Internal: what the checkpoint loaders share (building a Model, validating header fields).
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/formats/file_error.h"
#include "engine/formats/mapped_file.h"
#include "engine/model/model.h"
#include "veloxquant/errors.h"

namespace vq::engine {

struct ModelBuilder {
  Model model;
  ModelBuilder() = default;
  ModelConfig& config() { return model.config_; }
  Weights& weights() { return model.weights_; }
  void set_paths(std::string path, std::string directory) {
    model.path_ = std::move(path);
    model.directory_ = std::move(directory);
  }
  void set_file(std::unique_ptr<MappedFile> f) {
    model.files_.clear();
    model.files_.push_back(std::move(f));
  }
  // Several mappings (a sharded checkpoint), all kept for the Model's lifetime.
  void set_files(std::vector<std::unique_ptr<MappedFile>> fs) { model.files_ = std::move(fs); }
  // A new owned fp32 buffer of n floats (converted weights), zero-initialised.
  float* own(std::int64_t n) {
    void* p = own_bytes(n * 4);
    std::memset(p, 0, static_cast<std::size_t>(n) * 4);
    return static_cast<float*>(p);
  }
  // A new owned buffer of `bytes` bytes (16-byte aligned, uninitialised): copied or generated
  // tensors of any weight type.
  void* own_bytes(std::int64_t bytes) {
    model.owned_.push_back(
        std::unique_ptr<std::uint8_t[]>(new std::uint8_t[static_cast<std::size_t>(bytes)]));
    model.owned_sizes_.push_back(bytes);
    return model.owned_.back().get();
  }
  Model finish() { return std::move(model); }
};

// Checks the shape fields shared by both formats (positive, in range, heads divide, even head
// dim). `what(field)` names a field in the message, e.g. "header field dim" or
// "config.json 'hidden_size'".
void validate_shape(const std::string& path, const ModelConfig& c,
                    std::string (*name)(const char* field));

}  // namespace vq::engine
