// The C API (include/veloxquant/veloxquant_c.h) over the C++ library.
//
// Every entry point runs its body through guard(), which turns any exception into a status
// code and stores the message in the handle (or in a fresh vq_error for handle-less calls), so
// no exception crosses the C boundary. Handles are plain structs holding the C++ object and the
// strings the API hands out.
#include "veloxquant/veloxquant_c.h"

#include "base/finite_check.h"
#include "base/step_input.h"
#include "base/validate.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "veloxquant/builder.h"
#include "veloxquant/cache.h"
#include "veloxquant/config.h"
#include "veloxquant/errors.h"
#include "veloxquant/registry.h"
#include "veloxquant/version.h"

struct vq_error {
  vq_status status = VQ_OK;
  std::string message;
};

struct vq_config {
  vq::CacheConfig config;
  std::string last_error;
  std::string spec_text;  // storage for vq_config_spec
};

struct vq_layer_cache {
  std::unique_ptr<vq::LayerCache> owned;  // standalone caches
  vq::LayerCache* cache = nullptr;        // owned.get() or a model cache's layer
  std::optional<vq::StepView> view;       // the open step's view
  std::string last_error;
};

struct vq_model_cache {
  std::unique_ptr<vq::ModelCache> cache;
  std::vector<vq_layer_cache> layers;  // borrowed handles, one per layer
  std::string last_error;
};

static_assert(VQ_MAX_LAYERS == vq::kMaxLayers && VQ_MAX_HEADS == vq::kMaxHeads &&
                  VQ_MAX_HEAD_DIM == vq::kMaxHeadDim && VQ_MAX_BATCH_HEADS == vq::kMaxBatchHeads,
              "veloxquant_c.h's shape limits must be types.h's");

