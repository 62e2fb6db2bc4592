// GGUF files (llama.cpp's model format, versions 2 and 3): a parsed, validated view of the
// header, the metadata key/value pairs and the tensor directory, over bytes that stay in place
// (a read-only memory mapping for files, or a caller's buffer).
//
// Layout (little-endian): "GGUF", uint32 version, uint64 tensor_count, uint64 kv_count; kv_count
// pairs {string key, uint32 value_type, value}; tensor_count infos {string name, uint32 n_dims,
// uint64 dims[n_dims] (dims[0] is the innermost, contiguous one), uint32 ggml type, uint64
// offset}; padding to general.alignment (default 32); the tensor data, each tensor at
// data_start + offset (offsets multiples of the alignment). A string is uint64 length + bytes;
// an array is uint32 element type, uint64 count, elements.
//
// Every length, count, offset and size is checked against the bytes present before it is used:
// a malformed file gives Error(kFileError) naming the file, what was expected and what was found.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/compute/quants.h"

namespace vq::engine {

class MappedFile;

enum class GgufType : std::uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};
const char* to_string(GgufType type) noexcept;

// One metadata value. Scalars: integers (and bools) in `i` (unsigned 64-bit values above
// INT64_MAX are kept in `u` too), floats in `f`, strings in `s`. Arrays: `elem` is the element
// type and the elements are in `ints`, `floats`, `strings`, or `items` (arrays of arrays).
struct GgufValue {
  GgufType type = GgufType::kU8;
  std::int64_t i = 0;
  std::uint64_t u = 0;
  double f = 0.0;
  std::string s;
  GgufType elem = GgufType::kU8;
  std::vector<std::int64_t> ints;
  std::vector<double> floats;
  std::vector<std::string> strings;
  std::vector<GgufValue> items;

  bool is_integer() const noexcept;  // any integer type (not bool)
  bool is_float() const noexcept;    // F32 or F64
  std::size_t array_size() const noexcept;
  std::string describe() const;  // "uint32 7", "string 'llama'", "array of 32000 string"

  static GgufValue str(std::string v);
  static GgufValue u32(std::uint32_t v);
  static GgufValue i32(std::int32_t v);
  static GgufValue f32(float v);
  static GgufValue boolean(bool v);
  static GgufValue string_array(std::vector<std::string> v);
  static GgufValue f32_array(const std::vector<float>& v);
  static GgufValue i32_array(const std::vector<std::int32_t>& v);
};

struct GgufTensor {
  std::string name;
  std::vector<std::int64_t> dims;  // ggml order: dims[0] innermost
  GgmlType type = GgmlType::kF32;
  std::uint64_t offset = 0;  // from the start of the data section
  std::int64_t n_values = 0;
  std::int64_t n_bytes = 0;
  const std::uint8_t* data = nullptr;  // n_bytes bytes inside the file
  std::string shape_text() const;      // "[288, 512]" in ggml order
};

class GgufFile {
 public:
  // Maps `path` and parses it.
  static GgufFile open(const std::string& path);
  // Parses `size` bytes at `data` (not copied: they must outlive the GgufFile). `name` is the
  // file name errors give. This is the entry point for fuzzing.
  static GgufFile parse(const std::uint8_t* data, std::size_t size, const std::string& name);

  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;
  ~GgufFile();

  const std::string& path() const noexcept { return path_; }
  std::uint32_t version() const noexcept { return version_; }
  std::uint64_t alignment() const noexcept { return alignment_; }
  std::uint64_t data_offset() const noexcept { return data_offset_; }
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const noexcept { return kv_; }
  const std::vector<GgufTensor>& tensors() const noexcept { return tensors_; }

  const GgufValue* find(const std::string& key) const noexcept;
  const GgufTensor* find_tensor(const std::string& name) const noexcept;

  // Typed lookups; each throws Error(kFileError) naming the file and key when the key is
  // missing (the *_or forms return the fallback) or holds another type.
  std::string get_string(const std::string& key) const;
  std::int64_t get_int(const std::string& key) const;
  std::int64_t get_int_or(const std::string& key, std::int64_t fallback) const;
  double get_float(const std::string& key) const;
  double get_float_or(const std::string& key, double fallback) const;
  bool get_bool_or(const std::string& key, bool fallback) const;
  // An array whose elements have type `elem_kind` ("string", "integer", "float").
  const GgufValue& get_array(const std::string& key, const char* elem_kind) const;

  // Keeps `file` alive with this view (used by open()).
  void hold(std::shared_ptr<MappedFile> file) { file_ = std::move(file); }

 private:
  GgufFile() = default;
  std::string path_;
  std::uint32_t version_ = 0;
  std::uint64_t alignment_ = 32;
  std::uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::map<std::string, std::size_t> kv_index_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, std::size_t> tensor_index_;
  std::shared_ptr<MappedFile> file_;
  friend class GgufParser;
};

}  // namespace vq::engine
