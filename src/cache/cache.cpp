#include "veloxquant/cache.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <string_view>

#include "base/float_env.h"
#include "cache/store_access.h"
#include "base/step_input.h"
#include "base/kernels.h"
#include "policies/layer_state.h"
#include "policies/policy.h"
#include "policies/storage.h"
#include "policies/think.h"
#include "veloxquant/errors.h"
#include "veloxquant/registry.h"

namespace vq {

using detail::Decision;
using detail::HeadState;
using detail::LayerState;
using detail::RowStore;
using detail::StoreAccess;

namespace {

[[noreturn]] void shape_error(const std::string& msg) {
  throw Error(ErrorCode::kShapeMismatch, "[cache] " + msg);
}

std::string shape_text(const TensorRef& t) {
  return "[" + std::to_string(t.shape[0]) + ", " + std::to_string(t.shape[1]) + ", " +
         std::to_string(t.shape[2]) + ", " + std::to_string(t.shape[3]) + "]";
}

void check_tensor(const TensorRef& t, const char* name) {
  for (int i = 0; i < 4; ++i) {
    if (t.shape[i] < 0) shape_error(std::string(name) + " has a negative dimension " + shape_text(t));
  }
  if (t.dtype != DType::kF32 && t.dtype != DType::kF16) {
    shape_error(std::string(name) + " has an unsupported dtype (allowed: f32, f16)");
  }
  const bool empty = t.shape[0] == 0 || t.shape[1] == 0 || t.shape[2] == 0 || t.shape[3] == 0;
  if (!empty && t.data == nullptr) shape_error(std::string(name) + " has no data pointer");
  if (!empty && t.stride[3] != 1) {
    shape_error(std::string(name) + " must be contiguous along head_dim (stride 1), got stride " +
                std::to_string(t.stride[3]));
  }
}

// The step's queries (end_step): [B, Hq, S, D] of the open step, with data.
void check_queries(const LayerState& st, const TensorRef& q) {
  check_tensor(q, "queries");
  detail::check_step_input(q, "[cache] end_step", "queries");
  if (q.data == nullptr || q.shape[0] != st.batch || q.shape[1] != st.shape.n_query_heads ||
      q.shape[2] != st.step_new || q.shape[3] != st.shape.head_dim) {
    shape_error("queries must be [B, Hq, S, D] = [" + std::to_string(st.batch) + ", " +
                std::to_string(st.shape.n_query_heads) + ", " + std::to_string(st.step_new) +
                ", " + std::to_string(st.shape.head_dim) + "], got " + shape_text(q) +
                (q.data == nullptr ? " with no data" : ""));
  }
}

template <typename T>
std::int64_t capacity_bytes(const std::vector<T>& v) noexcept {
  return static_cast<std::int64_t>(v.capacity() * sizeof(T));
}

// After a large cut (a prefill cut to the budget: more than 2 x rows + 64 rows before it), a
// per-row array of `per_row` elements a row gives back its capacity beyond the kept rows and
// one more, whatever that capacity is (a token-by-token cut inside the prompt grows the arrays
// to about twice the budget, not to the prompt). Small cuts (decode steps) keep the capacity,
// so the steady state reallocates nothing.
template <typename T>
void give_back_capacity(std::vector<T>& v, std::int64_t rows, std::int64_t per_row) {
  const auto keep = static_cast<std::size_t>((rows + 1) * per_row);
  if (per_row == 0 || v.capacity() <= std::max(keep, v.size())) return;
  std::vector<T> t;
  t.reserve(std::max(v.size(), keep));
  t.assign(v.begin(), v.end());
  v.swap(t);
}

// Plan, then apply: the one place where a layer's stores change on a policy's decision
// (policies/decision.h says what each kind does). Bound to one LayerState for its life.
class StoreApplier final : public detail::DecisionSink {
 public:
  explicit StoreApplier(LayerState& st) : st_(st) {}

  void apply(const Decision& d) override {
    ++applied_;
    RowStore& store = StoreAccess::of(st_.heads[static_cast<std::size_t>(d.head)]);
    switch (d.kind) {
      case Decision::Kind::kBlend: blend(store, d); return;
      case Decision::Kind::kSpread: spread(store, d); return;
      case Decision::Kind::kDemote: store.demote(d.target, d.score); return;
      case Decision::Kind::kSettle: store.settle(d.rows, d.n_rows); return;
      case Decision::Kind::kKeep: store.keep(d.rows, d.n_rows); return;
      case Decision::Kind::kKeepAll: store.settle_keep_all(); return;
      case Decision::Kind::kPruneKeys: store.prune_keys(d.channels, d.n_rows, d.target); return;
    }
  }

 private:
  // x_t <- (1 - w) x_t + w x_e in fp32 for the values, and the keys when asked; then
  // pos_t <- max(pos_t, pos_e).
  void blend(RowStore& store, const Decision& d) {
    const std::int64_t D = st_.shape.head_dim;
    const float w = d.weight;
    a_.resize(static_cast<std::size_t>(D));
    b_.resize(static_cast<std::size_t>(D));
    store.read_value(d.target, a_.data());
    store.read_value(d.loser, b_.data());
    for (std::int64_t i = 0; i < D; ++i) a_[i] = (1.0f - w) * a_[i] + w * b_[i];
    store.write_value(d.target, a_.data());
    if (d.keys) {
      store.read_key(d.target, a_.data());
      store.read_key(d.loser, b_.data());
      for (std::int64_t i = 0; i < D; ++i) a_[i] = (1.0f - w) * a_[i] + w * b_[i];
      store.write_key(d.target, a_.data());
    }
    const HeadRows rows = store.rows();
    store.set_position(d.target, std::max(rows.positions[d.target], rows.positions[d.loser]));
  }