namespace {

vq_status status_of(vq::ErrorCode code) {
  switch (code) {
    case vq::ErrorCode::kInvalidConfig:
      return VQ_ERR_INVALID_CONFIG;
    case vq::ErrorCode::kInvalidSpec:
      return VQ_ERR_INVALID_SPEC;
    case vq::ErrorCode::kUnknownMethod:
      return VQ_ERR_UNKNOWN_METHOD;
    case vq::ErrorCode::kShapeMismatch:
      return VQ_ERR_SHAPE_MISMATCH;
    case vq::ErrorCode::kInvalidState:
      return VQ_ERR_INVALID_STATE;
    case vq::ErrorCode::kInvalidArgument:
      return VQ_ERR_INVALID_ARGUMENT;
    case vq::ErrorCode::kFileError:
      return VQ_ERR_FILE;
    case vq::ErrorCode::kIoError:
      return VQ_ERR_IO;
  }
  return VQ_ERR_INTERNAL;
}

// Thrown inside entry points for C-level argument problems (NULL pointers, bad indices).
vq::Error bad_argument(const std::string& message) {
  return vq::Error(vq::ErrorCode::kInvalidArgument, "[capi] " + message);
}

// Hands (status, message) to `sink`; a sink that fails (out of memory while copying the
// message) loses the message, never the status.
template <class Sink>
vq_status report(Sink& sink, vq_status status, const char* message) noexcept {
  try {
    sink(status, message);
  } catch (...) {
  }
  return status;
}

// Runs `body`; on an exception hands its status and message to `sink` and returns the status.
// The message is consumed inside the handler, while the exception object (which owns it) is
// still alive.
template <class Body, class Sink>
vq_status guard(Body&& body, Sink&& sink) noexcept {
  try {
    body();
    return VQ_OK;
  } catch (const vq::Error& e) {
    return report(sink, status_of(e.code()), e.what());
  } catch (const std::bad_alloc&) {
    return report(sink, VQ_ERR_OUT_OF_MEMORY, "[capi] out of memory");
  } catch (const std::exception& e) {
    return report(sink, VQ_ERR_INTERNAL, e.what());
  } catch (...) {
    return report(sink, VQ_ERR_INTERNAL, "[capi] unknown error");
  }
}

// Sink for a handle's last error.
struct ToString {
  std::string* target;
  void operator()(vq_status, const char* message) const {
    if (target != nullptr) *target = message;
  }
};

// Sink for handle-less calls: allocates a vq_error when the caller asked for one.
struct ToError {
  vq_error** target;
  void operator()(vq_status status, const char* message) const {
    if (target == nullptr) return;
    *target = nullptr;
    auto* e = new (std::nothrow) vq_error;
    if (e == nullptr) return;
    e->status = status;
    e->message = message;
    *target = e;
  }
};

template <class T>
T& need(T* p, const char* what) {
  if (p == nullptr) throw bad_argument(std::string(what) + " must not be NULL");
  return *p;
}

// The integer a C caller stored in an enum field. C lets any int sit there; in C++ loading an
// out-of-range value as the enum type is undefined, so the bytes are read as the underlying type.
template <class Enum>
std::underlying_type_t<Enum> raw_value(const Enum& e) {
  std::underlying_type_t<Enum> v;
  std::memcpy(&v, &e, sizeof v);
  return v;
}

vq::DType dtype_of(const vq_dtype& d) {
  const auto v = raw_value(d);
  if (v == VQ_DTYPE_F32) return vq::DType::kF32;
  if (v == VQ_DTYPE_F16) return vq::DType::kF16;
  throw vq::Error(vq::ErrorCode::kShapeMismatch,
                  "[capi] dtype must be VQ_DTYPE_F32 or VQ_DTYPE_F16, got " + std::to_string(v));
}

vq_dtype c_dtype(vq::DType d) { return d == vq::DType::kF32 ? VQ_DTYPE_F32 : VQ_DTYPE_F16; }

vq::TensorRef tensor_of(const vq_tensor& t) {
  vq::TensorRef r;
  r.data = t.data;
  r.dtype = dtype_of(t.dtype);
  for (int i = 0; i < 4; ++i) {
    r.shape[i] = t.shape[i];
    r.stride[i] = t.stride[i];
  }
  return r;
}

// Drops the layer's step view when the call that ends a step leaves no step open: every outcome
// but a refusal that keeps the step (a step a registered scorer threw in is rolled back, so its
// view goes too).
struct CloseViewAtEnd {
  vq_layer_cache& l;
  ~CloseViewAtEnd() {
    if (!l.cache->step_open()) l.view.reset();
  }
};

// A step's attention as the cache's AttentionRef. Its values are scanned for non-finite ones
// (the error names `fn`) only when data is set and the shape is the one the open step accepts;
// otherwise the cache reports the data or the shape.
vq::AttentionRef attention_of(const vq_attention& in, const vq_layer_cache& l, const char* fn) {
  vq::AttentionRef a;
  a.data = in.data;
  a.batch = in.batch;
  a.n_query_heads = in.n_query_heads;
  a.n_queries = in.n_queries;
  a.n_rows = in.n_rows;
  if (a.data != nullptr && l.view && a.batch == l.view->batch() &&
      a.n_queries == l.view->n_new() && a.n_rows == l.view->n_rows() &&
      a.n_query_heads == l.cache->shape().n_query_heads) {
    vq::detail::check_finite(a, fn);
  }
  return a;
}

void fill_rows(const vq::HeadRows& r, std::int64_t head_dim, vq_head_rows* out) {
  out->keys = r.keys;
  out->values = r.values;
  out->positions = r.positions;
  out->dtype = c_dtype(r.dtype);
  out->n_rows = r.n_rows;
  out->row_stride = r.row_stride;
  out->packed = r.packed != nullptr ? 1 : 0;
  out->head_dim = head_dim;
  out->internal = r.packed;
}

void fill_stats(const vq::CacheStats& s, vq_cache_stats* out) {
  out->tokens_seen = s.tokens_seen;
  out->tokens_kept = s.tokens_kept;
  out->kept_bytes = s.kept_bytes;
  out->full_bytes = s.full_bytes;
  out->resident_bytes = s.resident_bytes;
  out->allocated_bytes = s.allocated_bytes;
  out->evictions = s.evictions;
  out->merges = s.merges;
  out->compression_ratio = s.compression_ratio;
}

void check_head(const vq::LayerCache& cache, std::int64_t b, std::int64_t h, std::int64_t batch) {
  vq::validate::check_index(b, "[capi] vq_layer_view_head: (b, h): b", batch);
  vq::validate::check_index(h, "[capi] vq_layer_view_head: (b, h): h", cache.shape().n_kv_heads);
}

// A registry index (size_t) checked against the registry's size.
void check_registry_index(size_t i, const char* name, size_t n) {
  vq::validate::check_index(static_cast<std::int64_t>(std::min<size_t>(i, INT64_MAX)), name,
                            static_cast<std::int64_t>(n));
}

// Registry strings the C structs point at, built once (thread-safe static initialisation).
struct FieldStrings {
  std::string default_text, allowed_text;
  std::vector<const char*> choices;
};
const std::vector<std::vector<FieldStrings>>& registry_strings() {
  static const std::vector<std::vector<FieldStrings>> table = [] {
    static const char* const bool_choices[] = {"true", "false"};
    std::vector<std::vector<FieldStrings>> t;
    for (const vq::MethodInfo& m : vq::registry()) {
      std::vector<FieldStrings>& fields = t.emplace_back();
      for (const vq::FieldSpec& f : m.fields) {
        FieldStrings& s = fields.emplace_back();
        s.default_text = vq::value_text(f.default_value);
        s.allowed_text = f.allowed_text();
        if (f.type == vq::FieldType::kBool) {
          s.choices.assign(bool_choices, bool_choices + 2);
        } else {
          for (const std::string& c : f.choices) s.choices.push_back(c.c_str());
        }
      }
    }
    return t;
  }();
  return table;
}

vq_field_type c_field_type(vq::FieldType t) {
  switch (t) {
    case vq::FieldType::kInt:
      return VQ_FIELD_INT;
    case vq::FieldType::kFloat:
      return VQ_FIELD_FLOAT;
    case vq::FieldType::kBool:
      return VQ_FIELD_BOOL;
    case vq::FieldType::kEnum:
      return VQ_FIELD_ENUM;
  }
  return VQ_FIELD_INT;
}

// A status-only sink for calls that have no handle and no error out-parameter.
struct Drop {
  void operator()(vq_status, const char*) const {}
};

// State save / restore: the state into the caller's buffer (see the header), its size always,
// its bytes when they fit.
void copy_state(const std::vector<std::uint8_t>& state, uint8_t* buf, size_t capacity,
                size_t* size) {
  need(size, "size") = state.size();
  if (buf == nullptr && capacity == 0) return;
  if (buf == nullptr) throw bad_argument("buf must not be NULL when capacity > 0");
  if (capacity < state.size()) {
    throw bad_argument("the state takes " + std::to_string(state.size()) +
                       " bytes, the buffer holds " + std::to_string(capacity) +
                       " (call with buf NULL and capacity 0 for the size)");
  }
  std::memcpy(buf, state.data(), state.size());
}
const std::uint8_t* state_bytes(const uint8_t* data, size_t size) {
  if (data == nullptr && size > 0) throw bad_argument("data must not be NULL when size > 0");
  return data;
}

}  // namespace

