// Hugging Face tokenizer.json, BPE model, reproducing the `tokenizers` library:
//  - added tokens: split out first those matched on the raw text (normalized=false), then,
//    after normalizing each remaining piece, those matched on the normalized text (their
//    patterns are normalized too, so with a Prepend normalizer "<|x|>" matches as "▁<|x|>").
//    Leftmost-longest matching; lstrip / rstrip / single_word honoured (whitespace and word
//    characters judged on ASCII).
//  - normalizer: null, Prepend, Replace (string patterns), NFC / NFD / NFKC / NFKD (ICU), or a
//    Sequence of those.
//  - pre_tokenizer: null (the whole normalized piece is one BPE word), or Metaspace, ByteLevel,
//    Split (Isolated regex, e.g. Llama 3's and Qwen2's) and Sequences of them
//    (hf_pretokenizer.cpp).
//  - model BPE: one symbol per character (vocab lookup), else byte_fallback "<0xNN>" pieces,
//    else unk (fused when fuse_unk); merges applied by rank, leftmost first, with the
//    library's min-heap and its stale-entry rule; ignore_merges honoured; dropout must be off.
//  - post_processor: TemplateProcessing (its "single" template: special ids before / after
//    the text), ByteLevel (no ids), or a Sequence of those; null adds nothing.
//  - decoder: Replace, ByteFallback, Fuse, Strip, ByteLevel, Metaspace, or a Sequence of
//    those; null joins tokens with spaces, as the library does. Special tokens are skipped when
//    decoding.
// Input text that is not valid UTF-8 (the library rejects it) is read byte by byte.
#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_map>

#include "engine/tokenizers/hf_pretokenizer.h"
#include "engine/formats/json_limits.h"
#include "engine/formats/mapped_file.h"
#include "engine/formats/file_error.h"
#include "engine/tokenizers/tokenizer.h"

namespace vq::engine {
namespace {
using nlohmann::json;

// Byte length of the UTF-8 character starting at s[i]; 1 for an invalid byte.
std::size_t utf8_len(std::string_view s, std::size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  std::size_t n = c < 0x80           ? 1
                  : (c >> 5) == 0x6  ? 2
                  : (c >> 4) == 0xE  ? 3
                  : (c >> 3) == 0x1E ? 4
                                     : 0;
  if (n == 0 || i + n > s.size()) return 1;
  for (std::size_t k = 1; k < n; ++k) {
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 1;
  }
  return n;
}

bool valid_utf8(const std::string& s) {
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = utf8_len(s, i);
    if (n == 1 && static_cast<unsigned char>(s[i]) >= 0x80) return false;
    i += n;
  }
  return true;
}

bool ascii_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }
bool word_char(unsigned char c) {
  return c >= 0x80 || c == '_' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
         (c >= 'A' && c <= 'Z');
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  std::string out;
  std::size_t at = 0;
  for (std::size_t hit; (hit = s.find(from, at)) != std::string::npos; at = hit + from.size()) {
    out.append(s, at, hit - at);
    out += to;
  }
  out.append(s, at, std::string::npos);
  s = std::move(out);
}

class HfTokenizer final : public Tokenizer {
 public:
  explicit HfTokenizer(const std::string& path) {
    path_ = path;
    kind_ = "hf";
    const std::string text = read_text_file(path);
    json j = parse_json_limited(text, path, "tokenizer.json");
    try {
      if (!j.is_object()) bad("must be a JSON object, found " + std::string(j.type_name()));
      load_model(field(j, "model", json::value_t::object, "the BPE model"));
      load_added(j.value("added_tokens", json::array()));
      for (std::int32_t& id : byte_ids_) id = -1;
      for (int b = 0; b < 256; ++b) {
        static const char* hexd = "0123456789ABCDEF";
        const std::string name = std::string("<0x") + hexd[b >> 4] + hexd[b & 15] + ">";
        const auto it = vocab_.find(name);
        if (it != vocab_.end()) byte_ids_[static_cast<std::size_t>(b)] = it->second;
      }
      if (j.contains("normalizer")) load_normalizer(j["normalizer"]);
      pre_ = std::make_unique<HfPreTokenizer>(
          j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json(nullptr), path_);
      if (j.contains("post_processor")) load_post_processor(j["post_processor"]);
      if (j.contains("decoder")) load_decoder(j["decoder"]);
      // Added-token patterns are matched against raw or normalized text.
      for (Added& a : added_) {
        a.pattern = a.normalized ? normalize(a.content) : a.content;
      }
    } catch (const json::exception& e) {
      // A value of the wrong JSON type somewhere the checks above do not look.
      bad(std::string("malformed tokenizer.json: ") + e.what());
    }
    bos_id_ = prefix_.empty() ? -1 : prefix_.front();
  }

