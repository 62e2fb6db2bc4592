// Regex splitting (PCRE2) and the byte-level alphabet (see pretokenize.h).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "engine/tokenizers/pretokenize.h"

#include <pcre2.h>

#include <array>

#include "engine/formats/file_error.h"

namespace vq::engine {

const char* const kLlama3SplitRegex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char* const kQwen2SplitRegex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

std::string pre_tokenizer_regex(const std::string& name) {
  // llama.cpp spells the case-insensitive contractions out ("'[sS]") instead of "(?i:'s)",
  // which under Unicode case folding would also match e.g. U+017F; the same is done here.
  const std::string contractions = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])";
  const std::string rest = "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  if (name == "llama-bpe" || name == "llama3" || name == "llama-v3") {
    return contractions + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}" + rest;
  }
  if (name == "qwen2") return contractions + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}" + rest;
  if (name == "gpt-2" || name == "default") {
    return "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
  }
  return "";
}

struct RegexSplitter::Impl {
  pcre2_code* code = nullptr;
  ~Impl() {
    if (code) pcre2_code_free(code);
  }
};

RegexSplitter::RegexSplitter(const std::string& pattern, const std::string& source)
    : pattern_(pattern), impl_(std::make_unique<Impl>()) {
  int err = 0;
  PCRE2_SIZE at = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                              PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &at, nullptr);
  if (!impl_->code) {
    std::array<PCRE2_UCHAR, 256> msg{};
    pcre2_get_error_message(err, msg.data(), msg.size());
    file_error(source, "the pre-tokenizer regex does not compile (" +
                           std::string(reinterpret_cast<const char*>(msg.data())) + " at offset " +
                           std::to_string(at) + "): " + pattern);
  }
}

RegexSplitter::~RegexSplitter() = default;

std::vector<std::string_view> RegexSplitter::split(std::string_view text) const {
  std::vector<std::string_view> out;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(impl_->code, nullptr);
  std::size_t at = 0, gap = 0;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  while (at <= text.size()) {
    const int rc = pcre2_match(impl_->code, subject, text.size(), at, 0, md, nullptr);
    if (rc < 0) break;  // no more matches (or an error: the rest is one piece)
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const std::size_t begin = ov[0], end = ov[1];
    if (begin > gap) out.push_back(text.substr(gap, begin - gap));
    if (end > begin) {
      out.push_back(text.substr(begin, end - begin));
      at = end;
    } else {
      // An empty match: step one character (whole UTF-8 sequence) so the loop advances.
      at = begin + 1;
      while (at < text.size() && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80) ++at;
      if (begin >= text.size()) break;
      continue;
    }
    gap = end;
  }
  if (gap < text.size()) out.push_back(text.substr(gap));
  pcre2_match_data_free(md);
  return out;
}

namespace {

// byte -> code point of GPT-2's byte-level alphabet.
const std::array<std::uint32_t, 256>& byte_to_cp() {
  static const std::array<std::uint32_t, 256> table = [] {
    std::array<std::uint32_t, 256> t{};
    std::uint32_t next = 256;
    for (std::uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
      t[b] = printable ? b : next++;
    }
    return t;
  }();
  return table;
}

void append_utf8(std::string& s, std::uint32_t cp) {
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

}  // namespace

std::string byte_level_encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char c : bytes) append_utf8(out, byte_to_cp()[static_cast<unsigned char>(c)]);
  return out;
}

std::string byte_level_decode(std::string_view text) {
  static const std::array<int, 512> cp_to_byte = [] {
    std::array<int, 512> t{};
    t.fill(-1);
    for (int b = 0; b < 256; ++b) t[byte_to_cp()[static_cast<std::size_t>(b)]] = b;
    return t;
  }();
  std::string out;
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    std::uint32_t cp = c;
    std::size_t n = 1;
    if ((c >> 5) == 0x6 && i + 1 < text.size()) {
      cp = ((c & 0x1Fu) << 6) | (static_cast<unsigned char>(text[i + 1]) & 0x3Fu);
      n = 2;
    }
    if (cp < 512 && cp_to_byte[cp] >= 0 && (n == 2 || cp < 128)) {
      out += static_cast<char>(cp_to_byte[cp]);
      i += n;
    } else {
      out += text[i];
      ++i;
    }
  }
  return out;
}

}  // namespace vq::engine
