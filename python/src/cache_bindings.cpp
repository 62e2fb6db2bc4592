// LayerCache and ModelCache over NumPy arrays.
//
// Inputs: keys/values are 4-D [B, Hkv, S, D] float32 or float16 arrays. They are read in place
// (no copy) when the last axis is contiguous and every stride is a multiple of the element
// size; otherwise a contiguous copy is made first. Arrays whose rows overlap (a broadcast:
// np.broadcast_to gives zero strides) are refused with ArgumentError, as the C API does, and a
// shape past the limits of types.h is refused before any copy. The cache copies the new rows into its own
// storage during begin_step, so the arrays may change or go away afterwards.
// Views: StepView.keys(b, h) / values(b, h) / positions(b, h) return read-only NumPy arrays that
// point into cache storage (no copy). They are valid until the step's end_step() (or reset());
// after that the memory may be reused, so copy (np.array(a)) what must outlive the step. The
// StepView object refuses to hand out arrays once its step has ended.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cfloat>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/finite_check.h"
#include "base/step_input.h"
#include "bindings.h"
#include "veloxquant/builder.h"
#include "veloxquant/cache.h"
#include "veloxquant/errors.h"

namespace py = pybind11;

namespace vq::python {
namespace {

// A layer cache as Python sees it: owned (standalone) or a model cache's layer. `step` counts
// begin/end/reset events so a StepView can tell that its step is over.
struct LayerHandle {
  std::unique_ptr<LayerCache> owned;
  LayerCache* cache = nullptr;
  std::uint64_t step = 0;
};

struct ModelHandle {
  explicit ModelHandle(const CacheConfig& config, const ModelShape& shape) : cache(config, shape) {
    for (std::int64_t i = 0; i < cache.n_layers(); ++i) {
      auto h = std::make_shared<LayerHandle>();
      h->cache = &cache.layer(i);
      layers.push_back(std::move(h));
    }
  }
  ModelCache cache;
  std::vector<std::shared_ptr<LayerHandle>> layers;
};

struct PyStepView {
  std::shared_ptr<LayerHandle> layer;
  std::uint64_t step = 0;
  StepView view;
};

py::dtype float16_dtype() { return py::dtype("float16"); }

DType dtype_of(const py::array& a, const char* name) {
  if (a.dtype().is(py::dtype::of<float>())) return DType::kF32;
  if (a.dtype().is(float16_dtype())) return DType::kF16;
  throw py::type_error(std::string(name) + " must be a float32 or float16 array, got " +
                       std::string(py::str(a.dtype())));
}

// The array as a TensorRef, reading it in place when the layout allows; `keep` receives the
// contiguous copy otherwise.
TensorRef tensor_of(const py::array& a, const char* name, py::array& keep,
                    const char* layout = "[B, Hkv, S, D]") {
  if (a.ndim() != 4) {
    throw Error(ErrorCode::kShapeMismatch, std::string("[python] ") + name + " must be 4-D " +
                                               layout + ", got " + std::to_string(a.ndim()) +
                                               "-D");
  }
  const DType dtype = dtype_of(a, name);
  const py::ssize_t item = a.itemsize();
  bool in_place = a.shape(3) <= 1 || a.strides(3) == item;
  for (int i = 0; i < 4; ++i) in_place = in_place && a.strides(i) % item == 0 && a.strides(i) >= 0;
  if (!in_place) {
    // The limits before a copy is made (a shape past them would be refused after it).
    TensorRef shape_only;
    shape_only.data = a.data();
    for (int i = 0; i < 4; ++i) shape_only.shape[i] = a.shape(i);
    shape_only.stride[3] = 1;
    detail::check_step_shape(shape_only, std::string("[python] LayerCache.") +
                                             (std::string(name) == "queries" ? "end_step"
                                                                             : "begin_step"),
                             name);
  }
  const py::array& src = in_place ? a : (keep = py::array::ensure(a, py::array::c_style));
  TensorRef t;
  t.data = src.data();
  t.dtype = dtype;
  for (int i = 0; i < 4; ++i) {
    t.shape[i] = src.shape(i);
    t.stride[i] = src.strides(i) / item;
  }
  t.stride[3] = 1;
  return t;
}

void check_open(const PyStepView& v) {
  if (v.layer->step != v.step || !v.layer->cache->step_open()) {
    throw Error(ErrorCode::kInvalidState,
                "[python] this StepView's step has ended (end_step or reset); its rows are gone");
  }
}

// (b, h) of an open step's view, checked against its batch and KV heads (IndexError).
std::pair<std::int64_t, std::int64_t> head_of(const StepView& v, const py::handle& b,
                                              const py::handle& h, const char* entry) {
  const std::string name = std::string("[python] StepView.") + entry + ": (b, h): ";
  return {index_arg(b, name + "b", v.batch()), index_arg(h, name + "h", v.n_kv_heads())};
}

// Read-only arrays over a head's rows; `base` keeps the owner alive.
py::array rows_array(const HeadRows& r, bool keys, std::int64_t head_dim, const py::object& base) {
  if (r.packed != nullptr) {
    // Packed (quantized) rows: the cache keeps no fp32 copy, so this is a dequantized copy
    // [n_rows, head_dim] float32, not a view.
    py::array_t<float> a({static_cast<py::ssize_t>(r.n_rows), static_cast<py::ssize_t>(head_dim)});
    float* out = a.mutable_data();
    for (std::int64_t i = 0; i < r.n_rows; ++i) {
      if (keys) {
        r.packed->load_key(i, out + i * head_dim);
      } else {
        r.packed->load_value(i, out + i * head_dim);
      }
    }
    a.attr("setflags")(py::arg("write") = false);
    return a;
  }
  const bool f32 = r.dtype == DType::kF32;
  const py::ssize_t item = f32 ? 4 : 2;
  py::array a(f32 ? py::dtype::of<float>() : float16_dtype(),
              std::vector<py::ssize_t>{r.n_rows, head_dim},
              std::vector<py::ssize_t>{r.row_stride * item, item}, keys ? r.keys : r.values, base);
  a.attr("setflags")(py::arg("write") = false);
  return a;
}

py::array positions_array(const HeadRows& r, const py::object& base) {
  py::array_t<std::int32_t> a({static_cast<py::ssize_t>(r.n_rows)}, {sizeof(std::int32_t)},
                              r.positions, base);
  a.attr("setflags")(py::arg("write") = false);
  return a;
}

// fp32 copies of every head's rows: keys/values [B, Hkv, R, D], positions [B, Hkv, R]. A head
// with fewer rows than R (head-wise budgets) has zeros and position -1 beyond its own rows.
py::tuple stacked(const StepView& v) {
  const std::int64_t B = v.batch(), H = v.n_kv_heads(), R = v.n_rows(), D = v.head_dim();
  py::array_t<float> k({B, H, R, D}), val({B, H, R, D});
  py::array_t<std::int32_t> pos({B, H, R});
  float* kp = k.mutable_data();
  float* vp = val.mutable_data();
  std::int32_t* pp = pos.mutable_data();
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < H; ++h) {
      const HeadRows& r = v.head(b, h);
      for (std::int64_t i = 0; i < R; ++i) {
        const std::int64_t o = (b * H + h) * R + i;
        if (i >= r.n_rows) {
          pp[o] = -1;
          for (std::int64_t d = 0; d < D; ++d) kp[o * D + d] = vp[o * D + d] = 0.0f;
          continue;
        }
        pp[o] = r.positions[i];
        for (std::int64_t d = 0; d < D; ++d) {
          kp[o * D + d] = r.key(i, d);
          vp[o * D + d] = r.value(i, d);
        }
      }
    }
  }
  return py::make_tuple(k, val, pos);
}

