// Hostile-input defences (docs/engine.md "Robustness"): output files committed together or not
// at all and never over a non-regular file, JSON depth limits and short excerpts, overflow-safe
// sizes, the memory-size flag and the memory guard, non-finite detection.
#include <gtest/gtest.h>

#include <chrono>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "base/checked_math.h"
#include "base/validate.h"
#include "engine/formats/gguf.h"
#include "engine/formats/gguf_writer.h"
#include "engine/formats/json_limits.h"
#include "engine/tokenizers/gguf_tokenizer.h"
#include "engine/formats/mapped_file.h"
#include "engine/model/weights_check.h"
#include "eval/report/output_set.h"
#include "engine/run/resources.h"
#include "test_util.h"

namespace vq {
namespace {
namespace fs = std::filesystem;

struct Dir {
  fs::path path;
  explicit Dir(const std::string& name)
      : path(fs::temp_directory_path() / ("vq_robust_" + name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~Dir() { fs::remove_all(path); }
  std::string operator/(const std::string& rel) const { return (path / rel).string(); }
};

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::size_t entries(const fs::path& dir) {
  return static_cast<std::size_t>(
      std::distance(fs::directory_iterator(dir), fs::directory_iterator()));
}

TEST(OutputSet, WritesEveryOutputAndCreatesDirectories) {
  const Dir d("outputs");
  eval::OutputSet out;
  out.declare("--json", d / "a/b/r.json");
  out.declare("--plot", d / "a/r.svg");
  EXPECT_FALSE(fs::exists(d.path / "a")) << "declare must create nothing";
  out.stage("--json", "{}\n");
  out.stage("--plot", "<svg/>");
  out.commit();
  EXPECT_EQ(read(d / "a/b/r.json"), "{}\n");
  EXPECT_EQ(read(d / "a/r.svg"), "<svg/>");
  EXPECT_EQ(entries(d.path / "a/b"), 1u) << "a temporary file was left behind";
  EXPECT_EQ(entries(d.path / "a"), 2u);
}

TEST(OutputSet, RefusesNonRegularTargetsEmptyPathsAndDuplicates) {
  const Dir d("refuse");
  eval::OutputSet out;
  test::expect_error([&] { out.declare("--json", "/dev/null"); }, ErrorCode::kIoError,
                     {"--json: cannot write '/dev/null': it is a device"});
  ASSERT_EQ(::mkfifo((d / "fifo").c_str(), 0600), 0);
  test::expect_error([&] { out.declare("--json", d / "fifo"); }, ErrorCode::kIoError,
                     {"it is a FIFO"});
  std::ofstream(d / "real") << "keep";
  fs::create_symlink(d / "real", d / "link");
  test::expect_error([&] { out.declare("--json", d / "link"); }, ErrorCode::kIoError,
                     {"it is a symbolic link"});
  test::expect_error([&] { out.declare("--json", d.path.string()); }, ErrorCode::kIoError,
                     {"it is a directory"});
  test::expect_error([&] { out.declare("--json", ""); }, ErrorCode::kIoError, {"empty"});
  test::expect_error([&] { out.declare("--json", d / "real/x.json"); }, ErrorCode::kIoError,
                     {"is not a directory"});
  out.declare("--json", d / "r.json");
  // The same file through another spelling.
  test::expect_error([&] { out.declare("--plot", d / "sub/../r.json"); },
                     ErrorCode::kInvalidArgument, {"--json and --plot name the same file"});
  EXPECT_EQ(read(d / "real"), "keep");
  struct stat st {};
  ASSERT_EQ(::lstat((d / "fifo").c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  ASSERT_EQ(::lstat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
}

TEST(OutputSet, AFailedCommitWritesNothingAndRemovesCreatedDirectories) {
  const Dir d("all_or_none");
  std::ofstream(d / "r.json") << "old";
  eval::OutputSet out;
  out.declare("--json", d / "r.json");
  out.declare("--plot", d / "new/deeper/r.svg");
  out.declare("--per-token", d / "p.tsv");
  out.stage("--json", "new");
  out.stage("--plot", "<svg/>");
  out.stage("--per-token", "x");
  // The third target turns into a FIFO during the run: the commit must refuse it and leave
  // the first two untouched, removing the directories it created for the second.
  ASSERT_EQ(::mkfifo((d / "p.tsv").c_str(), 0600), 0);
  test::expect_error([&] { out.commit(); }, ErrorCode::kIoError,
                     {"--per-token: cannot write", "it is a FIFO"});
  EXPECT_EQ(read(d / "r.json"), "old");
  EXPECT_FALSE(fs::exists(d.path / "new")) << "a created directory was left behind";
  EXPECT_EQ(entries(d.path), 2u) << "a temporary file was left behind";
}

TEST(OutputSet, CommitNeedsEveryOutputStaged) {
  const Dir d("staged");
  eval::OutputSet out;
  out.declare("--json", d / "r.json");
  test::expect_error([&] { out.commit(); }, ErrorCode::kInvalidState, {"not staged"});
  EXPECT_FALSE(fs::exists(d.path / "r.json"));
}

TEST(JsonLimits, DepthIsLimitedBeforeAnyRecursiveWalk) {
  const std::string ok = std::string(128, '[') + std::string(128, ']');
  EXPECT_NO_THROW((void)engine::parse_json_limited(ok, "f.json", "config.json"));
  const std::string deep = std::string(129, '[') + std::string(129, ']');
  test::expect_error([&] { (void)engine::parse_json_limited(deep, "f.json", "config.json"); },
                     ErrorCode::kFileError, {"'f.json': config.json nests", "deeper than 128"});
  // Far deeper than any stack: refused, no crash (and unbalanced: never parsed to the end).
  std::string abyss;
  for (int i = 0; i < (1 << 19); ++i) abyss += "{\"a\":";
  test::expect_error([&] { (void)engine::parse_json_limited(abyss, "t.json", "tokenizer.json"); },
                     ErrorCode::kFileError, {"t.json", "deeper than 128"});
  const std::string mixed = std::string(100, '[') + "{\"a\":" + std::string(40, '[');
  test::expect_error([&] { (void)engine::parse_json_limited(mixed, "m.json", "x"); },
                     ErrorCode::kFileError, {"found level 129"});
}

// A SentencePiece ("llama") vocabulary in GGUF whose scores hold a NaN or an infinity: refused
// naming the file, the key and the entry (as tokenizer.bin and convert refuse it); and a
// metadata key with control bytes and a NUL printed escaped, never raw or cut at the NUL.
TEST(GgufTokenizerMetadata, NonFiniteScoresAndRawKeysAreRefusedClearly) {
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(),
                          -std::numeric_limits<float>::infinity()}) {
    engine::GgufWriter w;
    w.set("tokenizer.ggml.model", engine::GgufValue::str("llama"));
    w.set("tokenizer.ggml.tokens", engine::GgufValue::string_array({"<unk>", "<s>", "</s>", "a"}));
    w.set("tokenizer.ggml.scores", engine::GgufValue::f32_array({0.0f, 0.0f, 0.0f, bad}));
    const auto bytes = w.serialize();
    const engine::GgufFile g = engine::GgufFile::parse(bytes.data(), bytes.size(), "spm.gguf");
    test::expect_error([&] { (void)engine::load_gguf_tokenizer(g); }, ErrorCode::kFileError,
                       {"spm.gguf", "'tokenizer.ggml.scores' entry 3 is ",
                        std::isnan(bad) ? "nan" : "infinite", "scores must be finite"});
  }
  engine::GgufWriter w;
  const std::string key("a\x01" "b\0" "c", 5);
  w.set(key, engine::GgufValue::u32(1));
  auto bytes = w.serialize();
  // The value type (uint32) follows the key's bytes: make it an unknown type, 99.
  const auto at = std::search(bytes.begin(), bytes.end(), key.begin(), key.end());
  ASSERT_NE(at, bytes.end());
  const auto type_at = static_cast<std::size_t>(at - bytes.begin()) + key.size();
  bytes[type_at] = 99;
  try {
    (void)engine::GgufFile::parse(bytes.data(), bytes.size(), "keys.gguf");
    ADD_FAILURE() << "an unknown value type was accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'a\\x01b\\x00c'"), std::string::npos) << what;
    EXPECT_EQ(what.find('\x01'), std::string::npos) << what;
  }
}

TEST(JsonLimits, BracketsInsideStringsDoNotCount) {
  // 200 '[' inside a string (and an escaped quote before them) are text, not nesting.
  const std::string s = "{\"k\\\"" + std::string(200, '[') + "\": [1]}";
  const nlohmann::json j = engine::parse_json_limited(s, "s.json", "x");
  EXPECT_EQ(j.begin().key(), "k\"" + std::string(200, '['));
}

TEST(JsonLimits, ManyEntriesParseInLinearTime) {
  // A safetensors-like header with 200,000 tensors took over 20 minutes in the depth limiter
  // (a parser callback, quadratic in an object's entries); the limiter is now one linear scan.
  // 100,000 entries parse in about 0.5 s here; the quadratic limiter needed minutes (over 20 at
  // 200,000). A ratio of two sizes proved noisy for this DOM-building parse on a loaded machine
  // (memory effects at 100,000 entries), so the bound is absolute and generous: 60 s.
  std::string h = "{";
  h.reserve(100000 * 70);
  for (int i = 0; i < 100000; ++i) {
    if (i) h += ',';
    h += "\"t";
    h += std::to_string(i);
    h += "\":{\"dtype\":\"F32\",\"shape\":[4,4],\"data_offsets\":[0,64]}";
  }
  h += "}";
  const auto t0 = std::chrono::steady_clock::now();
  const nlohmann::json j = engine::parse_json_limited(h, "h.json", "safetensors header");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("json header: 100,000 entries %.3f s\n", s);
  EXPECT_EQ(j.size(), 100000u);
  EXPECT_LT(s, 60.0);
}

TEST(JsonLimits, SyntaxErrorsQuoteAShortEscapedExcerpt) {
  const std::string bad = "{\"a\": " + std::string(100000, 'x') + "\x01}";
  try {
    (void)engine::parse_json_limited(bad, "big.json", "result file");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_LT(std::string(e.what()).size(), 200u) << e.what();
    EXPECT_NE(std::string(e.what()).find("'big.json': result file is not valid JSON"),
              std::string::npos);
  }
  EXPECT_EQ(engine::text_excerpt("a\x01\xff", 10), "a\\x01\\xFF");
  EXPECT_EQ(engine::text_excerpt("abcdef", 3), "abc...");
  const nlohmann::json big = nlohmann::json::array({1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  EXPECT_EQ(engine::json_excerpt(big, 5), "an array of 10 entries");
  EXPECT_EQ(engine::json_excerpt(nlohmann::json{{"k", nullptr}}), "{\"k\":null}");
}

TEST(Sizes, CheckedArithmeticDetectsOverflow) {
  EXPECT_EQ(detail::checked_product({1 << 20, 1 << 20, 1 << 20}), std::int64_t{1} << 60);
  EXPECT_FALSE(detail::checked_product({std::int64_t{1} << 32, std::int64_t{1} << 32}));
  EXPECT_FALSE(detail::checked_product({4, -1}));
  EXPECT_FALSE(detail::checked_sum(std::numeric_limits<std::int64_t>::max(), 1));
  EXPECT_EQ(detail::checked_sum(2, 3), 5);
}

TEST(Sizes, TextFilesAreCappedWhileReading) {
  const Dir d("text_cap");
  std::ofstream(d / "t.txt") << "0123456789";
  EXPECT_EQ(engine::read_text_file(d / "t.txt", 10), "0123456789");
  test::expect_error([&] { (void)engine::read_text_file(d / "t.txt", 9); }, ErrorCode::kFileError,
                     {"t.txt': is larger than the", "(9 bytes)"});
  // A character device with no end: refused before any read (issue 33: only regular files
  // are read), not read forever.
  test::expect_error([] { (void)engine::read_text_file("/dev/zero", 1 << 20); },
                     ErrorCode::kFileError,
                     {"'/dev/zero': is not a regular file (a character device)"});
}

TEST(Sizes, MaxMemoryFlag) {
  EXPECT_EQ(engine::parse_memory_size("512M", "--max-memory"), std::uint64_t{512} << 20);
  EXPECT_EQ(engine::parse_memory_size("8g", "--max-memory"), std::uint64_t{8} << 30);
  EXPECT_EQ(engine::parse_memory_size("1000", "--max-memory"), 1000u);
  EXPECT_EQ(engine::parse_memory_size("2KiB", "--max-memory"), 2048u);
  for (const char* bad : {"", "-1", "0", "12Q", "M", "18446744073709551616", "17179869184G"}) {
    test::expect_error([&] { (void)engine::parse_memory_size(bad, "--max-memory"); },
                       ErrorCode::kInvalidArgument, {"--max-memory expects a size"});
  }
}

TEST(Sizes, MemoryGuardRefusesWithTheEstimate) {
  test::expect_error(
      [] { engine::check_memory("demo", 3.0 * (1 << 30), "synthetic K/V", std::uint64_t{1} << 30); },
      ErrorCode::kInvalidArgument,
      {"demo: the run needs about 3.0 GiB (synthetic K/V), more than 1.0 GiB (the --max-memory "
       "limit)"});
  EXPECT_NO_THROW(engine::check_memory("demo", 1000, "x", 1 << 20));
  // Without --max-memory the limit is MemAvailable: a petabyte never fits.
  if (engine::available_memory_bytes() > 0) {
    test::expect_error([] { engine::check_memory("eval", 1e15, "x", 0); },
                       ErrorCode::kInvalidArgument, {"MemAvailable"});
  }
}

TEST(NonFinite, FoundAndNamed) {
  std::vector<float> v(10000, 1.0f);
  EXPECT_TRUE(engine::all_finite(v.data(), static_cast<std::int64_t>(v.size())));
  v[9000] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(engine::all_finite(v.data(), static_cast<std::int64_t>(v.size())));
  test::expect_error(
      [&] {
        engine::check_finite(v.data(), static_cast<std::int64_t>(v.size()), "logits at position 7");
      },
      ErrorCode::kInvalidState, {"logits at position 7: value 9000 of 10000 is inf"});
  v[9000] = 1.0f;
  v[3] = std::nanf("");
  test::expect_error([&] { engine::check_finite(v.data(), 10000, "w"); }, ErrorCode::kInvalidState,
                     {"value 3 of 10000 is nan"});
  // Huge finite values are finite (a sum of them would overflow; the test must not).
  std::vector<float> big(100, 3e38f);
  EXPECT_TRUE(engine::all_finite(big.data(), 100));
}

// ---- The shared validators (base/validate.h) ------------------------------------------------
// Expected texts written by hand from the documented wording; bounds and values chosen at the
// edges of int64 / uint64 (2^63 - 1 = 9223372036854775807, 2^64 - 1 = 18446744073709551615).

TEST(Validate, IntegersParseExactlyAndNameTheRange) {
  std::int64_t v = 0;
  EXPECT_EQ(validate::parse_int("16", 1, 16, v), "");
  EXPECT_EQ(v, 16);
  EXPECT_EQ(validate::parse_int("-9223372036854775808", INT64_MIN, 0, v), "");
  EXPECT_EQ(v, INT64_MIN);
  EXPECT_EQ(validate::parse_int("17", 1, 16, v), "must be an integer in [1, 16], got 17");
  EXPECT_EQ(validate::parse_int("9223372036854775808", 1, 16, v),
            "must be an integer in [1, 16], got 9223372036854775808 (out of range)");
  for (const char* bad : {"", "+3", " 3", "3 ", "0x10", "1e3", "3.0", "--1"}) {
    EXPECT_EQ(validate::parse_int(bad, 1, 16, v),
              "must be an integer in [1, 16], got '" + std::string(bad) + "'")
        << bad;
  }
  EXPECT_EQ(validate::parse_int(std::string_view("1\0" "2", 3), 1, 16, v),
            "must be an integer in [1, 16], got '1\\x002'");
  std::uint64_t u = 0;
  EXPECT_EQ(validate::parse_uint("18446744073709551615", 0, UINT64_MAX, u), "");
  EXPECT_EQ(u, UINT64_MAX);
  EXPECT_EQ(validate::parse_uint("-1", 0, UINT64_MAX, u),
            "must be an integer in [0, 18446744073709551615], got -1 (out of range)");
  EXPECT_EQ(validate::parse_uint("18446744073709551616", 0, UINT64_MAX, u),
            "must be an integer in [0, 18446744073709551615], got 18446744073709551616 (out of "
            "range)");
  EXPECT_EQ(validate::int_problem(-1, 0, 7), "must be an integer in [0, 7], got -1");
  EXPECT_EQ(validate::index_problem(3, 3), "must be an integer in [0, 2], got 3");
  EXPECT_EQ(validate::index_problem(0, 0),
            "must be an integer in [0, n - 1], but there are none (got 0)");
  test::expect_error([] { validate::check_int(0, "--steps", 1, 1048576); },
                     ErrorCode::kInvalidArgument, {"--steps must be an integer in [1, 1048576], got 0"});
}

TEST(Validate, RealsAreFiniteAndInRange) {
  double v = 0;
  EXPECT_EQ(validate::parse_real("0.5", 0, 1, v), "");
  EXPECT_EQ(v, 0.5);
  EXPECT_EQ(validate::parse_real("1.0000001", 0, 1, v), "must be in [0, 1], got 1.0000001");
  EXPECT_EQ(validate::parse_real("nan", 0, 1, v), "must be a finite number in [0, 1], got nan");
  EXPECT_EQ(validate::parse_real("1e400", 0, 1, v), "must be a finite number in [0, 1], got 1e400");
  // 1e-5000 reads as 0 with ERANGE: refused, never taken as 0.
  EXPECT_EQ(validate::parse_real("1e-5000", 0, 1, v),
            "must be 0 or at least 1e-30 in magnitude, got 1e-5000");
  EXPECT_EQ(validate::parse_real("1e-40", 0, 1, v),
            "must be 0 or at least 1e-30 in magnitude, got 1e-40");
  EXPECT_EQ(validate::parse_real(" 1", 0, 1, v), "must be a number in [0, 1], got ' 1'");
  EXPECT_EQ(validate::parse_real("1x", 0, 1, v), "must be a number in [0, 1], got '1x'");
  EXPECT_EQ(validate::real_problem(2.0, 0, 1e6), "");
  EXPECT_EQ(validate::real_problem(-0.25, 0, 1e6), "must be in [0, 1e+06], got -0.25");
  EXPECT_EQ(validate::real_problem(-HUGE_VAL, 0, 1), "must be a finite number in [0, 1], got -inf");
  EXPECT_EQ(validate::real_problem(NAN, -DBL_MAX, DBL_MAX), "must be a finite number, got nan");
}

TEST(Validate, ThreadsAndSizes) {
  EXPECT_EQ(validate::thread_problem(0, 2), "");
  EXPECT_EQ(validate::thread_problem(2, 2), "");
  EXPECT_EQ(validate::thread_problem(65536, 2),
            "must be at most the 2 core(s) this process may use (0 = all of them), got 65536");
  EXPECT_EQ(validate::thread_problem(-1, 2),
            "must be an integer in [0, 2] (0 = every core this process may use), got -1");
  // 2^20 x 2^20 x 2^20 x 4 = 2^62 fits; x 2 more does not.
  EXPECT_EQ(validate::checked_size({1 << 20, 1 << 20, 1 << 20, 4}, "kv"), std::int64_t{1} << 62);
  test::expect_error([] { validate::checked_size({1 << 20, 1 << 20, 1 << 20, 8}, "--fill-chunk"); },
                     ErrorCode::kInvalidArgument,
                     {"--fill-chunk: the size 1048576 x 1048576 x 1048576 x 8 overflows a 64-bit count"});
  test::expect_error([] { validate::checked_size({4, -3}, "x"); }, ErrorCode::kInvalidArgument,
                     {"x: the size has a negative factor -3"});
  EXPECT_EQ(validate::excerpt(std::string(70, 'a')), std::string(60, 'a') + "...");
}

}  // namespace
}  // namespace vq
