// `veloxquant list [ID] [--markdown] [--ids [--with KEY]]`: the registered methods, or one
// method's fields; --ids prints the ids alone, one a line, in registry order (what tests,
// sweep scripts and the fuzz dictionary read instead of a list of their own).
#include <fmt/format.h>

#include <iostream>

#include "cli.h"
#include "veloxquant/errors.h"
#include "veloxquant/registry.h"

namespace vq::cli {
namespace {

// Whether a spec of method m takes `key`: one of its fields, with or without the prefix, or
// `budget` when it has a token budget.
bool takes_key(const MethodInfo& m, const std::string& key) {
  if (key == "budget" && !m.budget_field.empty()) return true;
  for (const auto& f : m.fields) {
    if (f.name == key || (!m.prefix.empty() && f.name == m.prefix + "_" + key)) return true;
  }
  return false;
}

}  // namespace

void add_list_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("list", "List the KV-cache methods, or one method's fields");
  auto id = std::make_shared<std::string>();
  auto markdown = std::make_shared<bool>(false);
  cmd->add_option("id", *id, "Method id: print its fields with defaults, ranges and docs");
  cmd->add_flag("--markdown", *markdown, "Print the README's method table (markdown)");
  auto ids = std::make_shared<bool>(false);
  auto with = std::make_shared<std::string>();
  cmd->add_flag("--ids", *ids, "Print the method ids alone, one a line, in registry order");
  cmd->add_option("--with", *with,
                  "With --ids: only the methods whose specs take KEY (a field name, with or "
                  "without the method's prefix; 'budget': the methods with a token budget)")
      ->needs("--ids");
  cmd->callback([id, markdown, ids, with]() {
    if (*ids) {
      if (!id->empty() || *markdown) {
        throw Error(ErrorCode::kInvalidArgument, "list --ids takes no method id and no --markdown");
      }
      std::string out;
      for (const auto& m : registry()) {
        if (with->empty() || takes_key(m, *with)) out += m.id + "\n";
      }
      if (out.empty()) {
        throw Error(ErrorCode::kInvalidArgument,
                    "list --ids --with: no registered method takes key '" + *with + "'");
      }
      std::cout << out;
      return;
    }
    if (*markdown) {
      std::cout << method_table_markdown();
      return;
    }
    if (id->empty()) {
      for (const auto& m : registry()) std::cout << fmt::format("{:<14} {}\n", m.id, m.summary);
      return;
    }
    const MethodInfo& m = find_method(*id);
    std::cout << m.id << ": " << m.summary << "\n";
    std::cout << "paper: " << m.paper << "\n";
    std::cout << "disposition: " << m.disposition << "; score: " << m.score_signal
              << "; budget: " << m.budget_type << "\n";
    std::cout << "deviations from the paper: " << m.deviations << "\n";
    if (!m.paper_config.empty()) std::cout << "paper configuration: " << m.paper_config << "\n";
    if (!m.defaults_note.empty()) std::cout << "defaults: " << m.defaults_note << "\n";
    if (!m.budget_offset.empty()) {
      std::cout << "budget key: budget = " << m.budget_offset << " + " << m.budget_field
                << " (budget=B sets " << m.budget_field << ", after the spec's other keys)\n";
    }
    std::cout << "\n";
    std::cout << fmt::format("{:<26} {:<6} {:<14} {:<32} {}\n", "field", "type", "default",
                             "allowed", "doc");
    for (const auto& f : m.fields) {
      std::cout << fmt::format("{:<26} {:<6} {:<14} {:<32} {}\n", f.name, to_string(f.type),
                               value_text(f.default_value), f.allowed_text(), f.doc);
    }
    if (!m.prefix.empty()) {
      std::cout << "\nSpec keys may drop the '" << m.prefix << "_' prefix, e.g. " << m.id
                << ":"
                << (!m.budget_field.empty() ? "budget=64" : m.fields.front().name + "=...")
                << "\n";
    }
  });
}

}  // namespace vq::cli
