// Helpers for the engine tests: where the data lives, reading golden references, temporary
// directories, and writing small synthetic checkpoints (llama2.c and Hugging Face formats).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "engine/model/model.h"
#include "engine/model/transformer.h"
#include "engine/tokenizers/tokenizer.h"
#include "test_util.h"
#include "veloxquant/builder.h"
#include "veloxquant/types.h"

#ifndef VELOXQUANT_DATA_DIR
#error "VELOXQUANT_DATA_DIR must point at the project's data/ directory"
#endif
#ifndef VELOXQUANT_SHARED_DIR
#error "VELOXQUANT_SHARED_DIR must point at the shared data checkout (it may be absent)"
#endif

namespace vq::test {
namespace fs = std::filesystem;

// Shipped with the project: stories260K, tok512, text excerpts, stories260K references.
inline std::string data(const std::string& rel) {
  return std::string(VELOXQUANT_DATA_DIR) + "/" + rel;
}
// ../shared/data: TinyStories-656K, full texts, all references. May be absent.
inline std::string shared(const std::string& rel) {
  return std::string(VELOXQUANT_SHARED_DIR) + "/data/" + rel;
}
inline bool have_shared() { return fs::is_directory(shared("models/tinystories-656K")); }

#define VQ_REQUIRE_SHARED()                                                              \
  do {                                                                                   \
    if (!::vq::test::have_shared()) {                                                    \
      GTEST_SKIP() << "shared data not found at " << ::vq::test::shared("")              \
                   << " (TinyStories-656K cannot ship with the project; configure with " \
                      "-DVELOXQUANT_SHARED_DIR=... to run this test)";                   \
    }                                                                                    \
  } while (0)

inline std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The shipped stories260K checkpoint, loaded once per test binary.
inline const engine::Model& stories() {
  static const engine::Model m = engine::Model::load(data("stories260K.bin"));
  return m;
}
// The first n ids (at most) of the shipped validation excerpt in stories260K's tokenizer.
inline std::vector<std::int32_t> excerpt_ids(std::int64_t n) {
  static const auto tok = engine::load_tokenizer("", stories());
  return engine::encode_first(*tok, read_all(data("tinystories_validation_excerpt.txt")), n);
}

inline std::vector<std::int32_t> read_ids(const std::string& path) {
  std::istringstream in(read_all(path));
  std::vector<std::int32_t> ids;
  for (std::int32_t v; in >> v;) ids.push_back(v);
  return ids;
}

struct NllLine {
  std::int64_t pos;
  std::int32_t target;
  double nll;
};
inline std::vector<NllLine> read_nll(const std::string& path) {
  std::istringstream in(read_all(path));
  std::vector<NllLine> out;
  NllLine l{};
  while (in >> l.pos >> l.target >> l.nll) out.push_back(l);
  return out;
}

inline std::vector<float> read_f32(const std::string& path) {
  const std::string bytes = read_all(path);
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}

inline void write_bytes(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A fresh, empty temporary directory, removed by the destructor.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name)
      : path(fs::temp_directory_path() / ("vq_engine_" + name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string operator/(const std::string& rel) const { return (path / rel).string(); }
};

template <typename T>
void append_pod(std::string& s, const T& v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof(T));
}
inline void append_floats(std::string& s, const std::vector<float>& v) {
  s.append(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

// A random Llama model in llama2.c's tensor layout ([out][in], interleaved-RoPE q/k rows).
struct TinyModel {
  std::int32_t dim = 16, hidden = 24, layers = 2, heads = 4, kv_heads = 2, vocab = 40, seq_len = 32;
  std::vector<float> emb, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, wcls;

  std::int32_t head_dim() const { return dim / heads; }
  // Values rounded to what `dtype` represents exactly, so F16/BF16 files hold the same weights.
  explicit TinyModel(std::uint64_t seed = 7, const char* exact_in = "f16") {
    const std::int32_t hd = head_dim(), kvd = kv_heads * hd;
    auto r = [&](std::size_t n, float scale, float offset = 0.0f) {
      std::vector<float> v = randn(n, seed++, scale);
      for (float& x : v) {
        x += offset;
        if (std::string(exact_in) == "f16") x = half_to_float(float_to_half(x));
        if (std::string(exact_in) == "bf16") {
          std::uint32_t b;
          std::memcpy(&b, &x, 4);
          b &= 0xFFFF0000u;
          std::memcpy(&x, &b, 4);
        }
      }
      return v;
    };
    const auto L = static_cast<std::size_t>(layers), D = static_cast<std::size_t>(dim),
               H = static_cast<std::size_t>(hidden), V = static_cast<std::size_t>(vocab);
    emb = r(V * D, 0.5f);
    rms_att = r(L * D, 0.1f, 1.0f);
    wq = r(L * D * D, 0.3f);
    wk = r(L * static_cast<std::size_t>(kvd) * D, 0.3f);
    wv = r(L * static_cast<std::size_t>(kvd) * D, 0.3f);
    wo = r(L * D * D, 0.3f);
    rms_ffn = r(L * D, 0.1f, 1.0f);
    w1 = r(L * H * D, 0.3f);
    w2 = r(L * D * H, 0.3f);
    w3 = r(L * H * D, 0.3f);
    rms_final = r(D, 0.1f, 1.0f);
    wcls = r(V * D, 0.5f);
  }

  // llama2.c v0: header, tensors, legacy RoPE tables (zeros), classifier if not tied.
  std::string llama2c(bool tied) const {
    std::string s;
    for (std::int32_t v : {dim, hidden, layers, heads, kv_heads, tied ? vocab : -vocab, seq_len})
      append_pod(s, v);
    for (const auto* t : {&emb, &rms_att, &wq, &wk, &wv, &wo, &rms_ffn, &w1, &w2, &w3, &rms_final})
      append_floats(s, *t);
    append_floats(s, std::vector<float>(static_cast<std::size_t>(seq_len * head_dim()), 0.0f));
    if (!tied) append_floats(s, wcls);
    return s;
  }

  // Hugging Face q/k rows for head h: rotate-half order (i, i + D/2) from llama2.c's (2i, 2i+1).
  std::vector<float> hf_qk(const std::vector<float>& w, std::int32_t n_heads,
                           std::int32_t layer) const {
    const std::int32_t hd = head_dim(), rows = n_heads * hd;
    std::vector<float> out(static_cast<std::size_t>(rows * dim));
    const float* src =
        w.data() + static_cast<std::size_t>(layer) * static_cast<std::size_t>(rows * dim);
    for (std::int32_t h = 0; h < n_heads; ++h) {
      for (std::int32_t half = 0; half < 2; ++half) {
        for (std::int32_t i = 0; i < hd / 2; ++i) {
          const std::int32_t to = h * hd + half * (hd / 2) + i, from = h * hd + 2 * i + half;
          std::memcpy(out.data() + to * dim, src + from * dim, static_cast<std::size_t>(dim) * 4);
        }
      }
    }
    return out;
  }

  nlohmann::json hf_config() const {
    return {{"architectures", {"LlamaForCausalLM"}},
            {"model_type", "llama"},
            {"hidden_size", dim},
            {"intermediate_size", hidden},
            {"num_hidden_layers", layers},
            {"num_attention_heads", heads},
            {"num_key_value_heads", kv_heads},
            {"vocab_size", vocab},
            {"max_position_embeddings", seq_len},
            {"rms_norm_eps", 1e-5},
            {"rope_theta", 10000.0},
            {"hidden_act", "silu"},
            {"bos_token_id", 1},
            {"eos_token_id", 2},
            {"tie_word_embeddings", true}};
  }

  enum class Head { kExplicit, kMissing, kMetadataAlias, kSeparate };
  // model.safetensors with tensors in `dtype` ("F32", "F16", "BF16"); `pad` header bytes
  // after the JSON (safetensors pads with spaces; an odd pad misaligns the data).
  std::string hf_safetensors(const std::string& dtype, Head head, std::size_t pad = 0) const {
    std::vector<std::pair<std::string, std::pair<std::vector<std::int64_t>, std::vector<float>>>> t;
    const std::int64_t hd = head_dim(), kvd = kv_heads * hd;
    auto slice = [](const std::vector<float>& w, std::int64_t layer, std::int64_t n) {
      return std::vector<float>(w.begin() + layer * n, w.begin() + (layer + 1) * n);
    };
    if (head != Head::kMetadataAlias)
      t.push_back({"model.embed_tokens.weight", {{vocab, dim}, emb}});
    for (std::int32_t l = 0; l < layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      t.push_back({p + "input_layernorm.weight", {{dim}, slice(rms_att, l, dim)}});
      t.push_back({p + "self_attn.q_proj.weight", {{dim, dim}, hf_qk(wq, heads, l)}});
      t.push_back({p + "self_attn.k_proj.weight", {{kvd, dim}, hf_qk(wk, kv_heads, l)}});
      t.push_back({p + "self_attn.v_proj.weight", {{kvd, dim}, slice(wv, l, kvd * dim)}});
      t.push_back({p + "self_attn.o_proj.weight", {{dim, dim}, slice(wo, l, dim * dim)}});
      t.push_back({p + "post_attention_layernorm.weight", {{dim}, slice(rms_ffn, l, dim)}});
      t.push_back({p + "mlp.gate_proj.weight", {{hidden, dim}, slice(w1, l, hidden * dim)}});
      t.push_back({p + "mlp.up_proj.weight", {{hidden, dim}, slice(w3, l, hidden * dim)}});
      t.push_back({p + "mlp.down_proj.weight", {{dim, hidden}, slice(w2, l, dim * hidden)}});
    }
    t.push_back({"model.norm.weight", {{dim}, rms_final}});
    if (head == Head::kExplicit || head == Head::kMetadataAlias)
      t.push_back({"lm_head.weight", {{vocab, dim}, emb}});
    if (head == Head::kSeparate) t.push_back({"lm_head.weight", {{vocab, dim}, wcls}});
    nlohmann::json header = nlohmann::json::object();
    if (head == Head::kMetadataAlias)
      header["__metadata__"] = {{"format", "pt"}, {"model.embed_tokens.weight", "lm_head.weight"}};
    std::string data;
    for (const auto& [name, st] : t) {
      const std::size_t begin = data.size();
      for (const float f : st.second) {
        if (dtype == "F32") {
          append_pod(data, f);
        } else if (dtype == "F16") {
          append_pod(data, float_to_half(f));
        } else {
          std::uint32_t b;
          std::memcpy(&b, &f, 4);
          append_pod(data, static_cast<std::uint16_t>(b >> 16));
        }
      }
      header[name] = {
          {"dtype", dtype}, {"shape", st.first}, {"data_offsets", {begin, data.size()}}};
    }
    std::string h = header.dump() + std::string(pad, ' ');
    std::string out;
    append_pod(out, static_cast<std::uint64_t>(h.size()));
    return out + h + data;
  }
};

// A safetensors file from a header (as JSON text) and a data section.
inline std::string safetensors_bytes(const std::string& header, const std::string& data) {
  std::string out;
  append_pod(out, static_cast<std::uint64_t>(header.size()));
  return out + header + data;
}

// A Hugging Face sharded checkpoint made from a single safetensors file's tensors, in the
// layout Transformers writes: shards named model-0000K-of-0000N.safetensors, each with
// __metadata__ {"format": "pt"}, and model.safetensors.index.json whose weight_map maps every
// tensor to its shard (metadata.total_size: the sum of the tensors' bytes). Tests edit
// `shards` (which tensors each file holds), `tensors` and `index` before write().
struct ShardedSafetensors {
  struct Tensor {
    nlohmann::json entry;  // dtype and shape (data_offsets are computed by write())
    std::string bytes;
  };
  std::map<std::string, Tensor> tensors;
  std::vector<std::pair<std::string, std::vector<std::string>>> shards;  // file, tensor names
  std::vector<nlohmann::json> shard_metadata;                            // per shard
  nlohmann::json index;

  // Tensors in file order, tensor i of T to shard i * n / T (contiguous runs, as Transformers
  // fills shards).
  ShardedSafetensors(const std::string& single, int n) {
    std::uint64_t hl = 0;
    std::memcpy(&hl, single.data(), 8);
    const nlohmann::json header = nlohmann::json::parse(single.substr(8, hl));
    const std::string data = single.substr(8 + hl);
    std::vector<std::pair<std::int64_t, std::string>> order;
    nlohmann::json meta = {{"format", "pt"}};
    for (const auto& [name, e] : header.items()) {
      if (name == "__metadata__") {
        meta = e;
        continue;
      }
      const std::int64_t b = e["data_offsets"][0], end = e["data_offsets"][1];
      tensors[name] = {{{"dtype", e["dtype"]}, {"shape", e["shape"]}},
                       data.substr(static_cast<std::size_t>(b), static_cast<std::size_t>(end - b))};
      order.push_back({b, name});
    }
    std::sort(order.begin(), order.end());
    std::int64_t total = 0;
    index = {{"metadata", nlohmann::json::object()}, {"weight_map", nlohmann::json::object()}};
    for (int k = 0; k < n; ++k) {
      char file[64];
      std::snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", k + 1, n);
      shards.push_back({file, {}});
      shard_metadata.push_back(meta);
    }
    for (std::size_t i = 0; i < order.size(); ++i) {
      auto& shard = shards[i * static_cast<std::size_t>(n) / order.size()];
      shard.second.push_back(order[i].second);
      index["weight_map"][order[i].second] = shard.first;
      total += static_cast<std::int64_t>(tensors[order[i].second].bytes.size());
    }
    index["metadata"]["total_size"] = total;
  }

  std::string shard_bytes(std::size_t k) const {
    nlohmann::json header = {{"__metadata__", shard_metadata[k]}};
    std::string data;
    for (const std::string& name : shards[k].second) {
      const Tensor& t = tensors.at(name);
      header[name] = t.entry;
      header[name]["data_offsets"] = {data.size(), data.size() + t.bytes.size()};
      data += t.bytes;
    }
    return safetensors_bytes(header.dump(), data);
  }

  void write(const fs::path& dir) const {
    for (std::size_t k = 0; k < shards.size(); ++k)
      write_bytes(dir / shards[k].first, shard_bytes(k));
    write_bytes(dir / "model.safetensors.index.json", index.dump(2));
  }
};

// Logits for 12 tokens fed one at a time through a full fp32 cache: [12][vocab].
inline std::vector<float> run_logits(const engine::Model& m) {
  ModelCache cache = KVCacheBuilder::for_model(CacheConfig::parse("full:kv_dtype=f32"),
                                               engine::model_shape(m.config()));
  engine::Transformer tf(m);
  std::vector<float> out;
  for (std::int32_t t = 0; t < 12; ++t) {
    const std::int32_t tok = (t * 7 + 3) % static_cast<std::int32_t>(m.config().vocab_size);
    const float* l = tf.forward(&tok, 1, cache);
    out.insert(out.end(), l, l + m.config().vocab_size);
  }
  return out;
}

// The largest |a[i] - b[i]| (the sizes must match).
inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
    d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
  return d;
}

}  // namespace vq::test
