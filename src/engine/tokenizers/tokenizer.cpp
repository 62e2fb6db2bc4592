#include "engine/tokenizers/tokenizer.h"

#include <algorithm>
#include <filesystem>

#include "engine/tokenizers/gguf_tokenizer.h"
#include "engine/model/model.h"
#include "engine/formats/file_error.h"

namespace vq::engine {
namespace fs = std::filesystem;

std::string default_tokenizer_path(const Model& model) {
  const ModelConfig& c = model.config();
  const fs::path dir(model.directory());
  std::vector<fs::path> candidates;
  if (c.format == "gguf") return model.path();  // the vocabulary is in the model file
  if (c.format == "hf") {
    candidates = {dir / "tokenizer.json"};
  } else {
    candidates = {dir / ("tok" + std::to_string(c.vocab_size) + ".bin"), dir / "tokenizer.bin"};
  }
  std::string tried;
  for (const fs::path& p : candidates) {
    if (fs::is_regular_file(p)) return p.string();
    tried += (tried.empty() ? "" : ", ") + p.string();
  }
  file_error(model.path(),
             "no tokenizer found next to the model (looked for " + tried + "); pass --tokenizer");
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path_in, const Model& model) {
  const std::string path = path_in.empty() ? default_tokenizer_path(model) : path_in;
  const bool json = path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0;
  const bool gguf = path.size() >= 5 && path.compare(path.size() - 5, 5, ".gguf") == 0;
  std::unique_ptr<Tokenizer> t =
      json   ? load_hf_tokenizer(path)
      : gguf || path == model.path() ? load_gguf_tokenizer(path)
             : load_llama2c_tokenizer(path, model.config().vocab_size);
  if (t->vocab_size() > model.config().vocab_size) {
    file_error(path, "has ids up to " + std::to_string(t->vocab_size() - 1) +
                         ", but the model's vocab_size is " +
                         std::to_string(model.config().vocab_size) +
                         " (a tokenizer for another model?)");
  }
  return t;
}

std::vector<std::int32_t> encode_first(const Tokenizer& tokenizer, std::string_view text,
                                       std::int64_t n, bool add_special) {
  const auto want = static_cast<std::size_t>(n < 0 ? 0 : n);
  std::size_t len = std::min(text.size(), std::max<std::size_t>(4096, 16 * want));
  std::vector<std::int32_t> prev = tokenizer.encode(text.substr(0, len), add_special);
  while (len < text.size()) {
    len = std::min(text.size(), 2 * len);
    std::vector<std::int32_t> cur = tokenizer.encode(text.substr(0, len), add_special);
    const bool settled =
        prev.size() > want && cur.size() > want &&
        std::equal(prev.begin(), prev.begin() + static_cast<std::ptrdiff_t>(want), cur.begin());
    prev = std::move(cur);
    if (settled) break;
  }
  if (prev.size() > want) prev.resize(want);
  return prev;
}

}  // namespace vq::engine
