// The custom-method registry (register_method, scored_method) driven by the input: a MethodInfo
// built from it (id, prefix, summary, a scorer factory that works, returns an empty scorer or
// throws, fields of every type with names, ranges, defaults, choices, groups and aliases taken
// from the input, shared_defaults, budget fields), then a spec and a few steps on the method
// through a LayerCache, with a scorer that returns input-chosen values (NaN and inf included)
// or throws at an input-chosen call.
//
// What must hold, else the target aborts and libFuzzer records the input:
//  - register_method answers a bad entry with vq::Error(kInvalidArgument), never anything else
//    (std::bad_function_call from a missing scorer was the bug of issue 33);
//  - every later call answers with a vq::Error or works; a scorer that throws rolls its step
//    back: the cache's step is closed, tokens_seen is what it was, and the next begin_step is
//    accepted (never kInvalidState).
//
// Registration is for good, so the target registers at most kMaxRegistered methods per
// process; after that an input's id is replaced by one already registered (the entry is still
// validated whole, then refused as a duplicate) and its steps run on that method.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "veloxquant/veloxquant.h"

namespace {

constexpr std::size_t kMaxRegistered = 256;
std::vector<std::string> g_registered;

struct Input : vq::fuzz::ByteReader {
  std::string str() {  // a length byte (0..23) and that many bytes
    const std::size_t len = byte() % 24;
    std::string s;
    for (std::size_t i = 0; i < len && at < n; ++i) s.push_back(static_cast<char>(p[at++]));
    return s;
  }
  double real() {
    static const double table[] = {0.0, 1.0, -1.0, 0.5, 2.0, 8.0, 64.0, 1e9, -1e9, 1e300,
                                   std::numeric_limits<double>::quiet_NaN(),
                                   std::numeric_limits<double>::infinity(),
                                   -std::numeric_limits<double>::infinity(), 4096.0, 3.0, 1e-300};
    return table[byte() % 16];
  }
  std::int64_t integer() {
    static const std::int64_t table[] = {0, 1, 2, 3, 4, 8, 16, -1, -2, 1 << 20,
                                         std::numeric_limits<std::int64_t>::max(),
                                         std::numeric_limits<std::int64_t>::min(), 6, 32, 100, 7};
    return table[byte() % 16];
  }
  float value() { return ByteReader::value(16.0f); }
};

// The scorer's behaviour for the current input (the scorer of a method registered by an earlier
// input reads it too): throw at call `throw_at` (0: never), else return plan values in turn.
struct ScorerPlan {
  int calls = 0, throw_at = 0;
  std::vector<float> values;
};
ScorerPlan g_plan;

float planned_score(const float* key, const float* value, std::int64_t head_dim) {
  ++g_plan.calls;
  if (g_plan.calls == g_plan.throw_at) throw std::runtime_error("planned scorer failure");
  if (g_plan.values.empty()) return head_dim > 0 ? key[0] + value[0] : 0.0f;
  return g_plan.values[static_cast<std::size_t>(g_plan.calls) % g_plan.values.size()];
}

vq::FieldSpec field_from(Input& in, const std::string& prefix) {
  vq::FieldSpec f;
  const std::uint8_t how = in.byte();
  f.name = (how & 1) ? prefix + "_" + in.str() : in.str();
  f.type = static_cast<vq::FieldType>(how / 2 % 4);
  f.min = in.real();
  f.max = in.real();
  switch (f.type) {
    case vq::FieldType::kInt: f.default_value = in.integer(); break;
    case vq::FieldType::kFloat: f.default_value = in.real(); break;
    case vq::FieldType::kBool: f.default_value = (in.byte() & 1) != 0; break;
    case vq::FieldType::kEnum: f.default_value = in.str(); break;
  }
  if (how & 16) f.default_value = in.str();  // a default of the wrong type
  for (int i = in.byte() % 4; i > 0; --i) f.choices.push_back(in.str());
  f.doc = in.str();
  if (how & 32) f.group = in.str();
  for (int i = in.byte() % 3; i > 0; --i) f.aliases.push_back(in.str());
  return f;
}

void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_registry: %s: %s\n", what, detail.c_str());
  std::abort();
}