PyStepView begin_step(const std::shared_ptr<LayerHandle>& l, const py::array& keys,
                      const py::array& values) {
  py::array keep_k, keep_v;
  const TensorRef k = tensor_of(keys, "keys", keep_k);
  const TensorRef v = tensor_of(values, "values", keep_v);
  // The limits and rows of their own (a broadcast read in place has zero strides), before the
  // scan below reads every element (base/step_input.h).
  detail::check_step_input(k, "[python] LayerCache.begin_step", "keys");
  detail::check_step_input(v, "[python] LayerCache.begin_step", "values");
  // Non-finite data refused (base/finite_check.h), when the heads and head_dim are the layer's
  // (else begin_step reports the shape).
  const LayerShape& ls = l->cache->shape();
  const auto fits = [&](const TensorRef& t) {
    return (ls.n_kv_heads == 0 || t.heads() == ls.n_kv_heads) &&
           (ls.head_dim == 0 || t.head_dim() == ls.head_dim);
  };
  if (fits(k) && fits(v)) {
    detail::check_finite(k, "[python] LayerCache.begin_step", "keys");
    detail::check_finite(v, "[python] LayerCache.begin_step", "values");
  }
  PyStepView out{l, 0, l->cache->begin_step(k, v)};
  out.step = ++l->step;
  return out;
}

using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;