extern "C" {

// ---- Version and errors ---------------------------------------------------------------------

int vq_abi_version(void) { return VQ_ABI_VERSION; }

const char* vq_version(void) { return vq::kVersion; }

const char* vq_status_name(vq_status status) {
  switch (raw_value(status)) {
    case VQ_OK:
      return "ok";
    case VQ_ERR_INVALID_CONFIG:
      return "invalid_config";
    case VQ_ERR_INVALID_SPEC:
      return "invalid_spec";
    case VQ_ERR_UNKNOWN_METHOD:
      return "unknown_method";
    case VQ_ERR_SHAPE_MISMATCH:
      return "shape_mismatch";
    case VQ_ERR_INVALID_STATE:
      return "invalid_state";
    case VQ_ERR_INVALID_ARGUMENT:
      return "invalid_argument";
    case VQ_ERR_FILE:
      return "file_error";
    case VQ_ERR_IO:
      return "io_error";
    case VQ_ERR_OUT_OF_MEMORY:
      return "out_of_memory";
    case VQ_ERR_INTERNAL:
      return "internal";
  }
  return "unknown";
}

vq_status vq_error_status(const vq_error* error) {
  return error == nullptr ? VQ_OK : error->status;
}

const char* vq_error_message(const vq_error* error) {
  return error == nullptr ? "" : error->message.c_str();
}

void vq_error_free(vq_error* error) { delete error; }

// ---- Registry -------------------------------------------------------------------------------

size_t vq_registry_count(void) {
  size_t n = 0;
  guard([&] { n = vq::registry().size(); }, Drop{});
  return n;
}

vq_status vq_registry_method(size_t index, vq_method_info* out) {
  return guard(
      [&] {
        const auto& reg = vq::registry();
        need(out, "out");
        check_registry_index(index, "[capi] vq_registry_method: index", reg.size());
        const vq::MethodInfo& m = reg[index];
        out->id = m.id.c_str();
        out->prefix = m.prefix.c_str();
        out->summary = m.summary.c_str();
        out->paper = m.paper.c_str();
        out->disposition = m.disposition.c_str();
        out->score_signal = m.score_signal.c_str();
        out->budget_type = m.budget_type.c_str();
        out->deviations = m.deviations.c_str();
        out->n_fields = m.fields.size();
        out->has_token_budget = m.budget_field.empty() ? 0 : 1;
      },
      Drop{});
}

vq_status vq_registry_field(size_t index, size_t field, vq_field_info* out) {
  return guard(
      [&] {
        const auto& reg = vq::registry();
        need(out, "out");
        check_registry_index(index, "[capi] vq_registry_field: index", reg.size());
        check_registry_index(field, "[capi] vq_registry_field: field", reg[index].fields.size());
        const vq::FieldSpec& f = reg[index].fields[field];
        const FieldStrings& s = registry_strings()[index][field];
        out->name = f.name.c_str();
        out->type = c_field_type(f.type);
        out->default_text = s.default_text.c_str();
        const bool ranged = f.type == vq::FieldType::kInt || f.type == vq::FieldType::kFloat;
        out->min = ranged ? f.min : 0;
        out->max = ranged ? f.max : 0;
        out->n_choices = s.choices.size();
        out->choices = s.choices.empty() ? nullptr : s.choices.data();
        out->allowed_text = s.allowed_text.c_str();
        out->doc = f.doc.c_str();
      },
      Drop{});
}

vq_status vq_registry_find(const char* id, size_t* index) {
  return guard(
      [&] {
        const char* name = &need(id, "id");
        need(index, "index");
        const auto& reg = vq::registry();
        for (size_t i = 0; i < reg.size(); ++i) {
          if (reg[i].id == name) {
            *index = i;
            return;
          }
        }
        throw vq::Error(vq::ErrorCode::kUnknownMethod, std::string("unknown method ") + name);
      },
      Drop{});
}

// ---- Config ---------------------------------------------------------------------------------

vq_status vq_config_create(const char* method, vq_config** out, vq_error** error) {
  return guard(
      [&] {
        need(out, "out");
        auto c = std::make_unique<vq_config>(
            vq_config{vq::CacheConfig(&need(method, "method")), {}, {}});
        *out = c.release();
      },
      ToError{error});
}

vq_status vq_config_parse(const char* spec, vq_config** out, vq_error** error) {
  return guard(
      [&] {
        need(out, "out");
        auto c = std::make_unique<vq_config>(
            vq_config{vq::CacheConfig::parse(&need(spec, "spec")), {}, {}});
        *out = c.release();
      },
      ToError{error});
}

vq_status vq_config_clone(const vq_config* config, vq_config** out, vq_error** error) {
  return guard(
      [&] {
        const vq_config& c = need(config, "config");
        need(out, "out");
        *out = std::make_unique<vq_config>(vq_config{c.config, {}, {}}).release();
      },
      ToError{error});
}

void vq_config_free(vq_config* config) { delete config; }

const char* vq_config_last_error(const vq_config* config) {
  return config == nullptr ? "" : config->last_error.c_str();
}

const char* vq_config_method(const vq_config* config) {
  return config == nullptr ? "" : config->config.method().c_str();
}

// Runs `body(config)` with the config's last error as the sink (NULL config: status only).
#define VQ_CONFIG_CALL(config_ptr, ...)                          \
  do {                                                           \
    if ((config_ptr) == nullptr) return VQ_ERR_INVALID_ARGUMENT; \
    vq_config& c = *(config_ptr);                                \
    return guard([&] { __VA_ARGS__ }, ToString{&c.last_error});  \
  } while (0)

vq_status vq_config_set(vq_config* config, const char* key, const char* value) {
  VQ_CONFIG_CALL(config, c.config.set_text(&need(key, "key"), &need(value, "value")););
}

vq_status vq_config_validate(vq_config* config) { VQ_CONFIG_CALL(config, c.config.validate();); }

vq_status vq_config_get_int(vq_config* config, const char* key, int64_t* out) {
  VQ_CONFIG_CALL(config, {
    const char* k = &need(key, "key");
    need(out, "out");
    *out = c.config.get_int(k);
  });
}

vq_status vq_config_get_float(vq_config* config, const char* key, double* out) {
  VQ_CONFIG_CALL(config, {
    const char* k = &need(key, "key");
    need(out, "out");
    *out = c.config.get_float(k);
  });
}

vq_status vq_config_get_bool(vq_config* config, const char* key, int* out) {
  VQ_CONFIG_CALL(config, {
    const char* k = &need(key, "key");
    need(out, "out");
    *out = c.config.get_bool(k) ? 1 : 0;
  });
}

vq_status vq_config_get_enum(vq_config* config, const char* key, const char** out) {
  VQ_CONFIG_CALL(config, {
    const char* k = &need(key, "key");
    need(out, "out");
    *out = c.config.get_enum(k).c_str();
  });
}

vq_status vq_config_spec(vq_config* config, int all_fields, const char** out) {
  VQ_CONFIG_CALL(config, {
    need(out, "out");
    c.spec_text = c.config.spec(all_fields != 0);
    *out = c.spec_text.c_str();
  });
}

vq_status vq_config_token_budget(vq_config* config, int64_t* out) {
  VQ_CONFIG_CALL(config, {
    need(out, "out");
    *out = vq::token_budget(c.config);
  });
}

vq_status vq_config_set_token_budget(vq_config* config, int64_t budget) {
  VQ_CONFIG_CALL(config, c.config = vq::with_token_budget(c.config, budget););
}

#undef VQ_CONFIG_CALL

// ---- Layer caches ---------------------------------------------------------------------------

vq_status vq_layer_cache_create(const vq_config* config, const vq_layer_shape* shape,
                                vq_layer_cache** out, vq_error** error) {
  return guard(
      [&] {
        const vq_config& c = need(config, "config");
        const vq_layer_shape& s = need(shape, "shape");
        need(out, "out");
        vq::LayerShape ls;
        ls.n_kv_heads = s.n_kv_heads;
        ls.head_dim = s.head_dim;
        ls.n_query_heads = s.n_query_heads;
        ls.layer = s.layer;
        ls.n_layers = s.n_layers == 0 ? 1 : s.n_layers;
        auto handle = std::make_unique<vq_layer_cache>();
        handle->owned = std::make_unique<vq::LayerCache>(c.config, ls);
        handle->cache = handle->owned.get();
        *out = handle.release();
      },
      ToError{error});
}

void vq_layer_cache_free(vq_layer_cache* layer) {
  if (layer != nullptr && layer->owned != nullptr) delete layer;
}

const char* vq_layer_last_error(const vq_layer_cache* layer) {
  return layer == nullptr ? "" : layer->last_error.c_str();
}

#define VQ_LAYER_CALL(layer_ptr, ...)                           \
  do {                                                          \
    if ((layer_ptr) == nullptr) return VQ_ERR_INVALID_ARGUMENT; \
    vq_layer_cache& l = *(layer_ptr);                           \
    return guard([&] { __VA_ARGS__ }, ToString{&l.last_error}); \
  } while (0)

vq_status vq_layer_begin_step(vq_layer_cache* layer, const vq_tensor* keys, const vq_tensor* values,
                              vq_step_view* view) {
  VQ_LAYER_CALL(layer, {
    const vq::TensorRef k = tensor_of(need(keys, "keys"));
    const vq::TensorRef v = tensor_of(need(values, "values"));
    // The limits and distinct rows first: a view naming 2^28 rows of one buffer (zero strides)
    // is refused before the scan below reads them all.
    vq::detail::check_step_input(k, "[capi] vq_layer_begin_step", "keys");
    vq::detail::check_step_input(v, "[capi] vq_layer_begin_step", "values");
    // Scanned only when the heads and head_dim are the layer's (else begin_step reports them).
    const vq::LayerShape& ls = l.cache->shape();
    const auto fits = [&](const vq::TensorRef& t) {
      return (ls.n_kv_heads == 0 || t.heads() == ls.n_kv_heads) &&
             (ls.head_dim == 0 || t.head_dim() == ls.head_dim);
    };
    if (fits(k) && fits(v)) {
      vq::detail::check_finite(k, "[capi] vq_layer_begin_step", "keys");
      vq::detail::check_finite(v, "[capi] vq_layer_begin_step", "values");
    }
    vq::StepView sv = l.cache->begin_step(k, v);
    l.view = sv;
    if (view != nullptr) {
      view->batch = sv.batch();
      view->n_kv_heads = sv.n_kv_heads();
      view->head_dim = sv.head_dim();
      view->n_rows = sv.n_rows();
      view->n_new = sv.n_new();
    }
  });
}

vq_status vq_layer_view_head(vq_layer_cache* layer, int64_t b, int64_t h, vq_head_rows* out) {
  VQ_LAYER_CALL(layer, {
    need(out, "out");
    if (!l.cache->step_open() || !l.view) {
      throw vq::Error(vq::ErrorCode::kInvalidState,
                      "[capi] vq_layer_view_head needs an open step (call vq_layer_begin_step)");
    }
    check_head(*l.cache, b, h, l.view->batch());
    fill_rows(l.view->head(b, h), l.view->head_dim(), out);
  });
}

vq_status vq_layer_end_step(vq_layer_cache* layer, const vq_attention* attention) {
  VQ_LAYER_CALL(layer, {
    // A step the cache rolled back (a registered scorer threw) is over: so is its view.
    const CloseViewAtEnd close_view{l};
    if (attention != nullptr) {
      if (attention->data == nullptr) throw bad_argument("attention->data must not be NULL");
      const vq::AttentionRef a = attention_of(*attention, l, "[capi] vq_layer_end_step");
      l.cache->end_step(&a);
    } else {
      l.cache->end_step(nullptr);
    }
  });
}

vq_status vq_layer_end_step_queries(vq_layer_cache* layer, const vq_attention* attention,
                                    const vq_tensor* queries) {
  VQ_LAYER_CALL(layer, {
    const CloseViewAtEnd close_view{l};
    vq::TensorRef q;
    if (queries != nullptr) {
      q = tensor_of(*queries);
      vq::detail::check_step_input(q, "[capi] vq_layer_end_step_queries", "queries");
      // Scanned only when the shape is the one end_step accepts (else it reports the shape).
      if (l.view && q.data != nullptr && q.batch() == l.view->batch() &&
          q.tokens() == l.view->n_new() && q.heads() == l.cache->shape().n_query_heads &&
          q.head_dim() == l.view->head_dim()) {
        vq::detail::check_finite(q, "[capi] vq_layer_end_step_queries", "queries");
      }
    }
    vq::AttentionRef a;
    if (attention != nullptr) {
      if (attention->data == nullptr) throw bad_argument("attention->data must not be NULL");
      a = attention_of(*attention, l, "[capi] vq_layer_end_step_queries");
    }
    l.cache->end_step(attention != nullptr ? &a : nullptr, queries != nullptr ? &q : nullptr);
  });
}

int vq_layer_reads_queries(const vq_layer_cache* layer) {
  return layer != nullptr && layer->cache->reads_queries() ? 1 : 0;
}

vq_status vq_layer_set_rope(vq_layer_cache* layer, const vq_rope* rope) {
  VQ_LAYER_CALL(layer, {
    need(rope, "rope");
    if (rope->pairing != VQ_ROPE_INTERLEAVED && rope->pairing != VQ_ROPE_HALF_SPLIT) {
      throw bad_argument("rope->pairing must be VQ_ROPE_INTERLEAVED (0) or VQ_ROPE_HALF_SPLIT "
                         "(1), got " + std::to_string(rope->pairing));
    }
    vq::RopeRef r;
    r.inv_freq = rope->inv_freq;
    r.n_pairs = rope->n_pairs;
    r.pairing = rope->pairing == VQ_ROPE_INTERLEAVED ? vq::RopePairing::kInterleaved
                                                     : vq::RopePairing::kHalfSplit;
    l.cache->set_rope(r);
  });
}

vq_status vq_layer_stored(vq_layer_cache* layer, int64_t b, int64_t h, vq_head_rows* out) {
  VQ_LAYER_CALL(layer, {
    need(out, "out");
    fill_rows(l.cache->stored(b, h), l.cache->shape().head_dim, out);  // stored() checks (b, h)
  });
}

vq_status vq_head_rows_load(const vq_head_rows* rows, int64_t row, float* key, float* value) {
  if (rows == nullptr || row < 0 || row >= rows->n_rows) return VQ_ERR_INVALID_ARGUMENT;
  const std::int64_t D = rows->head_dim;
  if (rows->packed != 0) {
    const auto* p = static_cast<const vq::PackedRows*>(rows->internal);
    if (p == nullptr) return VQ_ERR_INVALID_ARGUMENT;
    if (key != nullptr) p->load_key(row, key);
    if (value != nullptr) p->load_value(row, value);
    return VQ_OK;
  }
  if (rows->keys == nullptr || rows->values == nullptr) return VQ_ERR_INVALID_ARGUMENT;
  for (std::int64_t d = 0; d < D; ++d) {
    const std::int64_t i = row * rows->row_stride + d;
    if (rows->dtype == VQ_DTYPE_F32) {
      if (key != nullptr) key[d] = static_cast<const float*>(rows->keys)[i];
      if (value != nullptr) value[d] = static_cast<const float*>(rows->values)[i];
    } else {
      if (key != nullptr) key[d] = vq::half_to_float(static_cast<const std::uint16_t*>(rows->keys)[i]);
      if (value != nullptr)
        value[d] = vq::half_to_float(static_cast<const std::uint16_t*>(rows->values)[i]);
    }
  }
  return VQ_OK;
}

vq_status vq_layer_stats(vq_layer_cache* layer, vq_cache_stats* out) {
  VQ_LAYER_CALL(layer, fill_stats(l.cache->stats(), &need(out, "out")););
}

vq_status vq_layer_kept_per_head(vq_layer_cache* layer, int64_t* counts, size_t n,
                                 size_t* n_heads) {
  VQ_LAYER_CALL(layer, {
    const vq::CacheStats s = l.cache->stats();
    if (counts == nullptr && n > 0) throw bad_argument("counts must not be NULL when n > 0");
    for (size_t i = 0; i < n && i < s.tokens_kept_per_head.size(); ++i) {
      counts[i] = s.tokens_kept_per_head[i];
    }
    if (n_heads != nullptr) *n_heads = s.tokens_kept_per_head.size();
  });
}

vq_status vq_layer_budget(vq_layer_cache* layer, int64_t* out) {
  VQ_LAYER_CALL(layer, need(out, "out") = l.cache->budget(););
}

int vq_layer_step_open(const vq_layer_cache* layer) {
  return layer != nullptr && layer->cache->step_open() ? 1 : 0;
}

vq_status vq_layer_reset(vq_layer_cache* layer) {
  VQ_LAYER_CALL(layer, {
    l.cache->reset();
    l.view.reset();
  });
}

vq_status vq_layer_set_head_pattern(vq_layer_cache* layer, const float* scores, size_t n) {
  VQ_LAYER_CALL(layer, {
    if (scores == nullptr && n > 0) throw bad_argument("scores must not be NULL when n > 0");
    l.cache->set_head_pattern(n == 0 ? std::vector<float>{} : std::vector<float>(scores, scores + n));
  });
}

vq_status vq_layer_head_types(vq_layer_cache* layer, int32_t* types, size_t n, size_t* n_heads) {
  VQ_LAYER_CALL(layer, {
    const std::vector<std::int32_t> t = l.cache->head_types();
    if (types == nullptr && n > 0) throw bad_argument("types must not be NULL when n > 0");
    for (size_t i = 0; i < n && i < t.size(); ++i) types[i] = t[i];
    if (n_heads != nullptr) *n_heads = t.size();
  });
}

vq_status vq_layer_set_key_filters(vq_layer_cache* layer, const float* filters, size_t n) {
  VQ_LAYER_CALL(layer, {
    if (n > static_cast<size_t>(INT64_MAX)) throw bad_argument("n is too large");
    l.cache->set_key_filters(filters, static_cast<int64_t>(n));
  });
}

int vq_layer_needs_key_filters(const vq_layer_cache* layer) {
  return layer != nullptr && layer->cache->needs_key_filters() ? 1 : 0;
}

vq_status vq_layer_set_question_length(vq_layer_cache* layer, int64_t n) {
  VQ_LAYER_CALL(layer, l.cache->set_question_length(n););
}

int vq_layer_reads_question(const vq_layer_cache* layer) {
  return layer != nullptr && layer->cache->reads_question() ? 1 : 0;
}

vq_status vq_layer_set_output_gram(vq_layer_cache* layer, const float* gram,
                                   int64_t n_query_heads, int64_t head_dim) {
  VQ_LAYER_CALL(layer, l.cache->set_output_gram(gram, n_query_heads, head_dim););
}

int vq_layer_reads_output_gram(const vq_layer_cache* layer) {
  return layer != nullptr && layer->cache->reads_output_gram() ? 1 : 0;
}

int vq_layer_reads_reconstruction(const vq_layer_cache* layer) {
  return layer != nullptr && layer->cache->reads_reconstruction() ? 1 : 0;
}

int64_t vq_layer_reconstruction_chunk(const vq_layer_cache* layer) {
  return layer != nullptr ? layer->cache->reconstruction_chunk() : 0;
}

vq_status vq_layer_set_reconstruction(vq_layer_cache* layer, int on) {
  VQ_LAYER_CALL(layer, l.cache->set_reconstruction(on != 0););
}

vq_status vq_layer_end_reconstruction_step(vq_layer_cache* layer, const vq_attention* attention) {
  VQ_LAYER_CALL(layer, {
    const CloseViewAtEnd close_view{l};
    if (attention == nullptr) {
      l.cache->end_reconstruction_step(nullptr);
      return;
    }
    const vq::AttentionRef a =
        attention_of(*attention, l, "[capi] vq_layer_end_reconstruction_step");
    l.cache->end_reconstruction_step(&a);
  });
}

vq_status vq_layer_compress(vq_layer_cache* layer) { VQ_LAYER_CALL(layer, l.cache->compress();); }

// ---- Model caches ---------------------------------------------------------------------------

vq_status vq_model_cache_create(const vq_config* config, const vq_model_shape* shape,
                                vq_model_cache** out, vq_error** error) {
  return guard(
      [&] {
        const vq_config& c = need(config, "config");
        const vq_model_shape& s = need(shape, "shape");
        need(out, "out");
        const vq::ModelShape ms{s.n_layers, s.n_kv_heads, s.head_dim, s.n_query_heads};
        auto handle = std::make_unique<vq_model_cache>();
        handle->cache = std::make_unique<vq::ModelCache>(c.config, ms);
        handle->layers.resize(static_cast<size_t>(handle->cache->n_layers()));
        for (std::int64_t i = 0; i < handle->cache->n_layers(); ++i) {
          handle->layers[static_cast<size_t>(i)].cache = &handle->cache->layer(i);
        }
        *out = handle.release();
      },
      ToError{error});
}

void vq_model_cache_free(vq_model_cache* cache) { delete cache; }

const char* vq_model_cache_last_error(const vq_model_cache* cache) {
  return cache == nullptr ? "" : cache->last_error.c_str();
}

int64_t vq_model_cache_n_layers(const vq_model_cache* cache) {
  return cache == nullptr ? 0 : cache->cache->n_layers();
}

#define VQ_MODEL_CALL(cache_ptr, ...)                           \
  do {                                                          \
    if ((cache_ptr) == nullptr) return VQ_ERR_INVALID_ARGUMENT; \
    vq_model_cache& m = *(cache_ptr);                           \
    return guard([&] { __VA_ARGS__ }, ToString{&m.last_error}); \
  } while (0)

vq_status vq_model_cache_layer(vq_model_cache* cache, int64_t i, vq_layer_cache** out) {
  VQ_MODEL_CALL(cache, {
    need(out, "out");
    vq::validate::check_index(i, "[capi] vq_model_cache_layer: i", m.cache->n_layers());
    *out = &m.layers[static_cast<size_t>(i)];
  });
}

vq_status vq_model_cache_stats(vq_model_cache* cache, vq_cache_stats* out) {
  VQ_MODEL_CALL(cache, fill_stats(m.cache->stats(), &need(out, "out")););
}

vq_status vq_model_cache_layer_budgets(vq_model_cache* cache, int64_t* out, size_t n) {
  VQ_MODEL_CALL(cache, {
    if (out == nullptr && n > 0) throw bad_argument("out must not be NULL when n > 0");
    const std::vector<std::int64_t> budgets = m.cache->layer_budgets();
    for (size_t i = 0; i < n && i < budgets.size(); ++i) out[i] = budgets[i];
  });
}

vq_status vq_model_cache_observe_layer_similarity(vq_model_cache* cache, int64_t layer,
                                                  double cosine) {
  VQ_MODEL_CALL(cache, m.cache->observe_layer_similarity(layer, cosine););
}

vq_status vq_model_cache_reset(vq_model_cache* cache) {
  VQ_MODEL_CALL(cache, {
    m.cache->reset();
    for (vq_layer_cache& l : m.layers) l.view.reset();
  });
}

vq_status vq_model_cache_set_head_pattern(vq_model_cache* cache, const float* scores, size_t n) {
  VQ_MODEL_CALL(cache, {
    if (scores == nullptr && n > 0) throw bad_argument("scores must not be NULL when n > 0");
    const std::int64_t L = m.cache->n_layers(), H = m.cache->shape().n_kv_heads;
    vq::HeadPattern p(static_cast<size_t>(L));
    if (n > 0) {
      if (n != static_cast<size_t>(L * H)) {
        throw bad_argument("head pattern: expected n_layers x n_kv_heads = " +
                           std::to_string(L * H) + " scores, found " + std::to_string(n));
      }
      for (std::int64_t i = 0; i < L; ++i) {
        p[static_cast<size_t>(i)].assign(scores + i * H, scores + (i + 1) * H);
      }
    }
    m.cache->set_head_pattern(p);
  });
}

vq_status vq_model_cache_load_head_pattern(vq_model_cache* cache, const char* path) {
  VQ_MODEL_CALL(cache, {
    if (path == nullptr) throw bad_argument("path must not be NULL");
    m.cache->set_head_pattern(
        vq::load_head_pattern(path, m.cache->n_layers(), m.cache->shape().n_kv_heads));
  });
}

vq_status vq_model_cache_set_key_filters(vq_model_cache* cache, const float* filters, size_t n) {
  VQ_MODEL_CALL(cache, {
    if (n > static_cast<size_t>(INT64_MAX)) throw bad_argument("n is too large");
    m.cache->set_key_filters(filters, static_cast<int64_t>(n));
  });
}

vq_status vq_model_cache_set_question_length(vq_model_cache* cache, int64_t n) {
  VQ_MODEL_CALL(cache, m.cache->set_question_length(n););
}

// ---- State save / restore ----------------------------------------------------------------
vq_status vq_layer_save_state(vq_layer_cache* layer, uint8_t* buf, size_t capacity, size_t* size) {
  VQ_LAYER_CALL(layer, copy_state(l.cache->save_state(), buf, capacity, size););
}

vq_status vq_layer_load_state(vq_layer_cache* layer, const uint8_t* data, size_t size) {
  VQ_LAYER_CALL(layer, {
    l.cache->load_state(state_bytes(data, size), size);
    l.view.reset();
  });
}

vq_status vq_layer_save_state_file(vq_layer_cache* layer, const char* path) {
  VQ_LAYER_CALL(layer, l.cache->save_state_file(&need(path, "path")););
}

vq_status vq_layer_load_state_file(vq_layer_cache* layer, const char* path) {
  VQ_LAYER_CALL(layer, {
    l.cache->load_state_file(&need(path, "path"));
    l.view.reset();
  });
}

vq_status vq_model_cache_save_state(vq_model_cache* cache, uint8_t* buf, size_t capacity,
                                    size_t* size) {
  VQ_MODEL_CALL(cache, copy_state(m.cache->save_state(), buf, capacity, size););
}

vq_status vq_model_cache_load_state(vq_model_cache* cache, const uint8_t* data, size_t size) {
  VQ_MODEL_CALL(cache, {
    m.cache->load_state(state_bytes(data, size), size);
    for (vq_layer_cache& l : m.layers) l.view.reset();
  });
}

vq_status vq_model_cache_save_state_file(vq_model_cache* cache, const char* path) {
  VQ_MODEL_CALL(cache, m.cache->save_state_file(&need(path, "path")););
}

vq_status vq_model_cache_load_state_file(vq_model_cache* cache, const char* path) {
  VQ_MODEL_CALL(cache, {
    m.cache->load_state_file(&need(path, "path"));
    for (vq_layer_cache& l : m.layers) l.view.reset();
  });
}

#undef VQ_LAYER_CALL
#undef VQ_MODEL_CALL

}  // extern "C"

