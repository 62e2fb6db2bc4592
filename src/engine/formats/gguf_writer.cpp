// GGUF writer (see gguf_writer.h and the layout in gguf.h).
#include "engine/formats/gguf_writer.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/input_file.h"
#include "veloxquant/errors.h"

namespace vq::engine {
namespace {

constexpr std::uint64_t kAlignment = 32;

template <typename T>
void put(std::ostream& out, T v) {
  out.write(reinterpret_cast<const char*>(&v), sizeof(T));
}
void put_string(std::ostream& out, const std::string& s) {
  put<std::uint64_t>(out, s.size());
  out.write(s.data(), static_cast<std::streamsize>(s.size()));
}

void put_scalar(std::ostream& out, GgufType type, const GgufValue& v, std::int64_t i, double f) {
  switch (type) {
    case GgufType::kU8:
      put<std::uint8_t>(out, static_cast<std::uint8_t>(i));
      break;
    case GgufType::kI8:
      put<std::int8_t>(out, static_cast<std::int8_t>(i));
      break;
    case GgufType::kU16:
      put<std::uint16_t>(out, static_cast<std::uint16_t>(i));
      break;
    case GgufType::kI16:
      put<std::int16_t>(out, static_cast<std::int16_t>(i));
      break;
    case GgufType::kU32:
      put<std::uint32_t>(out, static_cast<std::uint32_t>(i));
      break;
    case GgufType::kI32:
      put<std::int32_t>(out, static_cast<std::int32_t>(i));
      break;
    case GgufType::kU64:
      put<std::uint64_t>(
          out, v.u > static_cast<std::uint64_t>(INT64_MAX) ? v.u : static_cast<std::uint64_t>(i));
      break;
    case GgufType::kI64:
      put<std::int64_t>(out, i);
      break;
    case GgufType::kF32:
      put<float>(out, static_cast<float>(f));
      break;
    case GgufType::kF64:
      put<double>(out, f);
      break;
    case GgufType::kBool:
      put<std::uint8_t>(out, i ? 1 : 0);
      break;
    case GgufType::kString:
    case GgufType::kArray:
      break;
  }
}

void put_value(std::ostream& out, const GgufValue& v) {
  if (v.type == GgufType::kString) {
    put_string(out, v.s);
  } else if (v.type == GgufType::kArray) {
    put<std::uint32_t>(out, static_cast<std::uint32_t>(v.elem));
    put<std::uint64_t>(out, v.array_size());
    for (const std::string& s : v.strings) put_string(out, s);
    for (const std::int64_t i : v.ints) put_scalar(out, v.elem, v, i, 0.0);
    for (const double f : v.floats) put_scalar(out, v.elem, v, 0, f);
    for (const GgufValue& item : v.items) put_value(out, item);  // arrays: elem type, count, ...
  } else {
    put_scalar(out, v.type, v, v.i, v.f);
  }
}

void pad_to(std::ostream& out, std::uint64_t& pos) {
  while (pos % kAlignment != 0) {
    out.put('\0');
    ++pos;
  }
}

}  // namespace

void GgufWriter::set(const std::string& key, GgufValue value) {
  for (auto& kv : kv_) {
    if (kv.first == key) {
      kv.second = std::move(value);
      return;
    }
  }
  kv_.emplace_back(key, std::move(value));
}

void GgufWriter::add_tensor(const std::string& name, std::vector<std::int64_t> dims, GgmlType type,
                            const float* values) {
  std::int64_t n = 1;
  for (const std::int64_t d : dims) n *= d;
  if (dims.empty() || dims[0] % type_info(type).block_size != 0) {
    throw Error(ErrorCode::kInvalidArgument, "[gguf] tensor '" + name + "': rows of " +
                                                 std::to_string(dims.empty() ? 0 : dims[0]) +
                                                 " values cannot be stored as " +
                                                 type_info(type).name + " (blocks of " +
                                                 std::to_string(type_info(type).block_size) + ")");
  }
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(type_bytes(type, n)));
  quantize(type, values, bytes.data(), n);
  add_raw_tensor(name, std::move(dims), type, std::move(bytes));
}

void GgufWriter::add_raw_tensor(const std::string& name, std::vector<std::int64_t> dims,
                                GgmlType type, std::vector<std::uint8_t> bytes) {
  for (const Tensor& t : tensors_) {
    if (t.name == name) {
      throw Error(ErrorCode::kInvalidArgument, "[gguf] duplicate tensor name '" + name + "'");
    }
  }
  tensors_.push_back(Tensor{name, std::move(dims), type, std::move(bytes)});
}

void GgufWriter::write_to(std::ostream& out) const {
  std::ostringstream head;
  head.write("GGUF", 4);
  put<std::uint32_t>(head, 3);
  put<std::uint64_t>(head, tensors_.size());
  put<std::uint64_t>(head, kv_.size());
  for (const auto& [key, v] : kv_) {
    put_string(head, key);
    put<std::uint32_t>(head, static_cast<std::uint32_t>(v.type));
    put_value(head, v);
  }
  std::uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    put_string(head, t.name);
    put<std::uint32_t>(head, static_cast<std::uint32_t>(t.dims.size()));
    for (const std::int64_t d : t.dims) put<std::uint64_t>(head, static_cast<std::uint64_t>(d));
    put<std::uint32_t>(head, static_cast<std::uint32_t>(t.type));
    put<std::uint64_t>(head, offset);
    offset += (t.bytes.size() + kAlignment - 1) / kAlignment * kAlignment;
  }
  const std::string h = head.str();
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  std::uint64_t pos = h.size();
  pad_to(out, pos);
  for (const Tensor& t : tensors_) {
    out.write(reinterpret_cast<const char*>(t.bytes.data()),
              static_cast<std::streamsize>(t.bytes.size()));
    pos += t.bytes.size();
    pad_to(out, pos);
  }
}

std::vector<std::uint8_t> GgufWriter::serialize() const {
  std::ostringstream out;
  write_to(out);
  const std::string s = out.str();
  return std::vector<std::uint8_t>(s.begin(), s.end());
}

void GgufWriter::write(const std::string& path,
                       const std::function<void(const std::string&)>& verify) const {
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) {
      throw Error(ErrorCode::kIoError, "'" + path + "': cannot create " + tmp + " for writing",
                  path);
    }
    write_to(out);
    out.flush();
    if (!out) {
      out.close();
      std::remove(tmp.c_str());
      throw Error(ErrorCode::kIoError, "'" + path + "': writing " + tmp + " failed (disk full?)",
                  path);
    }
  }
  try {
    if (verify) verify(tmp);
    check_not_an_input("", path);
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    throw Error(ErrorCode::kIoError, "'" + path + "': cannot rename " + tmp + ": " + ec.message(),
                path);
  }
}

}  // namespace vq::engine
