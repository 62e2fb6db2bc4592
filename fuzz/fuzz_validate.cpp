// The shared range and overflow validators (src/base/validate.h) that every surface's argument
// checks go through: the CLI's flags (text), the C API's and the Python module's integers and
// reals (the Python binding converts a Python int to int64 or reports it as out of range, then
// calls these). Each input is checked against an independent oracle written here (128-bit
// arithmetic, a digit-by-digit reading of the text), not only for crashes:
//   byte 0: the operation; bytes 1..16: two int64 bounds (or doubles); the rest: text or values.
// Every problem message must be printable and start with "must be" (or name the size).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>

#include "base/validate.h"
#include "fuzz_util.h"

namespace {

using i128 = __int128;

[[noreturn]] void fail(const char* what, std::string_view text, const std::string& got) {
  std::fprintf(stderr, "fuzz_validate: %s: text '%.*s' got '%s'\n", what,
               static_cast<int>(text.size()), text.data(), got.c_str());
  std::abort();
}

void check_message(const std::string& m, std::string_view text) {
  if (m.rfind("must be", 0) != 0) fail("message does not start with 'must be'", text, m);
  for (const char c : m) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e)
      fail("unprintable message", text, m);
  }
  if (m.size() > 400) fail("message too long", text, m);
}

// The oracle's reading of decimal text: an optional '-' then digits only; the value in 128 bits
// (saturated past 2^100, beyond every 64-bit bound). False when the text is not of that form.
bool oracle_integer(std::string_view t, i128& out) {
  std::size_t i = 0;
  const bool negative = !t.empty() && t[0] == '-';
  if (negative) i = 1;
  if (i == t.size()) return false;
  i128 v = 0;
  const i128 cap = static_cast<i128>(1) << 100;
  for (; i < t.size(); ++i) {
    if (t[i] < '0' || t[i] > '9') return false;
    v = v * 10 + (t[i] - '0');
    if (v > cap) v = cap;
  }
  out = negative ? -v : v;
  return true;
}

template <typename T>
T read(const std::uint8_t*& p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  p += sizeof v;
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 17 || size > 4096) return 0;
  const std::uint8_t* p = data + 1;
  const std::uint8_t op = data[0] % 6;
  const auto a = read<std::int64_t>(p), b = read<std::int64_t>(p);
  const std::int64_t lo = a < b ? a : b, hi = a < b ? b : a;
  const std::string_view text(reinterpret_cast<const char*>(p), size - 17);
  namespace v = vq::validate;
  vq::fuzz::expect_clean([&] {
    switch (op) {
      case 0: {  // signed integers as text (CLI flags, list items)
        std::int64_t out = 0;
        const std::string m = v::parse_int(text, lo, hi, out);
        i128 want = 0;
        const bool ok = oracle_integer(text, want) && want >= lo && want <= hi;
        if (ok != m.empty()) fail("parse_int disagrees with the oracle", text, m);
        if (ok && out != want) fail("parse_int read another value", text, std::to_string(out));
        if (!ok) check_message(m, text);
        break;
      }
      case 1: {  // unsigned integers as text (seeds)
        const auto ulo = static_cast<std::uint64_t>(a), uhi = static_cast<std::uint64_t>(b);
        const std::uint64_t l = ulo < uhi ? ulo : uhi, h = ulo < uhi ? uhi : ulo;
        std::uint64_t out = 0;
        const std::string m = v::parse_uint(text, l, h, out);
        i128 want = 0;
        const bool ok = oracle_integer(text, want) && want >= static_cast<i128>(l) &&
                        want <= static_cast<i128>(h) && !(want == 0 && text[0] == '-');
        if (ok != m.empty()) fail("parse_uint disagrees with the oracle", text, m);
        if (ok && static_cast<i128>(out) != want) fail("parse_uint read another value", text, "");
        if (!ok) check_message(m, text);
        break;
      }
      case 2: {  // reals as text (CLI real flags)
        double dlo, dhi;
        std::memcpy(&dlo, &a, sizeof dlo);
        std::memcpy(&dhi, &b, sizeof dhi);
        if (!std::isfinite(dlo) || !std::isfinite(dhi) || dlo > dhi) break;
        double out = std::nan("");
        const std::string m = v::parse_real(text, dlo, dhi, out);
        if (m.empty()) {
          if (!std::isfinite(out) || out < dlo || out > dhi || (out != 0 && std::fabs(out) < 1e-30))
            fail("parse_real accepted a value outside its contract", text, std::to_string(out));
          // Never a silent rounding to 0: a 0 read is a 0 written (strtold as the reference).
          const std::string copy(text);
          if ((out == 0) != (std::strtold(copy.c_str(), nullptr) == 0))
            fail("parse_real rounded a value to 0", text, std::to_string(out));
        } else {
          check_message(m, text);
        }
        break;
      }
      case 3: {  // integers handed in as values (C API, Python after conversion)
        const std::uint8_t* q = p;
        if (text.size() < 16) break;
        const auto x = read<std::int64_t>(q), n = read<std::int64_t>(q);
        const std::string m = v::int_problem(x, lo, hi);
        if ((x >= lo && x <= hi) != m.empty()) fail("int_problem", "", m);
        if (!m.empty()) check_message(m, "");
        const std::string mi = v::index_problem(x, n);
        if ((n > 0 && x >= 0 && x < n) != mi.empty()) fail("index_problem", "", mi);
        if (!mi.empty()) check_message(mi, "");
        const std::int64_t cores = 1 + (n & 1023);
        const std::string mt = v::thread_problem(x, cores);
        if ((x >= 0 && x <= cores) != mt.empty()) fail("thread_problem", "", mt);
        if (!mt.empty()) check_message(mt, "");
        break;
      }
      case 4: {  // reals handed in as values
        double x, dlo, dhi;
        std::memcpy(&dlo, &a, sizeof dlo);
        std::memcpy(&dhi, &b, sizeof dhi);
        if (text.size() < 8 || !std::isfinite(dlo) || !std::isfinite(dhi) || dlo > dhi) break;
        std::memcpy(&x, text.data(), sizeof x);
        const std::string m = v::real_problem(x, dlo, dhi);
        if ((std::isfinite(x) && x >= dlo && x <= dhi) != m.empty()) fail("real_problem", "", m);
        if (!m.empty()) check_message(m, "");
        break;
      }
      default: {  // size products: counts x sizes, against 128-bit arithmetic
        const std::size_t n = text.size() / 8 < 4 ? text.size() / 8 : 4;
        std::int64_t f[4] = {a, b, 1, 1};
        const std::uint8_t* q = p;
        for (std::size_t i = 0; i < n && i < 2; ++i) f[2 + i] = read<std::int64_t>(q);
        bool negative = false;
        i128 product = 1;
        bool zero = false;
        for (const std::int64_t x : f) {
          negative = negative || x < 0;
          zero = zero || x == 0;
        }
        const i128 max = std::numeric_limits<std::int64_t>::max();
        bool over = false;
        for (const std::int64_t x : f) {
          if (negative || zero) break;
          product *= x;
          if (product > max) {
            over = true;
            break;
          }
        }
        bool threw = false;
        std::int64_t got = -1;
        try {
          got = v::checked_size({f[0], f[1], f[2], f[3]}, "size");
        } catch (const vq::Error&) {
          threw = true;
        }
        if (threw != (negative || (!zero && over))) fail("checked_size throws wrongly", "", "");
        if (!threw && got != (zero ? 0 : static_cast<std::int64_t>(product)))
          fail("checked_size computed another product", "", std::to_string(got));
        break;
      }
    }
  });
  return 0;
}
