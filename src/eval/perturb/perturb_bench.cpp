// `bench perturb`: the measurement (eval/perturb/perturb_bench.h). Options and planning are in
// perturb_plan.cpp, the result file and its renderers in perturb_report.cpp.
#include "eval/perturb/perturb_bench.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <utility>

#include "engine/run/qfilters_file.h"
#include "eval/perturb/perturb.h"
#include "veloxquant/cache.h"

namespace vq::eval {

namespace {

// The data of one sequence length for every seed, and the full-cache reference per (seed,
// storage dtype): attention outputs of every probe over every token, and the full cache itself
// (its rows identify the planted token).
class SeqData {
 public:
  SeqData(const PerturbOptions& o, std::int64_t seq) : o_(o), seq_(seq) {
    data_.reserve(static_cast<std::size_t>(o.seeds));
    for (std::int64_t s = 0; s < o.seeds; ++s) {
      data_.push_back(make_synthetic(o.geometry, o.heads, seq, o.head_dim, o.probes,
                                     static_cast<std::uint64_t>(s)));
    }
  }

  const SyntheticKV& data(std::int64_t seed) const { return data_[static_cast<std::size_t>(seed)]; }

  struct Reference {
    LayerCache full;
    std::vector<float> outputs;  // [heads][probes][head_dim]
  };

  const Reference& reference(std::int64_t seed, DType dtype) {
    const auto key = std::make_pair(seed, static_cast<int>(dtype));
    auto it = refs_.find(key);
    if (it != refs_.end()) return *it->second;
    const SyntheticKV& kv = data(seed);
    CacheConfig config("full");
    config.set("kv_dtype", std::string(vq::to_string(dtype)));
    auto ref = std::make_unique<Reference>(
        Reference{LayerCache(config, LayerShape{o_.heads, o_.head_dim, 0, 0, 1}), {}});
    ref->full.begin_step(TensorRef::f32(kv.keys.data(), 1, o_.heads, seq_, o_.head_dim),
                         TensorRef::f32(kv.values.data(), 1, o_.heads, seq_, o_.head_dim));
    ref->full.end_step();
    const std::int64_t per_head = o_.probes * o_.head_dim;
    ref->outputs.resize(static_cast<std::size_t>(o_.heads * per_head));
    for (std::int64_t h = 0; h < o_.heads; ++h) {
      attention_outputs(kv.probe(h, 0), o_.probes, o_.head_dim, ref->full.stored(0, h),
                        ref->outputs.data() + h * per_head);
    }
    return *refs_.emplace(key, std::move(ref)).first->second;
  }

