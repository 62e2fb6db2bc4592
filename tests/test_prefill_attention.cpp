// Tiled prefill attention (docs/engine.md "Prefill attention"): the engine computes a chunk's
// attention a tile of query tokens at a time, and materialises the chunk's probabilities
// [Hq][S][R] only for a cache that reads them. Expected values come from a reference forward
// written here with the per-query attention the engine used before tiling (one query token at a
// time, the probabilities always materialised and always passed to the cache): logits, kept rows
// and row scores must be identical bit for bit, for GQA shapes, chunks that are not a multiple
// of the tile, and 1, 2 and 3 threads. The methods are the registry's (every registered method,
// at its defaults; no list of ids here), and whether each reads the probabilities is derived from
// what it does with them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "base/kernels.h"
#include "engine/compute/matmul.h"
#include "engine/compute/ops.h"
#include "engine/compute/parallel.h"
#include "engine/model/model.h"
#include "engine/model/transformer.h"
#include "attention_util.h"
#include "engine_test_util.h"
#include "engine/run/resources.h"
#include "veloxquant/builder.h"
#include "veloxquant/config.h"
#include "veloxquant/registry.h"

namespace vq {
namespace {

using engine::Model;
using engine::ModelConfig;
using engine::RunState;
namespace ops = engine::ops;

std::size_t sz(std::int64_t n) { return static_cast<std::size_t>(n); }

// A random llama2.c checkpoint (fp32) of the given shape, written and loaded.
struct Llama2cShape {
  std::int32_t dim, hidden, layers, heads, kv_heads, vocab, seq_len;
};
Model random_model(const Llama2cShape& s, const std::string& name) {
  std::string b;
  for (std::int32_t v : {s.dim, s.hidden, s.layers, s.heads, s.kv_heads, s.vocab, s.seq_len})
    test::append_pod(b, v);
  const std::size_t L = sz(s.layers), D = sz(s.dim), H = sz(s.hidden), V = sz(s.vocab);
  const std::size_t hd = D / sz(s.heads), kvd = sz(s.kv_heads) * hd;
  std::uint64_t seed = 101;
  auto put = [&](std::size_t n, float scale, float offset) {
    std::vector<float> v = test::randn(n, seed++, scale);
    for (float& x : v) x += offset;
    test::append_floats(b, v);
  };
  put(V * D, 0.5f, 0.0f);        // embedding (tied classifier)
  put(L * D, 0.1f, 1.0f);        // attention norms
  put(L * D * D, 0.4f, 0.0f);    // wq
  put(L * kvd * D, 0.4f, 0.0f);  // wk
  put(L * kvd * D, 0.4f, 0.0f);  // wv
  put(L * D * D, 0.3f, 0.0f);    // wo
  put(L * D, 0.1f, 1.0f);        // ffn norms
  put(L * H * D, 0.3f, 0.0f);    // w1
  put(L * D * H, 0.3f, 0.0f);    // w2
  put(L * H * D, 0.3f, 0.0f);    // w3
  put(D, 0.1f, 1.0f);            // final norm
  test::append_floats(b, std::vector<float>(sz(s.seq_len) * hd, 0.0f));  // legacy RoPE tables
  static int counter = 0;
  const test::TempDir dir("prefill_attention_" + name + std::to_string(counter++));
  test::write_bytes(dir.path / "model.bin", b);
  return Model::load(dir / "model.bin");
}

// RoPE as the engine applies it (transformer.cpp), over RunState's tables.
void rope(float* x, std::int64_t S, std::int64_t n_heads, std::int64_t D, std::int64_t pos0,
          engine::RopeStyle style, const RunState& s) {
  const std::int64_t half = D / 2;
  for (std::int64_t t = 0; t < S; ++t) {
    const float* cs = s.rope_cos.data() + (pos0 + t) * half;
    const float* sn = s.rope_sin.data() + (pos0 + t) * half;
    for (std::int64_t h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * D;
      for (std::int64_t i = 0; i < half; ++i) {
        float* a = style == engine::RopeStyle::kInterleaved ? v + 2 * i : v + i;
        float* c = style == engine::RopeStyle::kInterleaved ? v + 2 * i + 1 : v + i + half;
        const float x0 = *a, x1 = *c;
        *a = x0 * cs[i] - x1 * sn[i];
        *c = x0 * sn[i] + x1 * cs[i];
      }
    }
  }
}

// The forward with the per-query attention of the engine before tiling: for each KV head and
// each query token in turn, the scores of its G query heads over every row, the softmax, the
// weighted values; the probabilities [Hq][S][R] always materialised and passed to end_step.
class ReferenceForward {
 public:
  ReferenceForward(const Model& m, std::int64_t max_chunk) : m_(&m), s_(m.config(), max_chunk) {
    const ModelConfig& c = m.config();
    att_.resize(sz(c.n_heads * max_chunk * s_.max_rows));
  }

