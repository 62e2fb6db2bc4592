// GGUF reader: parses and validates the header, metadata and tensor directory (see gguf.h).
#include "engine/formats/gguf.h"

#include "engine/formats/json_limits.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "base/input_file.h"
#include "engine/formats/mapped_file.h"
#include "engine/formats/file_error.h"

namespace vq::engine {

const char* to_string(GgufType type) noexcept {
  switch (type) {
    case GgufType::kU8:
      return "uint8";
    case GgufType::kI8:
      return "int8";
    case GgufType::kU16:
      return "uint16";
    case GgufType::kI16:
      return "int16";
    case GgufType::kU32:
      return "uint32";
    case GgufType::kI32:
      return "int32";
    case GgufType::kF32:
      return "float32";
    case GgufType::kBool:
      return "bool";
    case GgufType::kString:
      return "string";
    case GgufType::kArray:
      return "array";
    case GgufType::kU64:
      return "uint64";
    case GgufType::kI64:
      return "int64";
    case GgufType::kF64:
      return "float64";
  }
  return "unknown";
}

bool GgufValue::is_integer() const noexcept {
  switch (type) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kU16:
    case GgufType::kI16:
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kU64:
    case GgufType::kI64:
      return true;
    default:
      return false;
  }
}
bool GgufValue::is_float() const noexcept {
  return type == GgufType::kF32 || type == GgufType::kF64;
}
std::size_t GgufValue::array_size() const noexcept {
  return ints.size() + floats.size() + strings.size() + items.size();
}

std::string GgufValue::describe() const {
  if (type == GgufType::kArray) {
    return "array of " + std::to_string(array_size()) + " " + to_string(elem);
  }
  if (type == GgufType::kString) {
    return "string '" + text_excerpt(s, 40) + "'";
  }
  if (is_float()) return std::string(to_string(type)) + " " + std::to_string(f);
  if (type == GgufType::kBool) return i ? "bool true" : "bool false";
  if (type == GgufType::kU64 && u > static_cast<std::uint64_t>(INT64_MAX)) {
    return "uint64 " + std::to_string(u);
  }
  return std::string(to_string(type)) + " " + std::to_string(i);
}

GgufValue GgufValue::str(std::string v) {
  GgufValue out;
  out.type = GgufType::kString;
  out.s = std::move(v);
  return out;
}
GgufValue GgufValue::u32(std::uint32_t v) {
  GgufValue out;
  out.type = GgufType::kU32;
  out.i = v;
  out.u = v;
  return out;
}
GgufValue GgufValue::i32(std::int32_t v) {
  GgufValue out;
  out.type = GgufType::kI32;
  out.i = v;
  out.u = static_cast<std::uint64_t>(v);
  return out;
}
GgufValue GgufValue::f32(float v) {
  GgufValue out;
  out.type = GgufType::kF32;
  out.f = v;
  return out;
}
GgufValue GgufValue::boolean(bool v) {
  GgufValue out;
  out.type = GgufType::kBool;
  out.i = v ? 1 : 0;
  return out;
}
GgufValue GgufValue::string_array(std::vector<std::string> v) {
  GgufValue out;
  out.type = GgufType::kArray;
  out.elem = GgufType::kString;
  out.strings = std::move(v);
  return out;
}
GgufValue GgufValue::f32_array(const std::vector<float>& v) {
  GgufValue out;
  out.type = GgufType::kArray;
  out.elem = GgufType::kF32;
  out.floats.assign(v.begin(), v.end());
  return out;
}
GgufValue GgufValue::i32_array(const std::vector<std::int32_t>& v) {
  GgufValue out;
  out.type = GgufType::kArray;
  out.elem = GgufType::kI32;
  out.ints.assign(v.begin(), v.end());
  return out;
}

std::string GgufTensor::shape_text() const {
  std::string out = "[";
  for (std::size_t k = 0; k < dims.size(); ++k) out += (k ? ", " : "") + std::to_string(dims[k]);
  return out + "]";
}