  // v_t <- v_t + v_e / m for each of the m target rows.
  void spread(RowStore& store, const Decision& d) {
    const std::int64_t D = st_.shape.head_dim;
    a_.resize(static_cast<std::size_t>(D));
    b_.resize(static_cast<std::size_t>(D));
    store.read_value(d.loser, a_.data());
    const float fm = static_cast<float>(d.n_rows);
    for (std::int64_t k = 0; k < d.n_rows; ++k) {
      store.read_value(d.rows[k], b_.data());
      for (std::int64_t c = 0; c < D; ++c) b_[c] = b_[c] + a_[c] / fm;
      store.write_value(d.rows[k], b_.data());
    }
  }

  LayerState& st_;
  std::vector<float> a_, b_;  // [head_dim] row scratch

 public:
  // Decisions applied since the cache last looked (an open step's: reset by end_step).
  std::int64_t applied_ = 0;
};

// Undoes an open step's begin_step: every head keeps the rows it held before the step (its
// first HeadState::prev rows; a demoting store the method's rows among them, its tier stays),
// and the step's positions are handed out again. Only for a step of which nothing was decided
// (LayerCache::end_step checks that).
void roll_back_step(LayerState& st) {
  std::vector<std::int64_t> idx;
  for (HeadState& hs : st.heads) {
    RowStore& store = StoreAccess::of(hs);
    const std::int64_t kept = hs.prev - store.n_demoted();
    idx.resize(static_cast<std::size_t>(kept));
    for (std::int64_t i = 0; i < kept; ++i) idx[static_cast<std::size_t>(i)] = i;
    store.keep(idx.data(), kept);
  }
  st.tokens_seen -= st.step_new;
  if (st.step_new > 0) st.question = st.step_question;
  st.step_question = 0;
  st.attention = nullptr;
  st.queries = nullptr;
  st.step_open = false;
  st.step_new = 0;
}

// The API boundary of a LayerCache built on its own: the config and the shape are validated
// here, once; the layers below (the private constructor, the policies, the stores) trust them.
const CacheConfig& validated(const CacheConfig& config, const LayerShape& shape) {
  config.validate();
  auto bad = [](const std::string& msg) {
    throw Error(ErrorCode::kInvalidArgument, "[cache] " + msg);
  };
  if (shape.n_kv_heads < 0) bad("n_kv_heads must be >= 0, got " + std::to_string(shape.n_kv_heads));
  if (shape.head_dim < 0) bad("head_dim must be >= 0, got " + std::to_string(shape.head_dim));
  if (shape.n_query_heads < 0) {
    bad("n_query_heads must be >= 0, got " + std::to_string(shape.n_query_heads));
  }
  if (shape.n_layers < 1) bad("n_layers must be >= 1, got " + std::to_string(shape.n_layers));
  detail::check_shape_limits(shape.n_layers, shape.n_kv_heads, shape.head_dim,
                             shape.n_query_heads, "[cache]");
  if (shape.layer < 0 || shape.layer >= shape.n_layers) {
    bad("layer must be in [0, " + std::to_string(shape.n_layers - 1) + "], got " +
        std::to_string(shape.layer));
  }
  if (shape.n_query_heads > 0 && shape.n_kv_heads > 0 &&
      shape.n_query_heads % shape.n_kv_heads != 0) {
    bad("n_query_heads (" + std::to_string(shape.n_query_heads) +
        ") must be a multiple of n_kv_heads (" + std::to_string(shape.n_kv_heads) + ")");
  }
  return config;
}

}  // namespace

LayerCache::LayerCache(const CacheConfig& config, const LayerShape& shape)
    : LayerCache(validated(config, shape), shape, nullptr) {}

LayerCache::LayerCache(const CacheConfig& config, const LayerShape& shape,
                       std::shared_ptr<detail::LayerGroup> group)
    : state_(std::make_unique<LayerState>()) {
  VQ_ASSERT(shape.n_kv_heads >= 0 && shape.head_dim >= 0 && shape.n_query_heads >= 0 &&
                shape.layer >= 0 && shape.layer < shape.n_layers,
            "LayerCache built with a shape its caller did not validate");
  state_->config = config;
  state_->shape = shape;
  state_->sink = std::make_unique<StoreApplier>(*state_);
  const detail::PolicyContext ctx{config, shape, std::move(group)};
  // think= (ThinK's key-channel pruning) wraps whichever policy the method makes.
  policy_ = detail::with_key_pruning(ctx, config.info().make_policy(ctx));
}

LayerCache::~LayerCache() = default;
LayerCache::LayerCache(LayerCache&&) noexcept = default;
LayerCache& LayerCache::operator=(LayerCache&&) noexcept = default;

StepView LayerCache::begin_step(const TensorRef& keys, const TensorRef& values) {
  FloatEnvGuard env;
  LayerState& st = *state_;
  if (st.step_open) {
    throw Error(ErrorCode::kInvalidState,
                "[cache] begin_step called while a step is open; call end_step() first");
  }
  check_tensor(keys, "keys");
  check_tensor(values, "values");
  for (int i = 0; i < 4; ++i) {
    if (keys.shape[i] != values.shape[i]) {
      shape_error("keys " + shape_text(keys) + " and values " + shape_text(values) +
                  " must have the same shape [B, Hkv, S, D]");
    }
  }
  // The limits of types.h and rows of their own, before anything is read or allocated.
  detail::check_step_input(keys, "[cache] begin_step", "keys");
  detail::check_step_input(values, "[cache] begin_step", "values");
  const std::int64_t B = keys.shape[0], H = keys.shape[1], S = keys.shape[2], D = keys.shape[3];
  const LayerShape& ls = st.shape;
  auto mismatch = [&](const char* what, std::int64_t got, std::int64_t want, const char* origin) {
    shape_error(std::string("keys/values ") + shape_text(keys) + " have " + what + " " +
                std::to_string(got) + ", but this cache holds " + std::to_string(want) + " (" +
                origin + ")");
  };
  if (st.shaped) {
    if (B != st.batch) mismatch("batch", B, st.batch, "fixed by the first update");
    if (H != ls.n_kv_heads) mismatch("n_kv_heads", H, ls.n_kv_heads, "fixed");
    if (D != ls.head_dim) mismatch("head_dim", D, ls.head_dim, "fixed");
  } else {
    if (ls.n_kv_heads > 0 && H != ls.n_kv_heads && S > 0) {
      mismatch("n_kv_heads", H, ls.n_kv_heads, "given at construction");
    }
    if (ls.head_dim > 0 && D != ls.head_dim && S > 0) {
      mismatch("head_dim", D, ls.head_dim, "given at construction");
    }
  }
  if (S > 0 && (B == 0 || H == 0 || D == 0)) {
    shape_error("keys/values " + shape_text(keys) + " must have B, Hkv and D >= 1");
  }
  if (S > 0 && st.tokens_seen + S > std::numeric_limits<std::int32_t>::max()) {
    shape_error("positions would exceed 2^31 - 1 tokens");
  }
  if (S > 0 && st.question > S) {
    throw Error(ErrorCode::kInvalidArgument,
                "[cache] set_question_length gave " + std::to_string(st.question) +
                    " question tokens, but this step has only " + std::to_string(S) +
                    " new rows: the question must be the step's last tokens");
  }
  if (S > 0 && !st.output_gram.empty()) {
    const std::int64_t hq = ls.n_query_heads > 0 ? ls.n_query_heads : H;
    if (st.output_gram_dim != D || st.output_gram_heads != hq || hq % H != 0) {
      shape_error("keys/values " + shape_text(keys) + " (n_query_heads " + std::to_string(hq) +
                  ") do not match the output projection given to set_output_gram (" +
                  std::to_string(st.output_gram_heads) + " query heads of head_dim " +
                  std::to_string(st.output_gram_dim) + ")");
    }
  }
  if (S > 0 && !st.shaped) {
    st.batch = B;
    st.shape.n_kv_heads = H;
    st.shape.head_dim = D;
    if (st.shape.n_query_heads == 0) st.shape.n_query_heads = H;
    if (st.shape.n_query_heads % H != 0) {
      shape_error("n_query_heads (" + std::to_string(st.shape.n_query_heads) +
                  ") must be a multiple of n_kv_heads (" + std::to_string(H) + ")");
    }
    detail::build_heads(st, B, H, D, ls.layer);
    st.shaped = true;
  }
  st.step_prev = 0;
  for (HeadState& hs : st.heads) {
    hs.prev = hs.store()->size();
    st.step_prev = std::max(st.step_prev, hs.prev);
  }
  st.step_new = S;
  if (S > 0) {
    st.step_question = st.question;
    st.question = 0;
    const auto first = static_cast<std::int32_t>(st.tokens_seen);
    for (std::int64_t b = 0; b < B; ++b) {
      for (std::int64_t h = 0; h < H; ++h) {
        StoreAccess::of(st.heads[static_cast<std::size_t>(b * H + h)])
            .append(keys, values, b, h, first);
      }
    }
    st.tokens_seen += S;
  }
  for (std::size_t i = 0; i < st.heads.size(); ++i) {
    st.view_rows[i] = st.heads[i].store()->rows();
  }
  st.step_open = true;
  StepView view;
  view.rows_ = st.view_rows.data();
  view.batch_ = st.batch;
  view.heads_ = st.shaped ? st.shape.n_kv_heads : 0;
  view.head_dim_ = st.shaped ? st.shape.head_dim : 0;
  view.n_rows_ = st.step_prev + S;
  view.n_new_ = S;
  return view;
}

void LayerCache::end_step(const AttentionRef* attention) { end_step(attention, nullptr); }

void LayerCache::end_step(const AttentionRef* attention, const TensorRef* queries) {
  FloatEnvGuard env;
  LayerState& st = *state_;
  if (!st.step_open) {
    throw Error(ErrorCode::kInvalidState, "[cache] end_step called without an open step");
  }
  if (queries != nullptr && st.step_new > 0) check_queries(st, *queries);
  if (st.step_new > 0 && policy_->reads_queries()) {
    const int given = queries != nullptr ? 1 : 0;
    if (st.query_source >= 0 && st.query_source != given) {
      throw Error(ErrorCode::kInvalidArgument,
                  "[" + st.config.method() + "] queries: this cache's first step " +
                      (st.query_source == 1
                           ? std::string("passed the step's queries, and this step passes none: "
                                         "pass them every step (end_step(&probs, &queries))")
                           : std::string("passed no queries (the keys stand in for them), and "
                                         "this step passes them: pass none until reset()")) +
                      "; the step stays open");
    }
    if (given == 1 && !st.rope_set) {
      throw Error(ErrorCode::kInvalidArgument,
                  "[" + st.config.method() + "] queries need the layer's rotary embedding: call "
                  "set_rope() (C: vq_layer_set_rope) once before the first step that passes "
                  "them; the step stays open");
    }
    if (given == 1 && !st.rope_inv_freq.empty() &&
        static_cast<std::int64_t>(st.rope_inv_freq.size()) * 2 != st.shape.head_dim) {
      throw Error(ErrorCode::kInvalidArgument,
                  "[" + st.config.method() + "] set_rope gave " +
                      std::to_string(st.rope_inv_freq.size()) + " pairs, but head_dim " +
                      std::to_string(st.shape.head_dim) + " needs " +
                      std::to_string(st.shape.head_dim / 2) + "; the step stays open");
    }
  }
  if (attention != nullptr && st.step_new > 0) {
    const AttentionRef& a = *attention;
    const std::int64_t R = st.step_prev + st.step_new;
    // No data is fine only for a cache that reads none (cache.h, end_step).
    if ((a.data == nullptr && reads_attention()) || a.batch != st.batch ||
        a.n_query_heads != st.shape.n_query_heads || a.n_queries != st.step_new ||
        a.n_rows != R) {
      throw Error(ErrorCode::kShapeMismatch,
                  "[cache] attention must be [B, Hq, S, R] = [" + std::to_string(st.batch) + ", " +
                      std::to_string(st.shape.n_query_heads) + ", " +
                      std::to_string(st.step_new) + ", " + std::to_string(R) + "], got [" +
                      std::to_string(a.batch) + ", " + std::to_string(a.n_query_heads) + ", " +
                      std::to_string(a.n_queries) + ", " + std::to_string(a.n_rows) + "]" +
                      (a.data == nullptr ? " with no data" : ""));
    }
  }
  const bool resolves_source = st.step_new > 0 && policy_->source_unresolved();
  if (resolves_source) {
    policy_->resolve_source(attention != nullptr);
    st.source_resolved = true;
  }
  if (st.step_new > 0 && attention == nullptr && policy_->needs_attention()) {
    throw Error(ErrorCode::kInvalidArgument,
                "[" + st.config.method() + "] " +
                    (st.source_resolved
                         ? std::string("source=auto resolved to attention at this cache's first "
                                       "step (it passed probabilities), and this step passes none: "
                                       "pass them every step, or set source=proxy")
                         : std::string("source=attention needs this step's attention "
                                       "probabilities: call end_step(&probs) (update() and "
                                       "end_step() pass none)")) +
                    "; the step stays open");
  }
  if (st.step_new > 0 && attention != nullptr && st.source_resolved &&
      std::string_view(policy_->source_name()) == "proxy") {
    throw Error(ErrorCode::kInvalidArgument,
                "[" + st.config.method() + "] source=auto resolved to proxy at this cache's first "
                "step (it passed no probabilities), and this step passes them: pass none, or set "
                "source=attention; the step stays open");
  }
  // Probabilities passed without data (the cache reads none): the policy gets none.
  const AttentionRef* given =
      attention != nullptr && attention->data != nullptr ? attention : nullptr;
  st.attention = given;
  const bool resolves_queries =
      st.step_new > 0 && policy_->reads_queries() && st.query_source < 0;
  if (resolves_queries) st.query_source = queries != nullptr ? 1 : 0;
  st.queries = st.step_new > 0 && policy_->reads_queries() && queries != nullptr ? queries
                                                                                   : nullptr;
  if (st.step_new > 0) {
    auto& applier = static_cast<StoreApplier&>(*st.sink);
    applier.applied_ = 0;
    try {
      policy_->end_step(st, given);
    } catch (...) {
      // A policy that throws before it decides anything (a registered method's scorer:
      // policies/scored.cpp scores every new row first) has changed nothing: the step is rolled
      // back, so the cache goes on as if it had never been given. After a decision there is no
      // way back, and the step stays open (reset() recovers).
      bool untouched = applier.applied_ == 0;
      for (const HeadState& hs : st.heads) untouched = untouched && hs.live.empty();
      if (!untouched) throw;
      roll_back_step(st);
      if (resolves_source) {
        policy_->reset_source();
        st.source_resolved = false;
      }
      if (resolves_queries) st.query_source = -1;
      st.queries = nullptr;
      try {
        throw;
      } catch (const Error& e) {
        throw Error(e.code(), std::string(e.what()) +
                                  "; the step was rolled back (its rows are forgotten and the "
                                  "cache is as before its begin_step)",
                    e.path());
      }
    }
    // The policy's per-row arrays follow the store's rows (live is empty between steps and
    // refilled with every row at the next step).
    const std::int64_t before = st.step_prev + st.step_new;
    for (HeadState& hs : st.heads) {
      const std::int64_t rows = hs.store()->size();
      if (before <= 2 * rows + 64) continue;
      give_back_capacity(hs.live, rows, 1);
      give_back_capacity(hs.score, rows, 1);
      give_back_capacity(hs.aux, rows, 1);
      give_back_capacity(hs.hist, rows, hs.hist_stride);
    }
  }
  st.attention = nullptr;
  st.step_open = false;
  st.step_new = 0;
  st.step_question = 0;
}

bool LayerCache::reads_queries() const noexcept {
  return policy_->reads_queries() && state_->query_source != 0;
}

void LayerCache::set_rope(const RopeRef& rope) {
  LayerState& st = *state_;
  auto bad = [](const std::string& msg) {
    throw Error(ErrorCode::kInvalidArgument, "[cache] set_rope: " + msg);
  };
  if (rope.n_pairs < 0 || rope.n_pairs > kMaxHeadDim / 2) {
    bad("n_pairs must be in [0, " + std::to_string(kMaxHeadDim / 2) + "], got " +
        std::to_string(rope.n_pairs));
  }
  if (rope.n_pairs > 0 && rope.inv_freq == nullptr) bad("inv_freq is null with n_pairs > 0");
  if (rope.pairing != RopePairing::kInterleaved && rope.pairing != RopePairing::kHalfSplit) {
    bad("pairing must be interleaved or half-split");
  }
  if (rope.n_pairs > 0 && st.shape.head_dim > 0 && rope.n_pairs * 2 != st.shape.head_dim) {
    bad("n_pairs must be head_dim / 2 = " + std::to_string(st.shape.head_dim / 2) +
        " (or 0: no rotary embedding), got " + std::to_string(rope.n_pairs));
  }
  std::vector<double> freq(static_cast<std::size_t>(rope.n_pairs));
  for (std::int64_t i = 0; i < rope.n_pairs; ++i) {
    const float f = rope.inv_freq[i];
    if (!std::isfinite(f) || f < 0.0f) {
      bad("inv_freq[" + std::to_string(i) + "] must be finite and >= 0, got " +
          std::to_string(f));
    }
    freq[static_cast<std::size_t>(i)] = f;
  }
  st.rope_inv_freq = std::move(freq);
  st.rope_interleaved = rope.pairing == RopePairing::kInterleaved;
  st.rope_set = true;
}

bool LayerCache::has_rope() const noexcept { return state_->rope_set; }

bool LayerCache::reads_attention() const noexcept {
  return policy_->needs_attention() || policy_->source_unresolved();
}

KVRows LayerCache::update(const TensorRef& keys, const TensorRef& values) {
  if (policy_->needs_attention() && keys.tokens() > 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "[" + state_->config.method() + "] " +
                    (state_->source_resolved ? std::string("source=auto resolved to attention at "
                                                           "this cache's first step, so it ")
                                             : std::string("source=attention ")) +
                    "needs the attention probabilities, which update() cannot take: use "
                    "begin_step() and end_step(&probs)");
  }
  const StepView view = begin_step(keys, values);
  KVRows out;
  out.batch = view.batch();
  out.n_kv_heads = view.n_kv_heads();
  out.n_rows = view.n_rows();
  out.head_dim = view.head_dim();
  const std::int64_t D = out.head_dim, R = out.n_rows;
  const std::size_t n = static_cast<std::size_t>(out.batch * out.n_kv_heads * R);
  out.keys.resize(n * static_cast<std::size_t>(D));
  out.values.resize(n * static_cast<std::size_t>(D));
  out.positions.resize(n);
  std::vector<float> kbuf, vbuf;  // packed rows, dequantized one head at a time
  for (std::int64_t b = 0; b < out.batch; ++b) {
    for (std::int64_t h = 0; h < out.n_kv_heads; ++h) {
      const HeadRows hr = dequantized(view.head(b, h), kbuf, vbuf);
      const std::size_t size = dtype_size(hr.dtype);
      for (std::int64_t r = 0; r < R; ++r) {
        const std::int64_t o = ((b * out.n_kv_heads + h) * R + r);
        if (r >= hr.n_rows) {  // a head-wise head with fewer rows than the view's R
          out.positions[static_cast<std::size_t>(o)] = -1;
          continue;
        }
        const auto* krow = static_cast<const char*>(hr.keys) + r * hr.row_stride * static_cast<std::int64_t>(size);
        const auto* vrow = static_cast<const char*>(hr.values) + r * hr.row_stride * static_cast<std::int64_t>(size);
        kernels::load_row(krow, hr.dtype, out.keys.data() + o * D, D);
        kernels::load_row(vrow, hr.dtype, out.values.data() + o * D, D);
        out.positions[static_cast<std::size_t>(o)] = hr.positions[r];
      }
    }
  }
  end_step(nullptr);
  return out;
}

