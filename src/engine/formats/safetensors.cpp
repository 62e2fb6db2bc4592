#include "engine/formats/safetensors.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "engine/formats/json_limits.h"
#include "engine/formats/file_error.h"

namespace vq::engine {

std::int64_t SafeTensor::numel() const noexcept {
  std::int64_t n = 1;
  for (const std::int64_t d : shape) n *= d;
  return n;
}

std::int64_t safetensors_dtype_size(const std::string& dtype) noexcept {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL" || dtype == "F8_E4M3" ||
      dtype == "F8_E5M2") {
    return 1;
  }
  return 0;
}

namespace {

std::string shape_text(const std::vector<std::int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// A non-negative JSON integer, or -1.
std::int64_t as_count(const nlohmann::json& j) {
  if (j.is_number_unsigned()) {
    const auto v = j.get<std::uint64_t>();
    return v > static_cast<std::uint64_t>(INT64_MAX) ? -1 : static_cast<std::int64_t>(v);
  }
  if (j.is_number_integer()) {
    const auto v = j.get<std::int64_t>();
    return v < 0 ? -1 : v;
  }
  return -1;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path)
    : file_(std::make_unique<MappedFile>(path)) {
  const std::int64_t size = static_cast<std::int64_t>(file_->size());
  if (size < 8) {
    file_error(path,
               "truncated safetensors file: expected at least 8 bytes (header length), found " +
                   std::to_string(size));
  }
  std::uint64_t n = 0;
  std::memcpy(&n, file_->data(), 8);  // little-endian hosts only (x86-64, arm64)
  if (n > static_cast<std::uint64_t>(size - 8)) {
    file_error(path, "safetensors header length " + std::to_string(n) + " exceeds the " +
                         std::to_string(size - 8) +
                         " bytes after the length field (truncated or not a safetensors file)");
  }
  header_len_ = static_cast<std::int64_t>(n);
  const char* text = reinterpret_cast<const char*>(file_->data() + 8);
  const nlohmann::json header = parse_json_limited(
      std::string_view(text, static_cast<std::size_t>(header_len_)), path, "safetensors header");
  if (!header.is_object()) {
    file_error(
        path, "safetensors header must be a JSON object, found " + std::string(header.type_name()));
  }
  data_ = file_->data() + 8 + header_len_;
  const std::int64_t data_size = size - 8 - header_len_;

  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) file_error(path, "__metadata__ must be a JSON object of strings");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) {
          file_error(path,
                     "__metadata__ entry '" + k + "' must be a string, found " + json_excerpt(v));
        }
        metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    // (name captured by an init-capture: clang 14 cannot capture structured bindings)
    auto bad = [&, &tensor = name](const std::string& what) {
      file_error(path, "tensor '" + tensor + "': " + what);
    };
    if (!entry.is_object()) bad("entry must be a JSON object, found " + json_excerpt(entry));
    SafeTensor t;
    t.name = name;
    if (!entry.contains("dtype") || !entry["dtype"].is_string())
      bad("missing string field 'dtype'");
    t.dtype = entry["dtype"].get<std::string>();
    const std::int64_t esize = safetensors_dtype_size(t.dtype);
    if (esize == 0) bad("unknown dtype '" + t.dtype + "'");
    if (!entry.contains("shape") || !entry["shape"].is_array()) bad("missing array field 'shape'");
    std::int64_t numel = 1;
    for (const auto& d : entry["shape"]) {
      const std::int64_t v = as_count(d);
      if (v < 0)
        bad("shape entries must be non-negative integers, found " + json_excerpt(entry["shape"]));
      t.shape.push_back(v);
      if (v != 0 && numel > (INT64_MAX / esize) / v)
        bad("shape " + json_excerpt(entry["shape"]) + " is too large");
      numel *= v;
    }
    if (!entry.contains("data_offsets") || !entry["data_offsets"].is_array() ||
        entry["data_offsets"].size() != 2) {
      bad("missing field 'data_offsets' ([begin, end])");
    }
    t.begin = as_count(entry["data_offsets"][0]);
    t.end = as_count(entry["data_offsets"][1]);
    if (t.begin < 0 || t.end < 0 || t.begin > t.end) {
      bad("data_offsets must be non-negative integers with begin <= end, found " +
          json_excerpt(entry["data_offsets"]));
    }
    if (t.end > data_size) {
      bad("data_offsets " + json_excerpt(entry["data_offsets"]) + " end past the data section (" +
          std::to_string(data_size) + " bytes; file truncated?)");
    }
    if (t.end - t.begin != numel * esize) {
      bad("data_offsets " + json_excerpt(entry["data_offsets"]) + " span " +
          std::to_string(t.end - t.begin) + " bytes, but " + t.dtype + " " + shape_text(t.shape) +
          " needs " + std::to_string(numel * esize));
    }
    index_[name] = tensors_.size();
    tensors_.push_back(std::move(t));
  }

  // The format requires the tensors to tile the data section without gaps or overlaps.
  std::vector<const SafeTensor*> order;
  for (const auto& t : tensors_) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const SafeTensor* a, const SafeTensor* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  std::int64_t at = 0;
  for (const SafeTensor* t : order) {
    if (t->begin != at) {
      file_error(path,
                 "tensor '" + t->name + "' starts at data offset " + std::to_string(t->begin) +
                     ", expected " + std::to_string(at) +
                     (t->begin < at ? " (overlaps the previous tensor)" : " (a gap before it)"));
    }
    at = t->end;
  }
  if (at != data_size) {
    file_error(path, "the tensors cover " + std::to_string(at) + " bytes of a " +
                         std::to_string(data_size) +
                         "-byte data section (expected them to cover it exactly)");
  }
}

const SafeTensor* SafetensorsFile::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace vq::engine
