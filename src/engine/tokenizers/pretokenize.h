// Pre-tokenization pieces shared by the byte-level BPE tokenizers (GGUF "gpt2" vocabularies and
// Hugging Face tokenizer.json with a ByteLevel pre-tokenizer): Unicode-aware regex splitting
// (PCRE2 with Unicode properties, lookahead, invalid UTF-8 tolerated) and GPT-2's byte <->
// printable-character mapping.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace vq::engine {

class RegexSplitter {
 public:
  // Compiles `pattern` (PCRE2 syntax, UTF + Unicode properties). Throws Error(kFileError)
  // naming `source` (the file the pattern came from) when it does not compile.
  RegexSplitter(const std::string& pattern, const std::string& source);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  // `text` cut into the regex's successive leftmost matches and the (non-empty) stretches
  // between them, in order ("Isolated" splitting: every byte lands in exactly one piece).
  std::vector<std::string_view> split(std::string_view text) const;
  const std::string& pattern() const noexcept { return pattern_; }

 private:
  std::string pattern_;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The pre-tokenizer regex llama.cpp uses for tokenizer.ggml.pre `name` ("llama-bpe", "llama3",
// "llama-v3", "qwen2", "gpt-2", "default"); "" when unknown.
std::string pre_tokenizer_regex(const std::string& name);
// The Llama 3 and Qwen2 regexes as their tokenizer.json files spell them.
extern const char* const kLlama3SplitRegex;
extern const char* const kQwen2SplitRegex;

// GPT-2's byte-level alphabet: each byte becomes one printable character (bytes 33-126,
// 161-172 and 174-255 map to themselves, the others to U+0100 onwards in order).
std::string byte_level_encode(std::string_view bytes);
// The inverse; a character outside the alphabet is copied as its UTF-8 bytes.
std::string byte_level_decode(std::string_view text);

}  // namespace vq::engine