void LayerCache::expect_positions(std::int64_t n) {
  if (n < 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "[cache] expect_positions needs a count >= 0 (0: unknown), got " +
                    std::to_string(n));
  }
  LayerState& st = *state_;
  st.expected_rows = n;
  for (HeadState& hs : st.heads) StoreAccess::of(hs).expect_rows(n);
}

void LayerCache::set_output_gram(const float* gram, std::int64_t n_query_heads,
                                 std::int64_t head_dim) {
  LayerState& st = *state_;
  auto bad = [](const std::string& msg) {
    throw Error(ErrorCode::kInvalidArgument, "[cache] set_output_gram: " + msg);
  };
  if (st.step_open) {
    throw Error(ErrorCode::kInvalidState,
                "[cache] set_output_gram called while a step is open; call end_step() first");
  }
  if (n_query_heads < 1 || n_query_heads > kMaxHeads) {
    bad("n_query_heads must be in [1, " + std::to_string(kMaxHeads) + "], got " +
        std::to_string(n_query_heads));
  }
  if (head_dim < 1 || head_dim > kMaxHeadDim) {
    bad("head_dim must be in [1, " + std::to_string(kMaxHeadDim) + "], got " +
        std::to_string(head_dim));
  }
  if (gram == nullptr) bad("gram is null");
  const LayerShape& ls = st.shape;
  if (ls.n_query_heads > 0 && n_query_heads != ls.n_query_heads) {
    bad("n_query_heads " + std::to_string(n_query_heads) + " differs from this cache's " +
        std::to_string(ls.n_query_heads));
  }
  if (ls.n_kv_heads > 0 && n_query_heads % ls.n_kv_heads != 0) {
    bad("n_query_heads " + std::to_string(n_query_heads) + " must be a multiple of n_kv_heads (" +
        std::to_string(ls.n_kv_heads) + ")");
  }
  if (ls.head_dim > 0 && head_dim != ls.head_dim) {
    bad("head_dim " + std::to_string(head_dim) + " differs from this cache's " +
        std::to_string(ls.head_dim));
  }
  const std::size_t n = static_cast<std::size_t>(n_query_heads * head_dim) *
                        static_cast<std::size_t>(head_dim);
  for (std::size_t i = 0; i < n; ++i) {
    if (!std::isfinite(gram[i])) {
      bad("entry " + std::to_string(i) + " of the Gram matrices is not finite");
    }
  }
  if (!policy_->reads_output_gram()) return;
  st.output_gram.assign(gram, gram + n);
  st.output_gram_heads = n_query_heads;
  st.output_gram_dim = head_dim;
}

