// A Hugging Face config.json, loaded beside an empty model.safetensors: every config check runs
// before the weights are read.
#include "engine/model/model.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string weights = [] {
    std::string st(8, '\0');
    st[0] = 2;  // header length 2: "{}"
    return vq::fuzz::write_file("model.safetensors", st + "{}");
  }();
  vq::fuzz::write_file("config.json", data, size);
  vq::fuzz::expect_clean([&] { (void)vq::engine::Model::load_hf(vq::fuzz::scratch_dir()); });
  return 0;
}
