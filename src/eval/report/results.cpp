#include "eval/report/results.h"

#include <fstream>
#include <thread>

#include "eval/report/output_set.h"
#include "veloxquant/errors.h"
#include "veloxquant/registry.h"
#include "veloxquant/version.h"

#ifndef VELOXQUANT_GIT_COMMIT
#define VELOXQUANT_GIT_COMMIT "unknown"
#endif

namespace vq::eval {
void check_writable(const std::string& path) { check_output_path("", path); }

void check_creatable(const std::string& path) { check_output_path("", path); }

void write_file_atomic(const std::string& path, const std::string& content) {
  OutputSet out;
  out.declare("", path);
  out.stage("", content);
  out.commit();
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