void LayerCache::set_question_length(std::int64_t n) {
  LayerState& st = *state_;
  if (st.step_open) {
    throw Error(ErrorCode::kInvalidState,
                "[cache] set_question_length called while a step is open; call it before "
                "begin_step of the prompt's step");
  }
  if (n < 0 || n > std::numeric_limits<std::int32_t>::max()) {
    throw Error(ErrorCode::kInvalidArgument,
                "[cache] set_question_length: n must be an integer in [0, 2147483647] (the "
                "prompt's last n tokens are its question; 0: none), got " +
                    std::to_string(n));
  }
  st.question = n;
}

std::int64_t LayerCache::question_length() const noexcept { return state_->question; }

bool LayerCache::reads_question() const noexcept { return policy_->reads_question(); }

bool LayerCache::reads_output_gram() const noexcept { return policy_->reads_output_gram(); }

bool LayerCache::has_output_gram() const noexcept { return !state_->output_gram.empty(); }

void LayerCache::set_reconstruction(bool on) {
  LayerState& st = *state_;
  if (st.step_open) {
    throw Error(ErrorCode::kInvalidState,
                "[cache] set_reconstruction called while a step is open; call end_step() first");
  }
  st.reconstruction = on;
}

bool LayerCache::reads_reconstruction() const noexcept { return policy_->reads_reconstruction(); }