// Reads the file front to back; every read checks the bytes left first.
class GgufParser {
 public:
  GgufParser(const std::uint8_t* data, std::size_t size, const std::string& name)
      : p_(data), size_(size), name_(name) {}

  GgufFile run() {
    GgufFile g;
    g.path_ = name_;
    if (size_ < 4 || std::memcmp(p_, "GGUF", 4) != 0) {
      const std::string found =
          size_ < 4 ? std::to_string(size_) + " bytes" : "'" + printable(p_, 4) + "'";
      fail("not a GGUF file: expected the magic 'GGUF' at offset 0, found " + found);
    }
    at_ = 4;
    g.version_ = u32("the version");
    if (g.version_ == 1) {
      fail(
          "GGUF version 1 is not supported (32-bit counts; re-convert the model); expected "
          "version 2 or 3");
    }
    if (g.version_ != 2 && g.version_ != 3) {
      fail("unknown GGUF version: expected 2 or 3, found " + std::to_string(g.version_) +
           (g.version_ > 0xFFFF ? " (a big-endian file?)" : ""));
    }
    const std::uint64_t n_tensors = u64("the tensor count");
    const std::uint64_t n_kv = u64("the metadata count");
    // Each pair needs at least 8 (key length) + 4 (type) + 1 bytes; each tensor info 8 + 4 + 4 + 8.
    check_count(n_kv, 13, "metadata pairs");
    check_count(n_tensors, 24, "tensor infos");

    for (std::uint64_t k = 0; k < n_kv; ++k) {
      const std::string where = "metadata pair " + std::to_string(k);
      std::string key = str("the key of " + where);
      // Keys and names come from the file: printed escaped (control bytes, NUL) and cut short.
      const std::string shown = text_excerpt(key, 80);
      // A pair in memory: the key twice (the list and the index), the value, a map node.
      charge(2 * string_bytes(key.size()) + sizeof(std::pair<std::string, GgufValue>) + 64,
             "metadata pair '" + shown + "'");
      const std::uint32_t type = u32("the value type of '" + shown + "'");
      GgufValue v = value(type, "'" + shown + "'", 0);
      if (g.kv_index_.count(key)) fail("duplicate metadata key '" + shown + "'");
      g.kv_index_[key] = g.kv_.size();
      g.kv_.emplace_back(std::move(key), std::move(v));
    }
    if (const GgufValue* a = g.find("general.alignment")) {
      if (a->type != GgufType::kU32) {
        fail("'general.alignment' must be a uint32, found " + a->describe());
      }
      if (a->i == 0 || (a->i & (a->i - 1)) != 0) {
        fail("'general.alignment' must be a power of two, found " + std::to_string(a->i));
      }
      g.alignment_ = static_cast<std::uint64_t>(a->i);
    }

    for (std::uint64_t k = 0; k < n_tensors; ++k) {
      GgufTensor t;
      t.name = str("the name of tensor " + std::to_string(k));
      // A tensor info in memory: the info, its name twice (the list and the index), a map node
      // and up to 4 dimensions.
      charge(sizeof(GgufTensor) + 2 * string_bytes(t.name.size()) + 64 + 4 * 8,
             "tensor " + std::to_string(k));
      const std::string tn = "tensor '" + text_excerpt(t.name, 80) + "'";
      const std::uint32_t n_dims = u32("the dimension count of " + tn);
      if (n_dims < 1 || n_dims > 4) {
        fail(tn + " must have 1 to 4 dimensions, found " + std::to_string(n_dims));
      }
      std::int64_t n = 1;
      for (std::uint32_t d = 0; d < n_dims; ++d) {
        const std::uint64_t dim = u64("dimension " + std::to_string(d) + " of " + tn);
        if (dim == 0 || dim > static_cast<std::uint64_t>(INT64_MAX) ||
            static_cast<std::uint64_t>(n) > static_cast<std::uint64_t>(INT64_MAX) / dim / 8) {
          fail(tn + " dimension " + std::to_string(d) + " = " + std::to_string(dim) +
               (dim == 0 ? " must be positive"
                         : ": the element count overflows (at most 2^60 values supported)"));
        }
        t.dims.push_back(static_cast<std::int64_t>(dim));
        n *= static_cast<std::int64_t>(dim);
      }
      const std::uint32_t type_id = u32("the type of " + tn);
      const auto type = ggml_type_from_id(type_id);
      if (!type) {
        fail(tn + " has type " + ggml_type_name(type_id) +
             "; supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K");
      }
      t.type = *type;
      const GgmlTypeInfo& info = type_info(t.type);
      if (t.dims[0] % info.block_size != 0) {
        fail(tn + " has type " + info.name + " (blocks of " + std::to_string(info.block_size) +
             ") but a row of " + std::to_string(t.dims[0]) + " values, not a multiple");
      }
      t.n_values = n;
      t.n_bytes = type_bytes(t.type, n);
      t.offset = u64("the data offset of " + tn);
      if (t.offset % g.alignment_ != 0) {
        fail(tn + " data offset " + std::to_string(t.offset) + " is not a multiple of the " +
             "alignment " + std::to_string(g.alignment_));
      }
      if (g.tensor_index_.count(t.name)) fail("duplicate tensor name '" + text_excerpt(t.name, 80) + "'");
      g.tensor_index_[t.name] = g.tensors_.size();
      g.tensors_.push_back(std::move(t));
    }

    // The data section starts at the next multiple of the alignment.
    const std::uint64_t pad = (g.alignment_ - at_ % g.alignment_) % g.alignment_;
    g.data_offset_ = at_ + pad;
    if (!g.tensors_.empty() && g.data_offset_ > size_) {
      fail("truncated: the tensor data should start at offset " + std::to_string(g.data_offset_) +
           ", but the file has " + std::to_string(size_) + " bytes");
    }
    const std::uint64_t data_size = g.data_offset_ <= size_ ? size_ - g.data_offset_ : 0;
    std::vector<const GgufTensor*> by_offset;
    for (GgufTensor& t : g.tensors_) {
      const auto bytes = static_cast<std::uint64_t>(t.n_bytes);
      if (t.offset > data_size || bytes > data_size - t.offset) {
        fail("tensor '" + text_excerpt(t.name, 80) + "' (" + type_info(t.type).name + " " + t.shape_text() + ", " +
             std::to_string(bytes) + " bytes at data offset " + std::to_string(t.offset) +
             ") ends past the end of the file: the data section has " + std::to_string(data_size) +
             " bytes");
      }
      t.data = p_ + g.data_offset_ + t.offset;
      by_offset.push_back(&t);
    }
    std::sort(by_offset.begin(), by_offset.end(),
              [](const GgufTensor* a, const GgufTensor* b) { return a->offset < b->offset; });
    for (std::size_t k = 1; k < by_offset.size(); ++k) {
      const GgufTensor& a = *by_offset[k - 1];
      const GgufTensor& b = *by_offset[k];
      if (a.offset + static_cast<std::uint64_t>(a.n_bytes) > b.offset) {
        fail("tensors '" + text_excerpt(a.name, 80) + "' (data offsets " +
             std::to_string(a.offset) + " to " +
             std::to_string(a.offset + static_cast<std::uint64_t>(a.n_bytes)) + ") and '" +
             text_excerpt(b.name, 80) + "' (from " + std::to_string(b.offset) + ") overlap");
      }
    }
    return g;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { file_error(name_, what); }

  // The memory a parsed std::string of `len` bytes takes (its object, and a heap block beyond
  // the small-string buffer).
  static std::uint64_t string_bytes(std::uint64_t len) {
    return sizeof(std::string) + (len > 15 ? len + 1 : 0);
  }
  // Counts `bytes` the parsed header will hold in memory before they are allocated, and
  // refuses a header that would take more than input_memory_limit() (base/input_file.h: 256 MiB,
  // or less under --max-memory): 50 MB of arrays of empty strings or nested arrays would
  // otherwise become gigabytes of objects.
  void charge(std::uint64_t bytes, const std::string& what) {
    held_ += bytes;
    if (held_ > limit_) {
      fail("the metadata and tensor directory would take more than " +
           std::to_string(limit_ >> 20) + " MiB in memory (" + std::to_string(limit_) +
           " bytes; reached at " + what + ", offset " + std::to_string(at_) +
           "): refused before allocating (a header that amplifies; the limit is the smaller "
           "of 256 MiB and --max-memory)");
    }
  }

  static std::string printable(const std::uint8_t* p, std::size_t n) {
    std::string out;
    for (std::size_t k = 0; k < n; ++k) {
      const char c = static_cast<char>(p[k]);
      if (c >= 32 && c < 127) {
        out += c;
      } else {
        static const char* hex = "0123456789abcdef";
        out += std::string("\\x") + hex[p[k] >> 4] + hex[p[k] & 15];
      }
    }
    return out;
  }

  void need(std::uint64_t n, const std::string& what) const {
    if (size_ - at_ < n) {
      fail("truncated: expected " + std::to_string(n) + " bytes for " + what + " at offset " +
           std::to_string(at_) + ", found " + std::to_string(size_ - at_));
    }
  }
  void check_count(std::uint64_t count, std::uint64_t min_bytes, const std::string& what) const {
    if (count > (size_ - at_) / min_bytes) {
      fail("the header declares " + std::to_string(count) + " " + what + ", but only " +
           std::to_string(size_ - at_) + " bytes follow (at least " + std::to_string(min_bytes) +
           " each)");
    }
  }
  template <typename T>
  T read(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_ + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  std::uint32_t u32(const std::string& what) { return read<std::uint32_t>(what); }
  std::uint64_t u64(const std::string& what) { return read<std::uint64_t>(what); }
  std::string str(const std::string& what) {
    const std::uint64_t len = u64("the length of " + what);
    if (len > size_ - at_) {
      fail("the length of " + what + " at offset " + std::to_string(at_ - 8) + " is " +
           std::to_string(len) + " bytes, past the end of the file (" +
           std::to_string(size_ - at_) + " bytes left)");
    }
    std::string s(reinterpret_cast<const char*>(p_ + at_), static_cast<std::size_t>(len));
    at_ += len;
    return s;
  }

  static std::uint64_t min_bytes(std::uint32_t type) {
    switch (static_cast<GgufType>(type)) {
      case GgufType::kU8:
      case GgufType::kI8:
      case GgufType::kBool:
        return 1;
      case GgufType::kU16:
      case GgufType::kI16:
        return 2;
      case GgufType::kU32:
      case GgufType::kI32:
      case GgufType::kF32:
        return 4;
      case GgufType::kU64:
      case GgufType::kI64:
      case GgufType::kF64:
      case GgufType::kString:
        return 8;
      case GgufType::kArray:
        return 12;
    }
    return 1;
  }

  GgufValue value(std::uint32_t type, const std::string& what, int depth) {
    if (type > static_cast<std::uint32_t>(GgufType::kF64)) {
      fail("unknown value type " + std::to_string(type) + " for " + what + " at offset " +
           std::to_string(at_ - 4) + " (expected 0 to 12)");
    }
    GgufValue v;
    v.type = static_cast<GgufType>(type);
    switch (v.type) {
      case GgufType::kU8:
        v.i = read<std::uint8_t>(what);
        break;
      case GgufType::kI8:
        v.i = read<std::int8_t>(what);
        break;
      case GgufType::kU16:
        v.i = read<std::uint16_t>(what);
        break;
      case GgufType::kI16:
        v.i = read<std::int16_t>(what);
        break;
      case GgufType::kU32:
        v.i = read<std::uint32_t>(what);
        break;
      case GgufType::kI32:
        v.i = read<std::int32_t>(what);
        break;
      case GgufType::kI64:
        v.i = read<std::int64_t>(what);
        break;
      case GgufType::kU64:
        v.u = read<std::uint64_t>(what);
        v.i = v.u > static_cast<std::uint64_t>(INT64_MAX) ? INT64_MAX
                                                          : static_cast<std::int64_t>(v.u);
        break;
      case GgufType::kF32:
        v.f = read<float>(what);
        break;
      case GgufType::kF64:
        v.f = read<double>(what);
        break;
      case GgufType::kBool: {
        const auto b = read<std::uint8_t>(what);
        if (b > 1) fail(what + " is a bool but holds " + std::to_string(b) + " (expected 0 or 1)");
        v.i = b;
        break;
      }
      case GgufType::kString: {
        // Charged only when the bytes are there (else str() reports the bad length).
        const std::uint64_t len = peek_u64();
        if (len > 15 && size_ - at_ >= 8 && len <= size_ - at_ - 8) charge(len + 1, what);
        v.s = str(what);
        break;
      }
      case GgufType::kArray: {
        if (depth >= 4) fail(what + " nests arrays more than 4 deep");
        const std::uint32_t elem = u32("the element type of " + what);
        if (elem > static_cast<std::uint32_t>(GgufType::kF64)) {
          fail("unknown array element type " + std::to_string(elem) + " for " + what +
               " (expected 0 to 12)");
        }
        v.elem = static_cast<GgufType>(elem);
        const std::uint64_t count = u64("the element count of " + what);
        if (count > (size_ - at_) / min_bytes(elem)) {
          fail(what + " declares " + std::to_string(count) + " elements of type " +
               to_string(v.elem) + ", past the end of the file (" + std::to_string(size_ - at_) +
               " bytes left)");
        }
        const auto n = static_cast<std::size_t>(count);
        // The slots, charged and reserved before any element is read.
        const std::uint64_t slot = v.elem == GgufType::kString  ? sizeof(std::string)
                                   : v.elem == GgufType::kArray ? sizeof(GgufValue)
                                                                : 8;
        if (count > 0) charge(count * slot, what);
        if (v.elem == GgufType::kString) {
          v.strings.reserve(n);
        } else if (v.elem == GgufType::kArray) {
          v.items.reserve(n);
        } else if (v.elem == GgufType::kF32 || v.elem == GgufType::kF64) {
          v.floats.reserve(n);
        } else {
          v.ints.reserve(n);
        }
        // An element's description is written only when it is wrong: building "element k of
        // ..." for each of millions of elements took seconds.
        const std::string elem_what = "an element of " + what;
        for (std::size_t k = 0; k < n; ++k) {
          GgufValue e;
          try {
            e = value(elem, elem_what, depth + 1);
          } catch (const Error& err) {
            std::string msg = err.what();
            const std::size_t at = msg.find(elem_what);
            if (at != std::string::npos) {
              msg.replace(at, elem_what.size(), "element " + std::to_string(k) + " of " + what);
            }
            throw Error(err.code(), msg, err.path());
          }
          if (v.elem == GgufType::kString) {
            v.strings.push_back(std::move(e.s));
          } else if (v.elem == GgufType::kArray) {
            v.items.push_back(std::move(e));
          } else if (e.is_float()) {
            v.floats.push_back(e.f);
          } else {
            v.ints.push_back(e.i);
          }
        }
        break;
      }
    }
    return v;
  }

  // The next uint64 without consuming it (0 when fewer than 8 bytes are left: str() reports).
  std::uint64_t peek_u64() const {
    if (size_ - at_ < 8) return 0;
    std::uint64_t v;
    std::memcpy(&v, p_ + at_, 8);
    return v;
  }

  const std::uint8_t* p_;
  std::size_t size_;
  std::size_t at_ = 0;
  std::string name_;
  std::uint64_t held_ = 0;                       // bytes charged so far
  std::uint64_t limit_ = input_memory_limit();  // base/input_file.h
};

GgufFile::GgufFile(GgufFile&&) noexcept = default;
GgufFile& GgufFile::operator=(GgufFile&&) noexcept = default;
GgufFile::~GgufFile() = default;

GgufFile GgufFile::parse(const std::uint8_t* data, std::size_t size, const std::string& name) {
  return GgufParser(data, size, name).run();
}

GgufFile GgufFile::open(const std::string& path) {
  auto file = std::make_shared<MappedFile>(path);
  GgufFile g = parse(file->data(), file->size(), path);
  g.hold(std::move(file));
  return g;
}

const GgufValue* GgufFile::find(const std::string& key) const noexcept {
  const auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const GgufTensor* GgufFile::find_tensor(const std::string& name) const noexcept {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {
[[noreturn]] void missing(const std::string& path, const std::string& key, const char* what) {
  file_error(path, std::string("missing metadata key '") + text_excerpt(key, 80) +
                       "' (expected " + what + ")");
}
[[noreturn]] void wrong(const std::string& path, const std::string& key, const char* what,
                        const GgufValue& v) {
  file_error(path, "metadata key '" + text_excerpt(key, 80) + "' must be " + what + ", found " +
                       v.describe());
}
}  // namespace

std::string GgufFile::get_string(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) missing(path_, key, "a string");
  if (v->type != GgufType::kString) wrong(path_, key, "a string", *v);
  return v->s;
}

std::int64_t GgufFile::get_int(const std::string& key) const {
  if (!find(key)) missing(path_, key, "an integer");
  return get_int_or(key, 0);
}

std::int64_t GgufFile::get_int_or(const std::string& key, std::int64_t fallback) const {
  const GgufValue* v = find(key);
  if (!v) return fallback;
  if (!v->is_integer()) wrong(path_, key, "an integer", *v);
  if (v->type == GgufType::kU64 && v->u > static_cast<std::uint64_t>(INT64_MAX)) {
    wrong(path_, key, "an integer below 2^63", *v);
  }
  return v->i;
}

double GgufFile::get_float(const std::string& key) const {
  if (!find(key)) missing(path_, key, "a number");
  return get_float_or(key, 0.0);
}

double GgufFile::get_float_or(const std::string& key, double fallback) const {
  const GgufValue* v = find(key);
  if (!v) return fallback;
  if (v->is_float()) return v->f;
  if (v->is_integer()) return static_cast<double>(v->i);
  wrong(path_, key, "a number", *v);
}

bool GgufFile::get_bool_or(const std::string& key, bool fallback) const {
  const GgufValue* v = find(key);
  if (!v) return fallback;
  if (v->type != GgufType::kBool) wrong(path_, key, "a bool", *v);
  return v->i != 0;
}

const GgufValue& GgufFile::get_array(const std::string& key, const char* elem_kind) const {
  const GgufValue* v = find(key);
  const std::string what = std::string("an array of ") + elem_kind;
  if (!v) missing(path_, key, what.c_str());
  if (v->type != GgufType::kArray) wrong(path_, key, what.c_str(), *v);
  const std::string kind = elem_kind;
  GgufValue probe;
  probe.type = v->elem;
  const bool ok = v->array_size() == 0 || (kind == "string" && v->elem == GgufType::kString) ||
                  (kind == "integer" && probe.is_integer()) ||
                  (kind == "float" && probe.is_float());
  if (!ok) wrong(path_, key, what.c_str(), *v);
  return *v;
}

}  // namespace vq::engine
