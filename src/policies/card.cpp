// A method's registry entry from its card: the declarative text in the method's file (see
// methods.h, method_card). Parsed once, when the registry is built; a malformed card is a
// programming error of the library (or of a program registering its own method) and throws
// Error(kInvalidArgument) naming the card and the line.
#include <charconv>
#include <utility>
#include <string>
#include <vector>

#include "policies/fields.h"
#include "policies/methods.h"
#include "veloxquant/errors.h"

namespace vq::detail {
namespace {

std::string trim(std::string_view s) {
  const auto b = s.find_first_not_of(' ');
  if (b == std::string_view::npos) return {};
  const auto e = s.find_last_not_of(' ');
  return std::string(s.substr(b, e - b + 1));
}

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (true) {
    const std::size_t at = s.find(sep, start);
    const std::size_t n = at == std::string_view::npos ? std::string_view::npos : at - start;
    out.push_back(trim(s.substr(start, n)));
    if (at == std::string_view::npos) return out;
    start = at + 1;
  }
}

struct CardReader {
  std::string id = "?";
  std::string line;

  [[noreturn]] void fail(const std::string& why) const {
    throw Error(ErrorCode::kInvalidArgument,
                "method card '" + id + "': " + why + " in line '" + line + "'");
  }
  double number(const std::string& s) const {
    double v = 0;
    const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || r.ec != std::errc() || r.ptr != s.data() + s.size()) {
      fail("bad number '" + s + "'");
    }
    return v;
  }
  std::int64_t integer(const std::string& s) const {
    std::int64_t v = 0;
    const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || r.ec != std::errc() || r.ptr != s.data() + s.size()) {
      fail("bad integer '" + s + "'");
    }
    return v;
  }
  // "[min, max]" -> {min, max}; "{a, b}" -> choices.
  std::vector<std::string> list(const std::string& s, char open, char close) const {
    if (s.size() < 2 || s.front() != open || s.back() != close) {
      fail(std::string("expected ") + open + "..." + close + ", got '" + s + "'");
    }
    return split(std::string_view(s).substr(1, s.size() - 2), ',');
  }

  // | name | type | default | range or choices | doc
  FieldSpec field(const std::string& row) const {
    const std::vector<std::string> cells = split(std::string_view(row).substr(1), '|');
    if (cells.size() < 5) fail("a field row needs | name | type | default | range | doc");
    std::string doc = cells[4];
    for (std::size_t i = 5; i < cells.size(); ++i) {
      if (!cells[i].empty()) doc += " | " + cells[i];
    }
    const std::string& name = cells[0];
    const std::string& type = cells[1];
    const std::string& def = cells[2];
    const std::string& range = cells[3];
    if (type == "int") {
      // "[min, max]", or "{2, 4} in [2, 4]" for an int that takes only the values listed.
      const std::size_t in = range.find(" in ");
      const auto r = list(in == std::string::npos ? range : range.substr(in + 4), '[', ']');
      if (r.size() != 2) fail("an int range is [min, max]");
      FieldSpec f = int_field(name, integer(def), integer(r[0]), integer(r[1]), doc);
      if (in != std::string::npos) f.choices = list(range.substr(0, in), '{', '}');
      return f;
    }
    if (type == "float") {
      const auto r = list(range, '[', ']');
      if (r.size() != 2) fail("a float range is [min, max]");
      return float_field(name, number(def), number(r[0]), number(r[1]), doc);
    }
    if (type == "bool") {
      if (def != "true" && def != "false") fail("a bool default is true or false");
      return bool_field(name, def == "true", doc);
    }
    if (type == "enum") return enum_field(name, def, list(range, '{', '}'), doc);
    fail("unknown field type '" + type + "'");
  }

  // mass: H2O's recent window and decay (fields.h), the one field group a card names (the
  // shared option groups are the registry's: add_shared_options).
  void group(MethodInfo& m, const std::string& g) const {
    if (g == "mass") {
      add_mass_fields(m.fields, m.prefix);
      return;
    }
    for (const char* shared : {"merge", "source", "headwise", "quantize", "demote", "common"}) {
      if (g.rfind(shared, 0) == 0) {
        fail("'" + g + "' is a shared option group, which the registry adds to every method it "
             "applies to (MethodInfo::fields): remove it from the card");
      }
    }
    fail("unknown field group '" + g + "'");
  }
};

