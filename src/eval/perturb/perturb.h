// Output perturbation: how far attention over a compressed cache moves from the full cache.
#pragma once

#include <cstdint>
#include <vector>

#include "veloxquant/cache.h"

namespace vq::eval {

// out[D] = softmax(q . K^T / sqrt(D)) V over the rows, in fp32 (fixed summation order).
void attention_output(const float* q, const HeadRows& rows, std::int64_t head_dim, float* out);

// 1 - cos(a, b); 0 when both are zero vectors, 1 when exactly one is.
double one_minus_cos(const float* a, const float* b, std::int64_t n);

// attention_output for each of n_probes probes ([n_probes][head_dim]) into out
// ([n_probes][head_dim]).
void attention_outputs(const float* probes, std::int64_t n_probes, std::int64_t head_dim,
                       const HeadRows& rows, float* out);

// Mean over probes of 1 - cos(reference[p], attention output of probe p over `compressed`),
// with reference outputs computed earlier by attention_outputs (over the full cache).
double perturbation_vs(const float* probes, std::int64_t n_probes, std::int64_t head_dim,
                       const float* reference, const HeadRows& compressed);

// Mean over probes of 1 - cos(full output, compressed output) for one head.
// probes: [n_probes][head_dim].
double head_perturbation(const float* probes, std::int64_t n_probes, std::int64_t head_dim,
                         const HeadRows& full, const HeadRows& compressed);

}  // namespace vq::eval
