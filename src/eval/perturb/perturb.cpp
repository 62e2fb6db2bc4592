#include "eval/perturb/perturb.h"

#include <cmath>
#include <cstring>

#include "base/kernels.h"

namespace vq::eval {

void attention_output(const float* q, const HeadRows& packed_or_plain, std::int64_t head_dim,
                      float* out) {
  std::vector<float> kbuf, vbuf;
  const HeadRows rows = dequantized(packed_or_plain, kbuf, vbuf);
  std::vector<float> w(static_cast<std::size_t>(rows.n_rows));
  std::vector<float> v(static_cast<std::size_t>(head_dim));
  const float sqrt_d = std::sqrt(static_cast<float>(head_dim));
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(rows.dtype));
  for (std::int64_t i = 0; i < rows.n_rows; ++i) {
    const void* k = static_cast<const char*>(rows.keys) + i * rows.row_stride * es;
    w[static_cast<std::size_t>(i)] = kernels::dot_row(k, rows.dtype, q, head_dim) / sqrt_d;
  }
  kernels::softmax(w.data(), rows.n_rows);
  for (std::int64_t d = 0; d < head_dim; ++d) out[d] = 0.0f;
  for (std::int64_t i = 0; i < rows.n_rows; ++i) {
    kernels::load_row(static_cast<const char*>(rows.values) + i * rows.row_stride * es, rows.dtype,
                      v.data(), head_dim);
    const float wi = w[static_cast<std::size_t>(i)];
    for (std::int64_t d = 0; d < head_dim; ++d) out[d] += wi * v[static_cast<std::size_t>(d)];
  }
}

double one_minus_cos(const float* a, const float* b, std::int64_t n) {
  if (std::memcmp(a, b, static_cast<std::size_t>(n) * sizeof(float)) == 0) return 0.0;
  double ab = 0, aa = 0, bb = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    ab += static_cast<double>(a[i]) * b[i];
    aa += static_cast<double>(a[i]) * a[i];
    bb += static_cast<double>(b[i]) * b[i];
  }
  if (aa == 0 && bb == 0) return 0.0;
  if (aa == 0 || bb == 0) return 1.0;
  return 1.0 - ab / (std::sqrt(aa) * std::sqrt(bb));
}

void attention_outputs(const float* probes, std::int64_t n_probes, std::int64_t head_dim,
                       const HeadRows& rows, float* out) {
  for (std::int64_t p = 0; p < n_probes; ++p) {
    attention_output(probes + p * head_dim, rows, head_dim, out + p * head_dim);
  }
}

double perturbation_vs(const float* probes, std::int64_t n_probes, std::int64_t head_dim,
                       const float* reference, const HeadRows& compressed) {
  std::vector<float> b(static_cast<std::size_t>(head_dim));
  double total = 0;
  for (std::int64_t p = 0; p < n_probes; ++p) {
    attention_output(probes + p * head_dim, compressed, head_dim, b.data());
    total += one_minus_cos(reference + p * head_dim, b.data(), head_dim);
  }
  return n_probes > 0 ? total / static_cast<double>(n_probes) : 0.0;
}

double head_perturbation(const float* probes, std::int64_t n_probes, std::int64_t head_dim,
                         const HeadRows& full, const HeadRows& compressed) {
  std::vector<float> a(static_cast<std::size_t>(head_dim)), b(static_cast<std::size_t>(head_dim));
  double total = 0;
  for (std::int64_t p = 0; p < n_probes; ++p) {
    attention_output(probes + p * head_dim, full, head_dim, a.data());
    attention_output(probes + p * head_dim, compressed, head_dim, b.data());
    total += one_minus_cos(a.data(), b.data(), head_dim);
  }
  return n_probes > 0 ? total / static_cast<double>(n_probes) : 0.0;
}

}  // namespace vq::eval
