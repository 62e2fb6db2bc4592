// A sharded checkpoint's model.safetensors.index.json (issue 33): the index reader, then the
// shard set it names, over two small shards in the scratch directory (tensors "a" and "b").
// Every rejection must be a vq::Error; an accepted set must hold exactly the index's tensors.
#include <cstdlib>
#include <string>

#include "engine/formats/safetensors_set.h"
#include "fuzz_util.h"

namespace {

// A safetensors file holding one F32 tensor `name` of shape [2].
std::string one_tensor(const std::string& name) {
  std::string header = "{\"" + name + "\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
  while (header.size() % 8 != 0) header += ' ';
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + std::string(8, '\0');
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const bool shards = [] {
    vq::fuzz::write_file("model-00001-of-00002.safetensors", one_tensor("a"));
    vq::fuzz::write_file("model-00002-of-00002.safetensors", one_tensor("b"));
    return true;
  }();
  (void)shards;
  const std::string path = vq::fuzz::write_file("model.safetensors.index.json", data, size);
  vq::fuzz::expect_clean([&] {
    const vq::engine::SafetensorsIndex index = vq::engine::read_safetensors_index(path);
    const vq::engine::SafetensorsSet set = vq::engine::SafetensorsSet::sharded(index);
    // Accepted: the set and the index agree tensor for tensor.
    if (set.tensor_names().size() != index.weight_map.size()) std::abort();
    for (const auto& [tensor, shard] : index.weight_map) {
      const vq::engine::SafeTensor* t = set.find(tensor);
      if (t == nullptr || set.file_of(*t).path().find(shard) == std::string::npos) std::abort();
    }
  });
  return 0;
}