std::int64_t LayerCache::reconstruction_chunk() const noexcept {
  return policy_->reconstruction_chunk();
}

void LayerCache::end_reconstruction_step(const AttentionRef* attention) {
  FloatEnvGuard env;
  LayerState& st = *state_;
  if (!st.step_open) {
    throw Error(ErrorCode::kInvalidState,
                "[cache] end_reconstruction_step called without an open step");
  }
  const std::string who = "[" + st.config.method() + "] end_reconstruction_step: ";
  if (!policy_->reads_reconstruction()) {
    roll_back_step(st);
    throw Error(ErrorCode::kInvalidState,
                who + "the method does not score by a reconstruction pass (kvzip does); the step "
                      "was rolled back");
  }
  if (!st.reconstruction) {
    roll_back_step(st);
    throw Error(ErrorCode::kInvalidState,
                who + "call set_reconstruction(true) (C: vq_layer_set_reconstruction) before the "
                      "prompt, so the prompt's rows wait for the pass; the step was rolled back");
  }
  const std::int64_t R = st.step_prev + st.step_new;
  if (attention == nullptr || attention->data == nullptr || attention->batch != st.batch ||
      attention->n_query_heads != st.shape.n_query_heads ||
      attention->n_queries != st.step_new || attention->n_rows != R) {
    const std::string got =
        attention == nullptr
            ? std::string("none")
            : "[" + std::to_string(attention->batch) + ", " +
                  std::to_string(attention->n_query_heads) + ", " +
                  std::to_string(attention->n_queries) + ", " + std::to_string(attention->n_rows) +
                  "]" + (attention->data == nullptr ? " with no data" : "");
    roll_back_step(st);
    throw Error(ErrorCode::kShapeMismatch,
                who + "attention must be [B, Hq, S, R] = [" + std::to_string(st.batch) + ", " +
                    std::to_string(st.shape.n_query_heads) + ", " + std::to_string(st.step_new) +
                    ", " + std::to_string(R) + "] with data, got " + got +
                    "; the step was rolled back");
  }
  if (st.step_new > 0) policy_->observe_reconstruction(st, *attention);
  roll_back_step(st);
}