  std::vector<std::int32_t> encode(std::string_view text, bool add_special) const override {
    return encode_with(text, add_special, true);
  }

  std::vector<std::int32_t> encode_plain(std::string_view text) const override {
    return encode_with(text, false, false);
  }

  // `match_special`: whether added tokens marked special are split out of the text (the
  // library's behaviour) or left to be encoded as characters (encode_plain).
  std::vector<std::int32_t> encode_with(std::string_view text, bool add_special,
                                        bool match_special) const {
    struct Seg {
      std::string text;
      std::int32_t id;  // -1: text still to tokenize
    };
    std::vector<Seg> segs{{std::string(text), -1}};
    // 1. Added tokens matched on the raw text; 2. normalize, then those matched on it.
    for (const bool normalized_pass : {false, true}) {
      std::vector<Seg> next;
      for (Seg& s : segs) {
        if (s.id >= 0) {
          next.push_back(std::move(s));
          continue;
        }
        if (normalized_pass) s.text = normalize(s.text);
        split_added(s.text, normalized_pass, match_special, next);
      }
      segs = std::move(next);
    }
    std::vector<std::int32_t> ids;
    if (add_special) ids = prefix_;
    for (std::size_t k = 0; k < segs.size(); ++k) {
      const Seg& s = segs[k];
      if (s.id >= 0) {
        ids.push_back(s.id);
      } else if (!s.text.empty()) {
        for (const std::string& word : pre_->run(s.text, k == 0)) bpe(word, ids);
      }
    }
    if (add_special) ids.insert(ids.end(), suffix_.begin(), suffix_.end());
    return ids;
  }

  std::string piece(std::int32_t prev, std::int32_t token) const override {
    if (token < 0 || token >= vocab_size_ || special_[static_cast<std::size_t>(token)]) return {};
    std::vector<std::string> one{id_to_token_[static_cast<std::size_t>(token)]};
    const bool first = prev < 0 || prev >= vocab_size_ || special_[static_cast<std::size_t>(prev)];
    return run_decoder(one, /*streaming=*/true, first);
  }

  std::string decode(const std::vector<std::int32_t>& ids) const override {
    std::vector<std::string> toks;
    for (const std::int32_t id : ids) {
      if (id < 0 || id >= vocab_size_ || special_[static_cast<std::size_t>(id)]) continue;
      toks.push_back(id_to_token_[static_cast<std::size_t>(id)]);
    }
    return run_decoder(toks, /*streaming=*/false, true);
  }

  std::string token_text(std::int32_t id) const override {
    return id >= 0 && id < vocab_size_ ? id_to_token_[static_cast<std::size_t>(id)] : std::string();
  }

 private:
  struct Added {
    std::int32_t id = 0;
    std::string content, pattern;
    bool single_word = false, lstrip = false, rstrip = false, normalized = false, special = false;
  };
  struct Merge {
    std::int32_t rank, new_id;
  };
  struct NormStep {
    enum Kind { kPrepend, kReplace, kUnicode } kind;
    std::string a, b;  // prepend a; replace a by b; Unicode form a
  };
  enum class Dec { kReplace, kByteFallback, kFuse, kStrip, kByteLevel, kMetaspace };
  struct DecStep {
    Dec kind;
    std::string a, b;
    std::int64_t start = 0, stop = 0;
  };

  [[noreturn]] void bad(const std::string& what) const { file_error(path_, what); }

  static std::string type_of(const json& j) {
    return j.is_object() && j.contains("type") && j["type"].is_string()
               ? "'" + j["type"].get<std::string>() + "'"
               : json_excerpt(j);
  }

