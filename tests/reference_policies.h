// Literal, slow reference implementations of the methods.md rules, written independently of
// src/policies (plain vectors of rows, no shared loop), for one (batch, head) at a time. They
// use the library's kernels for dot/softmax so that only the policy logic is under test.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "base/kernels.h"

namespace vq::ref {

struct Row {
  std::vector<float> k, v;
  std::int32_t pos;
  float score = 0;
};

inline std::vector<float> weights(const std::vector<Row>& rows, std::size_t n, const std::vector<float>& q) {
  std::vector<float> w(n);
  const float sd = std::sqrt(static_cast<float>(q.size()));
  for (std::size_t i = 0; i < n; ++i) {
    w[i] = kernels::dot(rows[i].k.data(), q.data(), static_cast<std::int64_t>(q.size())) / sd;
  }
  kernels::softmax(w.data(), static_cast<std::int64_t>(n));
  return w;
}

inline std::size_t argmin(const std::vector<float>& x) {
  std::size_t best = 0;
  for (std::size_t i = 1; i < x.size(); ++i) {
    if (x[i] < x[best]) best = i;
  }
  return best;
}

// Tokens given as (k, v) rows already rounded to the storage type.
struct Token {
  std::vector<float> k, v;
};

inline std::vector<Row> h2o(const std::vector<Token>& toks, std::size_t budget, std::size_t n_sink,
                            std::size_t grace, float decay) {
  std::vector<Row> rows;
  for (std::size_t t = 0; t < toks.size(); ++t) {
    if (rows.empty()) {
      rows.push_back({toks[t].k, toks[t].v, static_cast<std::int32_t>(t), 1.0f});
    } else {
      const auto a = weights(rows, rows.size(), toks[t].k);
      for (std::size_t i = 0; i < rows.size(); ++i) rows[i].score = rows[i].score * decay + a[i];
      rows.push_back({toks[t].k, toks[t].v, static_cast<std::int32_t>(t), 0.0f});
    }
    if (rows.size() > budget) {
      std::vector<float> view(rows.size());
      for (std::size_t i = 0; i < rows.size(); ++i) {
        const bool protect = i < n_sink || i + grace >= rows.size();
        view[i] = protect ? std::numeric_limits<float>::infinity() : rows[i].score;
      }
      rows.erase(rows.begin() + static_cast<std::ptrdiff_t>(argmin(view)));
    }
  }
  return rows;
}

inline std::vector<Row> tova(const std::vector<Token>& toks, std::size_t budget, std::size_t n_sink) {
  std::vector<Row> rows;
  for (std::size_t t = 0; t < toks.size(); ++t) {
    rows.push_back({toks[t].k, toks[t].v, static_cast<std::int32_t>(t)});
    if (rows.size() > budget) {
      auto w = weights(rows, rows.size(), toks[t].k);
      for (std::size_t i = 0; i < n_sink; ++i) w[i] = std::numeric_limits<float>::infinity();
      rows.erase(rows.begin() + static_cast<std::ptrdiff_t>(argmin(w)));
    }
  }
  return rows;
}

inline std::vector<Row> morphkv(const std::vector<Token>& toks, std::size_t budget, std::size_t n_sink,
                                std::size_t window, int fusion /*0 mean 1 sum 2 max*/) {
  std::vector<Row> rows;
  for (std::size_t t = 0; t < toks.size(); ++t) {
    rows.push_back({toks[t].k, toks[t].v, static_cast<std::int32_t>(t)});
    if (rows.size() > budget) {
      const std::size_t n = rows.size(), w = std::min(window, n);
      std::vector<float> rel(n, 0.0f);
      for (std::size_t r = n - w; r < n; ++r) {
        const auto a = weights(rows, n, rows[r].k);
        for (std::size_t j = 0; j < n; ++j) {
          if (r == n - w) rel[j] = a[j];
          else if (fusion == 2) rel[j] = std::max(rel[j], a[j]);
          else rel[j] += a[j];
        }
      }
      for (std::size_t j = 0; j < n; ++j) {
        if (fusion == 0) rel[j] /= static_cast<float>(w);
        if (j < n_sink || j >= n - w) rel[j] = std::numeric_limits<float>::infinity();
      }
      rows.erase(rows.begin() + static_cast<std::ptrdiff_t>(argmin(rel)));
    }
  }
  return rows;
}

inline std::vector<Row> streaming(const std::vector<Token>& toks, std::size_t n_sink, std::size_t window) {
  std::vector<Row> rows;
  for (std::size_t t = 0; t < toks.size(); ++t) {
    rows.push_back({toks[t].k, toks[t].v, static_cast<std::int32_t>(t)});
    if (rows.size() > n_sink + window) rows.erase(rows.begin() + static_cast<std::ptrdiff_t>(n_sink));
  }
  return rows;
}

}  // namespace vq::ref