void LayerCache::compress() {
  FloatEnvGuard env;
  LayerState& st = *state_;
  if (st.step_open) {
    throw Error(ErrorCode::kInvalidState,
                "[cache] compress called while a step is open; call end_step() first");
  }
  if (!policy_->reads_reconstruction() || !st.shaped) return;
  policy_->compress(st);
}

void LayerCache::reset() {
  LayerState& st = *state_;
  for (HeadState& hs : st.heads) {
    StoreAccess::of(hs).clear();
    hs.live.clear();
    hs.score.clear();
    hs.aux.clear();
    hs.hist.clear();
    hs.draws = 0;
    hs.prev = 0;
    hs.evictions = hs.merges = 0;
  }
  st.tokens_seen = 0;
  st.step_open = false;
  st.step_prev = st.step_new = 0;
  st.source_resolved = false;
  st.query_source = -1;
  st.question = st.step_question = 0;
  policy_->reset_source();
  policy_->on_reset(st);
}

HeadRows LayerCache::stored(std::int64_t b, std::int64_t h) const {
  const LayerState& st = *state_;
  if (!st.shaped) return HeadRows{};
  if (b < 0 || b >= st.batch || h < 0 || h >= st.shape.n_kv_heads) {
    throw Error(ErrorCode::kInvalidArgument,
                "[cache] stored(b, h) needs b in [0, " + std::to_string(st.batch - 1) +
                    "] and h in [0, " + std::to_string(st.shape.n_kv_heads - 1) + "], got (" +
                    std::to_string(b) + ", " + std::to_string(h) + ")");
  }
  return st.heads[static_cast<std::size_t>(b * st.shape.n_kv_heads + h)].store()->rows();
}

