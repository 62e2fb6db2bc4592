#include "veloxquant/config.h"

#include <charconv>
#include <cmath>
#include <cstring>
#include <set>
#include <string>

#include "policies/fields.h"
#include "policies/methods.h"
#include "veloxquant/errors.h"
#include "veloxquant/registry.h"

namespace vq {
namespace {

std::string int_text(double v) {
  return std::to_string(static_cast<long long>(v));
}

std::string double_text(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string(static_cast<long long>(v));
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, res.ptr);
}

const char* type_article(FieldType t) {
  switch (t) {
    case FieldType::kInt: return "an integer";
    case FieldType::kFloat: return "a number";
    case FieldType::kBool: return "true or false";
    case FieldType::kEnum: return "one of the listed values";
  }
  return "";
}

}  // namespace

const char* to_string(FieldType type) noexcept {
  switch (type) {
    case FieldType::kInt: return "int";
    case FieldType::kFloat: return "float";
    case FieldType::kBool: return "bool";
    case FieldType::kEnum: return "enum";
  }
  return "?";
}

std::string value_text(const FieldValue& value) {
  if (const auto* i = std::get_if<std::int64_t>(&value)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&value)) return double_text(*d);
  if (const auto* b = std::get_if<bool>(&value)) return *b ? "true" : "false";
  return std::get<std::string>(value);
}

std::string FieldSpec::allowed_text() const {
  switch (type) {
    case FieldType::kInt:
      if (!choices.empty()) {  // an integer field that takes only some values, e.g. {2, 4}
        std::string s = "{";
        for (std::size_t i = 0; i < choices.size(); ++i) s += (i ? ", " : "") + choices[i];
        return s + "}";
      }
      return "[" + int_text(min) + ", " + int_text(max) + "]";
    case FieldType::kFloat: return "[" + double_text(min) + ", " + double_text(max) + "]";
    case FieldType::kBool: return "{true, false}";
    case FieldType::kEnum: {
      std::string s = "{";
      for (std::size_t i = 0; i < choices.size(); ++i) s += (i ? ", " : "") + choices[i];
      return s + "}";
    }
  }
  return "";
}

FieldValue FieldSpec::parse(std::string_view text, std::string_view method) const {
  auto bad = [&](const std::string& why = {}) -> Error {
    return Error(ErrorCode::kInvalidSpec, "[" + std::string(method) + "] " + name + " must be " +
                                              type_article(type) + " in " + allowed_text() +
                                              ", got '" + std::string(text) + "'" + why);
  };
  const char* b = text.data();
  const char* e = text.data() + text.size();
  switch (type) {
    case FieldType::kInt: {
      std::int64_t v = 0;
      auto res = std::from_chars(b, e, v);
      if (res.ec == std::errc::result_out_of_range) throw bad(" (outside the 64-bit range)");
      if (text.empty() || res.ec != std::errc() || res.ptr != e) throw bad();
      return v;
    }
    case FieldType::kFloat: {
      double v = 0;
      auto res = std::from_chars(b, e, v);
      if (res.ec == std::errc::result_out_of_range && res.ptr == e) {
        throw bad(" (too small or too large for a double: it would round to 0 or infinity)");
      }
      if (text.empty() || res.ec != std::errc() || res.ptr != e || !std::isfinite(v)) throw bad();
      return v;
    }
    case FieldType::kBool:
      if (text == "true" || text == "1") return true;
      if (text == "false" || text == "0") return false;
      throw bad();
    case FieldType::kEnum:
      for (const auto& c : choices) {
        if (text == c) return c;
      }
      throw bad();
  }
  throw bad();
}

CacheConfig::CacheConfig(std::string_view method) : info_(&find_method(method)) {
  method_ = info_->id;
  values_.reserve(info_->fields.size());
  for (const auto& f : info_->fields) values_.emplace_back(f.name, f.default_value);
}

bool CacheConfig::is_set(std::string_view key) const {
  const std::size_t i = index_of(key);
  return values_[i].second != info_->fields[i].default_value;
}

std::string CacheConfig::resolve(std::string_view key) const {
  for (const auto& f : info_->fields) {
    if (f.name == key) return f.name;
  }
  if (!info_->prefix.empty()) {
    const std::string prefixed = info_->prefix + "_" + std::string(key);
    for (const auto& f : info_->fields) {
      if (f.name == prefixed) return f.name;
    }
  }
  for (const auto& f : info_->fields) {
    for (const auto& a : f.aliases) {
      if (a == key) return f.name;
    }
  }
  return {};
}

std::size_t CacheConfig::index_of(std::string_view key) const {
  const std::string name = resolve(key);
  for (std::size_t i = 0; i < values_.size(); ++i) {
    if (values_[i].first == name) return i;
  }
  std::string allowed;
  for (const auto& f : info_->fields) allowed += (allowed.empty() ? "" : ", ") + f.name;
  throw Error(ErrorCode::kInvalidArgument, "[" + method_ + "] unknown field '" +
                                               std::string(key) + "'; fields: " + allowed);
}

