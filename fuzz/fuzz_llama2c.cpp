// A llama2.c checkpoint (header and tensor sizes), loaded as a model.
#include "engine/model/model.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = vq::fuzz::write_file("model.bin", data, size);
  vq::fuzz::expect_clean([&] { (void)vq::engine::Model::load_llama2c(path); });
  return 0;
}