std::vector<float> LayerCache::row_scores(std::int64_t b, std::int64_t h) const {
  const HeadRows rows = stored(b, h);
  if (rows.n_rows == 0) return {};
  const HeadState& hs = state_->heads[static_cast<std::size_t>(b * state_->shape.n_kv_heads + h)];
  const std::int64_t n_demoted = hs.store()->n_demoted();
  if (static_cast<std::int64_t>(hs.score.size()) != rows.n_rows - n_demoted) {
    return std::vector<float>(static_cast<std::size_t>(rows.n_rows), 0.0f);
  }
  std::vector<float> out = hs.score;  // the method's rows, then the demoted rows (demote=)
  for (std::int64_t k = 0; k < n_demoted; ++k) out.push_back(hs.store()->demoted_score(k));
  return out;
}

bool LayerCache::step_open() const noexcept { return state_->step_open; }

std::int64_t LayerCache::tokens_seen() const noexcept { return state_->tokens_seen; }

std::int64_t LayerCache::tokens_kept() const noexcept {
  return state_->heads.empty() ? 0 : state_->heads[0].store()->size();
}

std::int64_t LayerCache::kept_bytes() const noexcept {
  std::int64_t total = 0;
  for (const HeadState& hs : state_->heads) total += hs.store()->bytes();
  return total;
}

std::int64_t LayerCache::full_bytes() const noexcept {
  const LayerState& st = *state_;
  if (!st.shaped) return 0;
  return st.tokens_seen * st.batch * st.shape.n_kv_heads * st.shape.head_dim * 2 * 2;
}

double LayerCache::compression_ratio() const noexcept {
  const std::int64_t kept = kept_bytes();
  const std::int64_t full = full_bytes();
  if (kept == 0) return 1.0;
  return static_cast<double>(full) / static_cast<double>(kept);
}

CacheStats LayerCache::stats() const {
  CacheStats s;
  s.tokens_seen = tokens_seen();
  s.tokens_kept = tokens_kept();
  for (const HeadState& hs : state_->heads) {
    s.tokens_kept_per_head.push_back(hs.store()->size());
    s.allocated_bytes += hs.store()->allocated_bytes();
    s.resident_bytes += hs.store()->resident_bytes() + capacity_bytes(hs.live) +
                        capacity_bytes(hs.score) + capacity_bytes(hs.aux) + capacity_bytes(hs.hist);
    s.evictions += hs.evictions + hs.store()->dropped();
    s.merges += hs.merges;
    s.demoted_rows += hs.store()->n_demoted();
  }
  s.resident_bytes += capacity_bytes(state_->heads) + capacity_bytes(state_->rngs) +
                      capacity_bytes(state_->view_rows);
  s.kept_bytes = kept_bytes();
  s.full_bytes = full_bytes();
  s.compression_ratio = compression_ratio();
  s.score_source = policy_->source_name();
  for (std::size_t i = 0; i < state_->heads.size(); ++i) {
    const std::int32_t type = policy_->head_type(static_cast<std::int64_t>(i));
    const std::int64_t bytes = state_->heads[i].store()->bytes();
    if (type == 1) {
      ++s.retrieval_heads;
      s.retrieval_bytes += bytes;
    } else if (type == 2) {
      ++s.streaming_heads;
      s.streaming_bytes += bytes;
    }
  }
  s.value_norm = !policy_->reads_output_gram()    ? "none"
                 : state_->output_gram.empty() ? "plain"
                                               : "projected";
  s.resident_bytes += capacity_bytes(state_->output_gram);
  return s;
}

const char* LayerCache::score_source() const noexcept { return policy_->source_name(); }

