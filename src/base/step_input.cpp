#include "base/step_input.h"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <string>

#include "veloxquant/errors.h"

namespace vq::detail {
namespace {

// Only well-formed, non-empty tensors are checked (step_input.h).
bool checkable(const TensorRef& t) {
  if (t.data == nullptr || t.stride[3] != 1) return false;
  for (const std::int64_t n : t.shape) {
    if (n <= 0) return false;
  }
  return true;
}

std::string list_text(const std::int64_t (&v)[4]) {
  return "[" + std::to_string(v[0]) + ", " + std::to_string(v[1]) + ", " + std::to_string(v[2]) +
         ", " + std::to_string(v[3]) + "]";
}

[[noreturn]] void refuse(const TensorRef& t, std::string_view where, std::string_view name,
                         const std::string& why) {
  throw Error(ErrorCode::kInvalidArgument, std::string(where) + ": " + std::string(name) + " " +
                                               list_text(t.shape) + " " + why);
}

}  // namespace

void check_step_shape(const TensorRef& t, std::string_view where, std::string_view name) {
  if (!checkable(t)) return;
  const std::int64_t B = t.shape[0], H = t.shape[1], S = t.shape[2], D = t.shape[3];
  const auto past = [&](const char* what, std::int64_t got, const char* limit, std::int64_t max) {
    refuse(t, where, name,
           std::string("has ") + what + " " + std::to_string(got) + ", past the limit " +
               std::to_string(max) + " (" + limit + ", include/veloxquant/types.h)");
  };
  if (H > kMaxHeads) past("Hkv", H, "kMaxHeads", kMaxHeads);
  if (D > kMaxHeadDim) past("head_dim", D, "kMaxHeadDim", kMaxHeadDim);
  // B <= B x H, so B alone is bounded by the product's limit before it is formed.
  if (B > kMaxBatchHeads || B * H > kMaxBatchHeads) {
    refuse(t, where, name,
           "has B x Hkv = " + std::to_string(B) + " x " + std::to_string(H) +
               " row stores, past the limit " + std::to_string(kMaxBatchHeads) +
               " (kMaxBatchHeads, include/veloxquant/types.h)");
  }
  if (S > std::numeric_limits<std::int32_t>::max()) {
    past("S", S, "positions are int32", std::numeric_limits<std::int32_t>::max());
  }
}

void check_rows_distinct(const TensorRef& t, std::string_view where, std::string_view name) {
  if (!checkable(t)) return;
  struct Dim {
    const char* name;
    std::int64_t size, stride;  // stride as |stride|
  };
  static const char* const kNames[3] = {"B", "Hkv", "S"};
  Dim dims[3];
  int n = 0;
  for (int i = 0; i < 3; ++i) {
    if (t.shape[i] < 2) continue;  // a dimension of one index has no second row to overlap
    // |INT64_MIN| does not fit: such a stride spans past any buffer (refused below anyway).
    const std::int64_t s = t.stride[i] == std::numeric_limits<std::int64_t>::min()
                               ? std::numeric_limits<std::int64_t>::max()
                               : std::llabs(t.stride[i]);
    dims[n++] = Dim{kNames[i], t.shape[i], s};
  }
  std::stable_sort(dims, dims + n, [](const Dim& a, const Dim& b) { return a.stride < b.stride; });
  // span: the elements covered by one index of the dimensions taken so far (D for a row).
  std::int64_t span = t.shape[3];
  for (int i = 0; i < n; ++i) {
    const Dim& d = dims[i];
    if (d.stride < span) {
      refuse(t, where, name,
             "with strides " + list_text(t.stride) + " has rows that overlap: along " + d.name +
                 " (size " + std::to_string(d.size) + ") the stride is " +
                 std::to_string(d.stride) + " elements, less than the " + std::to_string(span) +
                 " elements of the rows inside it; every (b, h, s) row needs head_dim elements "
                 "of its own (a zero stride, as a broadcast has, is refused: copy the data "
                 "first)");
    }
    std::int64_t reach = 0;
    if (__builtin_mul_overflow(d.stride, d.size - 1, &reach) ||
        __builtin_add_overflow(reach, span, &span)) {
      refuse(t, where, name,
             "with strides " + list_text(t.stride) + " spans more than 2^63 elements");
    }
  }
}

void check_step_input(const TensorRef& t, std::string_view where, std::string_view name) {
  check_step_shape(t, where, name);
  check_rows_distinct(t, where, name);
}

void check_shape_limits(std::int64_t n_layers, std::int64_t n_kv_heads, std::int64_t head_dim,
                        std::int64_t n_query_heads, std::string_view where) {
  const auto limit = [&](const char* field, std::int64_t got, const char* constant,
                         std::int64_t max) {
    if (got <= max) return;
    throw Error(ErrorCode::kInvalidArgument,
                std::string(where) + " " + field + " must be at most " + std::to_string(max) +
                    " (" + constant + ", include/veloxquant/types.h), got " +
                    std::to_string(got));
  };
  limit("n_layers", n_layers, "kMaxLayers", kMaxLayers);
  limit("n_kv_heads", n_kv_heads, "kMaxHeads", kMaxHeads);
  limit("n_query_heads", n_query_heads, "kMaxHeads", kMaxHeads);
  limit("head_dim", head_dim, "kMaxHeadDim", kMaxHeadDim);
}

}  // namespace vq::detail