// A step's probabilities [B, Hq, S, R] as an AttentionRef over `keep` (the array itself when it
// is C-contiguous float32, else a converted copy); non-finite values refused naming `where`.
AttentionRef attention_of(const py::array& attention, FloatArray& keep, const std::string& where) {
  keep = FloatArray::ensure(attention);
  if (!keep) throw py::type_error("attention must be convertible to a float32 array");
  if (keep.ndim() != 4) {
    throw Error(ErrorCode::kShapeMismatch, "[python] attention must be 4-D [B, Hq, S, R], got " +
                                               std::to_string(keep.ndim()) + "-D");
  }
  const AttentionRef ref{keep.data(), keep.shape(0), keep.shape(1), keep.shape(2), keep.shape(3)};
  // The array holds exactly these elements, so the scan is in bounds whatever the shape.
  detail::check_finite(ref, where);
  return ref;
}

void end_step(LayerHandle& l, const std::optional<py::array>& attention,
              const std::optional<py::array>& queries) {
  // The step's pre-RoPE queries [B, Hq, S, D] (expected_attention reads them, and think= until
  // it has chosen its key channels; LayerCache checks the shape against the step), read in
  // place where the layout allows, as keys are.
  py::array keep_q;
  TensorRef q;
  if (queries) {
    q = tensor_of(*queries, "queries", keep_q, "[B, Hq, S, D]");
    detail::check_step_input(q, "[python] LayerCache.end_step", "queries");
    detail::check_finite(q, "[python] LayerCache.end_step", "queries");
  }
  const TensorRef* qp = queries ? &q : nullptr;
  if (!attention) {
    l.cache->end_step(nullptr, qp);
  } else {
    FloatArray keep;
    const AttentionRef ref = attention_of(*attention, keep, "[python] LayerCache.end_step");
    l.cache->end_step(&ref, qp);
  }
  ++l.step;
}

// A float array of exactly `dims` (any float dtype, converted), for the setters below.
py::array_t<float, py::array::c_style | py::array::forcecast> float_array(
    const py::object& x, const std::string& name, const std::vector<py::ssize_t>& dims,
    const char* layout) {
  auto a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(x);
  if (!a) throw Error(ErrorCode::kInvalidArgument, name + " must be a float array");
  bool same = a.ndim() == static_cast<py::ssize_t>(dims.size());
  for (std::size_t i = 0; same && i < dims.size(); ++i) same = a.shape(i) == dims[i];
  if (!same) {
    std::string got = "[";
    for (py::ssize_t i = 0; i < a.ndim(); ++i) got += (i ? ", " : "") + std::to_string(a.shape(i));
    throw Error(ErrorCode::kShapeMismatch, name + " must be " + layout + ", got shape " + got + "]");
  }
  return a;
}

RopePairing pairing_arg(const std::string& pairing, const std::string& name) {
  if (pairing == "interleaved") return RopePairing::kInterleaved;
  if (pairing == "half_split") return RopePairing::kHalfSplit;
  throw Error(ErrorCode::kInvalidArgument, name + "pairing must be \"interleaved\" (llama2.c, "
                                                  "GGUF) or \"half_split\" (Hugging Face), got \"" +
                                                  pairing + "\"");
}

void set_rope(LayerCache& c, const py::object& inv_freq, const std::string& pairing,
              const std::string& name) {
  auto f = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(inv_freq);
  if (!f || f.ndim() != 1) {
    throw Error(ErrorCode::kInvalidArgument,
                name + "inv_freq must be a 1-D float array [head_dim / 2] (empty: no RoPE)");
  }
  c.set_rope(RopeRef{f.size() ? f.data() : nullptr, static_cast<std::int64_t>(f.size()),
                     pairing_arg(pairing, name)});
}

void set_output_gram(LayerCache& c, const py::object& gram, const std::string& name) {
  auto g = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(gram);
  if (!g || g.ndim() != 3 || g.shape(1) != g.shape(2)) {
    throw Error(ErrorCode::kShapeMismatch,
                name + "gram must be a float array [n_query_heads, head_dim, head_dim]");
  }
  c.set_output_gram(g.data(), g.shape(0), g.shape(1));
}

// kvzip's reconstruction step (LayerCache::end_reconstruction_step): the step's rows are
// forgotten whatever happens, so its view ends too.
void end_reconstruction_step(LayerHandle& l, const std::optional<py::array>& attention) {
  struct Ended {  // the view ends once the step is closed (rolled back included)
    LayerHandle& l;
    ~Ended() {
      if (!l.cache->step_open()) ++l.step;
    }
  } ended{l};
  if (!attention) {
    l.cache->end_reconstruction_step(nullptr);
    return;
  }
  FloatArray keep;
  const AttentionRef ref =
      attention_of(*attention, keep, "[python] LayerCache.end_reconstruction_step");
  l.cache->end_reconstruction_step(&ref);
}

