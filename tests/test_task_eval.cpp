// `eval --task` on the shipped task model (data/task-model.bin, docs/tasks.md): every answer is
// what `veloxquant generate` writes for the same prompt and method (greedy, cut at the stops),
// the results are bit-identical on 1 and 3 threads, the cells hold the runs' scores, and the
// model retrieves a needle with the full cache that StreamingLLM's window has evicted.
#include <gtest/gtest.h>

#include <algorithm>

#include "engine/compute/parallel.h"
#include "engine/run/generate.h"
#include "engine/tokenizers/tokenizer.h"
#include "eval/tasks/task_eval.h"

namespace vq::eval {
namespace {

// The model the task tests run on.
const std::string kTaskModel = VELOXQUANT_DATA_DIR "/task-model.bin";
// The least accuracy the full cache must reach on the needle test below (20 samples): the
// shipped model (run8) answers 18 of them (0.90; `veloxquant eval --model data/task-model.bin
// --task niah_single --lengths 1024 --depths 10,40 --samples 10 --seed 11 --method
// streaming_llm --ratio 8`); the floor leaves room for a retrained model of the same recipe, not
// for one that stopped retrieving.
constexpr double kFullNeedleFloor = 0.8;

TaskEvalOptions small_options() {
  TaskEvalOptions o;
  o.model = kTaskModel;
  o.tasks = {"niah_single", "vt"};
  o.lengths = {384};
  o.depths = {0, 100};
  o.samples = 2;
  o.seed = 3;
  o.methods = {"streaming_llm", "h2o"};
  o.ratios = {4};
  o.bootstrap_samples = 200;
  return o;
}

// The JSON without what depends on time or the machine.
nlohmann::json stable(nlohmann::json j) {
  j.erase("wall_time_ms");
  j.erase("machine");
  for (auto& row : j["rows"]) row.erase("time_per_sample_ms");
  return j;
}

TEST(TaskEval, SameResultsOnOneAndThreeThreads) {
  TaskEvalOptions o = small_options();
  const int saved = engine::threads();
  engine::set_threads(1);
  o.threads = 1;
  const nlohmann::json one = stable(task_eval_json(run_task_eval(o, nullptr), "x"));
  engine::set_threads(3);
  o.threads = 3;
  const TaskEvalResult r3 = run_task_eval(o, nullptr);
  engine::set_threads(saved);
  const nlohmann::json three = stable(task_eval_json(r3, "x"));
  EXPECT_EQ(one.dump(), three.dump());
  EXPECT_EQ(task_samples_jsonl(r3), task_samples_jsonl(run_task_eval(o, nullptr)));
}

TEST(TaskEval, AnswersAreWhatGenerateWrites) {
  const TaskEvalOptions o = small_options();
  const TaskEvalResult r = run_task_eval(o, nullptr);
  const engine::Model model = engine::Model::load(kTaskModel);
  const auto tok = engine::load_tokenizer("", model);
  ASSERT_EQ(r.settings.size(), 3u);  // full, streaming_llm 4x, h2o 4x
  ASSERT_EQ(r.samples.size(), 6u);   // niah_single: 2 depths x 2; vt: 2
  int checked = 0;
  for (std::size_t p = 0; p < r.settings.size(); ++p) {
    for (std::size_t i = 0; i < r.samples.size(); ++i) {
      const TaskSample& s = r.samples[i];
      const TaskSetting& set = r.settings[p];
      const std::size_t task = r.sample_task[i];
      const int ttg = task_spec(o.tasks[task]).tokens_to_generate;
      engine::GenerateOptions g;
      g.prompt = s.text.plain();
      g.temperature = 0;
      g.method = set.configs[set.at(task, 0)];
      g.steps = std::min<std::int64_t>(model.config().seq_len,
                                       static_cast<std::int64_t>(s.ids.size()) + ttg - 1);
      const engine::GenerateResult gen = engine::generate(model, *tok, g);
      ASSERT_EQ(gen.n_prompt, static_cast<std::int64_t>(s.ids.size()));
      // The generated tokens' text, cut at EOS (2) and at the first newline.
      std::string text;
      for (std::size_t k = s.ids.size(); k < gen.ids.size(); ++k) {
        if (gen.ids[k] == 2) break;
        text += tok->piece(gen.ids[k - 1], gen.ids[k]);
        if (text.find('\n') != std::string::npos) break;
      }
      text = text.substr(0, text.find('\n'));
      EXPECT_EQ(r.runs[p][i].output, text) << set.series << " sample " << i;
      EXPECT_DOUBLE_EQ(r.runs[p][i].score, string_match_all(text, s.parts.answers));
      ++checked;
    }
  }
  EXPECT_EQ(checked, 18);
}

TEST(TaskEval, CellsHoldTheirSamplesScores) {
  const TaskEvalResult r = run_task_eval(small_options(), nullptr);
  for (const TaskCell& c : r.cells) {
    double sum = 0;
    for (const std::size_t i : c.samples) {
      EXPECT_EQ(r.sample_task[i], c.task);
      if (c.depth >= 0) {
        EXPECT_EQ(r.samples[i].depth, c.depth);
      }
      sum += r.runs[c.setting][i].score;
    }
    // niah depth cells: 2 samples; all depths: 4; vt: 2.
    const bool niah = c.task == 0;
    EXPECT_EQ(c.n, niah && c.depth < 0 ? 4 : 2);
    EXPECT_DOUBLE_EQ(c.accuracy, sum / static_cast<double>(c.n));
    EXPECT_LE(c.ci.lo, c.accuracy);
    EXPECT_GE(c.ci.hi, c.accuracy);
    // At ratio 4 every compressed sample's cache holds at most a quarter of its rows' fp16 bytes
    // at the end of the prefill; the decoded rows only add to full_bytes.
    if (!r.settings[c.setting].is_reference) {
      EXPECT_GE(c.compression_ratio, 4.0 * 0.95);
    }
  }
}

TEST(TaskEval, TheTaskModelFindsTheNeedleThatStreamingLLMEvicts) {
  // niah_single at 1024 tokens with the needle at depth 10% or 40%: at least 600 tokens before
  // the question. At 8x equal memory streaming_llm keeps 4 sinks and about 124 recent rows, so
  // the needle's digits are not in its cache and it cannot answer (a 7-digit number guessed
  // right is a 1e-7 event); the full cache holds them, and the trained model reads them back.
  TaskEvalOptions o;
  o.model = kTaskModel;
  o.tasks = {"niah_single"};
  o.lengths = {1024};
  o.depths = {10, 40};
  o.samples = 10;
  o.seed = 11;
  o.methods = {"streaming_llm"};
  o.ratios = {8};
  o.bootstrap_samples = 200;
  const TaskEvalResult r = run_task_eval(o, nullptr);
  ASSERT_EQ(r.samples.size(), 20u);
  double full = -1, streaming = -1;
  for (const TaskCell& c : r.cells) {
    if (c.depth >= 0) continue;  // the all-depths cell
    (r.settings[c.setting].is_reference ? full : streaming) = c.accuracy;
  }
  EXPECT_GE(full, kFullNeedleFloor) << "the full cache should retrieve the needle";
  EXPECT_EQ(streaming, 0.0) << "streaming_llm's window cannot hold a needle 600 tokens back";
}

}  // namespace
}  // namespace vq::eval
