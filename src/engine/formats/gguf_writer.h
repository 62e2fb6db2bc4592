// Writing GGUF files (version 3, alignment 32): metadata in insertion order, then tensors.
#pragma once

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "engine/formats/gguf.h"

namespace vq::engine {

class GgufWriter {
 public:
  // Sets `key` (replacing an earlier value of the same key in place).
  void set(const std::string& key, GgufValue value);
  // Adds a tensor of `type` with ggml-order `dims` (dims[0] innermost) from fp32 values
  // `values[product of dims]`, quantized with vq::engine::quantize (F32, F16, BF16, Q8_0).
  // Throws Error(kInvalidArgument) for a duplicate name or a row not a multiple of the block.
  void add_tensor(const std::string& name, std::vector<std::int64_t> dims, GgmlType type,
                  const float* values);
  // Adds a tensor from already encoded bytes (type_bytes(type, n) of them).
  void add_raw_tensor(const std::string& name, std::vector<std::int64_t> dims, GgmlType type,
                      std::vector<std::uint8_t> bytes);

  // The whole file.
  void write_to(std::ostream& out) const;
  std::vector<std::uint8_t> serialize() const;
  // Writes `path` atomically: a temporary file next to it, renamed over `path` when complete.
  // Throws Error(kIoError) naming the path on failure (no partial file is left). `verify`, when
  // set, is called with the complete temporary file's path before the rename (convert loads it
  // back with the model loader); whatever it throws is rethrown after the temporary file is
  // removed, and `path` is left as it was. An output that is an input of this process (same
  // file: base/input_file.h) is refused the same way, before the rename.
  void write(const std::string& path,
             const std::function<void(const std::string& temporary)>& verify = {}) const;

  std::size_t tensor_count() const noexcept { return tensors_.size(); }

 private:
  struct Tensor {
    std::string name;
    std::vector<std::int64_t> dims;
    GgmlType type;
    std::vector<std::uint8_t> bytes;
  };
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::vector<Tensor> tensors_;
};

}  // namespace vq::engine
