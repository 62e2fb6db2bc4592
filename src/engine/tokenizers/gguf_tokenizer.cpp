// Tokenizers stored in GGUF metadata (tokenizer.ggml.*), with llama.cpp's semantics.
//
// Model "llama" (SentencePiece BPE with scores), as llama.cpp's SPM tokenizer encodes:
//  - optional BOS (tokenizer.ggml.add_bos_token, default true); a " " prefix when the text is
//    non-empty (tokenizer.ggml.add_space_prefix, default true); every ' ' becomes U+2581;
//  - one symbol per UTF-8 character; repeatedly merge the adjacent pair whose concatenation is
//    a token with the highest score (leftmost on ties); a final symbol that is not a token is
//    written as its bytes' "<0xNN>" tokens (or, when the vocabulary lacks them, as one unknown
//    token: llama.cpp aborts there);
//  - the text is taken literally (special-token text is not parsed).
//  - decode: U+2581 becomes ' ', "<0xNN>" is the byte, control tokens print nothing; the space
//    prefix is dropped after BOS.
// Where several ids share a text, the last id wins, as in llama.cpp's vocabulary map.
// Model "gpt2" (byte-level BPE): see gguf_bpe_tokenizer.cpp.
#include "engine/tokenizers/gguf_tokenizer.h"

#include <cmath>
#include <optional>
#include <unordered_map>

#include "engine/tokenizers/bpe_merge.h"
#include "engine/formats/gguf.h"
#include "engine/formats/file_error.h"

namespace vq::engine {
namespace {

const std::string kSpace = "\xE2\x96\x81";  // U+2581

class SpmTokenizer final : public Tokenizer {
 public:
  SpmTokenizer(const GgufFile& g, GgufVocab vocab) : v_(std::move(vocab)) {
    path_ = g.path();
    kind_ = "gguf-llama";
    vocab_size_ = static_cast<std::int64_t>(v_.tokens.size());
    bos_id_ = v_.add_bos ? v_.bos_id : -1;
    add_space_prefix_ = g.get_bool_or("tokenizer.ggml.add_space_prefix", true);
    for (std::size_t i = 0; i < v_.tokens.size(); ++i) {
      lookup_[v_.tokens[i]] = static_cast<std::int32_t>(i);
    }
    for (int b = 0; b < 256; ++b) {
      static const char* hex = "0123456789ABCDEF";
      const auto it = lookup_.find(std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">");
      byte_ids_[static_cast<std::size_t>(b)] = it == lookup_.end() ? -1 : it->second;
    }
  }

  std::vector<std::int32_t> encode(std::string_view text_in, bool add_special) const override {
    std::vector<std::int32_t> ids;
    if (add_special && v_.add_bos && v_.bos_id >= 0) ids.push_back(v_.bos_id);
    if (text_in.empty()) return ids;
    std::string text;
    text.reserve(text_in.size() + 8);
    if (add_space_prefix_) text += kSpace;
    for (const char c : text_in) {
      if (c == ' ') {
        text += kSpace;
      } else {
        text += c;
      }
    }
    // Merge priority: the score of the token the two symbols' concatenation is (adjacent
    // views of one string, so the concatenation is a view too).
    const std::vector<BpeSymbol> syms =
        bpe_merge<float>(text, [&](std::string_view a, std::string_view b) -> std::optional<float> {
          const auto it = lookup_.find(std::string_view(a.data(), a.size() + b.size()));
          if (it == lookup_.end()) return std::nullopt;
          return v_.scores[static_cast<std::size_t>(it->second)];
        });
    for (const BpeSymbol& s : syms) {
      const auto it = lookup_.find(std::string_view(text).substr(s.start, s.len));
      if (it != lookup_.end()) {
        ids.push_back(it->second);
        continue;
      }
      bool bytes = true;
      for (std::size_t k = 0; k < s.len; ++k) {
        bytes = bytes && byte_ids_[static_cast<unsigned char>(text[s.start + k])] >= 0;
      }
      if (bytes) {
        for (std::size_t k = 0; k < s.len; ++k) {
          ids.push_back(byte_ids_[static_cast<unsigned char>(text[s.start + k])]);
        }
      } else if (v_.unk_id >= 0) {
        ids.push_back(v_.unk_id);  // one per character (llama.cpp itself aborts here)
      } else {
        file_error(path_, "cannot encode '" + text.substr(s.start, s.len) +
                              "': it is not a token, the vocabulary has no '<0xNN>' byte tokens "
                              "for it and no unknown token");
      }
    }
    return ids;
  }

  std::string piece(std::int32_t prev, std::int32_t token) const override {
    std::string p = text_of(token);
    if (prev == v_.bos_id && add_space_prefix_ && !p.empty() && p[0] == ' ') p.erase(0, 1);
    return p;
  }

  std::string decode(const std::vector<std::int32_t>& ids) const override {
    std::string out;
    bool first = true;
    for (const std::int32_t id : ids) {
      std::string p = text_of(id);
      if (first && add_space_prefix_ && !p.empty() && p[0] == ' ') p.erase(0, 1);
      if (!p.empty()) first = false;
      out += p;
    }
    return out;
  }