// A LayerCache of the method and up to 12 steps of 1..6 tokens, values from the input.
void run_steps(Input& in, const vq::CacheConfig& config) {
  const std::int64_t H = 1 + in.byte() % 2, D = (in.byte() & 1) ? 32 : 1 + in.byte() % 8;
  std::unique_ptr<vq::LayerCache> cache;
  try {
    cache = std::make_unique<vq::LayerCache>(config, vq::LayerShape{H, D});
  } catch (const vq::Error& e) {
    if (e.code() != vq::ErrorCode::kInvalidArgument && e.code() != vq::ErrorCode::kInvalidConfig) {
      fail("LayerCache: unexpected error code", e.what());
    }
    return;
  }
  std::vector<float> k, v;
  for (int step = 0; step < 12 && in.more(); ++step) {
    const std::int64_t S = 1 + in.byte() % 6;
    k.resize(static_cast<std::size_t>(H * S * D));
    v.resize(k.size());
    for (float& x : k) x = in.value();
    for (float& x : v) x = in.value();
    const std::int64_t seen = cache->tokens_seen();
    try {
      cache->begin_step(vq::TensorRef::f32(k.data(), 1, H, S, D),
                        vq::TensorRef::f32(v.data(), 1, H, S, D));
    } catch (const vq::Error& e) {
      if (e.code() == vq::ErrorCode::kInvalidState) fail("begin_step after a closed step", e.what());
      continue;
    }
    try {
      cache->end_step();
    } catch (const vq::Error& e) {
      const std::string msg = e.what();
      if (msg.find("threw") == std::string::npos) continue;  // another clean refusal
      // The scorer (or its factory) threw: the step must be rolled back.
      if (e.code() != vq::ErrorCode::kInvalidArgument) fail("scorer error code", msg);
      if (cache->step_open()) fail("step left open after a scorer threw", msg);
      if (cache->tokens_seen() != seen) fail("tokens_seen not rolled back", msg);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Input in{{data, size}};
  g_plan = ScorerPlan{};
  g_plan.throw_at = in.byte() % 16;
  for (int i = in.byte() % 4; i > 0; --i) g_plan.values.push_back(in.value());

  std::string id = in.str();
  const std::string prefix = in.str();
  const std::string summary = in.str();
  const std::uint8_t factory = in.byte();
  std::function<vq::RowScorer(const vq::CacheConfig&)> make_scorer;
  switch (factory % 4) {
    case 0: make_scorer = [](const vq::CacheConfig&) { return vq::RowScorer(&planned_score); }; break;
    case 1: make_scorer = [](const vq::CacheConfig&) { return vq::RowScorer(); }; break;
    case 2:
      make_scorer = [](const vq::CacheConfig&) -> vq::RowScorer {
        throw std::runtime_error("planned factory failure");
      };
      break;
    default: break;  // none
  }
  vq::MethodInfo m = vq::scored_method(id, prefix, summary, make_scorer, in.integer());
  if (factory & 4) m.fields[1].default_value = in.integer();  // n_sink
  for (int i = in.byte() % 4; i > 0; --i) m.fields.push_back(field_from(in, prefix));
  if (factory & 8) m.shared_defaults = in.str();
  if (factory & 16) m.budget_field = in.str();
  if (factory & 32) m.budget_offset = in.str();
  if (factory & 64) m.scores_attention = true;
  if (g_registered.size() >= kMaxRegistered) {
    id = g_registered[in.byte() % g_registered.size()];
    m.id = id;
  }

  bool usable = false;
  try {
    vq::register_method(m);
    g_registered.push_back(id);
    usable = true;
  } catch (const vq::Error& e) {
    if (e.code() != vq::ErrorCode::kInvalidArgument) fail("register_method: error code", e.what());
    // A duplicate of a method an earlier input registered: run on that one.
    for (const std::string& r : g_registered) usable = usable || r == id;
  }
  // Any other exception escapes: libFuzzer reports it.
  if (!usable) return 0;

  const std::string spec = id + (in.byte() & 1 ? ":" + in.str() : "");
  vq::fuzz::expect_clean([&] {
    const vq::CacheConfig config = vq::CacheConfig::parse(spec);
    run_steps(in, config);
  });
  return 0;
}
