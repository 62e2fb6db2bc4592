// `veloxquant list [ID] [--markdown]`: the registered methods, or one method's fields.
#include <fmt/format.h>

#include <iostream>

#include "cli.h"
#include "veloxquant/registry.h"

namespace vq::cli {

void add_list_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("list", "List the KV-cache methods, or one method's fields");
  auto id = std::make_shared<std::string>();
  auto markdown = std::make_shared<bool>(false);
  cmd->add_option("id", *id, "Method id: print its fields with defaults, ranges and docs");
  cmd->add_flag("--markdown", *markdown, "Print the README's method table (markdown)");
  cmd->callback([id, markdown]() {
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
    if (!m.budget_rule.empty()) {
      std::cout << "budget key: " << m.budget_rule << " (budget=B sets " << m.budget_field
                << ", after the spec's other keys)\n";
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
                << ":" << (m.get_budget ? "budget=64" : m.fields.front().name + "=...") << "\n";
    }
  });
}

}  // namespace vq::cli
