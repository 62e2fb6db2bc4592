// The tensors of a Hugging Face checkpoint: one model.safetensors, or several shards
// (model-00001-of-00002.safetensors, ...) named by model.safetensors.index.json, whose
// "weight_map" maps every tensor name to the shard file that holds it (Transformers' format).
// Every file is memory-mapped and its tensors read in place, as SafetensorsFile does for one.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/formats/mapped_file.h"
#include "engine/formats/safetensors.h"

namespace vq::engine {

// The index file name Transformers writes beside the shards.
inline constexpr const char* kSafetensorsIndexName = "model.safetensors.index.json";

// A parsed index: tensor name -> shard file name (a plain file name in the index's directory).
struct SafetensorsIndex {
  std::string path;                               // the index file
  std::map<std::string, std::string> weight_map;  // tensor -> shard file name
  // The distinct shard file names, sorted.
  std::vector<std::string> shards() const;
};

// Reads and validates an index (read whole and parsed like config.json: at most
// kMaxTextFileBytes, kMaxJsonDepth). Throws Error(kFileError) naming the index when it is not
// JSON, not an object, has no "weight_map" object, an empty one, a value that is not a string,
// or a value that is not a plain file name (a path escaping the directory such as "../x" or
// "/abs/x", a subdirectory, ".", "..", control characters). "metadata" (total_size) is not
// read: Transformers does not read it either.
SafetensorsIndex read_safetensors_index(const std::string& path);

class SafetensorsSet {
 public:
  // One safetensors file (SafetensorsFile's checks).
  static SafetensorsSet single(const std::string& path);
  // Every shard the index names, from the index's directory, each checked by SafetensorsFile
  // (errors name the shard). Then the index and the shards must agree exactly, else
  // Error(kFileError) naming the file and the tensor: a named shard that does not exist; a
  // tensor the index maps to a shard that lacks it; a tensor a shard holds that the index
  // maps to another shard or does not list (ambiguous); a tensor held by two shards.
  static SafetensorsSet sharded(const SafetensorsIndex& index);

  // The safetensors file, or the index of a sharded checkpoint.
  const std::string& path() const noexcept { return path_; }
  bool sharded() const noexcept { return sharded_; }
  std::size_t n_files() const noexcept { return files_.size(); }
  // nullptr when absent.
  const SafeTensor* find(const std::string& name) const;
  // Every tensor name, sorted.
  std::vector<std::string> tensor_names() const;
  // The file that holds `t` (a tensor find() returned): for its path() and data().
  const SafetensorsFile& file_of(const SafeTensor& t) const;
  // The "__metadata__" value for `key` (nullptr when absent). Sharded: the value every shard
  // that has `key` gives; shards giving different values is an error naming both.
  const std::string* metadata(const std::string& key) const;

  // Hands over every mapping (the model keeps tensors in place), leaving the set empty.
  std::vector<std::unique_ptr<MappedFile>> release();

 private:
  std::string path_;
  bool sharded_ = false;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::size_t> where_;  // tensor name -> files_ index
};

}  // namespace vq::engine
