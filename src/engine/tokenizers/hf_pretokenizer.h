// Hugging Face tokenizer.json pre-tokenizers and the decoders that undo them, for the BPE
// tokenizer in hf_tokenizer.cpp:
//  - Metaspace {replacement, prepend_scheme always|first|never (or legacy add_prefix_space),
//    split}: spaces become the replacement; it is prepended (always; or, with "first", to the
//    input's first segment only); with split, pieces start at each replacement character;
//  - ByteLevel {add_prefix_space, use_regex}: a space is prepended when missing (with
//    add_prefix_space), the GPT-2 regex cuts the text (with use_regex), and every piece is
//    mapped to GPT-2's byte-level alphabet;
//  - Split {pattern Regex or String, behavior Isolated, invert false}: the regex's matches and
//    the text between them (the Llama 3 and Qwen2 tokenizers use this);
//  - Sequence of those. Anything else is an error naming the component.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/tokenizers/pretokenize.h"

namespace vq::engine {

class HfPreTokenizer {
 public:
  // Throws Error(kFileError) naming `path` and the unsupported component or field.
  HfPreTokenizer(const nlohmann::json& j, const std::string& path);

  // Pieces of one normalized segment; `first`: the segment starts the input text.
  std::vector<std::string> run(const std::string& text, bool first) const;
  bool byte_level() const noexcept { return byte_level_; }
  // Metaspace's replacement and whether it prepends (for the Metaspace decoder).
  const std::string& metaspace() const noexcept { return replacement_; }

 private:
  enum class Kind { kMetaspace, kByteLevel, kSplit };
  struct Step {
    Kind kind;
    std::string replacement;               // Metaspace
    std::string prepend = "always";        // Metaspace prepend_scheme
    bool split = true;                     // Metaspace
    bool add_prefix_space = false;         // ByteLevel
    bool use_regex = true;                 // ByteLevel
    std::shared_ptr<RegexSplitter> regex;  // Split, ByteLevel
  };
  void add(const nlohmann::json& j);
  std::string path_;
  std::vector<Step> steps_;
  bool byte_level_ = false;
  std::string replacement_;
};

// Unicode normalization form "NFC", "NFD", "NFKC" or "NFKD" of UTF-8 `text` (ICU). Invalid
// UTF-8 is replaced by U+FFFD first, as the tokenizers library rejects it.
std::string unicode_normalize(const std::string& text, const std::string& form);

}  // namespace vq::engine
