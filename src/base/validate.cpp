#include "base/validate.h"

#include <cerrno>
#include <cfloat>
#include <charconv>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <type_traits>

#include "base/checked_math.h"
#include "veloxquant/errors.h"

namespace vq::validate {
namespace {

std::string real_text(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);  // shortest text that reads back as v
  return std::string(buf, r.ptr);
}

template <typename T>
std::string parse_integer(std::string_view text, T lo, T hi, T& out) {
  const std::string range = range_text(lo, hi);
  T v{};
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  // std::from_chars accepts no '+', no spaces and (for unsigned types) no '-'.
  const auto [ptr, ec] = std::from_chars(begin, end, v);
  const bool negative_unsigned = std::is_unsigned_v<T> && !text.empty() && text[0] == '-' &&
                                 text.size() > 1 && text[1] >= '0' && text[1] <= '9';
  if (ec == std::errc::result_out_of_range || negative_unsigned) {
    return too_large_problem(text, range);
  }
  if (ec != std::errc() || ptr != end || text.empty()) {
    return "must be an integer in " + range + ", got '" + excerpt(text) + "'";
  }
  if (v < lo || v > hi) return "must be an integer in " + range + ", got " + excerpt(text);
  out = v;
  return {};
}

}  // namespace

std::string range_text(std::int64_t lo, std::int64_t hi) {
  return "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
}

std::string range_text(std::uint64_t lo, std::uint64_t hi) {
  return "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
}

std::string real_range_text(double lo, double hi) {
  return "[" + real_text(lo) + ", " + real_text(hi) + "]";
}

std::string excerpt(std::string_view text, std::size_t max_chars) {
  std::string out;
  for (std::size_t i = 0; i < text.size() && i < max_chars; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else if (c == '\\') {
      out += "\\\\";
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      out += buf;
    }
  }
  if (text.size() > max_chars) out += "...";
  return out;
}

std::string printable(std::string_view text, bool keep_newlines) {
  std::string out;
  out.reserve(text.size());
  auto escape = [&](unsigned char c) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\x%02X", c);
    out += buf;
  };
  std::size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      if ((c < 0x20 && !(keep_newlines && c == '\n')) || c == 0x7f) {
        escape(c);
      } else {
        out += static_cast<char>(c);
      }
      ++i;
      continue;
    }
    // A well-formed UTF-8 sequence (no overlong forms, no surrogates, at most U+10FFFF).
    const std::size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    std::uint32_t cp = 0;
    bool ok = len != 0 && c < 0xF5 && i + len <= text.size();
    if (ok) {
      cp = c & (len == 2 ? 0x1Fu : len == 3 ? 0x0Fu : 0x07u);
      for (std::size_t k = 1; k < len && ok; ++k) {
        const auto cc = static_cast<unsigned char>(text[i + k]);
        ok = (cc & 0xC0) == 0x80;
        cp = (cp << 6) | (cc & 0x3Fu);
      }
      const std::uint32_t min = len == 2 ? 0x80 : len == 3 ? 0x800 : 0x10000;
      ok = ok && cp >= min && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
    }
    // C1 controls, bidi controls (embeddings, overrides, isolates, marks) and invisible
    // format characters can reorder or hide what the terminal shows: escaped.
    const bool hidden = (cp >= 0x80 && cp <= 0x9F) || cp == 0x061C || cp == 0x00AD ||
                        (cp >= 0x200B && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202E) ||
                        (cp >= 0x2060 && cp <= 0x206F) || cp == 0xFEFF;
    if (!ok || hidden) {
      const std::size_t n = ok ? len : 1;
      for (std::size_t k = 0; k < n; ++k) escape(static_cast<unsigned char>(text[i + k]));
      i += n;
      continue;
    }
    out.append(text.substr(i, len));
    i += len;
  }
  return out;
}

std::string int_problem(std::int64_t v, std::int64_t lo, std::int64_t hi) {
  if (v >= lo && v <= hi) return {};
  return "must be an integer in " + range_text(lo, hi) + ", got " + std::to_string(v);
}

std::string too_large_problem(std::string_view text, std::string_view range) {
  return "must be an integer in " + std::string(range) + ", got " + excerpt(text) +
         " (out of range)";
}

std::string parse_int(std::string_view text, std::int64_t lo, std::int64_t hi,
                      std::int64_t& out) {
  return parse_integer<std::int64_t>(text, lo, hi, out);
}

std::string parse_uint(std::string_view text, std::uint64_t lo, std::uint64_t hi,
                       std::uint64_t& out) {
  return parse_integer<std::uint64_t>(text, lo, hi, out);
}

std::string index_problem(std::int64_t i, std::int64_t n) {
  if (n <= 0) {
    return "must be an integer in [0, n - 1], but there are none (got " + std::to_string(i) + ")";
  }
  return int_problem(i, 0, n - 1);
}