// The shape's sizes are any 64-bit ints here; LayerCache checks them.
std::shared_ptr<LayerHandle> make_layer(const CacheConfig& config, const py::handle& n_kv_heads,
                                        const py::handle& head_dim,
                                        const py::handle& n_query_heads, const py::handle& layer,
                                        const py::handle& n_layers) {
  const std::string name = "[python] LayerCache: ";
  auto h = std::make_shared<LayerHandle>();
  h->owned = std::make_unique<LayerCache>(
      config, LayerShape{int_arg(n_kv_heads, name + "n_kv_heads"),
                         int_arg(head_dim, name + "head_dim"),
                         int_arg(n_query_heads, name + "n_query_heads"),
                         int_arg(layer, name + "layer"), int_arg(n_layers, name + "n_layers")});
  h->cache = h->owned.get();
  return h;
}

// A state (save_state) as Python bytes.
py::bytes state_bytes(const std::vector<std::uint8_t>& state) {
  return py::bytes(reinterpret_cast<const char*>(state.data()), state.size());
}

// The bytes of a state given to load_state: any contiguous buffer of bytes (bytes, bytearray,
// memoryview, a uint8 array). Error(kInvalidArgument) naming `what` for anything else.
std::pair<const std::uint8_t*, std::size_t> state_buffer(const py::object& data, const std::string& what) {
  if (!PyObject_CheckBuffer(data.ptr())) {
    throw Error(ErrorCode::kInvalidArgument,
                what + ": data must be bytes (or a buffer of bytes), got " +
                    std::string(py::str(py::type::of(data).attr("__name__"))));
  }
  const py::buffer_info info = py::reinterpret_borrow<py::buffer>(data).request();
  const bool contiguous = info.ndim <= 1 && (info.ndim == 0 || info.strides[0] == info.itemsize);
  if (info.itemsize != 1 || !contiguous) {
    throw Error(ErrorCode::kInvalidArgument,
                what + ": data must be a contiguous buffer of bytes, got items of " +
                    std::to_string(info.itemsize) + " bytes in " + std::to_string(info.ndim) +
                    " dimension(s)");
  }
  return {static_cast<const std::uint8_t*>(info.ptr), static_cast<std::size_t>(info.size)};
}

// A file path: str or os.PathLike.
std::string path_arg(const py::object& path, const std::string& what) {
  const py::object p = py::module_::import("os").attr("fspath")(path);
  if (!py::isinstance<py::str>(p)) {
    throw Error(ErrorCode::kInvalidArgument, what + ": path must be a str or os.PathLike of str");
  }
  return p.cast<std::string>();
}

}  // namespace

py::dict stats_dict(const CacheStats& s) {
  py::dict d;
  d["tokens_seen"] = s.tokens_seen;
  d["tokens_kept"] = s.tokens_kept;
  d["tokens_kept_per_head"] = s.tokens_kept_per_head;
  d["kept_bytes"] = s.kept_bytes;
  d["full_bytes"] = s.full_bytes;
  d["compression_ratio"] = s.compression_ratio;
  d["resident_bytes"] = resident_bytes(s);
  d["allocated_bytes"] = s.allocated_bytes;
  d["evictions"] = s.evictions;
  d["merges"] = s.merges;
  d["retrieval_heads"] = s.retrieval_heads;
  d["retrieval_bytes"] = s.retrieval_bytes;
  d["streaming_heads"] = s.streaming_heads;
  d["streaming_bytes"] = s.streaming_bytes;
  return d;
}