 private:
  const PerturbOptions& o_;
  std::int64_t seq_;
  std::vector<SyntheticKV> data_;
  std::map<std::pair<std::int64_t, int>, std::unique_ptr<Reference>> refs_;
};

double mean_of(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += v;
  return x.empty() ? 0.0 : s / static_cast<double>(x.size());
}

double sample_std(const std::vector<double>& x) {
  if (x.size() < 2) return 0.0;
  const double m = mean_of(x);
  double s = 0;
  for (double v : x) s += (v - m) * (v - m);
  return std::sqrt(s / static_cast<double>(x.size() - 1));
}

// True when `kept` still holds the planted token: a row at its position, or a row whose stored
// key is the planted key bit for bit. A merge gives the target the larger position of the two
// rows, so a planted row that absorbed a later row (values-only merge) keeps its key but not
// its position; a row at the planted position may have absorbed earlier rows. Either way the
// row survived eviction, and the perturbation shows what merging did to its value. Quantized
// storage keeps positions, so the position test covers it.
bool holds_planted(const HeadRows& kept, const HeadRows& full, std::int64_t planted,
                   std::int64_t head_dim) {
  const std::size_t es = dtype_size(full.dtype);
  const std::size_t bytes = static_cast<std::size_t>(head_dim) * es;
  const char* planted_key =
      static_cast<const char*>(full.keys) + static_cast<std::size_t>(planted * full.row_stride) * es;
  for (std::int64_t i = 0; i < kept.n_rows; ++i) {
    if (kept.positions[i] == planted) return true;
    if (kept.packed != nullptr || kept.dtype != full.dtype) continue;  // no fp16 key to compare
    const char* key = static_cast<const char*>(kept.keys) +
                      static_cast<std::size_t>(i * kept.row_stride) * es;
    if (std::memcmp(key, planted_key, bytes) == 0) return true;
  }
  return false;
}

// Feeds a case's sequence to the cache (one prefill step or one token per step); returns the
// seconds it took.
double feed(LayerCache& cache, const SyntheticKV& kv, const PerturbOptions& o, std::int64_t S) {
  const std::int64_t H = o.heads, D = o.head_dim;
  const TensorRef all_k = TensorRef::f32(kv.keys.data(), 1, H, S, D);
  const TensorRef all_v = TensorRef::f32(kv.values.data(), 1, H, S, D);
  const auto t0 = std::chrono::steady_clock::now();
  if (o.feed == Feed::kPrefill) {
    cache.begin_step(all_k, all_v);
    cache.end_step();
  } else {
    TensorRef k = all_k, v = all_v;
    k.shape[2] = v.shape[2] = 1;
    for (std::int64_t t = 0; t < S; ++t) {
      k.data = kv.keys.data() + t * D;
      v.data = kv.values.data() + t * D;
      cache.begin_step(k, v);
      cache.end_step();
    }
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// What one data seed measured (means over KV heads).
struct SeedMeasure {
  double perturbation = 0, late = 0, survival = 0, kept_tokens = 0;
};

SeedMeasure measure_heads(const LayerCache& cache, const SyntheticKV& kv,
                          const SeqData::Reference& ref, const PerturbOptions& o) {
  const std::int64_t H = o.heads, D = o.head_dim, P = o.probes;
  double pert = 0, late_share = 0, survived = 0, rows = 0;
  for (std::int64_t h = 0; h < H; ++h) {
    const HeadRows kept = cache.stored(0, h);
    pert += perturbation_vs(kv.probe(h, 0), P, D, ref.outputs.data() + h * P * D, kept);
    rows += static_cast<double>(kept.n_rows);
    if (kv.late_start >= 0 && kept.n_rows > 0) {
      std::int64_t n_late = 0;
      for (std::int64_t i = 0; i < kept.n_rows; ++i) n_late += kept.positions[i] >= kv.late_start;
      late_share += static_cast<double>(n_late) / static_cast<double>(kept.n_rows);
    }
    if (kv.planted_pos >= 0) {
      survived += holds_planted(kept, ref.full.stored(0, h), kv.planted_pos, D) ? 1.0 : 0.0;
    }
  }
  const double hd = static_cast<double>(H);
  return {pert / hd, late_share / hd, survived / hd, rows / hd};
}

PerturbMeasure measure_in(const PerturbOptions& o, SeqData& seq_data, const PerturbCase& c) {
  PerturbMeasure m;
  std::vector<double> late, survival, kept_tokens, kept_bytes, full_bytes, ratio, merges,
      evictions, us;
  for (std::int64_t seed = 0; seed < o.seeds; ++seed) {
    const SyntheticKV& kv = seq_data.data(seed);
    const auto& ref = seq_data.reference(seed, c.config.kv_dtype());
    LayerCache cache(c.config, LayerShape{o.heads, o.head_dim, 0, 0, 1});
    engine::give_random_key_filters(cache, static_cast<std::uint64_t>(seed));  // qfilters
    us.push_back(feed(cache, kv, o, c.seq) * 1e6 / static_cast<double>(c.seq));
    const SeedMeasure s = measure_heads(cache, kv, ref, o);
    m.perturbation.push_back(s.perturbation);
    late.push_back(s.late);
    survival.push_back(s.survival);
    kept_tokens.push_back(s.kept_tokens);
    const CacheStats st = cache.stats();
    kept_bytes.push_back(static_cast<double>(st.kept_bytes));
    full_bytes.push_back(static_cast<double>(st.full_bytes));
    ratio.push_back(st.compression_ratio);
    merges.push_back(static_cast<double>(st.merges));
    evictions.push_back(static_cast<double>(st.evictions));
  }
  m.perturbation_mean = mean_of(m.perturbation);
  m.perturbation_std = sample_std(m.perturbation);
  m.kept_tokens = mean_of(kept_tokens);
  m.kept_bytes = mean_of(kept_bytes);
  m.full_bytes = mean_of(full_bytes);
  m.compression_ratio = mean_of(ratio);
  m.merges = mean_of(merges);
  m.evictions = mean_of(evictions);
  if (o.geometry == Geometry::kShift || o.geometry == Geometry::kStable) {
    m.late_topic_fraction = mean_of(late);
  }
  if (o.geometry == Geometry::kPlanted) m.planted_survival = mean_of(survival);
  m.time_per_token_us = mean_of(us);
  return m;
}

}  // namespace

PerturbMeasure measure_case(const PerturbOptions& options, const PerturbCase& c) {
  SeqData data(options, c.seq);
  return measure_in(options, data, c);
}

std::vector<PerturbRow> run_perturb_rows(const PerturbOptions& options,
                                         const PerturbProgress& progress) {
  const std::vector<PerturbCase> cases = plan_perturb(options);
  std::vector<PerturbRow> rows;
  for (const std::int64_t seq : options.seqs) {
    SeqData data(options, seq);
    for (const PerturbCase& c : cases) {
      if (c.seq != seq) continue;
      const auto t0 = std::chrono::steady_clock::now();
      rows.push_back({c, measure_in(options, data, c)});
      if (progress) {
        progress(rows.size(), cases.size(), c, rows.back().measure,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
    }
  }
  return rows;
}

nlohmann::json run_perturb(const PerturbOptions& options, const std::string& command,
                           const PerturbProgress& progress) {
  return perturb_json(options, run_perturb_rows(options, progress), command);
}

}  // namespace vq::eval