std::string nonfinite_problem(std::string_view shown, double lo, double hi) {
  const bool any = lo == -DBL_MAX && hi == DBL_MAX;  // any finite value
  return "must be a finite number" + (any ? std::string() : " in " + real_range_text(lo, hi)) +
         ", got " + std::string(shown);
}

std::string real_problem(double v, double lo, double hi) {
  if (!std::isfinite(v)) return nonfinite_problem(real_text(v), lo, hi);
  if (v < lo || v > hi) return "must be in " + real_range_text(lo, hi) + ", got " + real_text(v);
  return {};
}

std::string tiny_problem(double v, std::string_view shown) {
  if (v == 0 || !(std::fabs(v) < kMinRealMagnitude)) return {};
  return "must be 0 or at least " + real_text(kMinRealMagnitude) + " in magnitude, got " +
         std::string(shown);
}

std::string float_real_problem(double v, double lo, double hi) {
  std::string why = real_problem(v, lo, hi);
  if (why.empty()) why = tiny_problem(v, real_text(v));
  return why;
}

std::string parse_real(std::string_view text, double lo, double hi, double& out) {
  const std::string range = real_range_text(lo, hi);
  const std::string s(text);
  const std::string shown = excerpt(text);
  // strtold skips leading spaces; they are refused here so the whole text is the number.
  if (s.empty() || std::isspace(static_cast<unsigned char>(s.front())) != 0 ||
      s.find('\0') != std::string::npos) {
    return "must be a number in " + range + ", got '" + shown + "'";
  }
  char* end = nullptr;
  errno = 0;
  const long double v = std::strtold(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return "must be a number in " + range + ", got '" + shown + "'";
  if (!std::isfinite(v) || std::fabs(v) > static_cast<long double>(DBL_MAX)) {
    return nonfinite_problem(shown, lo, hi);
  }
  // Compared as the double the caller gets (0.1 read in long double is below the double 0.1).
  const auto d = static_cast<double>(v);
  // Underflow (1e-5000 reads as 0 with ERANGE) or a value that would round to 0 (or a
  // denormal) as a float.
  // (Compared as the double: the long double 1e-30 is just below the double 1e-30.)
  if (errno == ERANGE || (v != 0 && std::fabs(d) < kMinRealMagnitude)) {
    return "must be 0 or at least " + real_text(kMinRealMagnitude) + " in magnitude, got " + shown;
  }
  if (d < lo || d > hi) return "must be in " + range + ", got " + shown;
  out = d;
  return {};
}

std::string thread_problem(std::int64_t v, std::int64_t cores) {
  if (v < 0) {
    return "must be an integer in " + range_text(std::int64_t{0}, cores) +
           " (0 = every core this process may use), got " + std::to_string(v);
  }
  if (v > cores) {
    return "must be at most the " + std::to_string(cores) +
           " core(s) this process may use (0 = all of them), got " + std::to_string(v);
  }
  return {};
}

void fail(std::string_view name, std::string_view problem) {
  throw Error(ErrorCode::kInvalidArgument, std::string(name) + " " + std::string(problem));
}

std::int64_t check_int(std::int64_t v, std::string_view name, std::int64_t lo, std::int64_t hi) {
  const std::string why = int_problem(v, lo, hi);
  if (!why.empty()) fail(name, why);
  return v;
}

std::int64_t check_index(std::int64_t i, std::string_view name, std::int64_t n) {
  const std::string why = index_problem(i, n);
  if (!why.empty()) fail(name, why);
  return i;
}

double check_float_real(double v, std::string_view name, double lo, double hi) {
  const std::string why = float_real_problem(v, lo, hi);
  if (!why.empty()) fail(name, why);
  return v;
}

double check_real(double v, std::string_view name, double lo, double hi) {
  const std::string why = real_problem(v, lo, hi);
  if (!why.empty()) fail(name, why);
  return v;
}

int check_threads(std::int64_t v, std::string_view name, std::int64_t cores) {
  const std::string why = thread_problem(v, cores);
  if (!why.empty()) fail(name, why);
  return static_cast<int>(v);
}

std::int64_t checked_size(std::initializer_list<std::int64_t> factors, std::string_view what) {
  std::string product;
  for (const std::int64_t f : factors) {
    if (f < 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  std::string(what) + ": the size has a negative factor " + std::to_string(f));
    }
    product += (product.empty() ? "" : " x ") + std::to_string(f);
  }
  for (const std::int64_t f : factors) {
    if (f == 0) return 0;  // even when the other factors' product alone would overflow
  }
  const std::optional<std::int64_t> out = detail::checked_product(factors);
  if (!out) {
    throw Error(ErrorCode::kInvalidArgument,
                std::string(what) + ": the size " + product + " overflows a 64-bit count");
  }
  return *out;
}

}  // namespace vq::validate