// The string member a card key sets, or null.
std::string* text_of(MethodInfo& m, const std::string& key) {
  static const std::pair<const char*, std::string MethodInfo::*> kKeys[] = {
      {"id", &MethodInfo::id}, {"prefix", &MethodInfo::prefix},
      {"summary", &MethodInfo::summary}, {"paper", &MethodInfo::paper},
      {"disposition", &MethodInfo::disposition}, {"score", &MethodInfo::score_signal},
      {"budget", &MethodInfo::budget_type}, {"deviations", &MethodInfo::deviations},
      {"paper config", &MethodInfo::paper_config}, {"defaults", &MethodInfo::defaults_note},
      {"budget field", &MethodInfo::budget_field}, {"budget offset", &MethodInfo::budget_offset},
      {"shared defaults", &MethodInfo::shared_defaults},
  };
  for (const auto& [name, member] : kKeys) {
    if (key == name) return &(m.*member);
  }
  return nullptr;
}

// The yes/no member a card key sets, or null.
bool* flag_of(MethodInfo& m, const std::string& key) {
  static const std::pair<const char*, bool MethodInfo::*> kKeys[] = {
      {"exact budget", &MethodInfo::exact_budget}, {"prefill only", &MethodInfo::prefill_only},
      {"attention", &MethodInfo::scores_attention},
      {"quantizes rows", &MethodInfo::quantizes_rows},
      {"head types", &MethodInfo::head_types},
      {"all or window", &MethodInfo::all_or_window},
      {"token loop", &MethodInfo::token_loop},
  };
  for (const auto& [name, member] : kKeys) {
    if (key == name) return &(m.*member);
  }
  return nullptr;
}

bool yes_no(const CardReader& r, const std::string& v) {
  if (v != "yes" && v != "no") r.fail("expected yes or no");
  return v == "yes";
}

}  // namespace

MethodInfo method_card(std::string_view card, void (*check)(const CacheConfig&),
                       std::unique_ptr<Policy> (*make_policy)(const PolicyContext&)) {
  MethodInfo m;
  CardReader r;
  // Logical lines: a line starting with a space continues the one before it.
  std::vector<std::string> lines;
  std::size_t start = 0;
  while (start <= card.size()) {
    const std::size_t end = card.find('\n', start);
    const std::size_t n = end == std::string_view::npos ? std::string_view::npos : end - start;
    const std::string_view l = card.substr(start, n);
    if (!l.empty() && l.front() == ' ' && !lines.empty()) {
      lines.back() += " " + trim(l);
    } else if (!trim(l).empty()) {
      lines.push_back(trim(l));
    }
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  for (const std::string& l : lines) {
    r.line = l;
    if (l.front() == '|') {
      m.fields.push_back(r.field(l));
      continue;
    }
    const std::size_t colon = l.find(": ");
    if (colon == std::string::npos) r.fail("expected 'key: value' or a '| field |' row");
    const std::string key = l.substr(0, colon), value = trim(l.substr(colon + 2));
    if (key == "id") r.id = value;
    if (key == "groups") {
      for (const std::string& g : split(value, ' ')) {
        if (!g.empty()) r.group(m, g);
      }
    } else if (bool* flag = flag_of(m, key)) {
      *flag = yes_no(r, value);
    } else if (std::string* text = text_of(m, key)) {
      *text = key == "prefix" && value == "-" ? std::string() : value;
    } else {
      r.fail("unknown key '" + key + "'");
    }
  }
  // The budget: the <prefix>_budget field unless the card names another.
  if (m.budget_field.empty() && !m.prefix.empty()) {
    for (const FieldSpec& f : m.fields) {
      if (f.name == m.prefix + "_budget" && f.type == FieldType::kInt) m.budget_field = f.name;
    }
  }
  m.check = check;
  m.make_policy = make_policy;
  return m;
}

}  // namespace vq::detail