const FieldValue& CacheConfig::get(std::string_view key) const {
  return values_[index_of(key)].second;
}

namespace {
template <typename T>
const T& get_as(const CacheConfig& c, std::string_view key, const FieldValue& v,
                const char* type) {
  if (const T* p = std::get_if<T>(&v)) return *p;
  throw Error(ErrorCode::kInvalidArgument, "[" + c.method() + "] field '" + std::string(key) +
                                               "' is not of type " + type);
}
}  // namespace

std::int64_t CacheConfig::get_int(std::string_view key) const {
  return get_as<std::int64_t>(*this, key, get(key), "int");
}
double CacheConfig::get_float(std::string_view key) const {
  return get_as<double>(*this, key, get(key), "float");
}
bool CacheConfig::get_bool(std::string_view key) const {
  return get_as<bool>(*this, key, get(key), "bool");
}
const std::string& CacheConfig::get_enum(std::string_view key) const {
  return get_as<std::string>(*this, key, get(key), "enum");
}

DType CacheConfig::kv_dtype() const {
  return get_enum("kv_dtype") == "f32" ? DType::kF32 : DType::kF16;
}

void CacheConfig::set(std::string_view key, FieldValue value) {
  if (key == "budget" && resolve(key).empty() && !info_->budget_field.empty()) {
    const auto* b = std::get_if<std::int64_t>(&value);
    if (b == nullptr) {
      throw Error(ErrorCode::kInvalidConfig,
                  "[" + method_ + "] budget must be an integer, got " + value_text(value));
    }
    detail::set_budget_fields(*this, *b);
    return;
  }
  const std::size_t i = index_of(key);
  const FieldSpec& f = info_->fields[i];
  bool ok = false;
  switch (f.type) {
    case FieldType::kInt: ok = std::holds_alternative<std::int64_t>(value); break;
    case FieldType::kFloat:
      if (const auto* iv = std::get_if<std::int64_t>(&value)) value = static_cast<double>(*iv);
      ok = std::holds_alternative<double>(value);
      break;
    case FieldType::kBool: ok = std::holds_alternative<bool>(value); break;
    case FieldType::kEnum: ok = std::holds_alternative<std::string>(value); break;
  }
  if (!ok) {
    throw Error(ErrorCode::kInvalidConfig, "[" + method_ + "] " + f.name + " must be " +
                                               type_article(f.type) + " in " + f.allowed_text() +
                                               ", got " + value_text(value));
  }
  values_[i].second = std::move(value);
}

void CacheConfig::set_text(std::string_view key, std::string_view text) {
  if (key == "budget" && resolve(key).empty() && !info_->budget_field.empty()) {
    std::int64_t b = 0;
    const auto res = std::from_chars(text.data(), text.data() + text.size(), b);
    if (text.empty() || res.ec != std::errc() || res.ptr != text.data() + text.size()) {
      throw Error(ErrorCode::kInvalidSpec,
                  "[" + method_ + "] budget must be an integer, got '" + std::string(text) + "'");
    }
    set(key, b);
    return;
  }
  const std::size_t i = index_of(key);
  set(info_->fields[i].name, info_->fields[i].parse(text, method_));
}

void CacheConfig::validate() const {
  for (std::size_t i = 0; i < values_.size(); ++i) {
    const FieldSpec& f = info_->fields[i];
    const FieldValue& v = values_[i].second;
    bool in_range = true;
    switch (f.type) {
      case FieldType::kInt: {
        const double x = static_cast<double>(std::get<std::int64_t>(v));
        in_range = x >= f.min && x <= f.max;
        break;
      }
      case FieldType::kFloat: {
        const double x = std::get<double>(v);
        in_range = x >= f.min && x <= f.max;  // false for NaN
        break;
      }
      case FieldType::kBool: break;
      case FieldType::kEnum: {
        in_range = false;
        for (const auto& c : f.choices) in_range = in_range || c == std::get<std::string>(v);
        break;
      }
    }
    if (!in_range) {
      const bool is_enum = f.type == FieldType::kEnum;
      throw Error(ErrorCode::kInvalidConfig,
                  "[" + method_ + "] " + f.name + " must be " + (is_enum ? "one of " : "in ") +
                      f.allowed_text() + ", got " + (is_enum ? "'" : "") + value_text(v) +
                      (is_enum ? "'" : ""));
    }
  }
  if (info_->check) info_->check(*this);
  // quantize= on a method with a token budget: the fp16 tail holds the keys of up to
  // residual_length + kivi_group_size - 1 rows before its oldest key group is quantized, so a
  // smaller budget would keep every key in fp16 (and quantize only the values of the rows past
  // residual_length).
  if (has("quantize") && get_enum("quantize") != "none" && has_token_budget(*this)) {
    const std::int64_t budget = token_budget(*this), residual = get_int("residual_length"),
                       group = get_int("kivi_group_size");
    if (budget < residual + group) {
      throw Error(ErrorCode::kInvalidConfig,
                  "[" + method_ + "] quantize=" + get_enum("quantize") +
                      " would never quantize a key: the budget (" + std::to_string(budget) +
                      ") must be >= residual_length (" + std::to_string(residual) +
                      ") + kivi_group_size (" + std::to_string(group) + ") = " +
                      std::to_string(residual + group) +
                      "; lower residual_length or kivi_group_size, or raise the budget");
    }
  }
  detail::check_demote(*this);
  detail::check_kv_dtype(*this);
  detail::check_think(*this);
  detail::check_no_effect(*this);
}