  std::string token_text(std::int32_t id) const override {
    return id >= 0 && id < vocab_size_ ? v_.tokens[static_cast<std::size_t>(id)] : "";
  }

 private:
  std::string text_of(std::int32_t id) const {
    if (id < 0 || id >= vocab_size_) return "";
    const auto i = static_cast<std::size_t>(id);
    const std::int32_t type = v_.types.empty() ? 1 : v_.types[i];
    const std::string& t = v_.tokens[i];
    if (type == 3 || type == 5) return "";  // control, unused
    if (type == 6 && t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') {
      auto hex = [](char c) {
        return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      };
      const int hi = hex(t[3]), lo = hex(t[4]);
      if (hi >= 0 && lo >= 0) return std::string(1, static_cast<char>(hi * 16 + lo));
    }
    std::string out;
    for (std::size_t k = 0; k < t.size();) {
      if (t.compare(k, 3, kSpace) == 0) {
        out += ' ';
        k += 3;
      } else {
        out += t[k++];
      }
    }
    return out;
  }

  GgufVocab v_;
  bool add_space_prefix_ = true;
  std::unordered_map<std::string_view, std::int32_t> lookup_;
  std::int32_t byte_ids_[256];
};

}  // namespace

GgufVocab read_gguf_vocab(const GgufFile& g) {
  GgufVocab v;
  v.model = g.get_string("tokenizer.ggml.model");
  v.tokens = g.get_array("tokenizer.ggml.tokens", "string").strings;
  const std::size_t n = v.tokens.size();
  if (n == 0) file_error(g.path(), "metadata 'tokenizer.ggml.tokens' is empty");
  if (g.find("tokenizer.ggml.scores")) {
    const GgufValue& s = g.get_array("tokenizer.ggml.scores", "float");
    if (s.floats.size() != n) {
      file_error(g.path(), "metadata 'tokenizer.ggml.scores' has " +
                               std::to_string(s.floats.size()) + " entries, expected " +
                               std::to_string(n) + " (one per token)");
    }
    v.scores.assign(s.floats.begin(), s.floats.end());
    // Merge priorities compare scores: a NaN (or infinite) score makes the order undefined.
    // (tokenizer.bin and convert refuse the same.)
    for (std::size_t i = 0; i < v.scores.size(); ++i) {
      if (!std::isfinite(v.scores[i])) {
        file_error(g.path(), "metadata 'tokenizer.ggml.scores' entry " + std::to_string(i) +
                                 " is " + (std::isnan(v.scores[i]) ? "nan" : "infinite") +
                                 "; scores must be finite");
      }
    }
  }
  if (g.find("tokenizer.ggml.token_type")) {
    const GgufValue& t = g.get_array("tokenizer.ggml.token_type", "integer");
    if (t.ints.size() != n) {
      file_error(g.path(), "metadata 'tokenizer.ggml.token_type' has " +
                               std::to_string(t.ints.size()) + " entries, expected " +
                               std::to_string(n) + " (one per token)");
    }
    v.types.assign(t.ints.begin(), t.ints.end());
  }
  if (g.find("tokenizer.ggml.merges")) {
    v.merges = g.get_array("tokenizer.ggml.merges", "string").strings;
  }
  auto id = [&](const char* key, std::int64_t fallback) {
    const std::int64_t x = g.get_int_or(key, fallback);
    if (x < -1 || x >= static_cast<std::int64_t>(n)) {
      file_error(g.path(), std::string("metadata '") + key + "' = " + std::to_string(x) +
                               " is outside the vocabulary [0, " + std::to_string(n) + ")");
    }
    return static_cast<std::int32_t>(x);
  };
  const bool spm = v.model == "llama";
  v.bos_id = id("tokenizer.ggml.bos_token_id", spm ? 1 : -1);
  v.eos_id = id("tokenizer.ggml.eos_token_id", spm ? 2 : -1);
  v.unk_id = id("tokenizer.ggml.unknown_token_id", spm ? 0 : -1);
  v.add_bos = g.get_bool_or("tokenizer.ggml.add_bos_token", spm) && v.bos_id >= 0;
  v.add_eos = g.get_bool_or("tokenizer.ggml.add_eos_token", false);
  v.pre = g.find("tokenizer.ggml.pre") ? g.get_string("tokenizer.ggml.pre") : "default";
  return v;
}

std::unique_ptr<Tokenizer> load_gguf_tokenizer(const GgufFile& g) {
  GgufVocab v = read_gguf_vocab(g);
  if (v.model == "llama") {
    if (v.scores.empty()) {
      file_error(g.path(), "tokenizer model 'llama' needs metadata 'tokenizer.ggml.scores'");
    }
    return std::make_unique<SpmTokenizer>(g, std::move(v));
  }
  if (v.model == "gpt2") return make_gguf_bpe_tokenizer(g, std::move(v));
  file_error(g.path(), "metadata 'tokenizer.ggml.model' is '" + v.model +
                           "'; supported: 'llama' (SentencePiece) and 'gpt2' (byte-level BPE)");
}

std::unique_ptr<Tokenizer> load_gguf_tokenizer(const std::string& path) {
  return load_gguf_tokenizer(GgufFile::open(path));
}

}  // namespace vq::engine