void bind_cache(py::module_& m) {
  py::class_<PyStepView>(m, "StepView",
                         "The rows of an open step: per (b, kv head) every kept row followed by "
                         "the step's new rows. Arrays point into cache storage (no copy) and are "
                         "valid until end_step().")
      .def_property_readonly("batch", [](const PyStepView& v) { return v.view.batch(); })
      .def_property_readonly("n_kv_heads", [](const PyStepView& v) { return v.view.n_kv_heads(); })
      .def_property_readonly("head_dim", [](const PyStepView& v) { return v.view.head_dim(); })
      .def_property_readonly("n_rows", [](const PyStepView& v) { return v.view.n_rows(); })
      .def_property_readonly("n_new", [](const PyStepView& v) { return v.view.n_new(); })
      .def_property_readonly("open",
                             [](const PyStepView& v) {
                               return v.layer->step == v.step && v.layer->cache->step_open();
                             })
      .def_property_readonly("dtype",
                             [](const PyStepView& v) {
                               return v.view.batch() == 0 ? py::dtype::of<float>()
                                      : v.view.head(0, 0).dtype == DType::kF32
                                          ? py::dtype::of<float>()
                                          : float16_dtype();
                             })
      .def(
          "keys",
          [](py::object self, const py::handle& b_arg, const py::handle& h_arg) {
            const PyStepView& v = self.cast<const PyStepView&>();
            check_open(v);
            const auto [b, h] = head_of(v.view, b_arg, h_arg, "keys");
            return rows_array(v.view.head(b, h), true, v.view.head_dim(), self);
          },
          py::arg("b"), py::arg("h"),
          "Keys of (b, h): [n, D] float16/float32, read-only view (n: the head's rows)")
      .def(
          "values",
          [](py::object self, const py::handle& b_arg, const py::handle& h_arg) {
            const PyStepView& v = self.cast<const PyStepView&>();
            check_open(v);
            const auto [b, h] = head_of(v.view, b_arg, h_arg, "values");
            return rows_array(v.view.head(b, h), false, v.view.head_dim(), self);
          },
          py::arg("b"), py::arg("h"), "Values of (b, h): [n, D], read-only view")
      .def(
          "positions",
          [](py::object self, const py::handle& b_arg, const py::handle& h_arg) {
            const PyStepView& v = self.cast<const PyStepView&>();
            check_open(v);
            const auto [b, h] = head_of(v.view, b_arg, h_arg, "positions");
            return positions_array(v.view.head(b, h), self);
          },
          py::arg("b"), py::arg("h"), "True token positions of (b, h): [n] int32, read-only view")
      .def(
          "stack",
          [](const PyStepView& v) {
            check_open(v);
            return stacked(v.view);
          },
          "fp32 copies of every head: (keys [B, Hkv, R, D], values [B, Hkv, R, D], "
          "positions [B, Hkv, R]); a head with fewer rows (headwise=true) is padded with zeros "
          "at position -1");

  py::class_<LayerHandle, std::shared_ptr<LayerHandle>>(
      m, "LayerCache", "One layer's compressed KV cache (see include/veloxquant/cache.h)")
      .def(py::init(&make_layer), py::arg("config"), py::arg("n_kv_heads") = 0,
           py::arg("head_dim") = 0, py::arg("n_query_heads") = 0, py::arg("layer") = 0,
           py::arg("n_layers") = 1)
      .def("begin_step", &begin_step, py::arg("keys"), py::arg("values"), py::keep_alive<0, 1>(),
           "Appends keys/values [B, Hkv, S, D] (float32 or float16) and returns the StepView")
      .def("end_step", &end_step, py::arg("attention") = py::none(),
           py::arg("queries") = py::none(),
           "Closes the step: evicts/merges/quantizes to the budget. attention: the step's "
           "probabilities [B, Hq, S, R] (float32; other dtypes are converted), or None for the "
           "proxy source. queries: the step's pre-RoPE queries [B, Hq, S, D] (float32 or "
           "float16), for a method that reads them (reads_queries: expected_attention; set_rope "
           "first)")
      .def(
          "set_rope",
          [](LayerHandle& l, const py::object& inv_freq, const std::string& pairing) {
            set_rope(*l.cache, inv_freq, pairing, "[python] LayerCache.set_rope: ");
          },
          py::arg("inv_freq"), py::arg("pairing") = "interleaved",
          "The layer's rotary embedding: inv_freq [head_dim / 2] as the engine applies it (after "
          "any scaling), pairing \"interleaved\" (2i, 2i+1) or \"half_split\" (i, i+D/2)")
      .def_property_readonly("has_rope", [](const LayerHandle& l) { return l.cache->has_rope(); })
      .def_property_readonly("reads_queries",
                             [](const LayerHandle& l) { return l.cache->reads_queries(); })
      .def_property_readonly("reads_attention",
                             [](const LayerHandle& l) { return l.cache->reads_attention(); })
      .def(
          "set_output_gram",
          [](LayerHandle& l, const py::object& gram) {
            set_output_gram(*l.cache, gram, "[python] LayerCache.set_output_gram: ");
          },
          py::arg("gram"),
          "The output projection's Gram matrices [n_query_heads, head_dim, head_dim] (per query "
          "head g: W_o^g^T W_o^g), for criticalkv and criticaladakv")
      .def_property_readonly("reads_output_gram",
                             [](const LayerHandle& l) { return l.cache->reads_output_gram(); })
      .def_property_readonly("has_output_gram",
                             [](const LayerHandle& l) { return l.cache->has_output_gram(); })
      .def(
          "set_head_pattern",
          [](LayerHandle& l, const py::object& scores) {
            auto s = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(scores);
            if (!s || s.ndim() != 1) {
              throw Error(ErrorCode::kInvalidArgument,
                          "[python] LayerCache.set_head_pattern: scores must be a 1-D float array "
                          "[n_kv_heads] (empty: estimate from the prompt)");
            }
            l.cache->set_head_pattern(std::vector<float>(s.data(), s.data() + s.size()));
          },
          py::arg("scores"),
          "DuoAttention's per-KV-head scores (the higher, the more a head needs the full context); "
          "empty goes back to the estimate")
      .def("end_reconstruction_step", &end_reconstruction_step, py::arg("attention"),
           "kvzip: closes a reconstruction step (its rows are forgotten); attention: its "
           "queries' probabilities [B, Hq, S, R] over the view's rows (docs/api.md)")
      .def(
          "set_reconstruction", [](LayerHandle& l, bool on) { l.cache->set_reconstruction(on); },
          py::arg("on"),
          "kvzip: the engine runs the reconstruction pass, so prompt steps wait for compress()")
      .def("compress", [](LayerHandle& l) { l.cache->compress(); },
           "kvzip: cuts the rows kept since the prompt by the reconstruction scores")
      .def_property_readonly("reads_reconstruction",
                             [](const LayerHandle& l) { return l.cache->reads_reconstruction(); })
      .def_property_readonly("reconstruction_chunk",
                             [](const LayerHandle& l) { return l.cache->reconstruction_chunk(); })
      .def(
          "update",
          [](const std::shared_ptr<LayerHandle>& l, const py::array& keys,
             const py::array& values) {
            PyStepView v = begin_step(l, keys, values);
            py::tuple out = stacked(v.view);
            end_step(*l, std::nullopt, std::nullopt);
            return out;
          },
          py::arg("keys"), py::arg("values"),
          "begin_step + fp32 copies of the rows + end_step(): (keys, values, positions)")
      .def(
          "stored",
          [](py::object self, const py::handle& b, const py::handle& h) {
            // By value: a reference to the cast result would outlive the caster's temporary.
            const auto l = self.cast<std::shared_ptr<LayerHandle>>();
            // stored() checks (b, h) against the layer's batch and heads.
            const HeadRows r = l->cache->stored(int_arg(b, "[python] LayerCache.stored: b"),
                                                int_arg(h, "[python] LayerCache.stored: h"));
            const std::int64_t D = l->cache->shape().head_dim;
            return py::make_tuple(rows_array(r, true, D, self), rows_array(r, false, D, self),
                                  positions_array(r, self));
          },
          py::arg("b"), py::arg("h"),
          "The rows stored between steps for (b, h): (keys, values, positions), read-only views "
          "valid until the next step")
      .def(
          "row_scores",
          [](const LayerHandle& l, const py::handle& b, const py::handle& h) {
            const std::vector<float> s = l.cache->row_scores(
                int_arg(b, "[python] LayerCache.row_scores: b"),
                int_arg(h, "[python] LayerCache.row_scores: h"));
            return py::array_t<float>(static_cast<py::ssize_t>(s.size()), s.data());
          },
          py::arg("b"), py::arg("h"))
      .def("reset",
           [](LayerHandle& l) {
             l.cache->reset();
             ++l.step;
           })
      .def("save_state", [](const LayerHandle& l) { return state_bytes(l.cache->save_state()); },
           "The cache's state as bytes (docs/api.md, \"Saving and restoring a cache\")")
      .def(
          "load_state",
          [](LayerHandle& l, const py::object& data) {
            const auto [p, n] = state_buffer(data, "[python] LayerCache.load_state");
            l.cache->load_state(p, n);
            ++l.step;
          },
          py::arg("data"), "Restores a state from save_state(); all or nothing")
      .def(
          "save_state_file",
          [](const LayerHandle& l, const py::object& path) {
            l.cache->save_state_file(path_arg(path, "[python] LayerCache.save_state_file"));
          },
          py::arg("path"), "Writes the state to `path` atomically (temporary file, fsync, rename)")
      .def(
          "load_state_file",
          [](LayerHandle& l, const py::object& path) {
            l.cache->load_state_file(path_arg(path, "[python] LayerCache.load_state_file"));
            ++l.step;
          },
          py::arg("path"))
      .def(
          "set_key_filters",
          [](LayerHandle& l, const py::object& filters) {
            // Any float array, flattened: n_kv_heads x head_dim values (LayerCache checks n).
            const auto f = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(filters);
            if (!f) throw Error(ErrorCode::kInvalidArgument, "[python] LayerCache.set_key_filters: "
                                                             "filters must be a float array");
            l.cache->set_key_filters(f.data(), static_cast<std::int64_t>(f.size()));
          },
          py::arg("filters"),
          "Key filters [n_kv_heads, head_dim] of method qfilters (veloxquant calibrate makes them)")
      .def_property_readonly("needs_key_filters",
                             [](const LayerHandle& l) { return l.cache->needs_key_filters(); })
      .def(
          "set_question_length",
          [](LayerHandle& l, std::int64_t n) { l.cache->set_question_length(n); }, py::arg("n"),
          "The last n tokens of the next step are the prompt's question (method finch; 0: none)")
      .def_property_readonly("question_length",
                             [](const LayerHandle& l) { return l.cache->question_length(); })
      .def_property_readonly("reads_question",
                             [](const LayerHandle& l) { return l.cache->reads_question(); })
      .def("stats", [](const LayerHandle& l) { return stats_dict(l.cache->stats()); })
      .def(
          "head_types", [](const LayerHandle& l) { return l.cache->head_types(); },
          "Each (b, h) store's type, b-major: 0 untyped, 1 retrieval head (keeps every row), 2 "
          "streaming head (sinks + window); duoattention")
      .def_property_readonly("step_open", [](const LayerHandle& l) { return l.cache->step_open(); })
      .def_property_readonly("tokens_seen",
                             [](const LayerHandle& l) { return l.cache->tokens_seen(); })
      .def_property_readonly("tokens_kept",
                             [](const LayerHandle& l) { return l.cache->tokens_kept(); })
      .def_property_readonly("budget", [](const LayerHandle& l) { return l.cache->budget(); })
      .def_property_readonly("config", [](const LayerHandle& l) { return l.cache->config(); })
      .def_property_readonly("shape", [](const LayerHandle& l) {
        const LayerShape& s = l.cache->shape();
        py::dict d;
        d["n_kv_heads"] = s.n_kv_heads;
        d["head_dim"] = s.head_dim;
        d["n_query_heads"] = s.n_query_heads;
        d["layer"] = s.layer;
        d["n_layers"] = s.n_layers;
        return d;
      });

  py::class_<ModelHandle, std::shared_ptr<ModelHandle>>(m, "ModelCache",
                                                        "One cache per layer of a model")
      .def(py::init([](const CacheConfig& config, const py::handle& n_layers,
                       const py::handle& n_kv_heads, const py::handle& head_dim,
                       const py::handle& n_query_heads) {
             // Any 64-bit ints here; ModelCache checks the shape.
             const std::string name = "[python] ModelCache: ";
             return std::make_shared<ModelHandle>(
                 config, ModelShape{int_arg(n_layers, name + "n_layers"),
                                    int_arg(n_kv_heads, name + "n_kv_heads"),
                                    int_arg(head_dim, name + "head_dim"),
                                    int_arg(n_query_heads, name + "n_query_heads")});
           }),
           py::arg("config"), py::arg("n_layers"), py::arg("n_kv_heads"), py::arg("head_dim"),
           py::arg("n_query_heads") = 0)
      .def("__len__", [](const ModelHandle& h) { return h.cache.n_layers(); })
      .def(
          "layer",
          [](const ModelHandle& h, const py::handle& i) {
            return h.layers[static_cast<std::size_t>(
                index_arg(i, "[python] ModelCache.layer: i", h.cache.n_layers()))];
          },
          py::arg("i"), py::keep_alive<0, 1>(), "Layer i's cache (keeps the model cache alive)")
      .def(
          "__getitem__",
          [](const ModelHandle& h, const py::handle& i) {
            return h.layers[static_cast<std::size_t>(
                index_arg(i, "[python] ModelCache[i]: i", h.cache.n_layers()))];
          },
          py::keep_alive<0, 1>())
      .def(
          "stats", [](const ModelHandle& h) { return stats_dict(h.cache.stats()); },
          "Sums over layers (tokens_seen and tokens_kept are layer 0's)")
      .def(
          "set_key_filters",
          [](ModelHandle& h, const py::object& filters) {
            const auto f = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(filters);
            if (!f) throw Error(ErrorCode::kInvalidArgument, "[python] ModelCache.set_key_filters: "
                                                             "filters must be a float array");
            h.cache.set_key_filters(f.data(), static_cast<std::int64_t>(f.size()));
          },
          py::arg("filters"),
          "Key filters [n_layers, n_kv_heads, head_dim] of method qfilters (the layout of a "
          "`veloxquant calibrate` file)")
      .def_property_readonly("needs_key_filters",
                             [](const ModelHandle& h) { return h.cache.needs_key_filters(); })
      .def(
          "set_question_length",
          [](ModelHandle& h, std::int64_t n) { h.cache.set_question_length(n); }, py::arg("n"),
          "The last n tokens of the next step are the prompt's question, on every layer (finch)")
      .def_property_readonly("reads_question",
                             [](const ModelHandle& h) { return h.cache.reads_question(); })
      .def("layer_budgets", [](const ModelHandle& h) { return h.cache.layer_budgets(); })
      .def(
          "load_head_pattern",
          [](ModelHandle& h, const std::string& path) {
            h.cache.set_head_pattern(
                load_head_pattern(path, h.cache.n_layers(), h.cache.shape().n_kv_heads));
          },
          py::arg("path"),
          "Reads a DuoAttention head pattern file (full_attention_heads.tsv: one line per layer, "
          "one tab-separated score per KV head) and sets it on every layer (duoattention), "
          "before the first step")
      .def(
          "set_head_pattern",
          [](ModelHandle& h, const py::object& scores) {
            const auto s = float_array(scores, "[python] ModelCache.set_head_pattern: scores",
                                       {h.cache.n_layers(), h.cache.shape().n_kv_heads},
                                       "[n_layers, n_kv_heads]");
            HeadPattern p(static_cast<std::size_t>(s.shape(0)));
            for (py::ssize_t i = 0; i < s.shape(0); ++i) {
              p[static_cast<std::size_t>(i)].assign(s.data() + i * s.shape(1),
                                                     s.data() + (i + 1) * s.shape(1));
            }
            h.cache.set_head_pattern(p);
          },
          py::arg("scores"), "DuoAttention's scores [n_layers, n_kv_heads], every layer at once")
      .def(
          "set_output_gram",
          [](ModelHandle& h, const py::handle& layer, const py::object& gram) {
            const std::string name = "[python] ModelCache.set_output_gram: ";
            const std::int64_t i = index_arg(layer, name + "layer", h.cache.n_layers());
            set_output_gram(h.cache.layer(i), gram, name);
          },
          py::arg("layer"), py::arg("gram"),
          "Layer `layer`'s output-projection Gram matrices [n_query_heads, head_dim, head_dim]")
      .def(
          "set_rope",
          [](ModelHandle& h, const py::object& inv_freq, const std::string& pairing) {
            for (std::int64_t i = 0; i < h.cache.n_layers(); ++i)
              set_rope(h.cache.layer(i), inv_freq, pairing, "[python] ModelCache.set_rope: ");
          },
          py::arg("inv_freq"), py::arg("pairing") = "interleaved",
          "The rotary embedding of every layer (see LayerCache.set_rope)")
      .def("mean_budget", [](const ModelHandle& h) { return h.cache.mean_budget(); })
      .def(
          "observe_layer_similarity",
          [](ModelHandle& h, const py::handle& layer, const py::handle& cosine) {
            const std::string name = "[python] ModelCache.observe_layer_similarity: ";
            h.cache.observe_layer_similarity(
                index_arg(layer, name + "layer", h.cache.n_layers()),
                real_arg(cosine, name + "cosine", -DBL_MAX, DBL_MAX));  // any finite value
          },
          py::arg("layer"), py::arg("cosine"))
      .def("reset",
           [](ModelHandle& h) {
             h.cache.reset();
             for (auto& l : h.layers) ++l->step;
           })
      .def("save_state", [](const ModelHandle& h) { return state_bytes(h.cache.save_state()); },
           "Every layer's state and their shared state as bytes")
      .def(
          "load_state",
          [](ModelHandle& h, const py::object& data) {
            const auto [p, n] = state_buffer(data, "[python] ModelCache.load_state");
            h.cache.load_state(p, n);
            for (auto& l : h.layers) ++l->step;
          },
          py::arg("data"))
      .def(
          "save_state_file",
          [](const ModelHandle& h, const py::object& path) {
            h.cache.save_state_file(path_arg(path, "[python] ModelCache.save_state_file"));
          },
          py::arg("path"))
      .def(
          "load_state_file",
          [](ModelHandle& h, const py::object& path) {
            h.cache.load_state_file(path_arg(path, "[python] ModelCache.load_state_file"));
            for (auto& l : h.layers) ++l->step;
          },
          py::arg("path"))
      .def_property_readonly("config", [](const ModelHandle& h) { return h.cache.config(); })
      .def_property_readonly("n_layers", [](const ModelHandle& h) { return h.cache.n_layers(); });
}

}  // namespace vq::python
