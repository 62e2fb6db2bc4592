"""VeloxQuant: compressed KV caches for transformer inference, from Python.

The C++ library through pybind11 (the extension module veloxquant._core):

- CacheConfig, registry(), method_ids(): method specs ("h2o:budget=64"), their fields and
  defaults. Bad specs raise veloxquant.Error with the library's message and a .code
  ("invalid_spec", "invalid_config", "unknown_method", ...). An argument out of its range
  raises veloxquant.ArgumentError (a veloxquant.Error and a ValueError) naming the argument,
  the range and the value; one of the wrong kind raises TypeError.
- LayerCache, ModelCache: begin_step(keys, values) with NumPy float32/float16 arrays
  [B, Hkv, S, D] returns a StepView whose keys(b, h) / values(b, h) / positions(b, h) are
  read-only NumPy views into cache storage, valid until end_step(attention=None).
- Model, Tokenizer, generate(), run_forced(), eval(): the reference engine.

See docs/api.md, section "From Python".
"""

from ._core import (  # noqa: F401
    ArgumentError,
    CacheConfig,
    Error,
    LayerCache,
    Model,
    ModelCache,
    StepView,
    Tokenizer,
    __version__,
    eval,
    generate,
    method_ids,
    method_table_markdown,
    registry,
    run_forced,
)