  const json& field(const json& j, const char* key, json::value_t type,
                    const std::string& what) const {
    if (!j.is_object() || !j.contains(key))
      bad(std::string("missing '") + key + "' (" + what + ")");
    const json& v = j[key];
    if (v.type() != type && !(type == json::value_t::number_integer && v.is_number_unsigned())) {
      bad(std::string("'") + key + "' must be " + json(type).type_name() + "-typed (" + what +
          "), found " + json_excerpt(v));
    }
    return v;
  }

  bool flag(const json& j, const char* key, bool fallback, const std::string& where) const {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_boolean())
      bad(where + ": '" + key + "' must be true or false, found " + json_excerpt(j[key]));
    return j[key].get<bool>();
  }

  static std::uint64_t pair_key(std::int32_t a, std::int32_t b) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) |
           static_cast<std::uint32_t>(b);
  }

  void grow(std::int32_t id) {
    if (id >= vocab_size_) {
      vocab_size_ = id + 1;
      id_to_token_.resize(static_cast<std::size_t>(vocab_size_));
      special_.resize(static_cast<std::size_t>(vocab_size_), 0);
    }
  }

  void load_model(const json& m) {
    if (m.contains("type") && m["type"] != "BPE")
      bad("model type " + type_of(m) + " is not supported (only BPE)");
    const json& vocab = field(m, "vocab", json::value_t::object, "model.vocab");
    for (const auto& [tok, idj] : vocab.items()) {
      if (!idj.is_number_integer() || idj.get<std::int64_t>() < 0 ||
          idj.get<std::int64_t>() >= kMaxWidth) {
        bad("model.vocab['" + tok + "'] must be an id in [0, " + std::to_string(kMaxWidth) +
            "), found " + json_excerpt(idj));
      }
      const auto id = static_cast<std::int32_t>(idj.get<std::int64_t>());
      grow(id);
      if (!id_to_token_[static_cast<std::size_t>(id)].empty() || seen_.count(id)) {
        bad("model.vocab gives id " + std::to_string(id) + " to both '" +
            id_to_token_[static_cast<std::size_t>(id)] + "' and '" + tok + "'");
      }
      seen_.insert({id, true});
      id_to_token_[static_cast<std::size_t>(id)] = tok;
      vocab_[tok] = id;
    }
    if (m.contains("dropout") && !m["dropout"].is_null() &&
        !(m["dropout"].is_number() && m["dropout"].get<double>() == 0.0)) {
      bad("model.dropout " + json_excerpt(m["dropout"]) +
          " is not supported (tokenization must be deterministic)");
    }
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (m.contains(key) && !m[key].is_null() && m[key] != "") {
        bad(std::string("model.") + key + " " + json_excerpt(m[key]) + " is not supported");
      }
    }
    byte_fallback_ = flag(m, "byte_fallback", false, "model");
    fuse_unk_ = flag(m, "fuse_unk", false, "model");
    ignore_merges_ = flag(m, "ignore_merges", false, "model");
    if (m.contains("unk_token") && !m["unk_token"].is_null()) {
      if (!m["unk_token"].is_string()) bad("model.unk_token must be a string or null");
      const auto it = vocab_.find(m["unk_token"].get<std::string>());
      if (it == vocab_.end())
        bad("model.unk_token '" + m["unk_token"].get<std::string>() + "' is not in model.vocab");
      unk_id_ = it->second;
    }
    const json& merges = field(m, "merges", json::value_t::array, "model.merges");
    std::int32_t rank = 0;
    for (const json& mj : merges) {
      std::string a, b;
      if (mj.is_string()) {
        const std::string s = mj.get<std::string>();
        const std::size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
          bad("merge #" + std::to_string(rank) + " " + json_excerpt(mj) +
              " must be two pieces separated by one space");
        }
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (mj.is_array() && mj.size() == 2 && mj[0].is_string() && mj[1].is_string()) {
        a = mj[0].get<std::string>();
        b = mj[1].get<std::string>();
      } else {
        bad("merge #" + std::to_string(rank) + " must be \"a b\" or [\"a\", \"b\"], found " +
            json_excerpt(mj));
      }
      const auto ia = vocab_.find(a), ib = vocab_.find(b), iab = vocab_.find(a + b);
      for (const auto& [it, name] : {std::pair{ia, a}, std::pair{ib, b}, std::pair{iab, a + b}}) {
        if (it == vocab_.end()) {
          bad("merge #" + std::to_string(rank) + " (" + json_excerpt(mj) + "): '" + name +
              "' is not in model.vocab");
        }
      }
      merges_.emplace(pair_key(ia->second, ib->second),
                      Merge{rank, iab->second});  // first rank wins
      ++rank;
    }
  }

  void load_added(const json& list) {
    if (!list.is_array()) bad("'added_tokens' must be an array");
    for (const json& t : list) {
      Added a;
      const json& idj = field(t, "id", json::value_t::number_integer, "added_tokens[].id");
      if (idj.get<std::int64_t>() < 0 || idj.get<std::int64_t>() >= kMaxWidth) {
        bad("added token id " + json_excerpt(idj) + " is out of range");
      }
      a.id = static_cast<std::int32_t>(idj.get<std::int64_t>());
      a.content =
          field(t, "content", json::value_t::string, "added_tokens[].content").get<std::string>();
      if (a.content.empty()) bad("added token " + std::to_string(a.id) + " has empty content");
      const std::string where = "added token '" + a.content + "'";
      a.single_word = flag(t, "single_word", false, where);
      a.lstrip = flag(t, "lstrip", false, where);
      a.rstrip = flag(t, "rstrip", false, where);
      a.special = flag(t, "special", false, where);
      a.normalized = flag(t, "normalized", !a.special, where);
      grow(a.id);
      std::string& slot = id_to_token_[static_cast<std::size_t>(a.id)];
      if (!slot.empty() && slot != a.content) {
        bad(where + " has id " + std::to_string(a.id) + ", which model.vocab gives to '" + slot +
            "'");
      }
      slot = a.content;
      special_[static_cast<std::size_t>(a.id)] = a.special ? 1 : 0;
      added_.push_back(std::move(a));
    }
  }

  void load_normalizer(const json& n) {
    if (n.is_null()) return;
    const std::string type = n.value("type", "");
    if (type == "Sequence") {
      for (const json& s : field(n, "normalizers", json::value_t::array, "normalizer.normalizers"))
        load_normalizer(s);
    } else if (type == "Prepend") {
      normalizer_.push_back(
          {NormStep::kPrepend,
           field(n, "prepend", json::value_t::string, "Prepend normalizer").get<std::string>(),
           {}});
    } else if (type == "Replace") {
      normalizer_.push_back(
          {NormStep::kReplace, string_pattern(n, "Replace normalizer"),
           field(n, "content", json::value_t::string, "Replace normalizer").get<std::string>()});
    } else if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
      normalizer_.push_back({NormStep::kUnicode, type, {}});
    } else {
      bad("normalizer " + type_of(n) +
          " is not supported (supported: Sequence, Prepend, Replace, NFC, NFD, NFKC, NFKD)");
    }
  }

  std::string string_pattern(const json& n, const std::string& what) const {
    const json& p = field(n, "pattern", json::value_t::object, what);
    if (!p.contains("String") || !p["String"].is_string()) {
      bad(what + ": only {\"String\": ...} patterns are supported, found " + json_excerpt(p));
    }
    const std::string s = p["String"].get<std::string>();
    if (s.empty()) bad(what + ": empty pattern");
    return s;
  }

  void load_post_processor(const json& p) {
    if (p.is_null()) return;
    const std::string type = p.value("type", "");
    if (type == "Sequence") {
      for (const json& s :
           field(p, "processors", json::value_t::array, "post_processor.processors")) {
        load_post_processor(s);
      }
    } else if (type == "ByteLevel") {
      // Only adjusts offsets; adds no ids.
    } else if (type == "TemplateProcessing") {
      const json& single = field(p, "single", json::value_t::array, "TemplateProcessing.single");
      const json specials = p.value("special_tokens", json::object());
      bool seen_text = false;
      for (const json& item : single) {
        if (item.contains("Sequence")) {
          seen_text = true;
          continue;
        }
        if (!item.contains("SpecialToken") || !item["SpecialToken"].contains("id") ||
            !item["SpecialToken"]["id"].is_string()) {
          bad("TemplateProcessing.single item " + json_excerpt(item) +
              " is neither a Sequence nor a SpecialToken");
        }
        const std::string name = item["SpecialToken"]["id"].get<std::string>();
        if (!specials.contains(name) || !specials[name].contains("ids") ||
            !specials[name]["ids"].is_array()) {
          bad("TemplateProcessing names special token '" + name +
              "' but special_tokens has no ids for it");
        }
        for (const json& idj : specials[name]["ids"]) {
          if (!idj.is_number_integer() || idj.get<std::int64_t>() < 0 ||
              idj.get<std::int64_t>() >= vocab_size_) {
            bad("TemplateProcessing special token '" + name + "' has id " + json_excerpt(idj) +
                " outside the vocabulary [0, " + std::to_string(vocab_size_) + ")");
          }
          (seen_text ? suffix_ : prefix_)
              .push_back(static_cast<std::int32_t>(idj.get<std::int64_t>()));
        }
      }
    } else {
      bad("post_processor " + type_of(p) +
          " is not supported (supported: TemplateProcessing, ByteLevel, Sequence)");
    }
  }

  void load_decoder(const json& d) {
    if (d.is_null()) return;
    has_decoder_ = true;
    const std::string type = d.value("type", "");
    if (type == "Sequence") {
      for (const json& s : field(d, "decoders", json::value_t::array, "decoder.decoders"))
        load_decoder(s);
    } else if (type == "Replace") {
      decoder_.push_back(
          {Dec::kReplace, string_pattern(d, "Replace decoder"),
           field(d, "content", json::value_t::string, "Replace decoder").get<std::string>()});
    } else if (type == "ByteFallback") {
      decoder_.push_back({Dec::kByteFallback, {}, {}});
    } else if (type == "Fuse") {
      decoder_.push_back({Dec::kFuse, {}, {}});
    } else if (type == "Strip") {
      DecStep s{Dec::kStrip,
                field(d, "content", json::value_t::string, "Strip decoder").get<std::string>(),
                {}};
      if (utf8_len(s.a, 0) != s.a.size())
        bad("Strip decoder content must be one character, found " + json_excerpt(d["content"]));
      s.start =
          field(d, "start", json::value_t::number_integer, "Strip decoder").get<std::int64_t>();
      s.stop = field(d, "stop", json::value_t::number_integer, "Strip decoder").get<std::int64_t>();
      decoder_.push_back(s);
    } else if (type == "ByteLevel") {
      decoder_.push_back({Dec::kByteLevel, {}, {}});
    } else if (type == "Metaspace") {
      DecStep s{Dec::kMetaspace, d.value("replacement", std::string("\xE2\x96\x81")), {}};
      const std::string scheme = d.value(
          "prepend_scheme", std::string(d.value("add_prefix_space", true) ? "always" : "never"));
      s.start = scheme == "never" ? 0 : 1;  // strip the first token's leading space
      decoder_.push_back(s);
    } else {
      bad("decoder " + type_of(d) +
          " is not supported (supported: Sequence, Replace, ByteFallback, Fuse, Strip, "
          "ByteLevel, Metaspace)");
    }
  }

  std::string normalize(std::string s) const {
    for (const NormStep& n : normalizer_) {
      if (n.kind == NormStep::kPrepend) {
        if (!s.empty()) s = n.a + s;
      } else if (n.kind == NormStep::kReplace) {
        replace_all(s, n.a, n.b);
      } else {
        s = unicode_normalize(s, n.a);
      }
    }
    return s;
  }

  // Splits `text` on the added tokens of one pass (leftmost-longest), appending to `out`.
  template <typename Seg>
  void split_added(const std::string& text, bool normalized_pass, bool match_special,
                   std::vector<Seg>& out) const {
    std::size_t start_offset = 0, pos = 0;
    while (pos < text.size()) {
      const Added* best = nullptr;
      for (const Added& a : added_) {
        if (a.normalized != normalized_pass || a.pattern.size() > text.size() - pos) continue;
        if (a.special && !match_special) continue;
        if (text.compare(pos, a.pattern.size(), a.pattern) != 0) continue;
        if (best == nullptr || a.pattern.size() > best->pattern.size()) best = &a;
      }
      if (best == nullptr) {
        ++pos;
        continue;
      }
      std::size_t start = pos, stop = pos + best->pattern.size();
      pos = stop;  // matches never overlap, even when one is discarded
      if (best->single_word) {
        const bool start_ok = start == 0 || !word_char(static_cast<unsigned char>(text[start - 1]));
        const bool stop_ok =
            stop == text.size() || !word_char(static_cast<unsigned char>(text[stop]));
        if (!start_ok || !stop_ok) continue;
      }
      if (best->lstrip) {
        std::size_t s = start;
        while (s > 0 && ascii_space(text[s - 1])) --s;
        start = std::max(s, start_offset);
      }
      if (best->rstrip) {
        while (stop < text.size() && ascii_space(text[stop])) ++stop;
        pos = stop;
      }
      if (start_offset < start)
        out.push_back({text.substr(start_offset, start - start_offset), -1});
      out.push_back({text.substr(start, stop - start), best->id});
      start_offset = stop;
    }
    if (start_offset < text.size() || text.empty()) out.push_back({text.substr(start_offset), -1});
  }

  // BPE over one normalized piece, appending its ids.
  void bpe(const std::string& w, std::vector<std::int32_t>& ids) const {
    if (ignore_merges_) {
      const auto it = vocab_.find(w);
      if (it != vocab_.end()) {
        ids.push_back(it->second);
        return;
      }
    }
    struct Sym {
      std::int32_t c;
      std::int64_t prev, next;
      bool alive;
    };
    std::vector<Sym> syms;
    auto add = [&syms](std::int32_t id) {
      const auto n = static_cast<std::int64_t>(syms.size());
      if (n > 0) syms.back().next = n;
      syms.push_back(Sym{id, n - 1, -1, true});
    };
    std::int32_t pending_unk = -1;  // a fused run of unknown characters not yet emitted
    for (std::size_t i = 0; i < w.size();) {
      const std::size_t n = utf8_len(w, i);
      const std::string ch = w.substr(i, n);
      i += n;
      if (const auto it = vocab_.find(ch); it != vocab_.end()) {
        if (pending_unk >= 0) add(pending_unk);
        pending_unk = -1;
        add(it->second);
        continue;
      }
      if (byte_fallback_) {
        bool all = true;
        for (const char b : ch) all = all && byte_ids_[static_cast<unsigned char>(b)] >= 0;
        if (all) {
          // As in the library, a pending unk is emitted only at the next known character.
          for (const char b : ch) add(byte_ids_[static_cast<unsigned char>(b)]);
          continue;
        }
      }
      if (unk_id_ >= 0) {
        if (pending_unk >= 0 && !fuse_unk_) add(pending_unk);
        pending_unk = unk_id_;
      }
    }
    if (pending_unk >= 0) add(pending_unk);

    struct Cand {
      std::int32_t rank;
      std::int64_t pos;
      std::int32_t new_id;
    };
    auto later = [](const Cand& a, const Cand& b) {
      return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
    };
    std::priority_queue<Cand, std::vector<Cand>, decltype(later)> heap(later);
    auto lookup = [this](std::int32_t a, std::int32_t b) -> const Merge* {
      const auto it = merges_.find(pair_key(a, b));
      return it == merges_.end() ? nullptr : &it->second;
    };
    for (std::size_t k = 0; k + 1 < syms.size(); ++k) {
      if (const Merge* m = lookup(syms[k].c, syms[k + 1].c))
        heap.push({m->rank, static_cast<std::int64_t>(k), m->new_id});
    }
    while (!heap.empty()) {
      const Cand top = heap.top();
      heap.pop();
      Sym& left = syms[static_cast<std::size_t>(top.pos)];
      if (!left.alive || left.next < 0) continue;
      Sym& right = syms[static_cast<std::size_t>(left.next)];
      // The library's stale-entry rule: the pair now there must merge into the same id.
      const Merge* now = lookup(left.c, right.c);
      if (now == nullptr || now->new_id != top.new_id) continue;
      left.c = top.new_id;
      right.alive = false;
      left.next = right.next;
      if (right.next >= 0) syms[static_cast<std::size_t>(right.next)].prev = top.pos;
      if (left.prev >= 0) {
        if (const Merge* m = lookup(syms[static_cast<std::size_t>(left.prev)].c, left.c)) {
          heap.push({m->rank, left.prev, m->new_id});
        }
      }
      if (left.next >= 0) {
        if (const Merge* m = lookup(left.c, syms[static_cast<std::size_t>(left.next)].c)) {
          heap.push({m->rank, top.pos, m->new_id});
        }
      }
    }
    for (const Sym& s : syms) {
      if (s.alive) ids.push_back(s.c);
    }
  }

  static int byte_token(const std::string& t) {
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
    int v = 0;
    for (int k = 3; k < 5; ++k) {
      const char c = t[static_cast<std::size_t>(k)];
      const int d = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
      if (d < 0) return -1;
      v = v * 16 + d;
    }
    return v;
  }

  // The decoder chain over token strings. `streaming`: `toks` is one token of a longer text
  // (generation prints token by token): byte pieces are emitted raw, and after a Fuse step
  // Strip trims only what would be the text's start (`at_start`).
  std::string run_decoder(std::vector<std::string> toks, bool streaming, bool at_start) const {
    if (!has_decoder_) {
      std::string out;
      for (std::size_t i = 0; i < toks.size(); ++i)
        out += (i || (streaming && !at_start) ? " " : "") + toks[i];
      return out;
    }
    bool fused = false;
    for (const DecStep& d : decoder_) {
      switch (d.kind) {
        case Dec::kReplace:
          for (std::string& t : toks) replace_all(t, d.a, d.b);
          break;
        case Dec::kByteFallback: {
          std::vector<std::string> out;
          std::string bytes;
          auto flush = [&] {
            if (bytes.empty()) return;
            if (streaming || valid_utf8(bytes)) {
              out.push_back(bytes);
            } else {
              for (std::size_t k = 0; k < bytes.size(); ++k)
                out.push_back("\xEF\xBF\xBD");  // U+FFFD
            }
            bytes.clear();
          };
          for (std::string& t : toks) {
            const int b = byte_token(t);
            if (b >= 0) {
              bytes.push_back(static_cast<char>(b));
            } else {
              flush();
              out.push_back(std::move(t));
            }
          }
          flush();
          toks = std::move(out);
          break;
        }
        case Dec::kByteLevel:
          for (std::string& t : toks) t = byte_level_decode(t);
          break;
        case Dec::kMetaspace:
          for (std::size_t k = 0; k < toks.size(); ++k) {
            replace_all(toks[k], d.a, " ");
            if (k == 0 && d.start && at_start && !toks[k].empty() && toks[k][0] == ' ') {
              toks[k].erase(0, 1);
            }
          }
          break;
        case Dec::kFuse: {
          std::string all;
          for (const std::string& t : toks) all += t;
          toks.assign(1, all);
          fused = true;
          break;
        }
        case Dec::kStrip:
          // Applies to every token; after Fuse there is one: the whole text.
          for (std::string& t : toks) {
            if (!(streaming && fused && !at_start)) {
              for (std::int64_t k = 0; k < d.start && t.compare(0, d.a.size(), d.a) == 0; ++k) {
                t.erase(0, d.a.size());
              }
            }
            if (!(streaming && fused)) {
              for (std::int64_t k = 0; k < d.stop && t.size() >= d.a.size() &&
                                       t.compare(t.size() - d.a.size(), d.a.size(), d.a) == 0;
                   ++k) {
                t.erase(t.size() - d.a.size());
              }
            }
          }
          break;
      }
    }
    std::string out;
    for (const std::string& t : toks) out += t;
    return out;
  }

  std::unordered_map<std::string, std::int32_t> vocab_;
  std::unordered_map<std::int32_t, bool> seen_;
  std::vector<std::string> id_to_token_;
  std::vector<char> special_;
  std::unordered_map<std::uint64_t, Merge> merges_;
  bool byte_fallback_ = false, fuse_unk_ = false, ignore_merges_ = false, has_decoder_ = false;
  std::int32_t unk_id_ = -1;
  std::array<std::int32_t, 256> byte_ids_{};
  std::vector<NormStep> normalizer_;
  std::vector<Added> added_;
  std::vector<std::int32_t> prefix_, suffix_;
  std::vector<DecStep> decoder_;
  std::unique_ptr<HfPreTokenizer> pre_;
};

}  // namespace

std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path) {
  return std::make_unique<HfTokenizer>(path);
}

}  // namespace vq::engine
