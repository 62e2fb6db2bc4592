// veloxquant: the command-line tool. `veloxquant --help` lists the commands.
#include <signal.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <iostream>
#include <limits>
#include <new>

#include "base/input_file.h"
#include "base/validate.h"
#include "cli.h"
#include "engine/formats/json_limits.h"
#include "engine/compute/parallel.h"
#include "engine/run/resources.h"
#include "veloxquant/errors.h"
#include "veloxquant/registry.h"
#include "veloxquant/version.h"

namespace vq::cli {

std::vector<std::int64_t> parse_int_list(const std::string& text, const std::string& flag,
                                         std::int64_t min_value, std::int64_t max_value) {
  std::vector<std::int64_t> out;
  auto bad = [&](const std::string& why) {
    return Error(ErrorCode::kInvalidArgument,
                 flag + " expects comma-separated integers (e.g. 64,128); each " + why);
  };
  if (text.empty()) {
    throw Error(ErrorCode::kInvalidArgument,
                flag + " expects comma-separated integers in " +
                    validate::range_text(min_value, max_value) + " (e.g. 64,128), got an empty value");
  }
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = text.find(',', start);
    const std::string_view item = std::string_view(text).substr(
        start, comma == std::string::npos ? std::string::npos : comma - start);
    std::int64_t v = 0;
    const std::string why = validate::parse_int(item, min_value, max_value, v);
    if (!why.empty()) throw bad(why);
    out.push_back(v);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

namespace {
std::string g_activity;  // what the running command is doing (set_activity)
}  // namespace

// The CLI11 form of base/validate.h's checks: CLI11 writes "--steps: " before the problem.
CLI::Validator int_range(std::int64_t min_value, std::int64_t max_value) {
  return CLI::Validator(
      [min_value, max_value](std::string& text) -> std::string {
        std::int64_t v = 0;
        return validate::parse_int(text, min_value, max_value, v);
      },
      "INT in " + validate::range_text(min_value, max_value));
}

CLI::Validator uint_range(std::uint64_t min_value, std::uint64_t max_value) {
  return CLI::Validator(
      [min_value, max_value](std::string& text) -> std::string {
        std::uint64_t v = 0;
        return validate::parse_uint(text, min_value, max_value, v);
      },
      "INT in " + validate::range_text(min_value, max_value));
}

CLI::Validator real_range(double min_value, double max_value) {
  return CLI::Validator(
      [min_value, max_value](std::string& text) -> std::string {
        double v = 0;
        return validate::parse_real(text, min_value, max_value, v);
      },
      "NUMBER in " + validate::real_range_text(min_value, max_value));
}

CLI::Validator thread_count() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const std::int64_t cores = engine::available_cores();
        std::int64_t v = 0;
        const std::string why = validate::parse_int(text, std::numeric_limits<std::int64_t>::min(),
                                                    std::numeric_limits<std::int64_t>::max(), v);
        return why.empty() ? validate::thread_problem(v, cores) : why;
      },
      "INT in [0, cores]");
}

CLI::Validator non_empty_path() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        return text.empty() ? "expects a file path, got an empty string" : std::string();
      },
      "PATH");
}

void add_head_pattern_option(CLI::App& cmd, std::string& path) {
  cmd.add_option("--duo-pattern,--head-pattern", path,
                 "DuoAttention head pattern: the full_attention_heads.tsv layout, one line per "
                 "layer with one tab-separated score per KV head; the top duo_head_ratio of each "
                 "layer's heads keep every row. Only methods with head types (duoattention) read "
                 "it; without it they estimate the heads from the prompt")
      ->check(non_empty_path())
      ->type_name("FILE");
}

void add_max_memory_option(CLI::App& cmd, std::uint64_t& bytes) {
  cmd.add_option_function<std::string>(
         "--max-memory",
         [&bytes](const std::string& text) {
           bytes = engine::parse_memory_size(text, "--max-memory");
           vq::set_input_memory_limit(bytes);  // file headers are held to it too
         },
         "Refuse a run estimated to need more memory than SIZE (e.g. 512M, 8G; default: the "
         "memory available: MemAvailable in /proc/meminfo, or the room under a cgroup memory "
         "limit when smaller)")
      ->type_name("SIZE");
}

void set_activity(std::string what) { g_activity = std::move(what); }

