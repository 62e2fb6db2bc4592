// Hugging Face pre-tokenizers (see hf_pretokenizer.h) and Unicode normalization (ICU).
#include "engine/tokenizers/hf_pretokenizer.h"
#include "engine/formats/json_limits.h"

#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include "engine/formats/file_error.h"

namespace vq::engine {
namespace {
using nlohmann::json;

const char* const kGpt2Regex =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

std::string type_name(const json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string()
             ? "'" + j["type"].get<std::string>() + "'"
             : json_excerpt(j);
}

}  // namespace

HfPreTokenizer::HfPreTokenizer(const json& j, const std::string& path) : path_(path) {
  if (!j.is_null()) add(j);
}

void HfPreTokenizer::add(const json& j) {
  auto bad = [&](const std::string& what) { file_error(path_, "pre_tokenizer: " + what); };
  if (!j.is_object()) bad("expected an object, found " + json_excerpt(j));
  const std::string type = j.value("type", std::string());
  auto flag = [&](const char* key, bool fallback) {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_boolean())
      bad(type + "." + key + " must be true or false, found " + json_excerpt(j[key]));
    return j[key].get<bool>();
  };
  if (type == "Sequence") {
    if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array()) {
      bad("Sequence needs a 'pretokenizers' array");
    }
    for (const json& s : j["pretokenizers"]) add(s);
    return;
  }
  Step s;
  if (type == "Metaspace") {
    s.kind = Kind::kMetaspace;
    s.replacement = j.value("replacement", std::string("\xE2\x96\x81"));
    if (s.replacement.empty()) bad("Metaspace.replacement must not be empty");
    if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string()) {
      s.prepend = j["prepend_scheme"].get<std::string>();
      if (s.prepend != "always" && s.prepend != "first" && s.prepend != "never") {
        bad("Metaspace.prepend_scheme must be always, first or never, found '" + s.prepend + "'");
      }
    } else {
      s.prepend = flag("add_prefix_space", true) ? "always" : "never";
    }
    s.split = flag("split", true);
    replacement_ = s.replacement;
  } else if (type == "ByteLevel") {
    s.kind = Kind::kByteLevel;
    s.add_prefix_space = flag("add_prefix_space", true);
    s.use_regex = flag("use_regex", true);
    if (s.use_regex) s.regex = std::make_shared<RegexSplitter>(kGpt2Regex, path_);
    byte_level_ = true;
  } else if (type == "Split") {
    s.kind = Kind::kSplit;
    const std::string behavior = j.value("behavior", std::string("Isolated"));
    if (behavior != "Isolated") {
      bad("Split behavior '" + behavior + "' is not supported (only Isolated)");
    }
    if (flag("invert", false)) bad("Split with invert = true is not supported");
    if (!j.contains("pattern") || !j["pattern"].is_object()) bad("Split needs a 'pattern' object");
    const json& p = j["pattern"];
    std::string regex;
    if (p.contains("Regex") && p["Regex"].is_string()) {
      regex = p["Regex"].get<std::string>();
    } else if (p.contains("String") && p["String"].is_string()) {
      // A literal: quote it for PCRE2.
      regex = "\\Q" + p["String"].get<std::string>() + "\\E";
    } else {
      bad("Split.pattern must be {\"Regex\": ...} or {\"String\": ...}, found " + json_excerpt(p));
    }
    s.regex = std::make_shared<RegexSplitter>(regex, path_);
  } else {
    bad(type_name(j) +
        " is not supported (supported: Metaspace, ByteLevel, Split (Isolated), Sequence)");
  }
  steps_.push_back(std::move(s));
}

std::vector<std::string> HfPreTokenizer::run(const std::string& text, bool first) const {
  std::vector<std::string> pieces{text};
  for (const Step& s : steps_) {
    std::vector<std::string> next;
    for (std::size_t k = 0; k < pieces.size(); ++k) {
      const std::string& p = pieces[k];
      switch (s.kind) {
        case Kind::kMetaspace: {
          std::string t;
          for (const char c : p) {
            if (c == ' ') {
              t += s.replacement;
            } else {
              t += c;
            }
          }
          const bool prepend = s.prepend == "always" || (s.prepend == "first" && first && k == 0);
          if (prepend && !t.empty() && t.compare(0, s.replacement.size(), s.replacement) != 0) {
            t = s.replacement + t;
          }
          if (!s.split) {
            next.push_back(std::move(t));
            break;
          }
          // MergedWithNext: each piece starts at a replacement character.
          std::size_t start = 0;
          for (std::size_t at = t.find(s.replacement, 1); at != std::string::npos;
               at = t.find(s.replacement, at + s.replacement.size())) {
            if (at > start) next.push_back(t.substr(start, at - start));
            start = at;
          }
          if (start < t.size()) next.push_back(t.substr(start));
          break;
        }
        case Kind::kByteLevel: {
          std::string t = p;
          if (s.add_prefix_space && !t.empty() && t[0] != ' ') t = " " + t;
          if (s.use_regex) {
            for (const std::string_view w : s.regex->split(t)) next.push_back(byte_level_encode(w));
          } else {
            next.push_back(byte_level_encode(t));
          }
          break;
        }
        case Kind::kSplit:
          for (const std::string_view w : s.regex->split(p)) next.emplace_back(w);
          break;
      }
    }
    pieces = std::move(next);
  }
  return pieces;
}

std::string unicode_normalize(const std::string& text, const std::string& form) {
  UErrorCode err = U_ZERO_ERROR;
  const UNormalizer2* n = form == "NFC"    ? unorm2_getNFCInstance(&err)
                          : form == "NFD"  ? unorm2_getNFDInstance(&err)
                          : form == "NFKC" ? unorm2_getNFKCInstance(&err)
                                           : unorm2_getNFKDInstance(&err);
  if (U_FAILURE(err)) return text;
  // UTF-8 -> UTF-16 (invalid sequences become U+FFFD), normalize, back to UTF-8.
  std::vector<UChar> in(text.size() + 1);
  std::int32_t in_len = 0;
  err = U_ZERO_ERROR;
  u_strFromUTF8WithSub(in.data(), static_cast<std::int32_t>(in.size()), &in_len, text.data(),
                       static_cast<std::int32_t>(text.size()), 0xFFFD, nullptr, &err);
  if (U_FAILURE(err)) return text;
  std::vector<UChar> out(static_cast<std::size_t>(in_len) * 4 + 16);
  err = U_ZERO_ERROR;
  const std::int32_t out_len = unorm2_normalize(n, in.data(), in_len, out.data(),
                                                static_cast<std::int32_t>(out.size()), &err);
  if (U_FAILURE(err)) return text;
  std::string result(static_cast<std::size_t>(out_len) * 3 + 4, '\0');
  std::int32_t bytes = 0;
  err = U_ZERO_ERROR;
  u_strToUTF8(result.data(), static_cast<std::int32_t>(result.size()), &bytes, out.data(), out_len,
              &err);
  if (U_FAILURE(err)) return text;
  result.resize(static_cast<std::size_t>(bytes));
  return result;
}

}  // namespace vq::engine
