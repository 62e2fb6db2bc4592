// Range and overflow checks for values a user hands in, shared by every surface: the CLI's
// flags (tools/cli.h wraps them as CLI11 validators), the C API (src/capi), the Python module
// (python/src) and the option checks of the commands' libraries (e.g. eval/decode_bench). One
// wording everywhere:
//
//   <name> must be an integer in [lo, hi], got <value>
//   <name> must be an integer in [lo, hi], got <text> (out of range)     (does not fit at all)
//   <name> must be an integer in [lo, hi], got '<text>'                  (not an integer)
//   <name> must be a finite number in [lo, hi], got nan
//   <name> must be in [lo, hi], got <value>                              (a finite real)
//   <name> must be at most the 2 core(s) this process may use (0 = all of them), got 64
//   <name>: the size 1048576 x 1048576 x 1048576 x 4 overflows a 64-bit count
//
// The *_problem and parse_* functions return that text without the name ("must be ...", empty
// when the value is fine), for callers that add the name themselves (CLI11 writes "--steps: ");
// the check_* functions throw Error(kInvalidArgument) "<name> <problem>". Names carry their
// surface's prefix when it has one ("[capi] vq_layer_view_head: b", "[python] budget").
// Text from the user is shown as a printable excerpt (control bytes escaped, cut at 60
// characters), never raw.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

namespace vq::validate {

// "[lo, hi]" with the bounds written in full ("[0, 18446744073709551615]").
std::string range_text(std::int64_t lo, std::int64_t hi);
std::string range_text(std::uint64_t lo, std::uint64_t hi);
// Real bounds with enough digits that 1.0000001 is not written as 1 ("[0, 1]", "[0, 1e+06]").
std::string real_range_text(double lo, double hi);

// At most `max_chars` bytes of `text`, control and non-ASCII bytes written as \xNN and a
// backslash as \\, "..." when cut.
std::string excerpt(std::string_view text, std::size_t max_chars = 60);

// The whole of `text` for a terminal: printable ASCII and well-formed UTF-8 as they are;
// control bytes (newline and tab included), DEL, C1 controls, bidi controls (U+202A-U+202E,
// U+2066-U+2069, U+200E/F, U+061C), invisible format characters (U+200B-U+200D, U+2060-U+206F,
// U+FEFF, U+00AD), line/paragraph separators and malformed UTF-8 written as \xNN per byte.
// For whole messages (the CLI prints every error through it), where excerpt() would mangle the
// program's own non-ASCII text ("±").
// With `keep_newlines`, '\n' is kept (multi-line output such as bench table's markdown).
std::string printable(std::string_view text, bool keep_newlines = false);

// "must be an integer in [lo, hi], got v", or "" when lo <= v <= hi.
std::string int_problem(std::int64_t v, std::int64_t lo, std::int64_t hi);
// For a value that does not fit a 64-bit integer at all (a Python int of 2^70, the text
// "18446744073709551616"): "must be an integer in <range>, got <excerpt> (out of range)", with
// `range` from range_text.
std::string too_large_problem(std::string_view text, std::string_view range);

// Integers written as text, parsed exactly: decimal digits with an optional '-' (no '+', no
// spaces, no wrapping or saturation of 2^63, 2^64 or -1 for unsigned). Sets `out` and returns
// "" when the text is an integer in [lo, hi], else the problem.
std::string parse_int(std::string_view text, std::int64_t lo, std::int64_t hi, std::int64_t& out);
std::string parse_uint(std::string_view text, std::uint64_t lo, std::uint64_t hi,
                       std::uint64_t& out);

// An index into n things: "must be an integer in [0, n - 1], got i", or "must be an integer in
// [0, n - 1], but there are none (got i)" when n is 0; "" when 0 <= i < n.
std::string index_problem(std::int64_t i, std::int64_t n);

// A real must be finite and in [lo, hi]: "must be a finite number in [lo, hi], got inf",
// "must be in [lo, hi], got 2", or "". With [-DBL_MAX, DBL_MAX] (any finite value):
// "must be a finite number, got nan".
std::string real_problem(double v, double lo, double hi);
// "must be a finite number in [lo, hi], got <shown>" (without the range for any finite value),
// for a value shown as text (a NaN, an infinity, an int beyond the double range).
std::string nonfinite_problem(std::string_view shown, double lo, double hi);
// The smallest nonzero magnitude a real setting may have where it is used in single precision
// (temperature, top-p, every real flag): below it a value rounds to 0 or a denormal as a float,
// so 1e-45 would act as 0 (greedy) while claiming to sample. The CLI (parse_real), serve's
// request fields and the Python API's float arguments all refuse it with tiny_problem's words.
inline constexpr double kMinRealMagnitude = 1e-30;
// "must be 0 or at least 1e-30 in magnitude, got <shown>" when 0 < |v| < kMinRealMagnitude;
// "" otherwise.
std::string tiny_problem(double v, std::string_view shown);
// real_problem, then tiny_problem: a real that will be used as a float.
std::string float_real_problem(double v, double lo, double hi);
// A real written as text, parsed exactly (the whole text, as strtold reads it) and checked as
// real_problem does; a value that would round to 0 in single precision (0 < |v| <
// kMinRealMagnitude) is refused too ("must be 0 or at least 1e-30 in magnitude, got 1e-40").
std::string parse_real(std::string_view text, double lo, double hi, double& out);

// A thread count: an integer in [0, cores] (0: every core). More threads than cores only slow a
// run down, so more are refused naming the core count.
std::string thread_problem(std::int64_t v, std::int64_t cores);

// Throwing forms: Error(kInvalidArgument) "<name> <problem>".
[[noreturn]] void fail(std::string_view name, std::string_view problem);
std::int64_t check_int(std::int64_t v, std::string_view name, std::int64_t lo, std::int64_t hi);
std::int64_t check_index(std::int64_t i, std::string_view name, std::int64_t n);
double check_real(double v, std::string_view name, double lo, double hi);
// check_real plus tiny_problem (a value used as a float: temperature, top-p).
double check_float_real(double v, std::string_view name, double lo, double hi);
int check_threads(std::int64_t v, std::string_view name, std::int64_t cores);

// The product of counts and sizes (elements x bytes), overflow-safe: every factor must be
// >= 0 and the product fit an int64, else Error(kInvalidArgument) "<what>: the size a x b x c
// overflows a 64-bit count" (or "... has a negative factor -3").
std::int64_t checked_size(std::initializer_list<std::int64_t> factors, std::string_view what);

}  // namespace vq::validate
