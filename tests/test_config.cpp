// Method specs, field validation, the guards of every method, the registry.
#include <gtest/gtest.h>

#include <limits>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "test_util.h"

namespace vq {
namespace {

using test::expect_error;

TEST(Spec, PrefixIsOptional) {
  EXPECT_EQ(CacheConfig::parse("cam:budget=64,merge=drop"),
            CacheConfig::parse("cam:cam_budget=64,cam_merge=drop"));
  const CacheConfig c = CacheConfig::parse("cam:budget=64,merge=drop,seed=7,kv_dtype=f32");
  EXPECT_EQ(c.get_int("cam_budget"), 64);
  EXPECT_EQ(c.get_int("budget"), 64);
  EXPECT_EQ(c.get_enum("merge"), "drop");
  EXPECT_EQ(c.get_enum("cam_merge"), "drop");  // the merge fields' per-method names: aliases
  EXPECT_EQ(c.seed(), 7);
  EXPECT_EQ(c.kv_dtype(), DType::kF32);
}

TEST(Spec, BareIdGivesTheReferenceDefaults) {
  const CacheConfig h = CacheConfig::parse("h2o");
  EXPECT_EQ(h.get_int("h2o_budget"), 512);
  EXPECT_EQ(h.get_int("h2o_n_sink"), 4);
  EXPECT_EQ(h.get_int("h2o_grace"), -1);  // derived: recent_ratio of the non-sink budget
  EXPECT_DOUBLE_EQ(h.get_float("h2o_recent_ratio"), 0.5);
  EXPECT_DOUBLE_EQ(h.get_float("h2o_decay"), 0.98);
  EXPECT_EQ(h.get_enum("source"), "auto");
  EXPECT_EQ(h.seed(), 42);
  EXPECT_EQ(h.kv_dtype(), DType::kF16);
  const CacheConfig c = CacheConfig::parse("cam");
  EXPECT_EQ(c.get_int("cam_budget"), 512);
  EXPECT_EQ(c.get_enum("merge"), "mean");
  EXPECT_EQ(c.get_enum("merge_target"), "window");
  EXPECT_EQ(c.get_enum("merge_attention"), "current");
  EXPECT_EQ(c.get_int("cam_grace"), -1);
  EXPECT_DOUBLE_EQ(c.get_float("cam_decay"), 0.98);
  const CacheConfig k = CacheConfig::parse("keyformer");
  EXPECT_EQ(k.get_int("keyformer_recent"), -1);
  EXPECT_DOUBLE_EQ(k.get_float("keyformer_recent_ratio"), 0.3);
  EXPECT_TRUE(c.get_bool("merge_gate"));
  EXPECT_FALSE(c.get_bool("merge_keys"));
  // The shared merge group's defaults elsewhere: drop, nearest, the method's own scores.
  EXPECT_EQ(h.get_enum("merge"), "drop");
  EXPECT_EQ(h.get_enum("merge_target"), "nearest");
  EXPECT_EQ(h.get_enum("merge_attention"), "cumulative");
  EXPECT_EQ(h.get_int("merge_m"), 32);
  const CacheConfig m = CacheConfig::parse("morphkv");
  EXPECT_EQ(m.get_int("morphkv_window"), 8);
  EXPECT_EQ(m.get_enum("morphkv_fusion"), "mean");
  const CacheConfig s = CacheConfig::parse("streaming_llm");
  EXPECT_EQ(s.get_int("stream_n_sink"), 4);
  EXPECT_EQ(s.get_int("stream_window_size"), 512);
  EXPECT_EQ(CacheConfig::parse("tova").get_int("tova_budget"), 512);
}

TEST(Spec, RoundTripsThroughSpecString) {
  for (const auto& id : method_ids()) {
    const CacheConfig c(id);
    EXPECT_EQ(CacheConfig::parse(c.spec(true)), c) << c.spec(true);
    EXPECT_EQ(CacheConfig::parse(c.spec(false)), c) << c.spec(false);
  }
  const CacheConfig c = CacheConfig::parse("h2o:decay=0.5,grace=0,budget=100");
  EXPECT_EQ(c.spec(), "h2o:h2o_budget=100,h2o_grace=0,h2o_decay=0.5");
  EXPECT_EQ(CacheConfig::parse(c.spec()), c);
}

TEST(Spec, UnknownMethodListsTheKnownOnes) {
  std::vector<std::string> expected = {"unknown method 'snapkvv'"};
  for (const auto& id : method_ids()) expected.push_back(id);
  expect_error([] { CacheConfig::parse("snapkvv:budget=3"); }, ErrorCode::kUnknownMethod, expected);
  expect_error([] { CacheConfig("nope"); }, ErrorCode::kUnknownMethod, {"'nope'"});
}

TEST(Spec, UnknownKeyListsTheAllowedKeys) {
  expect_error([] { CacheConfig::parse("cam:budgett=64"); }, ErrorCode::kInvalidSpec,
               {"[cam] unknown key 'budgett'", "budget (cam_budget)", "merge_gate", "seed",
                "kv_dtype"});
  // Another method's prefix does not resolve.
  expect_error([] { CacheConfig::parse("cam:h2o_budget=64"); }, ErrorCode::kInvalidSpec,
               {"unknown key 'h2o_budget'"});
}

TEST(Spec, BadValuesNameTheFieldAndWhatIsAllowed) {
  expect_error([] { CacheConfig::parse("cam:budget=abc"); }, ErrorCode::kInvalidSpec,
               {"[cam] cam_budget must be an integer", "got 'abc'"});
  expect_error([] { CacheConfig::parse("cam:budget=64.5"); }, ErrorCode::kInvalidSpec,
               {"cam_budget", "got '64.5'"});
  expect_error([] { CacheConfig::parse("cam:merge=blend"); }, ErrorCode::kInvalidSpec,
               {"[cam] merge must be", "{sim_weighted, mean, drop}", "got 'blend'"});
  expect_error([] { CacheConfig::parse("cam:merge_gate=maybe"); }, ErrorCode::kInvalidSpec,
               {"merge_gate", "true or false"});
  expect_error([] { CacheConfig::parse("h2o:decay=nan"); }, ErrorCode::kInvalidSpec,
               {"h2o_decay"});
  expect_error([] { CacheConfig::parse("h2o:decay=1.5"); }, ErrorCode::kInvalidConfig,
               {"[h2o] h2o_decay must be in [0, 1], got 1.5"});
  expect_error([] { CacheConfig::parse("h2o:budget=99999999999"); }, ErrorCode::kInvalidConfig,
               {"h2o_budget must be in [1, 16777216], got 99999999999"});
  expect_error([] { CacheConfig::parse("full:kv_dtype=bf16"); }, ErrorCode::kInvalidSpec,
               {"kv_dtype", "{f16, f32, q8_0, q4_0}", "'bf16'"});
}

TEST(Spec, SyntaxErrors) {
  for (const char* s : {"", ":budget=4", "cam:", "cam:budget", "cam:=4", "cam:budget=4,",
                        "cam:budget=4,,seed=1", "cam: budget=4"}) {
    try {
      CacheConfig::parse(s);
      ADD_FAILURE() << "spec '" << s << "' parsed";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidSpec) << s << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("ID[:KEY=VALUE"), std::string::npos) << e.what();
    }
  }
  expect_error([] { CacheConfig::parse("cam:budget=4,cam_budget=8"); }, ErrorCode::kInvalidSpec,
               {"'cam_budget' is given more than once"});
}

