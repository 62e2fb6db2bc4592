// The RULER-style task prompts and generators of `eval --task` (eval/tasks/task_prompts.h,
// eval/tasks/task_gen.h) against hand-written expectations: prompt texts written out by hand from
// docs/tasks.md, the scorer and the Wilson interval on hand-computed cases, and every
// generator's samples checked by reading the rendered prompt back (needle counts, depth, chain,
// word counts, token counts at most L and maximal).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include "engine/tokenizers/tokenizer.h"
#include "eval/tasks/task_gen.h"
#include "eval/tasks/task_prompts.h"
#include "veloxquant/errors.h"

namespace vq::eval {
namespace {

const engine::Tokenizer& tok512() {
  static const auto t = engine::load_llama2c_tokenizer(VELOXQUANT_DATA_DIR "/tok512.bin", 512);
  return *t;
}

PromptEncoder plain_encoder() {
  return [](const PromptText& t) { return tok512().encode(t.plain(), true); };
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::size_t count_of(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::string line;
  std::istringstream in(text);
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

const std::string kNoise =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";

TEST(TaskPrompts, NiahSingleIsRulersSingularTemplate) {
  PromptParts p;
  p.task = TaskKind::kNiahSingle;
  p.haystack = Haystack::kNoise;
  p.sentences = {kNoise, kNoise};
  p.inserts = {{1, "One of the special magic numbers for amber-falcon is: 1234567."}};
  p.query = "amber-falcon";
  p.answers = {"1234567"};
  const PromptText t = render_prompt(p);
  EXPECT_EQ(t.user,
            "A special magic number is hidden within the following text. Make sure to memorize "
            "it. I will quiz you about the number afterwards.\n" +
                kNoise + "\nOne of the special magic numbers for amber-falcon is: 1234567.\n" + kNoise +
                "\nWhat is the special magic number for amber-falcon mentioned in the provided "
                "text?");
  EXPECT_EQ(t.answer_prefix,
            " The special magic number for amber-falcon mentioned in the provided text is");
  EXPECT_EQ(expected_completion(p.answers, t.plain().back()), " 1234567.");
}

TEST(TaskPrompts, NiahMultiqueryIsPluralWithRulersJoin) {
  PromptParts p;
  p.task = TaskKind::kNiahMultiquery;
  p.haystack = Haystack::kEssay;
  p.sentences = {"First one.", "Second one."};
  // Two inserts at the same position keep their list order; position 2 = after the last.
  p.inserts = {{0, "N1."}, {0, "N2."}, {2, "N3."}};
  p.query = join_query({"a-b", "c-d", "e-f"});
  p.answers = {"1111111", "2222222", "3333333"};
  EXPECT_EQ(p.query, "a-b, c-d, and e-f");
  EXPECT_EQ(join_query({"a-b", "c-d"}), "a-b, and c-d");
  const PromptText t = render_prompt(p);
  EXPECT_EQ(t.user,
            "Some special magic numbers are hidden within the following text. Make sure to "
            "memorize it. I will quiz you about the numbers afterwards.\nN1. N2. First one. "
            "Second one. N3.\nWhat are all the special magic numbers for a-b, c-d, and e-f "
            "mentioned in the provided text?");
  EXPECT_EQ(t.answer_prefix,
            " The special magic numbers for a-b, c-d, and e-f mentioned in the provided text are");
  EXPECT_EQ(expected_completion(p.answers, 'e'), " 1111111, 2222222, 3333333.");
}

TEST(TaskPrompts, QuestionFirstPutsTheQuestionBeforeTheContext) {
  PromptParts p;
  p.task = TaskKind::kVt;
  p.question = QuestionAt::kFirst;
  p.haystack = Haystack::kNoise;
  p.sentences = {kNoise};
  p.inserts = {{0, "VAR ABCDE = 12345"}, {1, "VAR FGHIJ = VAR ABCDE "}};
  p.query = "12345";
  p.answers = {"ABCDE", "FGHIJ"};
  const PromptText t = render_prompt(p);
  EXPECT_EQ(t.user,
            "Memorize and track the chain(s) of variable assignment hidden in the following "
            "text.\n\nQuestion: Find all variables that are assigned the value 12345 in the text "
            "above.\nVAR ABCDE = 12345\n" + kNoise + "\nVAR FGHIJ = VAR ABCDE ");
  EXPECT_EQ(t.answer_prefix, "\nAnswer:");
  p.question = QuestionAt::kLast;
  EXPECT_EQ(render_prompt(p).answer_prefix,
            " Answer: According to the chain(s) of variable assignment in the text above, 2 "
            "variables are assigned the value 12345, they are: ");
  // The prefix ends with a space: the completion starts without one.
  EXPECT_EQ(expected_completion(p.answers, ' '), "ABCDE, FGHIJ.");
}

TEST(TaskPrompts, CweNumbersItsWords) {
  PromptParts p;
  p.task = TaskKind::kCwe;
  p.haystack = Haystack::kWords;
  p.sentences = {"apple", "bread", "apple"};
  EXPECT_EQ(render_context(p), "1. apple 2. bread 3. apple");
  p.answers = {"apple"};
  EXPECT_EQ(render_prompt(p).plain(),
            "Below is a numbered list of words. In these words, some appear more often than "
            "others. Memorize the ones that appear most often.\n1. apple 2. bread 3. apple\n"
            "Question: What are the 10 most common words in the above list? Answer: The top 10 "
            "words that appear most often in the list are:");
}

TEST(TaskPrompts, StringMatchAllByHand) {
  EXPECT_DOUBLE_EQ(string_match_all("1234567, 7654321.", {"1234567", "7654321"}), 1.0);
  EXPECT_DOUBLE_EQ(string_match_all("1234567, 7654321.", {"1234567", "1111111"}), 0.5);
  EXPECT_DOUBLE_EQ(string_match_all(" 123456.", {"1234567"}), 0.0);
  EXPECT_DOUBLE_EQ(string_match_all("Amber, QUILT", {"amber", "quilt", "xylo"}), 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(string_match_all("abcde", {"ABCDE"}), 1.0);
  EXPECT_DOUBLE_EQ(string_match_all("", {"x"}), 0.0);
}

TEST(TaskPrompts, WilsonIntervalByHand) {
  // (p + z^2/2n -+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n), z = 1.959964, evaluated by hand:
  // 8/10: z^2 = 3.841459, center (0.8 + 0.1920729) / 1.3841459 = 0.7167402, half-width
  // 1.959964 sqrt(0.016 + 0.0096036) / 1.3841459 = 0.2265777.
  const Interval a = wilson_interval(8, 10);
  EXPECT_NEAR(a.lo, 0.4901625, 1e-6);
  EXPECT_NEAR(a.hi, 0.9433178, 1e-6);
  // 0/10: center = half-width = 0.1920729 / 1.3841459 = 0.1387664: [0, 0.2775328].
  const Interval b = wilson_interval(0, 10);
  EXPECT_NEAR(b.lo, 0.0, 1e-12);
  EXPECT_NEAR(b.hi, 0.2775328, 1e-6);
  const Interval c = wilson_interval(10, 10);
  EXPECT_NEAR(c.lo, 0.7224672, 1e-6);
  EXPECT_NEAR(c.hi, 1.0, 1e-12);
}

TEST(TaskPrompts, SentenceSplitByHand) {
  EXPECT_EQ(split_sentences("A b. C d!  E\nF? g.h i\n\n  "),
            (std::vector<std::string>{"A b.", "C d!", "E", "F?", "g.h i"}));
  EXPECT_EQ(split_sentences(" = Title = \n\n Text . More"),
            (std::vector<std::string>{"= Title =", "Text .", "More"}));
}

TEST(TaskPrompts, BadNamesNameTheFlag) {
  try {
    task_spec("niah");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--task expects task names from niah_single"),
              std::string::npos);
    EXPECT_NE(std::string(e.what()).find("got 'niah'"), std::string::npos);
  }
  EXPECT_THROW(parse_haystack("words"), Error);
  EXPECT_THROW(parse_question("middle"), Error);
}

TEST(TaskData, EmbeddedFilesAreTheDataFiles) {
  const std::vector<std::string> words = lines_of(read_file(VELOXQUANT_DATA_DIR "/tasks/words.txt"));
  EXPECT_EQ(task_words(), words);
  EXPECT_EQ(task_words().size(), 196u);
  EXPECT_EQ(default_essay_text(), read_file(VELOXQUANT_DATA_DIR "/tasks/haystack_wikitext.txt"));
}

// --- generators ---------------------------------------------------------------------------

TaskGenerator generator(std::uint64_t seed = 7) {
  return TaskGenerator(plain_encoder(), default_essay_text(), task_words(), seed);
}

// The sample's prompt is at most L tokens, and one more haystack unit would exceed L.
void expect_fits_maximally(const TaskGenerator& g, const TaskSpec& spec, Haystack h,
                           const TaskSample& s) {
  EXPECT_LE(static_cast<std::int64_t>(s.ids.size()), s.length);
  EXPECT_EQ(s.ids, tok512().encode(s.text.plain(), true));
  const PromptParts more = g.parts(spec, h, s.parts.question, s.length, s.depth, s.index, s.units + 1);
  EXPECT_GT(static_cast<std::int64_t>(tok512().encode(render_prompt(more).plain(), true).size()),
            s.length)
      << spec.name << " L=" << s.length << " units=" << s.units;
}

TEST(TaskGen, NiahNoiseNeedleOnceAtItsDepth) {
  const TaskGenerator g = generator();
  for (const char* name : {"niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery"}) {
    const TaskSpec& spec = task_spec(name);
    for (const std::int64_t depth : {0, 25, 50, 100}) {
      const TaskSample s = g.make(spec, Haystack::kNoise, QuestionAt::kLast, 2048, depth, 3);
      const PromptParts& p = s.parts;
      const std::int64_t n = static_cast<std::int64_t>(p.sentences.size());
      EXPECT_EQ(n, s.units);
      EXPECT_GT(n, 20);
      EXPECT_EQ(p.keys.size(), static_cast<std::size_t>(spec.n_keys));
      EXPECT_EQ(p.answers.size(), static_cast<std::size_t>(spec.n_queries * spec.n_values));
      // Every needle once; every answer value exactly once in the whole prompt.
      const std::string prompt = s.text.plain();
      EXPECT_EQ(count_of(prompt, "One of the special magic numbers for "),
                static_cast<std::size_t>(spec.n_keys * spec.n_values));
      for (const std::string& v : p.answers) EXPECT_EQ(count_of(prompt, v), 1u) << v;
      // The queried needle (keys[0], values[0]) after round(depth n / 100) noise lines.
      const std::string first =
          "One of the special magic numbers for " + p.keys[0] + " is: " + p.values[0] + ".";
      const std::vector<std::string> lines = lines_of(render_context(p));
      const auto at = std::find(lines.begin(), lines.end(), first);
      ASSERT_NE(at, lines.end());
      const auto noise_before = std::count(lines.begin(), at, kNoise);
      const std::int64_t expected = static_cast<std::int64_t>(
          std::floor(static_cast<double>(depth) * static_cast<double>(n) / 100.0 + 0.5));
      EXPECT_EQ(noise_before, expected) << name << " depth " << depth << " n " << n;
      expect_fits_maximally(g, spec, Haystack::kNoise, s);
    }
  }
}

TEST(TaskGen, NiahSingleUsesTheSingularRewrite) {
  const TaskSample s = generator().make(task_spec("niah_single"), Haystack::kNoise,
                                        QuestionAt::kLast, 400, 50, 0);
  const std::string prompt = s.text.plain();
  EXPECT_EQ(prompt.rfind("A special magic number is hidden within the following text. Make sure to "
                         "memorize it. I will quiz you about the number afterwards.\n",
                         0),
            0u);
  EXPECT_NE(prompt.find("\nWhat is the special magic number for " + s.parts.keys[0] +
                        " mentioned in the provided text? The special magic number for " +
                        s.parts.keys[0] + " mentioned in the provided text is"),
            std::string::npos);
  EXPECT_EQ(s.completion, " " + s.parts.values[0] + ".");
  // Keys: two words of the list joined by '-'; values: 7 digits.
  const std::string& k = s.parts.keys[0];
  const std::size_t dash = k.find('-');
  ASSERT_NE(dash, std::string::npos);
  const auto& w = task_words();
  EXPECT_NE(std::find(w.begin(), w.end(), k.substr(0, dash)), w.end());
  EXPECT_NE(std::find(w.begin(), w.end(), k.substr(dash + 1)), w.end());
  EXPECT_EQ(s.parts.values[0].size(), 7u);
}

// Finch's question (TaskSample::question_tokens): the prompt's tokens after the context. With
// the question last they spell "\n" + the question + the answer prefix (a token spanning the
// cut may add a few characters of the context before it); with the question first they spell
// the "\nAnswer:" cue that follows the context.
TEST(TaskGen, QuestionTokensAreThePromptAfterTheContext) {
  for (const QuestionAt at : {QuestionAt::kLast, QuestionAt::kFirst}) {
    const TaskSample s = generator().make(task_spec("niah_single"), Haystack::kNoise, at, 400, 50, 0);
    const std::string after = s.text.plain().substr(s.text.context_end);
    EXPECT_EQ(after.rfind(at == QuestionAt::kLast ? "\nWhat is the special magic number" : "\nAnswer:",
                          0),
              0u);
    ASSERT_GT(s.question_tokens, 0);
    ASSERT_LT(s.question_tokens, static_cast<std::int64_t>(s.ids.size()));
    const std::vector<std::int32_t> tail(s.ids.end() - s.question_tokens, s.ids.end());
    const std::string text = tok512().decode(tail);
    ASSERT_GE(text.size(), after.size());
    EXPECT_EQ(text.substr(text.size() - after.size()), after);
    EXPECT_LE(text.size(), after.size() + 16);  // at most the token that spans the cut
    // The tokens before the window are the context's own.
    const std::vector<std::int32_t> head =
        tok512().encode(s.text.user.substr(0, s.text.context_end), true);
    EXPECT_TRUE(std::equal(s.ids.begin(), s.ids.end() - s.question_tokens, head.begin()));
  }
}

TEST(TaskGen, EssayHaystackIsConsecutiveSentencesOfTheText) {
  const TaskGenerator g = generator();
  const std::vector<std::string> all = split_sentences(default_essay_text());
  const TaskSample s = g.make(task_spec("niah_multikey"), Haystack::kEssay, QuestionAt::kLast, 512, 25, 1);
  const auto& sent = s.parts.sentences;
  ASSERT_GE(sent.size(), 1u);
  const auto start = std::find(all.begin(), all.end(), sent[0]) - all.begin();
  ASSERT_LT(static_cast<std::size_t>(start), all.size());
  for (std::size_t i = 0; i < sent.size(); ++i) EXPECT_EQ(sent[i], all[(start + i) % all.size()]);
  expect_fits_maximally(g, task_spec("niah_multikey"), Haystack::kEssay, s);
}

TEST(TaskGen, NeedleHaystackKeysAreNotTheQueriedOnes) {
  const TaskSample s = generator().make(task_spec("niah_single"), Haystack::kNeedle,
                                        QuestionAt::kLast, 512, 75, 2);
  EXPECT_GT(s.parts.sentences.size(), 2u);
  for (const std::string& h : s.parts.sentences) {
    EXPECT_EQ(h.rfind("One of the special magic numbers for ", 0), 0u);
    EXPECT_EQ(h.find(" " + s.parts.keys[0] + " "), std::string::npos);
  }
  EXPECT_EQ(count_of(s.text.plain(), s.parts.values[0]), 1u);
}

TEST(TaskGen, VtChainLeadsFromTheValueToEveryName) {
  const TaskGenerator g = generator();
  const TaskSample s = g.make(task_spec("vt"), Haystack::kNoise, QuestionAt::kLast, 512, -1, 4);
  // Read the chain back from the context's lines.
  std::map<std::string, std::string> assigned;  // name -> what it is assigned
  std::vector<std::string> order;
  for (const std::string& line : lines_of(render_context(s.parts))) {
    if (line == kNoise) continue;
    ASSERT_EQ(line.rfind("VAR ", 0), 0u) << line;
    const std::string name = line.substr(4, 5);
    ASSERT_EQ(line.substr(9, 3), " = ");
    assigned[name] = line.substr(12);
    order.push_back(name);
  }
  ASSERT_EQ(order.size(), 5u);
  // The first statement assigns the value; each next one the previous name (trailing space).
  EXPECT_EQ(assigned[order[0]], s.parts.query);
  for (std::size_t i = 1; i < 5; ++i) EXPECT_EQ(assigned[order[i]], "VAR " + order[i - 1] + " ");
  EXPECT_EQ(s.parts.answers, order);
  EXPECT_EQ(s.parts.query.size(), 5u);
  EXPECT_NE(s.text.answer_prefix.find("5 variables are assigned the value " + s.parts.query), std::string::npos);
  EXPECT_EQ(s.completion, order[0] + ", " + order[1] + ", " + order[2] + ", " + order[3] + ", " + order[4] + ".");
  expect_fits_maximally(g, task_spec("vt"), Haystack::kNoise, s);
}

TEST(TaskGen, CweCommonWordsAreTheAnswers) {
  const TaskGenerator g = generator();
  const TaskSample s = g.make(task_spec("cwe"), Haystack::kWords, QuestionAt::kLast, 1024, -1, 0);
  std::map<std::string, int> counts;
  for (const std::string& w : s.parts.sentences) ++counts[w];
  ASSERT_EQ(s.parts.answers.size(), 10u);
  for (const std::string& a : s.parts.answers) EXPECT_EQ(counts[a], 6) << a;  // L < 4096: 6 and 1
  EXPECT_EQ(counts.size(), 10u + static_cast<std::size_t>(s.units));
  for (const auto& [w, c] : counts) {
    if (std::find(s.parts.answers.begin(), s.parts.answers.end(), w) == s.parts.answers.end()) {
      EXPECT_EQ(c, 1) << w;
    }
  }
  EXPECT_NE(s.text.plain().find("\n1. " + s.parts.sentences[0] + " 2. " + s.parts.sentences[1] + " "),
            std::string::npos);
  expect_fits_maximally(g, task_spec("cwe"), Haystack::kWords, s);
}

TEST(TaskGen, FweAnswersAreTheThreeMostFrequentCodedWords) {
  const TaskGenerator g = generator();
  const TaskSample s = g.make(task_spec("fwe"), Haystack::kCoded, QuestionAt::kLast, 512, -1, 0);
  std::map<std::string, int> counts;
  for (const std::string& w : s.parts.sentences) ++counts[w];
  std::vector<std::pair<int, std::string>> ranked;
  for (const auto& [w, c] : counts) {
    if (w != "...") ranked.emplace_back(c, w);
  }
  std::sort(ranked.rbegin(), ranked.rend());
  ASSERT_GE(ranked.size(), 4u);
  EXPECT_GT(ranked[2].first, ranked[3].first);  // a strict top three
  EXPECT_EQ(s.parts.answers, (std::vector<std::string>{ranked[0].second, ranked[1].second, ranked[2].second}));
  EXPECT_GT(counts["..."], ranked[0].first);  // the noise word is the most frequent
  expect_fits_maximally(g, task_spec("fwe"), Haystack::kCoded, s);
}

TEST(TaskGen, SamplesDependOnTheirKeyOnly) {
  const TaskGenerator g = generator(11);
  const TaskSpec& spec = task_spec("niah_multiquery");
  const TaskSample a = g.make(spec, Haystack::kEssay, QuestionAt::kLast, 512, 50, 5);
  const TaskSample b = g.make(spec, Haystack::kEssay, QuestionAt::kLast, 512, 50, 6);
  const TaskSample c = g.make(spec, Haystack::kEssay, QuestionAt::kLast, 512, 50, 5);
  EXPECT_EQ(a.text.plain(), c.text.plain());
  EXPECT_NE(a.text.plain(), b.text.plain());
  EXPECT_NE(a.text.plain(), generator(12).make(spec, Haystack::kEssay, QuestionAt::kLast, 512, 50, 5).text.plain());
}

TEST(TaskGen, TooShortALengthNamesTheFlag) {
  try {
    generator().make(task_spec("cwe"), Haystack::kWords, QuestionAt::kLast, 300, -1, 0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--lengths 300 is too short for task cwe"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace vq::eval