  std::vector<float> forward(const std::int32_t* tokens, std::int64_t S, ModelCache& cache) {
    const ModelConfig& c = m_->config();
    const engine::Weights& w = m_->weights();
    const std::int64_t dim = c.dim, hid = c.hidden_dim, D = c.head_dim, Hq = c.n_heads,
                       Hkv = c.n_kv_heads, G = Hq / Hkv, qd = c.q_dim();
    const std::int64_t pos0 = cache.layer(0).tokens_seen();
    // A method that weighs values by the output projection (criticalkv) gets each layer's
    // G_g = W_o^g^T W_o^g, summed here in double over W_o's rows in order (exact products, so
    // the same bits as the engine's).
    if (cache.reads_output_gram() && !cache.has_output_gram()) {
      std::vector<float> row(sz(qd));
      for (std::int64_t l = 0; l < c.n_layers; ++l) {
        std::vector<double> g(sz(Hq * D * D), 0.0);
        for (std::int64_t r = 0; r < dim; ++r) {
          engine::dequantize_row(w.layers[sz(l)].wo, r, row.data());
          for (std::int64_t h = 0; h < Hq; ++h) {
            for (std::int64_t a = 0; a < D; ++a) {
              for (std::int64_t b = 0; b < D; ++b) {
                g[sz((h * D + a) * D + b)] +=
                    static_cast<double>(row[sz(h * D + a)]) * row[sz(h * D + b)];
              }
            }
          }
        }
        const std::vector<float> gf(g.begin(), g.end());
        cache.set_output_gram(l, gf.data(), Hq, D);
      }
    }
    s_.fit_tokens(c, S);  // the per-token buffers start with one token's room
    float* x = s_.x.data();
    float* xb = s_.xb.data();
    float* xb2 = s_.xb2.data();
    for (std::int64_t t = 0; t < S; ++t)
      engine::dequantize_row(w.token_embedding, tokens[t], x + t * dim);
    for (std::int64_t l = 0; l < c.n_layers; ++l) {
      const engine::LayerWeights& lw = w.layers[sz(l)];
      for (std::int64_t t = 0; t < S; ++t)
        ops::rmsnorm(xb + t * dim, x + t * dim, lw.attn_norm, dim, c.norm_eps);
      engine::matmul(s_.q.data(), xb, lw.wq, S);
      engine::matmul(s_.k.data(), xb, lw.wk, S);
      engine::matmul(s_.v.data(), xb, lw.wv, S);
      // A cache that reads the step's pre-RoPE queries (expected_attention) gets them, and the
      // layer's RoPE, as the engine gives them.
      LayerCache& lcq = cache.layer(l);
      const bool reads_queries = lcq.reads_queries();
      if (reads_queries) {
        q_pre_.assign(s_.q.begin(), s_.q.begin() + S * qd);
        if (!lcq.has_rope()) {
          lcq.set_rope(RopeRef{s_.rope_inv_freq.data(), D / 2,
                               c.rope == engine::RopeStyle::kInterleaved
                                   ? RopePairing::kInterleaved
                                   : RopePairing::kHalfSplit});
        }
      }
      rope(s_.q.data(), S, Hq, D, pos0, c.rope, s_);
      rope(s_.k.data(), S, Hkv, D, pos0, c.rope, s_);
      TensorRef kref = TensorRef::f32(s_.k.data(), 1, Hkv, S, D);
      TensorRef vref = TensorRef::f32(s_.v.data(), 1, Hkv, S, D);
      for (TensorRef* t : {&kref, &vref}) {
        t->stride[0] = S * Hkv * D;
        t->stride[1] = D;
        t->stride[2] = Hkv * D;
      }
      LayerCache& lc = cache.layer(l);
      const StepView view = lc.begin_step(kref, vref);
      const std::int64_t R = view.n_rows();
      float* att = att_.data();
      const float scale = std::sqrt(static_cast<float>(D));
      std::vector<float> row(sz(D)), sums(sz(G * 4 * D)), psums(sz(G * 8 * D));
      for (std::int64_t g = 0; g < Hkv; ++g) {
        const HeadRows hr = view.head(0, g);
        const std::int64_t n = hr.n_rows;
        for (std::int64_t t = 0; t < S; ++t) {
          const float* q = s_.q.data() + t * qd + g * G * D;
          float* scores = att + (g * G * S + t) * R;  // head j at + j * S * R
          float* out = s_.att_out.data() + t * qd + g * G * D;
          if (hr.packed == nullptr) {
            ops::attention_scores(q, G, D, hr.keys, hr.dtype, hr.row_stride, hr.positions, n,
                                  pos0 + t, scores, S * R, row.data());
          } else {
            hr.packed->attend_scores(q, G, pos0 + t, scores, S * R);
          }
          for (std::int64_t j = 0; j < G; ++j) {
            float* p = scores + j * S * R;
            ops::softmax(p, n, scale);
            std::fill(p + n, p + R, 0.0f);
          }
          if (hr.packed == nullptr) {
            ops::attention_values(scores, G, S * R, D, hr.values, hr.dtype, hr.row_stride,
                                  hr.positions, n, pos0 + t, out, sums.data());
          } else {
            hr.packed->attend_values(scores, G, S * R, pos0 + t, out, psums.data());
          }
        }
      }
      const AttentionRef probs{att, 1, Hq, S, R};
      engine::matmul(xb2, s_.att_out.data(), lw.wo, S);
      double cos_sum = 0.0;
      for (std::int64_t t = 0; t < S; ++t) {
        float* xt = x + t * dim;
        float* yt = xb + t * dim;
        for (std::int64_t i = 0; i < dim; ++i) yt[i] = xt[i] + xb2[t * dim + i];
        cos_sum += kernels::cosine(xt, yt, dim);
        std::memcpy(xt, yt, sz(dim) * sizeof(float));
      }
      cache.observe_layer_similarity(l, cos_sum / static_cast<double>(S));
      TensorRef qref = TensorRef::f32(q_pre_.data(), 1, Hq, S, D);
      qref.stride[0] = S * qd;
      qref.stride[1] = D;
      qref.stride[2] = qd;
      lc.end_step(&probs, reads_queries ? &qref : nullptr);
      for (std::int64_t t = 0; t < S; ++t)
        ops::rmsnorm(xb + t * dim, x + t * dim, lw.ffn_norm, dim, c.norm_eps);
      engine::matmul(s_.hb.data(), xb, lw.w_gate, S);
      engine::matmul(s_.hb2.data(), xb, lw.w_up, S);
      ops::swiglu(s_.hb.data(), s_.hb2.data(), S * hid);
      engine::matmul(xb, s_.hb.data(), lw.w_down, S);
      for (std::int64_t i = 0; i < S * dim; ++i) x[i] += xb[i];
    }
    for (std::int64_t t = 0; t < S; ++t)
      ops::rmsnorm(xb + t * dim, x + t * dim, w.final_norm, dim, c.norm_eps);
    s_.logits.resize(sz(S * c.vocab_size));  // RunState holds one row until asked for more
    engine::matmul(s_.logits.data(), xb, w.classifier, S);
    return std::vector<float>(s_.logits.begin(), s_.logits.begin() + S * c.vocab_size);
  }