namespace {
// The cleanup list, as fixed-size C strings the signal handler can read without allocating.
constexpr int kMaxCleanup = 16;
char g_cleanup_paths[kMaxCleanup][4096];
bool g_cleanup_is_dir[kMaxCleanup];
volatile std::sig_atomic_t g_cleanup_count = 0;
struct sigaction g_old_actions[3];
constexpr int kCleanupSignals[3] = {SIGINT, SIGTERM, SIGHUP};

void remove_listed() noexcept {
  for (int i = g_cleanup_count - 1; i >= 0; --i) {
    if (g_cleanup_is_dir[i]) {
      (void)::rmdir(g_cleanup_paths[i]);
    } else {
      (void)::unlink(g_cleanup_paths[i]);
    }
  }
}

extern "C" void on_cleanup_signal(int sig) {
  remove_listed();
  g_cleanup_count = 0;
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

void add_cleanup(const std::string& path, bool dir) {
  if (g_cleanup_count >= kMaxCleanup || path.size() >= sizeof g_cleanup_paths[0]) {
    throw Error(ErrorCode::kInvalidState, "[cli] cleanup list full or path too long: " + path);
  }
  const int i = g_cleanup_count;
  std::snprintf(g_cleanup_paths[i], sizeof g_cleanup_paths[i], "%s", path.c_str());
  g_cleanup_is_dir[i] = dir;
  g_cleanup_count = i + 1;  // published after the entry is complete
}
}  // namespace

CleanupGuard::CleanupGuard() {
  g_cleanup_count = 0;
  struct sigaction sa {};
  sa.sa_handler = on_cleanup_signal;
  sigemptyset(&sa.sa_mask);
  for (int i = 0; i < 3; ++i) ::sigaction(kCleanupSignals[i], &sa, &g_old_actions[i]);
}

CleanupGuard::~CleanupGuard() {
  if (active_) remove_listed();
  g_cleanup_count = 0;
  if (active_) {
    for (int i = 0; i < 3; ++i) ::sigaction(kCleanupSignals[i], &g_old_actions[i], nullptr);
  }
}

void CleanupGuard::add_file(const std::string& path) { add_cleanup(path, false); }
void CleanupGuard::add_dir(const std::string& path) { add_cleanup(path, true); }

void CleanupGuard::commit() {
  g_cleanup_count = 0;
  for (int i = 0; i < 3; ++i) ::sigaction(kCleanupSignals[i], &g_old_actions[i], nullptr);
  active_ = false;
}

std::vector<CacheConfig> parse_methods(const std::vector<std::string>& specs) {
  std::vector<CacheConfig> out;
  if (specs.empty()) {
    for (const auto& id : method_ids()) out.emplace_back(id);
  }
  for (const auto& s : specs) out.push_back(CacheConfig::parse(s));
  return out;
}

}  // namespace vq::cli

namespace {
// "eval", "bench perturb": the command that ran.
std::string command_name(const CLI::App& app) {
  std::string name = "veloxquant";
  const CLI::App* at = &app;
  while (true) {
    const auto subs = at->get_subcommands();
    if (subs.empty()) break;
    at = subs.front();
    name += " " + at->get_name();
  }
  return name;
}
std::string doing() {
  return vq::cli::g_activity.empty() ? std::string() : " while " + vq::cli::g_activity;
}
}  // namespace

int main(int argc, char** argv) {
  // Every file the command reads is recorded, so no output of it can replace one
  // (base/input_file.h).
  const vq::InputRecording record_inputs;
  CLI::App app{"VeloxQuant: compressed KV caches for transformer inference, with a reference "
               "engine and benchmarks.",
               "veloxquant"};
  app.set_version_flag("--version", std::string("veloxquant ") + vq::kVersion);
  app.require_subcommand(1);
  app.fallthrough(false);
  vq::cli::add_list_command(app);
  vq::cli::add_demo_command(app);
  vq::cli::add_bench_command(app, argc, argv);
  vq::cli::add_generate_command(app);
  vq::cli::add_eval_command(app);
  vq::cli::add_make_model_command(app);
  vq::cli::add_convert_command(app);
  vq::cli::add_serve_command(app);
  vq::cli::add_calibrate_command(app);
  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    std::string names;
    for (const auto* sub : app.get_subcommands({})) {
      known = known || sub->get_name() == argv[1];
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    if (!known) {
      std::cerr << "error: unknown command '" << argv[1] << "'; commands: " << names
                << " (see veloxquant --help)\n";
      return 2;
    }
    // The same for a command with subcommands of its own (`bench perturb`).
    const CLI::App* cmd = app.get_subcommand(argv[1]);
    const auto subs = cmd->get_subcommands({});
    if (!subs.empty() && argc > 2 && argv[2][0] != '-') {
      bool sub_known = false;
      std::string sub_names;
      for (const auto* sub : subs) {
        sub_known = sub_known || sub->get_name() == argv[2];
        sub_names += (sub_names.empty() ? "" : ", ") + sub->get_name();
      }
      if (!sub_known) {
        std::cerr << "error: unknown " << argv[1] << " command '" << argv[2] << "'; " << argv[1]
                  << " commands: " << sub_names << " (see veloxquant " << argv[1] << " --help)\n";
        return 2;
      }
    }
  }
  try {
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      // Help and --version exit 0; every usage error exits 2, like other errors.
      return app.exit(e) == 0 ? 0 : 2;
    }
  } catch (const vq::Error& e) {
    // Messages carry names from files (tensors, shards, series): never raw control or bidi
    // characters on the terminal (base/validate.h printable).
    std::cerr << "error: " << vq::validate::printable(e.what()) << "\n";
    return 2;
  } catch (const std::bad_alloc&) {
    std::cerr << "error: " << command_name(app) << ": out of memory" << doing()
              << " (the memory guard's estimate fell short; try smaller sizes or a lower "
                 "--max-memory)\n";
    return 3;
  } catch (const std::exception& e) {
    std::cerr << "error: " << command_name(app) << ": internal error" << doing() << ": "
              << vq::engine::text_excerpt(e.what(), 200) << "\n";
    return 3;
  } catch (...) {
    std::cerr << "error: " << command_name(app) << ": internal error" << doing()
              << ": an unknown exception\n";
    return 3;
  }
  return 0;
}
