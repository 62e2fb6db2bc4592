// Tokenizers: llama2.c's tokenizer.bin (SentencePiece BPE by score, as run.c encodes) and
// Hugging Face tokenizer.json (BPE by merge rank, as the `tokenizers` library encodes).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace vq::engine {

struct ModelConfig;
class Model;

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Token ids of `text`; with `add_special` the format's special tokens are added (llama2.c:
  // BOS first, as run.c encode(text, bos=1, eos=0); tokenizer.json: its post-processor template).
  virtual std::vector<std::int32_t> encode(std::string_view text,
                                           bool add_special = true) const = 0;
  // Token ids of `text` read as plain text, no BOS/EOS: the text of a special (control) token,
  // e.g. "<|im_end|>" typed by a user, is encoded as ordinary characters, never as that token
  // (llama.cpp's parse_special = false); added tokens that are not special still match. This
  // default is encode(text, false), right for the formats that never parse control-token text
  // (llama2.c, GGUF); tokenizer.json overrides it.
  virtual std::vector<std::int32_t> encode_plain(std::string_view text) const {
    return encode(text, false);
  }
  // The bytes generation prints for `token` when it follows `prev` (streaming).
  virtual std::string piece(std::int32_t prev, std::int32_t token) const = 0;
  // The text of a whole id sequence (special tokens are skipped).
  virtual std::string decode(const std::vector<std::int32_t>& ids) const = 0;
  // The raw vocabulary entry of `id` (for diagnostics); "" when out of range.
  virtual std::string token_text(std::int32_t id) const = 0;

  // One past the largest id the tokenizer can produce.
  std::int64_t vocab_size() const noexcept { return vocab_size_; }
  std::int32_t bos_id() const noexcept { return bos_id_; }  // -1 when there is none
  const std::string& path() const noexcept { return path_; }
  const std::string& kind() const noexcept { return kind_; }  // "llama2c" or "hf"

 protected:
  std::int64_t vocab_size_ = 0;
  std::int32_t bos_id_ = -1;
  std::string path_, kind_;
};

// llama2.c tokenizer.bin: int32 max_token_length, then `vocab_size` entries of {float32 score,
// int32 length, bytes}. The vocabulary size is not in the file; it comes from the model.
std::unique_ptr<Tokenizer> load_llama2c_tokenizer(const std::string& path, std::int64_t vocab_size);
// Hugging Face tokenizer.json with a BPE model (see hf_tokenizer.cpp for what is supported).
std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path);

// Loads `path` (a tokenizer.json is read as HF, a *.gguf file's metadata as GGUF, anything
// else as llama2.c) and checks that it
// fits `model` (every id it can produce is below the model's vocab_size). An empty path picks
// the default next to the model: the model file itself for GGUF; tokenizer.json for HF; tok<vocab>.bin or
// tokenizer.bin for llama2.c ones. Throws Error(kFileError) naming the path.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path, const Model& model);
// The path load_tokenizer("") would use; throws Error(kFileError) when none exists.
std::string default_tokenizer_path(const Model& model);

// The first `n` tokens of encode(text) (fewer when the whole text has fewer), without encoding
// a long text whole: prefixes of 16 bytes per wanted token (at least 4 KiB) are encoded, doubling,
// until two successive prefixes agree on their first n tokens (a merge near the cut can only
// change tokens near the cut). Encoding whole files costs seconds for large texts.
std::vector<std::int32_t> encode_first(const Tokenizer& tokenizer, std::string_view text,
                                       std::int64_t n, bool add_special = true);

}  // namespace vq::engine