TEST(Config, SetChecksTypesAndValidateChecksRanges) {
  CacheConfig c("h2o");
  expect_error([&] { c.set("budget", std::string("x")); }, ErrorCode::kInvalidConfig,
               {"h2o_budget must be an integer"});
  expect_error([&] { c.set("nonsense", std::int64_t{1}); }, ErrorCode::kInvalidArgument,
               {"unknown field 'nonsense'"});
  c.set("decay", std::int64_t{1});  // ints are accepted for floats
  EXPECT_DOUBLE_EQ(c.get_float("h2o_decay"), 1.0);
  c.set("budget", std::int64_t{0});
  expect_error([&] { c.validate(); }, ErrorCode::kInvalidConfig,
               {"[h2o] h2o_budget must be in [1, 16777216], got 0"});
  // The cache constructor validates too: nothing is clamped.
  expect_error([&] { LayerCache cache(c, LayerShape{}); }, ErrorCode::kInvalidConfig,
               {"h2o_budget", "got 0"});
}

// Every construction guard, each naming its field.
struct GuardCase {
  std::string spec;
  std::string fragment;
};

class Guards : public ::testing::TestWithParam<GuardCase> {};

TEST_P(Guards, RaiseNamingTheField) {
  const GuardCase& g = GetParam();
  try {
    CacheConfig::parse(g.spec);
    ADD_FAILURE() << g.spec << " was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidConfig) << e.what();
    EXPECT_NE(std::string(e.what()).find(g.fragment), std::string::npos)
        << "'" << e.what() << "' lacks '" << g.fragment << "'";
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllMethods, Guards,
    ::testing::Values(
        // h2o's two
        GuardCase{"h2o:budget=8,n_sink=8,grace=0", "h2o_n_sink must be < h2o_budget (8), got 8"},
        GuardCase{"h2o:budget=20,n_sink=4,grace=16",
                  "h2o_n_sink + h2o_grace must be < h2o_budget (20), got 4 + 16 = 20"},
        // morphkv's five
        GuardCase{"morphkv:budget=0", "morphkv_budget must be in [1, 16777216], got 0"},
        GuardCase{"morphkv:window=0", "morphkv_window must be in [1, 16777216], got 0"},
        GuardCase{"morphkv:budget=8,n_sink=8,window=1",
                  "morphkv_n_sink must be < morphkv_budget (8), got 8"},
        GuardCase{"morphkv:budget=8,n_sink=0,window=9",
                  "morphkv_window must be <= morphkv_budget (8), got 9"},
        GuardCase{"morphkv:budget=12,n_sink=4,window=8",
                  "morphkv_n_sink + morphkv_window must be < morphkv_budget (12), got 4 + 8 = 12"},
        // cam's
        GuardCase{"cam:budget=4,n_sink=4", "cam_n_sink must be < cam_budget (4), got 4"},
        GuardCase{"cam:budget=0", "cam_budget must be in [1, 16777216], got 0"},
        GuardCase{"cam:n_sink=-1", "cam_n_sink must be in [0, 16777216], got -1"},
        // tova, streaming_llm
        GuardCase{"tova:budget=2,n_sink=3", "tova_n_sink must be < tova_budget (2), got 3"},
        GuardCase{"streaming_llm:window_size=0",
                  "stream_window_size must be in [1, 16777216], got 0"},
        GuardCase{"full:seed=-3", "seed must be in [0, 9007199254740991], got -3"}));

TEST(Registry, ListsTheMethodsInOrderWithCompleteEntries) {
  // The methods are the cards of the method files (src/policies/methods/*.cpp, an `id: ...` line
  // in a card), each registered once, `full` (the reference row) first.
  const std::vector<std::string> ids = method_ids();
  std::set<std::string> carded;
  const std::filesystem::path dir =
      std::filesystem::path(VELOXQUANT_DATA_DIR) / ".." / "src" / "policies" / "methods";
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".cpp") continue;
    std::ifstream in(entry.path());
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("id: ", 0) == 0) carded.insert(line.substr(4));
    }
  }
  EXPECT_EQ(std::set<std::string>(ids.begin(), ids.end()), carded);
  EXPECT_EQ(std::set<std::string>(ids.begin(), ids.end()).size(), ids.size()) << "an id twice";
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), "full");
  for (const auto& m : registry()) {
    EXPECT_FALSE(m.summary.empty()) << m.id;
    EXPECT_FALSE(m.paper.empty()) << m.id;
    EXPECT_FALSE(m.deviations.empty()) << m.id;
    EXPECT_TRUE(m.make_policy != nullptr) << m.id;
    for (const auto& f : m.fields) {
      EXPECT_FALSE(f.doc.empty()) << m.id << "." << f.name;
      // A method's own fields carry its prefix (kivi's reference-library names excepted); the
      // shared options do not.
      const bool kivi_name = f.name == "bit_width_inlier" || f.name == "residual_length";
      if (!m.prefix.empty() && f.group.empty() && !kivi_name) {
        EXPECT_EQ(f.name.rfind(m.prefix + "_", 0), 0u) << m.id << "." << f.name;
      }
      if (!f.group.empty() && !m.prefix.empty()) {
        EXPECT_NE(f.name.rfind(m.prefix + "_", 0), 0u) << m.id << "." << f.name;
      }
    }
    EXPECT_NO_THROW(CacheConfig(m.id).validate()) << m.id;
    EXPECT_TRUE(m.budget_offset.empty() || !m.budget_field.empty()) << m.id;
  }
}