std::string CacheConfig::spec(bool all_fields) const {
  std::string out = method_;
  bool first = true;
  for (std::size_t i = 0; i < values_.size(); ++i) {
    if (!all_fields && values_[i].second == info_->fields[i].default_value) continue;
    out += first ? ":" : ",";
    first = false;
    out += values_[i].first + "=" + value_text(values_[i].second);
  }
  return out;
}

CacheConfig CacheConfig::parse(std::string_view spec) {
  auto bad = [&](const std::string& why) {
    return Error(ErrorCode::kInvalidSpec,
                 "invalid method spec '" + std::string(spec) + "': " + why +
                     " (syntax: ID[:KEY=VALUE[,KEY=VALUE...]], e.g. cam:budget=64,merge=drop)");
  };
  for (char ch : spec) {
    if (ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r') throw bad("spaces are not allowed");
  }
  const std::size_t colon = spec.find(':');
  const std::string_view id = spec.substr(0, colon);
  if (id.empty()) throw bad("the method id is empty");
  CacheConfig config(id);
  if (colon != std::string_view::npos) {
    std::string_view rest = spec.substr(colon + 1);
    if (rest.empty()) throw bad("expected KEY=VALUE after ':'");
    std::set<std::string> seen;
    std::string deferred_budget;
    while (true) {
      const std::size_t comma = rest.find(',');
      const std::string_view item = rest.substr(0, comma);
      const std::size_t eq = item.find('=');
      if (item.empty()) throw bad("empty KEY=VALUE item");
      if (eq == std::string_view::npos) {
        throw bad("expected KEY=VALUE, got '" + std::string(item) + "'");
      }
      const std::string_view key = item.substr(0, eq);
      const std::string_view value = item.substr(eq + 1);
      if (key.empty()) throw bad("empty key in '" + std::string(item) + "'");
      std::string name = config.resolve(key);
      if (name.empty() && key == "budget" && !config.info().budget_field.empty()) {
        // A method without a budget field (streaming_llm): applied after the other keys, since
        // the setter reads them (window = budget - n_sink).
        if (!deferred_budget.empty()) throw bad("key 'budget' is given more than once");
        deferred_budget = std::string(value);
        if (deferred_budget.empty()) deferred_budget = " ";  // parsed (and rejected) below
        if (comma == std::string_view::npos) break;
        rest = rest.substr(comma + 1);
        continue;
      }
      if (name.empty()) {
        std::string allowed;
        const std::string& prefix = config.info().prefix;
        for (const auto& f : config.info().fields) {
          std::string shown = f.name;
          if (!prefix.empty() && shown.rfind(prefix + "_", 0) == 0) {
            shown = shown.substr(prefix.size() + 1) + " (" + f.name + ")";
          }
          allowed += (allowed.empty() ? "" : ", ") + shown;
        }
        throw Error(ErrorCode::kInvalidSpec, "[" + config.method() + "] unknown key '" +
                                                 std::string(key) + "' in spec '" +
                                                 std::string(spec) + "'; allowed keys: " + allowed);
      }
      if (!seen.insert(name).second) {
        throw bad("key '" + name + "' is given more than once");
      }
      config.set_text(name, value);
      if (comma == std::string_view::npos) break;
      rest = rest.substr(comma + 1);
    }
    if (!deferred_budget.empty()) {
      const std::string& field = config.info().budget_field;
      if (!field.empty() && seen.count(field) != 0) {
        throw Error(ErrorCode::kInvalidSpec,
                    "[" + config.method() + "] budget and " + field + " both set the budget (" +
                        "budget = " + config.info().budget_offset + " + " + field +
                        "): give one of them, in spec '" +
                        std::string(spec) + "'");
      }
      config.set_text("budget", deferred_budget == " " ? std::string_view() : deferred_budget);
    }
  }
  config.validate();
  return config;
}

}  // namespace vq