void LayerCache::set_head_pattern(const std::vector<float>& scores) {
  const LayerState& st = *state_;
  const std::string who = "[" + st.config.method() + "] set_head_pattern: ";
  if (!policy_->takes_head_pattern()) {
    throw Error(ErrorCode::kInvalidArgument,
                who + "the method takes no head pattern (methods with head types do: duoattention)");
  }
  if (st.step_open || st.tokens_seen > 0) {
    throw Error(ErrorCode::kInvalidState,
                who + "the pattern must be set before the first step (call reset() first)");
  }
  if (!scores.empty()) {
    if (st.shape.n_kv_heads <= 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  who + "the number of KV heads is not known yet: give it in the LayerShape");
    }
    if (static_cast<std::int64_t>(scores.size()) != st.shape.n_kv_heads) {
      throw Error(ErrorCode::kInvalidArgument,
                  who + "expected " + std::to_string(st.shape.n_kv_heads) +
                      " scores (one per KV head), found " + std::to_string(scores.size()));
    }
    for (std::size_t h = 0; h < scores.size(); ++h) {
      if (!std::isfinite(scores[h])) {
        throw Error(ErrorCode::kInvalidArgument,
                    who + "the score of KV head " + std::to_string(h) + " is " +
                        std::to_string(scores[h]) + ", expected a finite number");
      }
    }
  }
  policy_->set_head_pattern(scores);
}

std::vector<std::int32_t> LayerCache::head_types() const {
  std::vector<std::int32_t> out;
  for (std::size_t i = 0; i < state_->heads.size(); ++i) {
    out.push_back(policy_->head_type(static_cast<std::int64_t>(i)));
  }
  return out;
}

std::int64_t LayerCache::budget() const noexcept { return policy_->budget(); }
const CacheConfig& LayerCache::config() const noexcept { return state_->config; }
const LayerShape& LayerCache::shape() const noexcept { return state_->shape; }

HeadPattern load_head_pattern(const std::string& path, std::int64_t n_layers,
                              std::int64_t n_kv_heads) {
  auto fail = [&](const std::string& where, const std::string& msg) -> void {
    throw Error(ErrorCode::kFileError, "[head pattern] " + path + ": " + where + msg, path);
  };
  if (n_layers < 1 || n_kv_heads < 1) {
    throw Error(ErrorCode::kInvalidArgument,
                "[head pattern] needs n_layers and n_kv_heads >= 1, got " +
                    std::to_string(n_layers) + " and " + std::to_string(n_kv_heads));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("", "cannot be opened for reading");
  HeadPattern out;
  std::string line;
  std::int64_t line_no = 0;
  bool blank_seen = false;  // blank lines may only trail
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const std::string where = "line " + std::to_string(line_no) + ": ";
    if (line.find_first_not_of(" \t") == std::string::npos) {
      blank_seen = true;
      continue;
    }
    if (blank_seen) fail(where, "expected only blank lines after the last layer, found \"" +
                                    line.substr(0, 40) + "\"");
    if (static_cast<std::int64_t>(out.size()) == n_layers) {
      fail(where, "expected " + std::to_string(n_layers) + " lines (one per layer), found more");
    }
    std::vector<float> row;
    std::size_t pos = 0;
    while (true) {
      pos = line.find_first_not_of(" \t", pos);
      if (pos == std::string::npos) break;
      const std::size_t end = std::min(line.find_first_of(" \t", pos), line.size());
      const std::string field = line.substr(pos, end - pos);
      const std::string nth = "field " + std::to_string(row.size() + 1) + ": ";
      char* stop = nullptr;
      const double v = std::strtod(field.c_str(), &stop);
      if (stop == field.c_str() || *stop != '\0') {
        fail(where, nth + "expected a number, found \"" + field.substr(0, 40) + "\"");
      }
      if (!std::isfinite(v) || std::fabs(v) > 3.0e38) {
        fail(where, nth + "expected a finite number, found \"" + field.substr(0, 40) + "\"");
      }
      row.push_back(static_cast<float>(v));
      pos = end;
    }
    if (static_cast<std::int64_t>(row.size()) != n_kv_heads) {
      fail(where, "expected " + std::to_string(n_kv_heads) + " numbers (one per KV head), found " +
                      std::to_string(row.size()));
    }
    out.push_back(std::move(row));
  }
  if (in.bad()) fail("", "read error");
  if (static_cast<std::int64_t>(out.size()) != n_layers) {
    fail("", "expected " + std::to_string(n_layers) + " lines (one per layer), found " +
                 std::to_string(out.size()));
  }
  return out;
}

void LayerCache::set_key_filters(const float* filters, std::int64_t n) {
  const LayerShape& sh = state_->shape;
  auto bad = [&](const std::string& msg) {
    throw Error(ErrorCode::kInvalidArgument, "[cache] set_key_filters: " + msg);
  };
  if (n < 0) bad("n must be >= 0, got " + std::to_string(n));
  if (filters == nullptr && n > 0) bad("filters must not be null when n > 0");
  if (sh.n_kv_heads > 0 && sh.head_dim > 0 && n != sh.n_kv_heads * sh.head_dim) {
    bad("n must be n_kv_heads x head_dim = " + std::to_string(sh.n_kv_heads) + " x " +
        std::to_string(sh.head_dim) + " = " + std::to_string(sh.n_kv_heads * sh.head_dim) +
        ", got " + std::to_string(n));
  }
  for (std::int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(filters[i])) {
      bad("value " + std::to_string(i) + " (head " +
          std::to_string(sh.head_dim > 0 ? i / sh.head_dim : 0) + ") is not finite");
    }
  }
  state_->key_filters.assign(filters, filters + n);
}

bool LayerCache::needs_key_filters() const noexcept { return policy_->needs_key_filters(); }

}  // namespace vq
