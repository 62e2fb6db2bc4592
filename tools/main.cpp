// veloxquant: the command-line tool. `veloxquant --help` lists the commands.
#include <cstdio>
#include <iostream>

#include "cli.h"
#include "veloxquant/errors.h"
#include "veloxquant/registry.h"
#include "veloxquant/version.h"

namespace vq::cli {

std::vector<std::int64_t> parse_int_list(const std::string& text, const std::string& flag,
                                         std::int64_t min_value) {
  std::vector<std::int64_t> out;
  std::size_t start = 0;
  auto bad = [&](const std::string& why) {
    return Error(ErrorCode::kInvalidArgument, flag + " expects comma-separated integers >= " +
                                                  std::to_string(min_value) + " (e.g. 64,128), " +
                                                  why);
  };
  if (text.empty()) throw bad("got an empty value");
  while (start <= text.size()) {
    const std::size_t comma = text.find(',', start);
    const std::string item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    std::size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      throw bad("got '" + item + "'");
    }
    if (used != item.size() || item.empty()) throw bad("got '" + item + "'");
    if (v < min_value) throw bad("got " + item);
    out.push_back(v);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
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

int main(int argc, char** argv) {
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
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 3;
  }
  return 0;
}
