// CacheConfig, the method registry and veloxquant.Error.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <variant>

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

// A Python value for a field: bool, int, float or str, checked against the field's type by
// CacheConfig::set (an int is accepted for a float field).
FieldValue from_python(const CacheConfig& c, const std::string& key, const py::handle& value) {
  if (py::isinstance<py::bool_>(value)) return value.cast<bool>();
  if (py::isinstance<py::int_>(value)) return int64_of(value, key);
  if (py::isinstance<py::float_>(value)) return value.cast<double>();
  if (py::isinstance<py::str>(value)) {
    // Text goes through the field's parser, so "64" and "true" work for any field type.
    const std::string canonical = c.resolve(key);
    if (!canonical.empty()) {
      for (const FieldSpec& f : c.info().fields) {
        if (f.name == canonical) return f.parse(value.cast<std::string>(), c.method());
      }
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
  // vq::Error -> veloxquant.Error(message) with .code ("invalid_config", ...) and .path.
  // The type object lives as long as the process (never destroyed after the interpreter).
  static PyObject* error_type = [&] {
    auto* type = new py::exception<Error>(m, "Error");
    type->attr("__module__") = "veloxquant";
    type->doc() = "A VeloxQuant error: the library's message, .code and .path (file errors)";
    return type->ptr();
  }();
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      py::object instance = py::reinterpret_borrow<py::object>(error_type)(e.what());
      instance.attr("code") = to_string(e.code());
      instance.attr("path") = e.path();
      PyErr_SetObject(error_type, instance.ptr());
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
            if (!py::isinstance<py::int_>(budget) || py::isinstance<py::bool_>(budget)) {
              throw Error(ErrorCode::kInvalidArgument,
                          "[python] budget must be an int, got " +
                              std::string(py::str(budget.get_type().attr("__name__"))));
            }
            return with_token_budget(c, int64_of(budget, "budget"));
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