// Which shared option groups each method has, derived from what the method does (not read from
// the registry): merge for every method that evicts rows (a token budget; full and kivi keep
// every row), source for those that rank rows by attention (the H2O family, TOVA, SnapKV,
// Keyformer, MorphKV, CaM; not StreamingLLM's positions or the key scorers), headwise for those
// among them that evict row by row (ChunkKV evicts whole chunks), demote, quantize and think
// (ThinK's key-channel pruning) for every method storing plain rows (KIVI stores its own
// quantized rows), seed and kv_dtype for all; schedule (compress_interval) for the methods that
// evict token by token on the shared loop (not the prefill-time selections: SnapKV, leverage,
// CriticalKV, Expected Attention's prefill cut; not DuoAttention's, SimLayerKV's or Q-Filters'
// own step rules).
TEST(Registry, SharedOptionGroupsFollowWhatTheMethodDoes) {
  const std::vector<std::string> plain = {"demote", "quantize", "think", "common"};
  const std::vector<std::string> evicts = {"merge", "demote", "quantize", "think", "common"};
  const std::vector<std::string> attention = {"merge",  "source",   "headwise",
                                              "demote", "quantize", "think", "common"};
  const std::vector<std::string> loop = {"merge", "schedule", "demote", "quantize", "think",
                                         "common"};
  const std::vector<std::string> loop_attention = {"merge",  "schedule", "source", "headwise",
                                                   "demote", "quantize", "think",  "common"};
  const std::map<std::string, std::vector<std::string>> expected = {
      {"full", plain},
      {"streaming_llm", loop},
      {"h2o", loop_attention},
      {"tova", loop_attention},
      {"snapkv", attention},
      {"pyramidkv", loop_attention},
      {"squeeze", loop_attention},
      {"chunkkv", {"merge", "schedule", "source", "demote", "quantize", "think", "common"}},
      {"keyformer", loop_attention},
      {"morphkv", loop_attention},
      {"cam", loop_attention},
      {"kivi", {"common"}},
      {"knorm", loop},
      {"keydiff", loop},
      {"lagkv", loop},
      {"leverage", evicts},
      {"duoattention", {"merge", "source", "demote", "quantize", "think", "common"}},
      {"qfilters", evicts},
      {"simlayerkv", {"merge", "source", "demote", "quantize", "think", "common"}},
      {"criticalkv", attention},
      {"criticaladakv", attention},
      {"random", loop},
      {"expected_attention", evicts},
      {"think", plain},
      {"finch", attention},
      {"kvzip", attention},
  };
  ASSERT_EQ(expected.size(), registry().size());
  const std::map<std::string, std::vector<std::string>> group_fields = {
      {"merge",
       {"merge", "merge_gate", "merge_keys", "merge_target", "merge_m", "merge_attention"}},
      {"schedule", {"compress_interval"}},
      {"source", {"source", "gqa_reduce"}},
      {"headwise", {"headwise", "headwise_floor"}},
      {"demote", {"demote", "demote_budget", "demote_group"}},
      {"quantize", {"quantize", "kivi_group_size", "residual_length"}},
      {"think", {"think", "think_window"}},
      {"common", {"seed", "kv_dtype"}},
  };
  for (const auto& m : registry()) {
    std::vector<std::string> groups, fields;
    for (const auto& f : m.fields) {
      if (f.group.empty()) continue;
      if (groups.empty() || groups.back() != f.group) groups.push_back(f.group);
      fields.push_back(f.name);
    }
    EXPECT_EQ(groups, expected.at(m.id)) << m.id;
    std::vector<std::string> want;
    for (const auto& g : expected.at(m.id)) {
      want.insert(want.end(), group_fields.at(g).begin(), group_fields.at(g).end());
    }
    EXPECT_EQ(fields, want) << m.id;
    // The shared options come after the method's own fields.
    bool shared = false;
    for (const auto& f : m.fields) {
      EXPECT_FALSE(shared && f.group.empty()) << m.id << "." << f.name << " after a shared one";
      shared = shared || !f.group.empty();
    }
  }
}

