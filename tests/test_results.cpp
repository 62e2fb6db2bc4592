// Result files (atomic writes, the shared envelope) and the SVG plot writer.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "eval/report/plot.h"
#include "eval/report/results.h"
#include "test_util.h"

namespace vq {
namespace {
namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("vq_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

TEST(Results, AtomicWriteCreatesDirectoriesAndReplacesWhole) {
  const fs::path dir = temp_dir("atomic");
  const std::string path = (dir / "a" / "b" / "out.json").string();
  eval::write_file_atomic(path, "first");
  eval::write_file_atomic(path, "second");
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "second");
  for (const auto& e : fs::directory_iterator(dir / "a" / "b")) {
    EXPECT_EQ(e.path().filename(), "out.json") << "temporary file left behind";
  }
  fs::remove_all(dir);
}

TEST(Results, UnwritablePathsFailBeforeWritingAnything) {
  const fs::path dir = temp_dir("unwritable");
  test::expect_error([&] { eval::check_writable(dir.string()); }, ErrorCode::kIoError,
                     {"it is a directory"});
  std::ofstream(dir / "file") << "x";
  // A path "under" a regular file cannot be created.
  test::expect_error([&] { eval::write_file_atomic((dir / "file" / "out.json").string(), "x"); },
                     ErrorCode::kIoError, {"is not a directory"});
  fs::remove_all(dir);
}

TEST(Results, EnvelopeAndMethodJson) {
  const auto env = eval::results_envelope("perturb", "veloxquant bench perturb", {{"seeds", 5}});
  EXPECT_EQ(env["schema"], "veloxquant.results/1");
  EXPECT_EQ(env["kind"], "perturb");
  EXPECT_EQ(env["settings"]["seeds"], 5);
  EXPECT_TRUE(env["rows"].is_array());
  const auto m = eval::method_json(CacheConfig::parse("cam:budget=64,merge=drop"));
  EXPECT_EQ(m["method"], "cam:cam_budget=64,merge=drop");
  EXPECT_EQ(m["method_id"], "cam");
  EXPECT_EQ(m["params"]["cam_budget"], 64);
  EXPECT_EQ(m["params"]["merge_gate"], true);
  EXPECT_EQ(m["params"]["kv_dtype"], "f16");
  EXPECT_EQ(m["budget"], 64);
  EXPECT_TRUE(eval::method_json(CacheConfig("full"))["budget"].is_null());
  EXPECT_EQ(eval::command_line({"veloxquant", "eval", "--text", "a b.txt"}),
            "veloxquant eval --text 'a b.txt'");
}

TEST(Plot, DrawsEverySeriesOnceInTheLegend) {
  eval::Panel p1{"seq 256", "budget", "perturbation", true, false, {}};
  p1.series.push_back({"cam", {64, 128}, {0.5, 0.3}, {0.05, 0.02}, false});
  p1.series.push_back({"h2o <drop>", {64, 128}, {0.6, 0.4}, {}, true});
  eval::Panel p2 = p1;
  p2.title = "seq 512";
  const std::string svg = eval::line_plot_svg("perturbation & budget", {p1, p2});
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("perturbation &amp; budget"), std::string::npos);
  EXPECT_NE(svg.find("h2o &lt;drop&gt;"), std::string::npos);
  EXPECT_EQ(svg, eval::line_plot_svg("perturbation & budget", {p1, p2})) << "not deterministic";
  // Each label once in the legend (plus nowhere else as text).
  std::size_t count = 0;
  for (std::size_t pos = svg.find(">cam<"); pos != std::string::npos; pos = svg.find(">cam<", pos + 1)) ++count;
  EXPECT_EQ(count, 1u);
}

TEST(Plot, RejectsBadInput) {
  test::expect_error([] { eval::line_plot_svg("t", {}); }, ErrorCode::kInvalidArgument, {"no panels"});
  eval::Panel bad{"p", "x", "y", false, false, {{"s", {1, 2}, {1}, {}, false}}};
  test::expect_error([&] { eval::line_plot_svg("t", {bad}); }, ErrorCode::kInvalidArgument,
                     {"mismatched"});
  eval::Panel logp{"p", "x", "y", true, false, {{"s", {0, 2}, {1, 2}, {}, false}}};
  test::expect_error([&] { eval::line_plot_svg("t", {logp}); }, ErrorCode::kInvalidArgument,
                     {"log axis"});
}

}  // namespace
}  // namespace vq
