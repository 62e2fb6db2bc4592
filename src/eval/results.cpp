#include "eval/results.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "veloxquant/errors.h"
#include "veloxquant/registry.h"
#include "veloxquant/version.h"

#ifndef VELOXQUANT_GIT_COMMIT
#define VELOXQUANT_GIT_COMMIT "unknown"
#endif

namespace vq::eval {
namespace fs = std::filesystem;

namespace {
[[noreturn]] void io_error(const std::string& path, const std::string& what) {
  throw Error(ErrorCode::kIoError, "cannot write '" + path + "': " + what, path);
}

fs::path parent_of(const std::string& path) {
  fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? fs::path(".") : parent;
}
}  // namespace

void check_writable(const std::string& path) {
  if (path.empty()) io_error(path, "empty path");
  if (fs::is_directory(path)) io_error(path, "it is a directory");
  const fs::path parent = parent_of(path);
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) io_error(path, "cannot create directory '" + parent.string() + "': " + ec.message());
  if (::access(parent.c_str(), W_OK) != 0) {
    io_error(path, "directory '" + parent.string() + "' is not writable: " + std::strerror(errno));
  }
}

void check_creatable(const std::string& path) {
  if (path.empty()) io_error(path, "empty path");
  std::error_code ec;
  if (fs::is_directory(path, ec)) io_error(path, "it is a directory");
  // Walk up to the nearest existing ancestor; it must be a directory we can write into.
  fs::path dir = parent_of(path);
  while (!fs::exists(dir, ec)) {
    const fs::path up = dir.parent_path();
    if (up.empty() || up == dir) {
      dir = fs::path(".");
      break;
    }
    dir = up;
  }
  if (!fs::is_directory(dir, ec)) {
    io_error(path, "'" + dir.string() + "' is not a directory");
  }
  if (::access(dir.c_str(), W_OK) != 0) {
    io_error(path, "directory '" + dir.string() + "' is not writable: " + std::strerror(errno));
  }
}

void write_file_atomic(const std::string& path, const std::string& content) {
  check_writable(path);
  const fs::path target(path);
  const fs::path tmp = parent_of(path) / ("." + target.filename().string() + ".tmp." +
                                          std::to_string(::getpid()));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) io_error(path, "cannot create temporary file '" + tmp.string() + "'");
    out.write(content.data(), static_cast<std::streamsize>(content.size()));
    out.flush();
    if (!out) {
      out.close();
      std::remove(tmp.c_str());
      io_error(path, "write failed (disk full?)");
    }
  }
  std::error_code ec;
  fs::rename(tmp, target, ec);
  if (ec) {
    std::remove(tmp.c_str());
    io_error(path, "rename failed: " + ec.message());
  }
}

nlohmann::json results_envelope(const std::string& kind, const std::string& command,
                                nlohmann::json settings) {
  nlohmann::json j;
  j["schema"] = kResultsSchema;
  j["kind"] = kind;
  j["veloxquant_version"] = kVersion;
  j["git_commit"] = build_commit();
  j["machine"] = machine_description();
  j["command"] = command;
  j["settings"] = std::move(settings);
  j["rows"] = nlohmann::json::array();
  return j;
}

nlohmann::json method_json(const CacheConfig& config) {
  nlohmann::json j;
  j["method"] = config.spec(false);
  j["method_id"] = config.method();
  nlohmann::json params = nlohmann::json::object();
  for (const auto& [name, value] : config.fields()) {
    std::visit([&, &n = name](const auto& v) { params[n] = v; }, value);
  }
  j["params"] = params;
  j["budget"] = has_token_budget(config) ? nlohmann::json(token_budget(config)) : nlohmann::json();
  return j;
}

std::string command_line(const std::vector<std::string>& args) {
  std::string out;
  for (const auto& a : args) {
    const bool plain = !a.empty() && a.find_first_of(" \t\"'\\$`") == std::string::npos;
    out += (out.empty() ? "" : " ") + (plain ? a : "'" + a + "'");
  }
  return out;
}

std::string command_line(int argc, const char* const* argv) {
  return command_line(std::vector<std::string>(argv, argv + argc));
}

std::string build_commit() { return VELOXQUANT_GIT_COMMIT; }

std::string machine_description() {
  std::string model = "unknown CPU";
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) model = line.substr(colon + 2);
      break;
    }
  }
  return model + ", " + std::to_string(std::thread::hardware_concurrency()) + " logical cores";
}

}  // namespace vq::eval
