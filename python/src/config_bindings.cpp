// CacheConfig, the method registry and veloxquant.Error.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <string>
#include <variant>

#include "base/validate.h"
#include "bindings.h"
#include "veloxquant/config.h"
#include "veloxquant/errors.h"
#include "veloxquant/registry.h"

namespace py = pybind11;

namespace vq::python {
namespace {

py::object to_python(const FieldValue& v) {
  return std::visit([](const auto& x) -> py::object { return py::cast(x); }, v);
}

// The field `key` names ("budget": the method's budget field), nullptr for unknown keys
// (CacheConfig::set reports those).
const FieldSpec* field_of(const CacheConfig& c, const std::string& key) {
  std::string canonical = c.resolve(key);
  if (canonical.empty() && key == "budget") canonical = c.info().budget_field;
  for (const FieldSpec& f : c.info().fields) {
    if (f.name == canonical) return &f;
  }
  return nullptr;
}

// A Python value for a field: bool, int, float or str, checked against the field's type by
// CacheConfig::set (an int is accepted for a float field). Like set(), this checks no range
// (validate() and the caches do), except what cannot be stored at all: an int outside 64 bits
// and a float that is not finite are refused here, naming the field's documented range.
FieldValue from_python(const CacheConfig& c, const std::string& key, const py::handle& value) {
  const FieldSpec* f = field_of(c, key);
  const std::string name = "[python] " + key;
  if (py::isinstance<py::bool_>(value)) return value.cast<bool>();
  // Python ints and NumPy integers (anything with __index__ that is not a float).
  if (py::isinstance<py::int_>(value) ||
      (PyIndex_Check(value.ptr()) && !PyFloat_Check(value.ptr()))) {
    if (f != nullptr && f->type == FieldType::kFloat) {
      return real_arg(value, name, -DBL_MAX, DBL_MAX);  // stored as a double; range: validate()
    }
    const std::int64_t lo = f != nullptr && f->type == FieldType::kInt
                                ? static_cast<std::int64_t>(f->min) : INT64_MIN;
    const std::int64_t hi = f != nullptr && f->type == FieldType::kInt
                                ? static_cast<std::int64_t>(f->max) : INT64_MAX;
    return int64_arg(value, name, lo, hi);
  }
  if (py::isinstance<py::float_>(value)) {
    const double v = value.cast<double>();
    if (!std::isfinite(v) && f != nullptr && f->type == FieldType::kFloat) {
      validate::check_real(v, name, f->min, f->max);  // throws: not finite
    }
    return v;
  }
  if (py::isinstance<py::str>(value)) {
    // Text goes through the field's parser, so "64" and "true" work for any field type.
    if (f != nullptr && !c.resolve(key).empty()) {
      return f->parse(value.cast<std::string>(), c.method());
    }
    return value.cast<std::string>();
  }
  throw Error(ErrorCode::kInvalidArgument,
              "[python] " + key + " must be a bool, int, float or str, got " +
                  std::string(py::str(value.get_type().attr("__name__"))));
}

py::dict field_dict(const FieldSpec& f) {
  py::dict d;
  d["name"] = f.name;
  d["type"] = to_string(f.type);
  d["default"] = to_python(f.default_value);
  if (f.type == FieldType::kInt || f.type == FieldType::kFloat) {
    d["min"] = f.min;
    d["max"] = f.max;
  } else {
    d["min"] = py::none();
    d["max"] = py::none();
  }
  d["choices"] = f.type == FieldType::kBool ? std::vector<std::string>{"true", "false"} : f.choices;
  d["allowed"] = f.allowed_text();
  d["doc"] = f.doc;
  d["group"] = f.group;  // the shared option group, "" for a field of the method's own
  d["aliases"] = f.aliases;
  return d;
}

py::dict method_dict(const MethodInfo& m) {
  py::dict d;
  d["id"] = m.id;
  d["prefix"] = m.prefix;
  d["summary"] = m.summary;
  d["paper"] = m.paper;
  d["disposition"] = m.disposition;
  d["score_signal"] = m.score_signal;
  d["budget_type"] = m.budget_type;
  d["deviations"] = m.deviations;
  d["has_token_budget"] = !m.budget_field.empty();
  py::list fields;
  for (const FieldSpec& f : m.fields) fields.append(field_dict(f));
  d["fields"] = fields;
  return d;
}

}  // namespace

void bind_config(py::module_& m) {
  // vq::Error -> veloxquant.Error(message) with .code ("invalid_config", ...) and .path; an
  // argument out of range or of the wrong kind (code invalid_argument, base/validate.h's
  // messages) -> veloxquant.ArgumentError, a subclass of both veloxquant.Error and ValueError.
  // The type objects live as long as the process (never destroyed after the interpreter).
  static PyObject* error_type = [&] {
    auto* type = new py::exception<Error>(m, "Error");
    type->attr("__module__") = "veloxquant";
    type->doc() = "A VeloxQuant error: the library's message, .code and .path (file errors)";
    return type->ptr();
  }();
  static PyObject* argument_error_type = [&] {
    const py::tuple bases = py::make_tuple(py::handle(error_type), py::handle(PyExc_ValueError));
    PyObject* type = PyErr_NewExceptionWithDoc(
        "veloxquant.ArgumentError",
        "An argument out of its range or of the wrong kind (code 'invalid_argument'): a "
        "veloxquant.Error and a ValueError",
        bases.ptr(), nullptr);
    if (type == nullptr) throw py::error_already_set();
    m.add_object("ArgumentError", py::handle(type));  // the module takes its own reference
    return type;
  }();
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      PyObject* type =
          e.code() == ErrorCode::kInvalidArgument ? argument_error_type : error_type;
      py::object instance = py::reinterpret_borrow<py::object>(type)(e.what());
      instance.attr("code") = to_string(e.code());
      instance.attr("path") = e.path();
      PyErr_SetObject(type, instance.ptr());
    }
  });

  py::class_<CacheConfig>(m, "CacheConfig",
                          "A method id plus its typed fields (spec: ID[:KEY=VALUE,...])")
      .def(py::init<std::string_view>(), py::arg("method") = "full",
           "The method's defaults; raises Error(unknown_method) listing the known ids")
      .def_static("parse", &CacheConfig::parse, py::arg("spec"),
                  "Parses and validates a spec string; raises Error(invalid_spec / "
                  "unknown_method / invalid_config) with the library's message")
      .def_property_readonly("method", &CacheConfig::method)
      .def("resolve", &CacheConfig::resolve, py::arg("key"),
           "Canonical field name of a key with or without the prefix ('' when none)")
      .def("__contains__", &CacheConfig::has)
      .def(
          "get", [](const CacheConfig& c, std::string_view key) { return to_python(c.get(key)); },
          py::arg("key"))
      .def("__getitem__",
           [](const CacheConfig& c, std::string_view key) { return to_python(c.get(key)); })
      .def(
          "set",
          [](CacheConfig& c, const std::string& key, const py::handle& value) {
            c.set(key, from_python(c, key, value));
          },
          py::arg("key"), py::arg("value"),
          "Sets a field (type-checked); ranges are checked by validate() and by caches")
      .def("__setitem__", [](CacheConfig& c, const std::string& key,
                             const py::handle& value) { c.set(key, from_python(c, key, value)); })
      .def("validate", &CacheConfig::validate)
      .def(
          "fields",
          [](const CacheConfig& c) {
            py::dict d;
            for (const auto& [name, value] : c.fields()) d[py::str(name)] = to_python(value);
            return d;
          },
          "Every field in registry order with its current value")
      .def("spec", &CacheConfig::spec, py::arg("all_fields") = false)
      .def_property_readonly(
          "token_budget",
          [](const CacheConfig& c) -> py::object {
            if (!has_token_budget(c)) return py::none();
            return py::cast(token_budget(c));
          },
          "Rows kept per KV head (None for methods without a budget)")
      .def(
          "with_token_budget",
          [](const CacheConfig& c, const py::handle& budget) {
            if (py::isinstance<py::bool_>(budget)) {
              throw py::type_error("[python] budget must be an int, got bool");
            }
            const FieldSpec* f = field_of(c, "budget");
            // with_token_budget checks the range (with the sinks: streaming_llm).
            return with_token_budget(
                c, int64_arg(budget, "[python] budget",
                           f != nullptr ? static_cast<std::int64_t>(f->min) : INT64_MIN,
                           f != nullptr ? static_cast<std::int64_t>(f->max) : INT64_MAX));
          },
          py::arg("budget"),
           "A validated copy with the token budget set")
      .def("copy", [](const CacheConfig& c) { return CacheConfig(c); })
      .def("__eq__", [](const CacheConfig& a, const CacheConfig& b) { return a == b; })
      .def("__str__", [](const CacheConfig& c) { return c.spec(); })
      .def("__repr__",
           [](const CacheConfig& c) { return "CacheConfig.parse('" + c.spec() + "')"; });

  m.def(
      "registry",
      [] {
        py::list out;
        for (const MethodInfo& info : registry()) out.append(method_dict(info));
        return out;
      },
      "Every registered method (dicts: id, prefix, summary, paper, ..., fields)");
  m.def("method_ids", &method_ids);
  m.def("method_table_markdown", &method_table_markdown);
}

}  // namespace vq::python
