#include "engine/formats/safetensors_set.h"

#include <sys/stat.h>

#include <cerrno>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "engine/formats/file_error.h"
#include "engine/formats/json_limits.h"

namespace vq::engine {
namespace {

// A shard name as written, quoted and escaped for a message.
std::string quoted(const std::string& name) { return "\"" + text_excerpt(name, 120) + "\""; }

// A file name directly in the index's directory: no separator, not "." or "..", no control
// bytes (a NUL would end the name the operating system sees).
bool plain_file_name(const std::string& name) {
  if (name.empty() || name == "." || name == "..") return false;
  for (const char ch : name) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '/' || c == '\\' || c < 0x20 || c == 0x7f) return false;
  }
  return true;
}

}  // namespace

std::vector<std::string> SafetensorsIndex::shards() const {
  std::set<std::string> names;
  for (const auto& [tensor, shard] : weight_map) names.insert(shard);
  return {names.begin(), names.end()};
}

SafetensorsIndex read_safetensors_index(const std::string& path) {
  const nlohmann::json j = parse_json_limited(read_text_file(path), path, "safetensors index");
  if (!j.is_object()) {
    file_error(path,
               "safetensors index must be a JSON object, found " + std::string(j.type_name()));
  }
  if (!j.contains("weight_map")) {
    file_error(path, "safetensors index has no 'weight_map' object (tensor name -> shard file)");
  }
  const nlohmann::json& wm = j["weight_map"];
  if (!wm.is_object()) {
    file_error(path, "'weight_map' must be an object (tensor name -> shard file), found " +
                         json_excerpt(wm));
  }
  if (wm.empty()) file_error(path, "'weight_map' is empty: the index names no tensor");
  SafetensorsIndex index;
  index.path = path;
  for (const auto& [tensor, shard] : wm.items()) {
    if (!shard.is_string()) {
      file_error(path, "'weight_map' entry '" + tensor +
                           "' must be a string (a shard file name), found " + json_excerpt(shard));
    }
    const std::string& name = shard.get_ref<const std::string&>();
    if (!plain_file_name(name)) {
      file_error(path, "'weight_map' entry '" + tensor + "' names shard " + quoted(name) +
                           "; expected a file name in the index's directory (a path that "
                           "leaves it, is absolute or enters a subdirectory is refused)");
    }
    index.weight_map[tensor] = name;
  }
  return index;
}

SafetensorsSet SafetensorsSet::single(const std::string& path) {
  SafetensorsSet s;
  s.path_ = path;
  s.files_.push_back(std::make_unique<SafetensorsFile>(path));
  for (const SafeTensor& t : s.files_[0]->tensors()) s.where_[t.name] = 0;
  return s;
}

SafetensorsSet SafetensorsSet::sharded(const SafetensorsIndex& index) {
  namespace fs = std::filesystem;
  SafetensorsSet s;
  s.path_ = index.path;
  s.sharded_ = true;
  const fs::path parent = fs::path(index.path).parent_path();
  const fs::path dir = parent.empty() ? fs::path(".") : parent;
  const std::vector<std::string> shards = index.shards();
  const std::string by_index = "the index '" + index.path + "'";
  for (const std::string& name : shards) {
    const std::string p = (dir / name).string();
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0 && errno == ENOENT) {
      std::size_t n = 0;
      std::string example;
      for (const auto& [tensor, shard] : index.weight_map) {
        if (shard != name) continue;
        if (n++ == 0) example = tensor;
      }
      file_error(p, "shard file not found; " + by_index + " maps " + std::to_string(n) +
                        " tensor(s) to it (e.g. '" + example + "')");
    }
    s.files_.push_back(std::make_unique<SafetensorsFile>(p));
  }
  // A tensor stored twice is ambiguous whatever the index says: reported first.
  for (std::size_t i = 0; i < s.files_.size(); ++i) {
    for (const SafeTensor& t : s.files_[i]->tensors()) {
      const auto [it, fresh] = s.where_.emplace(t.name, i);
      if (!fresh) {
        file_error(s.files_[i]->path(),
                   "holds tensor '" + t.name + "', which shard '" + s.files_[it->second]->path() +
                       "' holds too (ambiguous: a tensor must be stored once)");
      }
    }
  }
  for (const auto& [tensor, i] : s.where_) {
    const auto it = index.weight_map.find(tensor);
    if (it == index.weight_map.end()) {
      file_error(s.files_[i]->path(), "holds tensor '" + tensor + "', which " + by_index +
                                          " does not list (ambiguous: the index must map every "
                                          "tensor to its shard)");
    }
    if (it->second != shards[i]) {
      file_error(s.files_[i]->path(), "holds tensor '" + tensor + "', which " + by_index +
                                          " maps to " + quoted(it->second) + " (ambiguous)");
    }
  }
  for (const auto& [tensor, shard] : index.weight_map) {
    if (s.where_.count(tensor) == 0) {
      file_error((dir / shard).string(),
                 "has no tensor '" + tensor + "', which " + by_index + " maps to this shard");
    }
  }
  return s;
}

const SafeTensor* SafetensorsSet::find(const std::string& name) const {
  const auto it = where_.find(name);
  return it == where_.end() ? nullptr : files_[it->second]->find(name);
}

std::vector<std::string> SafetensorsSet::tensor_names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& [name, i] : where_) out.push_back(name);
  return out;
}

const SafetensorsFile& SafetensorsSet::file_of(const SafeTensor& t) const {
  return *files_[where_.at(t.name)];
}

const std::string* SafetensorsSet::metadata(const std::string& key) const {
  const std::string* value = nullptr;
  const SafetensorsFile* from = nullptr;
  for (const auto& f : files_) {
    const auto it = f->metadata().find(key);
    if (it == f->metadata().end()) continue;
    if (value != nullptr && *value != it->second) {
      file_error(f->path(), "__metadata__ '" + key + "' is " + quoted(it->second) +
                                ", but shard '" + from->path() + "' gives " + quoted(*value));
    }
    value = &it->second;
    from = f.get();
  }
  return value;
}

std::vector<std::unique_ptr<MappedFile>> SafetensorsSet::release() {
  std::vector<std::unique_ptr<MappedFile>> out;
  for (auto& f : files_) out.push_back(f->release());
  files_.clear();
  where_.clear();
  return out;
}

}  // namespace vq::engine
