// Internal: what the checkpoint loaders share (building a Model, validating header fields).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/mapped_file.h"
#include "engine/model.h"
#include "veloxquant/errors.h"

namespace vq::engine {

[[noreturn]] inline void file_error(const std::string& path, const std::string& what) {
  throw Error(ErrorCode::kFileError, "'" + path + "': " + what, path);
}

// Limits that keep every size computation far from int64 overflow and reject garbage headers.
inline constexpr std::int64_t kMaxWidth = std::int64_t{1} << 20;  // dim, hidden, vocab, seq_len
inline constexpr std::int64_t kMaxCount = std::int64_t{1} << 12;  // layers, heads

struct ModelBuilder {
  Model model;
  ModelBuilder() = default;
  ModelConfig& config() { return model.config_; }
  Weights& weights() { return model.weights_; }
  void set_paths(std::string path, std::string directory) {
    model.path_ = std::move(path);
    model.directory_ = std::move(directory);
  }
  void set_file(std::unique_ptr<MappedFile> f) { model.file_ = std::move(f); }
  // A new owned fp32 buffer of n floats (converted weights).
  float* own(std::int64_t n) {
    model.owned_.push_back(std::make_unique<float[]>(static_cast<std::size_t>(n)));
    model.owned_sizes_.push_back(n * 4);
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