// The merge fields, once declared by every evicting method under its prefix, are one shared
// group: the old spellings are aliases with the same meaning, and the spec prints the new names.
TEST(Spec, MergeFieldsAnswerToTheirPerMethodNames) {
  EXPECT_EQ(CacheConfig::parse("h2o:budget=64,merge=sim_weighted"),
            CacheConfig::parse("h2o:h2o_budget=64,h2o_merge=sim_weighted"));
  EXPECT_EQ(CacheConfig::parse("tova:merge=mean,merge_gate=false,merge_keys=true"),
            CacheConfig::parse("tova:tova_merge=mean,tova_merge_gate=false,tova_merge_keys=true"));
  const CacheConfig w =
      CacheConfig::parse("streaming_llm:merge=mean,merge_target=window,merge_m=8");
  EXPECT_EQ(CacheConfig::parse("streaming_llm:merge=mean,target=window,merge_m=8"), w);
  EXPECT_EQ(CacheConfig::parse(
                "streaming_llm:stream_merge=mean,stream_target=window,stream_merge_m=8"),
            w);
  EXPECT_EQ(w.spec(), "streaming_llm:merge=mean,merge_target=window,merge_m=8");
  EXPECT_EQ(CacheConfig::parse("cam:cam_merge_attention=cumulative").spec(),
            "cam:merge_attention=cumulative");
  EXPECT_EQ(CacheConfig::parse("snapkv:snap_merge=mean").get_enum("merge"), "mean");
  CacheConfig c("h2o");
  c.set("h2o_merge_gate", false);
  EXPECT_FALSE(c.get_bool("merge_gate"));
  EXPECT_EQ(c.resolve("h2o_target"), "merge_target");
  EXPECT_EQ(c.resolve("target"), "merge_target");
  // One field, however spelled: twice is an error; another method's prefix is no alias.
  expect_error([] { CacheConfig::parse("h2o:merge=mean,h2o_merge=drop"); },
               ErrorCode::kInvalidSpec, {"key 'merge' is given more than once"});
  expect_error([] { CacheConfig::parse("h2o:tova_merge=mean"); }, ErrorCode::kInvalidSpec,
               {"[h2o] unknown key 'tova_merge'"});
  // Methods that keep every row have no merge options under any name.
  expect_error([] { CacheConfig::parse("full:merge=mean"); }, ErrorCode::kInvalidSpec,
               {"[full] unknown key 'merge'"});
  expect_error([] { CacheConfig::parse("kivi:kivi_merge=mean"); }, ErrorCode::kInvalidSpec,
               {"[kivi] unknown key 'kivi_merge'"});
}

