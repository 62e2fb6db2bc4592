// The `veloxquant._core` extension module: the C++ library seen from Python (pybind11 + NumPy).
// python/veloxquant/__init__.py re-exports it; docs/api.md "From Python" documents the API.
#include <pybind11/pybind11.h>

#include "bindings.h"
#include "veloxquant/version.h"

PYBIND11_MODULE(_core, m) {
  m.doc() = "VeloxQuant: compressed KV caches for transformer inference";
  m.attr("__version__") = vq::kVersion;
  vq::python::bind_config(m);
  vq::python::bind_cache(m);
  vq::python::bind_engine(m);
}
