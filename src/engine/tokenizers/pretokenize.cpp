// Regex splitting (PCRE2) and the byte-level alphabet (see pretokenize.h).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "engine/tokenizers/pretokenize.h"

#include <pcre2.h>

#include <array>
#include <utility>

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
                              PCRE2_UTF | PCRE2_UCP, &err, &at, nullptr);
  if (!impl_->code) {
    std::array<PCRE2_UCHAR, 256> msg{};
    pcre2_get_error_message(err, msg.data(), msg.size());
    file_error(source, "the pre-tokenizer regex does not compile (" +
                           std::string(reinterpret_cast<const char*>(msg.data())) + " at offset " +
                           std::to_string(at) + "): " + pattern);
  }
}

RegexSplitter::~RegexSplitter() = default;

namespace {

// Bytes of the valid UTF-8 sequence (RFC 3629: no overlong forms, no surrogates, at most
// U+10FFFF) that starts at text[i], or 0 when none does.
std::size_t valid_utf8_at(std::string_view text, std::size_t i) noexcept {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(text[i + k]); };
  const std::size_t left = text.size() - i;
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  const auto cont = [&](std::size_t k) { return k < left && (b(k) & 0xC0) == 0x80; };
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (!cont(1) || !cont(2)) return 0;
    if (c == 0xE0 && b(1) < 0xA0) return 0;   // overlong
    if (c == 0xED && b(1) >= 0xA0) return 0;  // surrogate
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (!cont(1) || !cont(2) || !cont(3)) return 0;
    if (c == 0xF0 && b(1) < 0x90) return 0;   // overlong
    if (c == 0xF4 && b(1) >= 0x90) return 0;  // above U+10FFFF
    return 4;
  }
  return 0;
}

}  // namespace

std::vector<std::string_view> RegexSplitter::split(std::string_view text) const {
  // The regex runs over each maximal valid UTF-8 stretch of the text as a subject of its own,
  // checked once here (PCRE2_NO_UTF_CHECK). PCRE2's own tolerance of invalid UTF-8
  // (PCRE2_MATCH_INVALID_UTF) re-scans the rest of the subject at every match, which made
  // splitting quadratic in the text (1M characters: 111 s; now 0.25 s). An invalid byte matches
  // nothing and no match crosses it, as with PCRE2_MATCH_INVALID_UTF; it lands in the unmatched
  // stretch (gap) around it.
  std::vector<std::pair<std::size_t, std::size_t>> matches;  // [begin, end) in `text`
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(impl_->code, nullptr);
  for (std::size_t seg = 0; seg < text.size();) {
    std::size_t end = seg;
    while (end < text.size()) {
      const std::size_t n = valid_utf8_at(text, end);
      if (n == 0) break;
      end += n;
    }
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data() + seg);
    const std::size_t len = end - seg;
    std::size_t at = 0;
    while (len > 0 && at <= len) {
      const int rc = pcre2_match(impl_->code, subject, len, at, PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc < 0) break;  // no more matches (or an error: the rest is one piece)
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      const std::size_t begin = ov[0], stop = ov[1];
      if (stop > begin) {
        matches.emplace_back(seg + begin, seg + stop);
        at = stop;
      } else {
        // An empty match: step one character (whole UTF-8 sequence) so the loop advances.
        if (begin >= len) break;
        at = begin + 1;
        while (at < len && (static_cast<unsigned char>(text[seg + at]) & 0xC0) == 0x80) ++at;
      }
    }
    seg = end;
    while (seg < text.size() && valid_utf8_at(text, seg) == 0) ++seg;  // the invalid bytes
  }
  pcre2_match_data_free(md);
  std::vector<std::string_view> out;
  std::size_t gap = 0;
  for (const auto& [begin, end] : matches) {
    if (begin > gap) out.push_back(text.substr(gap, begin - gap));
    out.push_back(text.substr(begin, end - begin));
    gap = end;
  }
  if (gap < text.size()) out.push_back(text.substr(gap));
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
