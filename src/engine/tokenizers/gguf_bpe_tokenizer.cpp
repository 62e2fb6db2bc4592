// GGUF tokenizer model "gpt2": byte-level BPE, as llama.cpp encodes it.
//  - user-defined tokens (token type 4) are split out of the text first, longest first (the
//    text is otherwise taken literally: control-token text is not parsed);
//  - each remaining stretch is cut by the pre-tokenizer regex that tokenizer.ggml.pre names
//    (llama-bpe / llama3 / llama-v3, qwen2, gpt-2 / default; others are rejected), every piece
//    is mapped to GPT-2's byte-level alphabet, and BPE merges adjacent symbols (initially UTF-8
//    characters) by the lowest merge rank, leftmost on ties; with the Llama 3 pre-tokenizer a
//    piece that is itself a token is taken whole (llama.cpp's ignore_merges);
//  - a final symbol that is not a token becomes the tokens of its single bytes, when present;
//  - BOS is added when tokenizer.ggml.add_bos_token says so (and EOS by add_eos_token).
//  - decode maps the byte-level alphabet back to bytes; control tokens print nothing.
#include <algorithm>
#include <optional>
#include <unordered_map>

#include "engine/tokenizers/bpe_merge.h"
#include "engine/formats/gguf.h"
#include "engine/tokenizers/gguf_tokenizer.h"
#include "engine/formats/file_error.h"
#include "engine/tokenizers/pretokenize.h"

namespace vq::engine {
namespace {

class BpeTokenizer final : public Tokenizer {
 public:
  BpeTokenizer(const GgufFile& g, GgufVocab vocab) : v_(std::move(vocab)) {
    path_ = g.path();
    kind_ = "gguf-gpt2";
    vocab_size_ = static_cast<std::int64_t>(v_.tokens.size());
    bos_id_ = v_.add_bos ? v_.bos_id : -1;
    const std::string regex = pre_tokenizer_regex(v_.pre);
    if (regex.empty()) {
      file_error(path_, "metadata 'tokenizer.ggml.pre' is '" + v_.pre +
                            "'; supported pre-tokenizers: llama-bpe, llama3, llama-v3, qwen2, "
                            "gpt-2, default");
    }
    split_ = std::make_unique<RegexSplitter>(regex, path_);
    ignore_merges_ = v_.pre == "llama-bpe" || v_.pre == "llama3" || v_.pre == "llama-v3";
    for (std::size_t i = 0; i < v_.tokens.size(); ++i) {
      lookup_[v_.tokens[i]] = static_cast<std::int32_t>(i);
      if (!v_.types.empty() && v_.types[i] == 4) user_.push_back(static_cast<std::int32_t>(i));
    }
    std::stable_sort(user_.begin(), user_.end(), [&](std::int32_t a, std::int32_t b) {
      return v_.tokens[static_cast<std::size_t>(a)].size() >
             v_.tokens[static_cast<std::size_t>(b)].size();
    });
    for (std::size_t r = 0; r < v_.merges.size(); ++r) {
      const std::string& m = v_.merges[r];
      const std::size_t sp = m.find(' ', 1);
      if (sp == std::string::npos) {
        file_error(path_, "metadata 'tokenizer.ggml.merges' entry " + std::to_string(r) + " '" + m +
                              "' is not two pieces separated by a space");
      }
      ranks_.emplace(m.substr(0, sp) + '\x01' + m.substr(sp + 1), static_cast<std::int32_t>(r));
    }
  }

  std::vector<std::int32_t> encode(std::string_view text, bool add_special) const override {
    std::vector<std::int32_t> ids;
    if (add_special && v_.add_bos && v_.bos_id >= 0) ids.push_back(v_.bos_id);
    // Fragments: raw text (id -1) or a user-defined token.
    struct Frag {
      std::string_view text;
      std::int32_t id;
    };
    std::vector<Frag> frags{{text, -1}};
    for (const std::int32_t u : user_) {
      const std::string& pat = v_.tokens[static_cast<std::size_t>(u)];
      if (pat.empty()) continue;
      std::vector<Frag> next;
      for (const Frag& f : frags) {
        if (f.id >= 0) {
          next.push_back(f);
          continue;
        }
        std::size_t at = 0;
        for (std::size_t hit; (hit = f.text.find(pat, at)) != std::string_view::npos;
             at = hit + pat.size()) {
          if (hit > at) next.push_back({f.text.substr(at, hit - at), -1});
          next.push_back({{}, u});
        }
        if (at < f.text.size()) next.push_back({f.text.substr(at), -1});
      }
      frags = std::move(next);
    }
    for (const Frag& f : frags) {
      if (f.id >= 0) {
        ids.push_back(f.id);
      } else {
        for (const std::string_view word : split_->split(f.text)) bpe(byte_level_encode(word), ids);
      }
    }
    if (add_special && v_.add_eos && v_.eos_id >= 0) ids.push_back(v_.eos_id);
    return ids;
  }

  std::string piece(std::int32_t, std::int32_t token) const override { return text_of(token); }

  std::string decode(const std::vector<std::int32_t>& ids) const override {
    std::string out;
    for (const std::int32_t id : ids) out += text_of(id);
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
    if (type == 3 || type == 5) return "";  // control, unused
    if (type == 4) return v_.tokens[i];     // user-defined: the text itself
    return byte_level_decode(v_.tokens[i]);
  }

  std::int32_t rank(std::string_view a, std::string_view b) const {
    std::string key;
    key.reserve(a.size() + b.size() + 1);
    key.append(a).push_back('\x01');
    key.append(b);
    const auto it = ranks_.find(key);
    return it == ranks_.end() ? -1 : it->second;
  }

  void bpe(const std::string& word, std::vector<std::int32_t>& ids) const {
    if (word.empty()) return;
    if (ignore_merges_) {
      const auto it = lookup_.find(word);
      if (it != lookup_.end()) {
        ids.push_back(it->second);
        return;
      }
    }
    // Merge priority: the lower merge rank first (as a larger negated rank).
    const std::string_view w(word);
    const std::vector<BpeSymbol> syms = bpe_merge<std::int64_t>(
        w, [&](std::string_view a, std::string_view b) -> std::optional<std::int64_t> {
          const std::int32_t r = rank(a, b);
          if (r < 0) return std::nullopt;
          return -static_cast<std::int64_t>(r);
        });
    for (const BpeSymbol& s : syms) {
      const auto it = lookup_.find(w.substr(s.start, s.len));
      if (it != lookup_.end()) {
        ids.push_back(it->second);
        continue;
      }
      for (std::size_t k = 0; k < s.len; ++k) {
        const auto b = lookup_.find(w.substr(s.start + k, 1));
        if (b != lookup_.end()) ids.push_back(b->second);
      }
    }
  }

  GgufVocab v_;
  std::unique_ptr<RegexSplitter> split_;
  bool ignore_merges_ = false;
  std::unordered_map<std::string_view, std::int32_t> lookup_;
  std::unordered_map<std::string, std::int32_t> ranks_;
  std::vector<std::int32_t> user_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_gguf_bpe_tokenizer(const GgufFile& g, GgufVocab vocab) {
  if (vocab.merges.empty()) {
    file_error(g.path(), "tokenizer model 'gpt2' needs metadata 'tokenizer.ggml.merges'");
  }
  return std::make_unique<BpeTokenizer>(g, std::move(vocab));
}

}  // namespace vq::engine