// register_method's guards (a successful registration is examples/custom_method.cpp, run by
// ctest in its own process, so this binary's registry stays the library's).
TEST(Registry, RegisterMethodRejectsBadEntries) {
  auto scorer = [](const CacheConfig&) -> RowScorer {
    return [](const float*, const float*, std::int64_t) { return 0.0f; };
  };
  const std::size_t before = registry().size();
  expect_error([&] { register_method(scored_method("h2o", "x", "s", scorer)); },
               ErrorCode::kInvalidArgument, {"register_method('h2o')", "already registered"});
  expect_error([&] { register_method(scored_method("Bad-Id", "x", "s", scorer)); },
               ErrorCode::kInvalidArgument, {"lower-case letters, digits and '_'"});
  expect_error([&] { register_method(scored_method("", "x", "s", scorer)); },
               ErrorCode::kInvalidArgument, {"the id is empty"});
  MethodInfo no_policy;
  no_policy.id = "nopolicy";
  expect_error([&] { register_method(no_policy); }, ErrorCode::kInvalidArgument,
               {"needs make_policy or make_scorer"});
  MethodInfo bad_default = scored_method("baddefault", "bd", "s", scorer);
  bad_default.fields.push_back(FieldSpec{"bd_power", FieldType::kFloat, 9.0, 0.5, 8.0, {}, "x"});
  expect_error([&] { register_method(bad_default); }, ErrorCode::kInvalidArgument,
               {"bd_power's default is not one it allows"});
  // A field of the method's own named like a shared option (the registry adds those).
  MethodInfo clash = scored_method("clash", "cl", "s", scorer);
  clash.fields.push_back(FieldSpec{"merge", FieldType::kBool, false, 0, 0, {}, "x"});
  expect_error([&] { register_method(clash); }, ErrorCode::kInvalidArgument,
               {"register_method('clash')", "two fields are named 'merge'"});
  MethodInfo clash_alias = scored_method("clashalias", "ca", "s", scorer);
  clash_alias.fields.push_back(
      FieldSpec{"ca_target", FieldType::kInt, std::int64_t{1}, 0, 2, {}, "x"});
  expect_error([&] { register_method(clash_alias); }, ErrorCode::kInvalidArgument,
               {"two fields are named 'ca_target'"});
  MethodInfo bad_shared = scored_method("badshared", "bs", "s", scorer);
  bad_shared.shared_defaults = "merge=blend";
  expect_error([&] { register_method(bad_shared); }, ErrorCode::kInvalidArgument,
               {"register_method('badshared'): shared_defaults 'merge=blend'", "got 'blend'"});
  bad_shared.shared_defaults = "headwise=true";  // a scorer method has no head-wise budgets
  expect_error([&] { register_method(bad_shared); }, ErrorCode::kInvalidArgument,
               {"'headwise' is no shared option of this method"});
  bad_shared.shared_defaults = "merge";
  expect_error([&] { register_method(bad_shared); }, ErrorCode::kInvalidArgument,
               {"expected KEY=VALUE, got 'merge'"});
  MethodInfo bad_budget = scored_method("badbudget", "bb", "s", scorer);
  bad_budget.budget_field = "bb_nope";
  expect_error([&] { register_method(bad_budget); }, ErrorCode::kInvalidArgument,
               {"budget_field 'bb_nope' is not an int field"});
  EXPECT_EQ(registry().size(), before);
}

