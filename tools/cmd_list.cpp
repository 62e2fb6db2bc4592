// `veloxquant list [ID] [--markdown] [--ids [--with KEY]]`: the registered methods, or one
// method's fields; --ids prints the ids alone, one a line, in registry order (what tests,
// sweep scripts and the fuzz dictionary read instead of a list of their own).
#include <fmt/format.h>

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "cli.h"
#include "veloxquant/errors.h"
#include "veloxquant/registry.h"

namespace vq::cli {
namespace {

// Whether a spec of method m takes `key`: one of its fields, with or without the prefix, an
// alias of one, or `budget` when it has a token budget.
bool takes_key(const MethodInfo& m, const std::string& key) {
  if (key == "budget" && !m.budget_field.empty()) return true;
  for (const auto& f : m.fields) {
    if (f.name == key || (!m.prefix.empty() && f.name == m.prefix + "_" + key)) return true;
    for (const auto& a : f.aliases) {
      if (a == key) return true;
    }
  }
  return false;
}

// Which methods a shared option group applies to (the registry's rule, MethodInfo::fields).
std::string group_note(const std::string& group) {
  if (group == "merge") return "every method that evicts";
  if (group == "source") return "every method scored by attention";
  if (group == "headwise") return "every method scored by attention that evicts row by row";
  if (group == "demote") return "mixed precision; every method that stores plain rows";
  if (group == "quantize") return "every method that stores plain rows";
  if (group == "think") return "ThinK's key-channel pruning; every method that stores plain rows";
  if (group == "common") return "every method";
  return "shared";
}

// `list --ids [--with KEY]`: the ids of the methods whose specs take KEY (all without --with).
void print_ids(const std::string& with) {
  std::string out;
  for (const auto& m : registry()) {
    if (with.empty() || takes_key(m, with)) out += m.id + "\n";
  }
  if (out.empty()) {
    throw Error(ErrorCode::kInvalidArgument,
                "list --ids --with: no registered method takes key '" + with + "'");
  }
  std::cout << out;
}

// The method's own fields, then each shared option group that applies to it: one table each.
void print_fields(const MethodInfo& m) {
  std::vector<std::string> groups{""};
  for (const auto& f : m.fields) {
    if (std::find(groups.begin(), groups.end(), f.group) == groups.end()) {
      groups.push_back(f.group);
    }
  }
  const bool own = std::any_of(m.fields.begin(), m.fields.end(),
                               [](const FieldSpec& f) { return f.group.empty(); });
  if (!own) std::cout << "\nfields of " << m.id << ": none of its own\n";
  for (const std::string& g : groups) {
    if (g.empty() && !own) continue;
    std::cout << "\n"
              << (g.empty() ? "fields of " + m.id : "shared options: " + g + " (" +
                                                        group_note(g) + ")")
              << "\n";
    std::cout << fmt::format("{:<26} {:<6} {:<14} {:<32} {}\n", "field", "type", "default",
                             "allowed", "doc");
    for (const auto& f : m.fields) {
      if (f.group != g) continue;
      std::string doc = f.doc;
      if (!f.aliases.empty()) {
        doc += " (also: ";
        for (std::size_t i = 0; i < f.aliases.size(); ++i) doc += (i ? ", " : "") + f.aliases[i];
        doc += ")";
      }
      std::cout << fmt::format("{:<26} {:<6} {:<14} {:<32} {}\n", f.name, to_string(f.type),
                               value_text(f.default_value), f.allowed_text(), doc);
    }
  }
}

// `list ID`: the method's card, then its own fields and each shared option group it takes.
void print_method(const MethodInfo& m) {
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
  print_fields(m);
  if (!m.prefix.empty()) {
    std::cout << "\nSpec keys may drop the '" << m.prefix << "_' prefix, e.g. " << m.id
              << ":"
              << (!m.budget_field.empty() ? "budget=64" : m.fields.front().name + "=...")
              << "\n";
  }
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
      print_ids(*with);
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
    print_method(find_method(*id));
  });
}

}  // namespace vq::cli
