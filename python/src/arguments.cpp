// Integer and real arguments from Python (bindings.h): CPython's conversions, then the shared
// validators of base/validate.h.
#include <pybind11/pybind11.h>

#include <cmath>
#include <string>
#include <vector>

#include "base/validate.h"
#include "bindings.h"
#include "veloxquant/errors.h"

namespace py = pybind11;

namespace vq::python {
namespace {

std::string type_name(const py::handle& value) {
  return std::string(py::str(value.get_type().attr("__name__")));
}

// A value of the wrong kind: TypeError "<name> must be an int, got float".
[[noreturn]] void wrong_type(const std::string& name, const char* expected,
                             const py::handle& value) {
  throw py::type_error(name + " must be " + expected + ", got " + type_name(value));
}

// The value as a Python int (via __index__), else TypeError.
py::object as_index(const py::handle& value, const std::string& name) {
  if (PyFloat_Check(value.ptr()) || !PyIndex_Check(value.ptr())) wrong_type(name, "an int", value);
  PyObject* index = PyNumber_Index(value.ptr());
  if (index == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(index);
}

// A printable rendering of an int too large for 64 bits: its digits when short, else its size
// (str() of a huge int is slow, and refused past 4300 digits by recent CPython).
std::string big_int_text(const py::object& index) {
  const auto bits = index.attr("bit_length")().cast<std::int64_t>();
  if (bits <= 256) return std::string(py::str(index));
  const bool negative = PyObject_RichCompareBool(index.ptr(), py::int_(0).ptr(), Py_LT) == 1;
  return std::string(negative ? "-" : "") + "an integer of " + std::to_string(bits) + " bits";
}

}  // namespace

std::int64_t int64_arg(const py::handle& value, const std::string& name, std::int64_t lo,
                       std::int64_t hi) {
  const py::object index = as_index(value, name);
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
  if (overflow != 0) {
    validate::fail(name,
                   validate::too_large_problem(big_int_text(index), validate::range_text(lo, hi)));
  }
  return v;
}

std::int64_t int_arg(const py::handle& value, const std::string& name, std::int64_t lo,
                     std::int64_t hi) {
  return validate::check_int(int64_arg(value, name, lo, hi), name, lo, hi);
}

std::uint64_t uint_arg(const py::handle& value, const std::string& name, std::uint64_t lo,
                       std::uint64_t hi) {
  const py::object index = as_index(value, name);
  const unsigned long long v = PyLong_AsUnsignedLongLong(index.ptr());
  if (v == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    PyErr_Clear();  // OverflowError: negative, or past 64 bits
    validate::fail(name,
                   validate::too_large_problem(big_int_text(index), validate::range_text(lo, hi)));
  }
  if (v < lo || v > hi) {
    validate::fail(name, "must be an integer in " + validate::range_text(lo, hi) + ", got " +
                             std::to_string(v));
  }
  return v;
}

std::int64_t index_arg(const py::handle& value, const std::string& name, std::int64_t n) {
  std::int64_t i = 0;
  try {
    i = int64_arg(value, name, 0, n - 1);
  } catch (const Error& e) {  // outside 64 bits: an index out of range all the same
    throw py::index_error(e.what());
  }
  const std::string why = validate::index_problem(i, n);
  if (!why.empty()) throw py::index_error(name + " " + why);
  return i;
}

double real_arg(const py::handle& value, const std::string& name, double lo, double hi,
                bool as_float) {
  // float, int, NumPy scalars: whatever float() takes, except text.
  if (PyUnicode_Check(value.ptr()) || PyBytes_Check(value.ptr()) || !PyNumber_Check(value.ptr())) {
    wrong_type(name, "a number", value);
  }
  const double v = PyFloat_AsDouble(value.ptr());
  if (v == -1.0 && PyErr_Occurred()) {
    const bool overflow = PyErr_ExceptionMatches(PyExc_OverflowError) != 0;
    PyErr_Clear();
    if (!overflow || !PyIndex_Check(value.ptr())) wrong_type(name, "a number", value);
    // An int beyond the double range.
    validate::fail(name, validate::nonfinite_problem(big_int_text(as_index(value, name)), lo, hi));
  }
  // A value used as a float (temperature, top_p) must not round to 0 there: the CLI's rule.
  return as_float ? validate::check_float_real(v, name, lo, hi) : validate::check_real(v, name, lo, hi);
}

std::vector<std::int64_t> int_list_arg(const py::handle& value, const std::string& name,
                                       std::int64_t lo, std::int64_t hi) {
  if (PyUnicode_Check(value.ptr()) || PyBytes_Check(value.ptr()) ||
      !PySequence_Check(value.ptr())) {
    wrong_type(name, "a sequence of ints", value);
  }
  const py::sequence seq = py::reinterpret_borrow<py::sequence>(value);
  std::vector<std::int64_t> out;
  out.reserve(seq.size());
  for (std::size_t i = 0; i < seq.size(); ++i) {
    out.push_back(int_arg(seq[i], name + "[" + std::to_string(i) + "]", lo, hi));
  }
  return out;
}

}  // namespace vq::python