TEST(Registry, TokenBudgetHelpers) {
  EXPECT_FALSE(has_token_budget(CacheConfig("full")));
  expect_error([] { with_token_budget(CacheConfig("full"), 64); }, ErrorCode::kInvalidConfig,
               {"[full]", "no token budget"});
  const CacheConfig s = with_token_budget(CacheConfig("streaming_llm"), 64);
  EXPECT_EQ(s.get_int("stream_window_size"), 60);
  EXPECT_EQ(token_budget(s), 64);
  expect_error([] { with_token_budget(CacheConfig("streaming_llm"), 4); },
               ErrorCode::kInvalidConfig, {"must be > stream_n_sink (4)"});
  for (const auto& id : method_ids()) {
    const CacheConfig c(id);
    if (!has_token_budget(c)) continue;
    EXPECT_EQ(token_budget(with_token_budget(c, 100)), 100) << id;
  }
  // A negative n_sink (out of range until validate()) cannot split a budget: an error naming
  // the field, not budget - offset overflowing (found by fuzz_capi_steps: n_sink=-1 then
  // budget=INT64_MAX).
  expect_error(
      [] {
        CacheConfig c("streaming_llm");
        c.set("n_sink", std::int64_t{-1});
        c.set("budget", std::numeric_limits<std::int64_t>::max());
      },
      ErrorCode::kInvalidConfig, {"stream_n_sink is -1", "must be >= 0"});
  // The sum of window and sink that does not fit 64 bits is an error, not a wrapped budget.
  expect_error(
      [] {
        CacheConfig c("streaming_llm");
        c.set("window_size", std::numeric_limits<std::int64_t>::max());
        c.set("n_sink", std::int64_t{8});
        (void)token_budget(c);
      },
      ErrorCode::kInvalidConfig, {"stream_window_size", "does not fit"});
  // Setting a budget that breaks a guard is an error, not a silent clamp.
  expect_error([] { with_token_budget(CacheConfig::parse("h2o:grace=16"), 16); },
               ErrorCode::kInvalidConfig, {"h2o_n_sink + h2o_grace"});
}

TEST(Registry, MarkdownTableHasOneRowPerMethod) {
  const std::string table = method_table_markdown();
  for (const auto& m : registry()) {
    EXPECT_NE(table.find("| `" + m.id + "` |"), std::string::npos) << m.id;
  }
}

}  // namespace
}  // namespace vq