 private:
  const Model* m_;
  RunState s_;
  std::vector<float> att_;
  std::vector<float> q_pre_;  // the step's queries before RoPE, for a cache that reads them
};

// Every stored row (keys, values as fp32, positions) and the row scores of every layer and head.
struct CacheDump {
  std::vector<float> kv, scores;
  std::vector<std::int32_t> positions;
};
CacheDump dump(const ModelCache& cache, const ModelConfig& c) {
  CacheDump d;
  for (std::int64_t l = 0; l < c.n_layers; ++l) {
    const LayerCache& lc = cache.layer(l);
    for (std::int64_t h = 0; h < c.n_kv_heads; ++h) {
      const HeadRows hr = lc.stored(0, h);
      for (std::int64_t r = 0; r < hr.n_rows; ++r) {
        d.positions.push_back(hr.positions[r]);
        for (std::int64_t i = 0; i < c.head_dim; ++i) {
          d.kv.push_back(hr.key(r, i));
          d.kv.push_back(hr.value(r, i));
        }
      }
      const std::vector<float> s = lc.row_scores(0, h);
      d.scores.insert(d.scores.end(), s.begin(), s.end());
    }
  }
  return d;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The method `id` at its defaults, with token budget `budget` where it has one.
CacheConfig at_budget(const std::string& id, std::int64_t budget) {
  const CacheConfig c(id);
  return has_token_budget(c) ? with_token_budget(c, budget) : c;
}

// Every registered method at budget 40 with its other defaults (source=auto resolves to
// attention at the engine's first step), then storage and source variants.
std::vector<std::string> prefill_specs() {
  std::vector<std::string> specs;
  for (const std::string& id : method_ids()) specs.push_back(at_budget(id, 40).spec());
  for (const char* v : {"full:kv_dtype=f32", "h2o:budget=40,source=attention",
                        "snapkv:budget=40,source=attention", "tova:budget=40,source=proxy",
                        "kivi:residual_length=8,kivi_group_size=8",
                        "kivi:bit_width_inlier=4,residual_length=16,kivi_group_size=8,kv_dtype=f32"})
    specs.push_back(v);
  return specs;
}

// Prefill of `n_prompt` tokens in chunks of `chunk`, then `n_decode` single steps, through the
// engine at 1, 2 and 3 threads against the reference.
void check_model(const Model& m, std::int64_t chunk, std::int64_t n_prompt, std::int64_t n_decode) {
  const ModelConfig& c = m.config();
  const ModelShape shape = engine::model_shape(c);
  std::vector<std::int32_t> ids;
  for (std::int64_t i = 0; i < n_prompt + n_decode; ++i)
    ids.push_back(static_cast<std::int32_t>((i * 7 + 3) % c.vocab_size));
  const int saved = engine::threads();
  for (const std::string& spec : prefill_specs()) {
    SCOPED_TRACE(spec);
    // The reference, single-threaded.
    engine::set_threads(1);
    ModelCache ref_cache = KVCacheBuilder::for_model(CacheConfig::parse(spec), shape);
    test::give_key_filters(ref_cache);
    ReferenceForward ref(m, chunk);
    std::vector<std::vector<float>> want;
    for (std::int64_t t = 0; t < n_prompt + n_decode;) {
      const std::int64_t S = t < n_prompt ? std::min(chunk, n_prompt - t) : 1;
      want.push_back(ref.forward(ids.data() + t, S, ref_cache));
      t += S;
    }
    const CacheDump want_cache = dump(ref_cache, c);
    for (const int threads : {1, 2, 3}) {
      SCOPED_TRACE("threads " + std::to_string(threads));
      engine::set_threads(threads);
      ModelCache cache = KVCacheBuilder::for_model(CacheConfig::parse(spec), shape);
      test::give_key_filters(cache);
      engine::Transformer tf(m, chunk);
      std::size_t step = 0;
      for (std::int64_t t = 0; t < n_prompt + n_decode; ++step) {
        const std::int64_t S = t < n_prompt ? std::min(chunk, n_prompt - t) : 1;
        const float* l = tf.forward(ids.data() + t, S, cache, engine::Logits::kAll);
        const std::vector<float> got(l, l + S * c.vocab_size);
        ASSERT_TRUE(same_bits(got, want[step])) << "step " << step << " at token " << t;
        t += S;
      }
      const CacheDump got_cache = dump(cache, c);
      EXPECT_EQ(got_cache.positions, want_cache.positions);
      EXPECT_TRUE(same_bits(got_cache.kv, want_cache.kv));
      EXPECT_TRUE(same_bits(got_cache.scores, want_cache.scores));
      // The probabilities exist only for a cache that read them.
      EXPECT_EQ(tf.state().att.empty(),
                !cache.layer(0).reads_attention() &&
                    std::string(cache.layer(0).score_source()) != "attention");
    }
  }
  engine::set_threads(saved);
}

TEST(PrefillAttention, Gqa4Head16EqualsThePerQueryAttention) {
  // G = 4 (tile of 8 tokens), head_dim 16 (the SIMD kernels), chunks of 29: 29, 29, 19 tokens.
  const Model m = random_model({128, 96, 2, 8, 2, 64, 128}, "g4");
  ASSERT_EQ(m.config().n_heads / m.config().n_kv_heads, 4);
  ASSERT_EQ(RunState::tile_tokens(4), 8);
  check_model(m, 29, 77, 6);
}

TEST(PrefillAttention, Gqa2Head8EqualsThePerQueryAttention) {
  // stories260K: G = 2 (tile of 16 tokens), head_dim 8; chunks of 37 (37, 37, 10 tokens).
  const Model m = Model::load(test::data("stories260K.bin"));
  ASSERT_EQ(m.config().n_heads / m.config().n_kv_heads, 2);
  check_model(m, 37, 84, 5);
}

TEST(PrefillAttention, ScalarHeadsEqualThePerQueryAttention) {
  // head_dim 4: the kernels' scalar paths; G = 3 (tile of 10 tokens); one chunk of 45.
  const Model m = random_model({24, 32, 2, 6, 2, 40, 64}, "g3");
  ASSERT_EQ(m.config().head_dim, 4);
  check_model(m, 45, 45, 4);
}

TEST(PrefillAttention, NoProbabilityBufferForMethodsThatReadNone) {
  const Model m = random_model({128, 96, 1, 8, 2, 64, 128}, "alloc");
  const ModelConfig& c = m.config();
  std::vector<std::int32_t> ids(64);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>(i % 64);
  // Every registered method at budget 40, and one whose source is the proxy.
  std::vector<CacheConfig> configs;
  for (const std::string& id : method_ids()) configs.push_back(at_budget(id, 40));
  configs.push_back(CacheConfig::parse("h2o:budget=40,source=proxy"));
  std::size_t reading = 0;
  for (const CacheConfig& config : configs) {
    const std::string spec = config.spec();
    ModelCache cache = KVCacheBuilder::for_model(config, engine::model_shape(c));
    test::give_key_filters(cache);
    const bool reads = cache.layer(0).reads_attention();
    engine::Transformer tf(m, 64);
    tf.forward(ids.data(), 64, cache);
    if (reads) {
      ++reading;
      // One step of 64 tokens over 64 rows, Hq = 8.
      EXPECT_GE(tf.state().att.size(), sz(8 * 64 * 64)) << spec;
      EXPECT_STREQ(cache.layer(0).score_source(), "attention") << spec;
    } else {
      EXPECT_TRUE(tf.state().att.empty()) << spec;
      EXPECT_EQ(tf.state().att.capacity(), 0u) << spec;
    }
  }
  EXPECT_GT(reading, 0u);
  EXPECT_LT(reading, configs.size());
  // The memory estimate counts the buffer only for a method that reads it: Hq * S * R floats.
  const double with = engine::engine_run_bytes(c, 64, 128, true);
  const double without = engine::engine_run_bytes(c, 64, 128, false);
  EXPECT_EQ(with - without, 4.0 * 8 * 64 * 128);
}

// Whether a method's decisions follow the attention probabilities it is given: the same keys
// and values fed twice in chunks of 8, with the probabilities of two different query sets
// (engine-like attention, tests/attention_util.h); the kept positions or row scores differ.
bool decisions_follow_attention(const CacheConfig& config) {
  constexpr std::int64_t B = 1, H = 2, Hq = 4, D = 8, S = 96;
  const test::KV kv(B, H, S, D, 31);
  std::vector<std::vector<std::int64_t>> positions[2];
  std::vector<std::vector<float>> scores[2];
  for (int run = 0; run < 2; ++run) {
    const std::vector<float> q = test::randn(sz(B * Hq * S * D), 40 + static_cast<unsigned>(run));
    LayerCache cache(config, LayerShape{H, D, Hq, 0, 1});
    test::give_key_filters(cache, H, D);
    test::feed_attention(cache, kv, q, Hq, 8);
    for (std::int64_t h = 0; h < H; ++h) {
      const HeadRows hr = cache.stored(0, h);
      positions[run].emplace_back(hr.positions, hr.positions + hr.n_rows);
      scores[run].push_back(cache.row_scores(0, h));
    }
  }
  return positions[0] != positions[1] || scores[0] != scores[1];
}

TEST(PrefillAttention, EveryMethodSaysWhetherItReadsTheProbabilities) {
  // Every registered method at budget 40 with its defaults (source=auto resolves to attention
  // when the engine passes probabilities): it says it reads them exactly when its kept rows or
  // scores depend on them.
  std::size_t reading = 0, seen = 0;
  for (const std::string& id : method_ids()) {
    const CacheConfig config = at_budget(id, 40);
    const bool follows = decisions_follow_attention(config);
    const ModelCache cache = KVCacheBuilder::for_model(config, ModelShape{2, 2, 8, 4});
    EXPECT_EQ(cache.layer(0).reads_attention(), follows) << id;
    reading += follows ? 1 : 0;
    ++seen;
  }
  EXPECT_EQ(seen, registry().size());
  // The suite holds both kinds (else the check above could not tell them apart).
  EXPECT_GT(reading, 0u);
  EXPECT_LT(reading, seen);
  const ModelShape shape{2, 2, 8, 4};
  for (const char* spec :
       {"h2o:source=proxy", "tova:source=proxy", "chunkkv:chunkkv_score=key_norm",
        "streaming_llm:budget=64,quantize=kivi2",
        "streaming_llm:budget=4,n_sink=1,demote=kivi4,demote_budget=2", "full:kv_dtype=f32"}) {
    const ModelCache cache = KVCacheBuilder::for_model(CacheConfig::parse(spec), shape);
    EXPECT_FALSE(cache.layer(0).reads_attention()) << spec;
  }
  for (const char* spec :
       {"h2o:budget=512,quantize=kivi2", "h2o:budget=64,demote=kivi2,demote_budget=32",
        "snapkv:source=attention", "squeeze:source=attention"}) {
    const ModelCache cache = KVCacheBuilder::for_model(CacheConfig::parse(spec), shape);
    EXPECT_TRUE(cache.layer(0).reads_attention()) << spec;
  }
}

TEST(PrefillAttention, CacheTakesProbabilitiesWithoutDataOnlyWhenItReadsNone) {
  const ModelShape shape{1, 2, 8, 4};
  const std::vector<float> k = test::randn(2 * 3 * 8, 5), v = test::randn(2 * 3 * 8, 6);
  const TensorRef kr = TensorRef::f32(k.data(), 1, 2, 3, 8),
                  vr = TensorRef::f32(v.data(), 1, 2, 3, 8);
  const AttentionRef shape_only{nullptr, 1, 4, 3, 3};
  {
    ModelCache full = KVCacheBuilder::for_model(CacheConfig::parse("full"), shape);
    full.layer(0).begin_step(kr, vr);
    EXPECT_NO_THROW(full.layer(0).end_step(&shape_only));
    EXPECT_EQ(full.layer(0).tokens_kept(), 3);
    // The shape is still checked.
    full.layer(0).begin_step(kr, vr);
    const AttentionRef wrong{nullptr, 1, 4, 2, 6};
    EXPECT_THROW(full.layer(0).end_step(&wrong), Error);
  }
  {
    ModelCache h2o =
        KVCacheBuilder::for_model(CacheConfig::parse("h2o:budget=8,source=attention"), shape);
    h2o.layer(0).begin_step(kr, vr);
    try {
      h2o.layer(0).end_step(&shape_only);
      ADD_FAILURE() << "h2o took probabilities without data";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kShapeMismatch);
      EXPECT_NE(std::string(e.what()).find("no data"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(h2o.layer(0).step_open());
  }
}

}  // namespace
}  // namespace vq
