#include "eval/tasks/task_gen.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "base/rng.h"
#include "veloxquant/errors.h"

namespace vq::eval {

namespace {

// Built from data/tasks/ at configure time (CMakeLists.txt): kTaskWordsText, kEssayText.
#include <task_data.inc>  // generated in the build tree, not a source file

// An embedded file's bytes (the array ends with a 0 that is not part of the file).
std::string embedded(const unsigned char* bytes, std::size_t size) {
  return std::string(reinterpret_cast<const char*>(bytes), size - 1);
}

constexpr const char* kNoise =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";

// Counter ranges of a sample's stream (docs/tasks.md "Random draws").
constexpr std::uint64_t kHaystackDraws = std::uint64_t{1} << 40;  // needle haystack
constexpr std::uint64_t kPositionDraws = std::uint64_t{2} << 40;  // insert positions
constexpr std::uint64_t kShuffleDraws = std::uint64_t{3} << 40;   // word-list shuffles

// A sample's draws: uniform(c) of CounterRng(seed, task number << 32 | L, (depth + 1) << 32 |
// index), read through a cursor for the sequential draws.
class Draws {
 public:
  Draws(std::uint64_t seed, std::uint64_t task, std::uint64_t length, std::int64_t depth,
        std::uint64_t index)
      : rng_(seed, (task << 32) | length, (static_cast<std::uint64_t>(depth + 1) << 32) | index) {}
  // floor(uniform(counter) * n), n >= 1.
  std::uint64_t at(std::uint64_t counter, std::uint64_t n) const {
    return static_cast<std::uint64_t>(std::floor(rng_.uniform(counter) * static_cast<double>(n)));
  }
  std::uint64_t next(std::uint64_t n) { return at(cursor_++, n); }
  void seek(std::uint64_t counter) { cursor_ = counter; }

 private:
  CounterRng rng_;
  std::uint64_t cursor_ = 0;
};

std::string needle(const std::string& key, const std::string& value) {
  return "One of the special magic numbers for " + key + " is: " + value + ".";
}

// A key not in `used` (two words joined by '-'), added to it.
std::string draw_key(Draws& d, const std::vector<std::string>& words, std::set<std::string>& used) {
  while (true) {
    const std::string& a = words[d.next(words.size())];
    std::string key = a + "-" + words[d.next(words.size())];
    if (used.insert(key).second) return key;
  }
}

std::string draw_value(Draws& d, std::uint64_t lo, std::uint64_t span, std::set<std::string>& used) {
  while (true) {
    std::string v = std::to_string(lo + d.next(span));
    if (used.insert(v).second) return v;
  }
}

// Fisher-Yates from the back, swap partner of i drawn at counter base + i.
template <typename T>
void shuffle(std::vector<T>& v, const Draws& d, std::uint64_t base) {
  for (std::size_t i = v.size(); i-- > 1;) std::swap(v[i], v[d.at(base + i, i + 1)]);
}

std::uint64_t task_number(const TaskSpec& t) {
  const auto& all = task_specs();
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (all[i].kind == t.kind) return i + 1;
  }
  return 0;
}

bool is_niah(const TaskSpec& t) { return t.has_depth; }

[[noreturn]] void too_short(const TaskSpec& t, std::int64_t length, const std::string& why) {
  throw Error(ErrorCode::kInvalidArgument, "--lengths " + std::to_string(length) +
                                               " is too short for task " + t.name + ": " + why);
}

}  // namespace

const std::vector<std::string>& task_words() {
  static const std::vector<std::string> words = [] {
    std::vector<std::string> w;
    std::string line;
    for (const char c : embedded(kTaskWordsText, sizeof kTaskWordsText)) {
      if (c != '\n') {
        line += c;
      } else if (!line.empty()) {
        w.push_back(line);
        line.clear();
      }
    }
    if (!line.empty()) w.push_back(line);
    return w;
  }();
  return words;
}

const std::string& default_essay_text() {
  static const std::string text = embedded(kEssayText, sizeof kEssayText);
  return text;
}

TaskGenerator::TaskGenerator(PromptEncoder encode, const std::string& essay,
                             std::vector<std::string> words, std::uint64_t seed)
    : encode_(std::move(encode)), essay_(split_sentences(essay)), words_(std::move(words)),
      seed_(seed) {
  if (std::set<std::string>(words_.begin(), words_.end()).size() < 20 ||
      words_.size() != std::set<std::string>(words_.begin(), words_.end()).size()) {
    throw Error(ErrorCode::kInvalidArgument,
                "[task] the word list must hold at least 20 words, all distinct; got " +
                    std::to_string(words_.size()));
  }
}

namespace {

struct Ctx {
  const TaskSpec& task;
  Haystack haystack;
  std::int64_t length, depth, n;
  const std::vector<std::string>& essay;
  const std::vector<std::string>& words;
};

// The haystack's first n sentences (noise, essay or needle), the keys in `used` avoided.
std::vector<std::string> haystack_sentences(const Ctx& c, Draws& d, std::uint64_t essay_start,
                                            std::set<std::string> used) {
  std::vector<std::string> s;
  s.reserve(static_cast<std::size_t>(c.n));
  Draws h = d;
  h.seek(kHaystackDraws);
  std::set<std::string> values;
  for (std::int64_t i = 0; i < c.n; ++i) {
    if (c.haystack == Haystack::kNoise) {
      s.emplace_back(kNoise);
    } else if (c.haystack == Haystack::kEssay) {
      s.push_back(c.essay[(essay_start + static_cast<std::uint64_t>(i)) % c.essay.size()]);
    } else {
      const std::string key = draw_key(h, c.words, used);
      s.push_back(needle(key, draw_value(h, 1000000, 9000000, values)));
    }
  }
  return s;
}

std::uint64_t essay_start(const Ctx& c, Draws& d) {
  return c.haystack == Haystack::kEssay ? d.next(c.essay.size()) : 0;
}

PromptParts niah_parts(const Ctx& c, Draws& d) {
  PromptParts p;
  p.haystack = c.haystack;
  const std::uint64_t start = essay_start(c, d);
  std::set<std::string> used, values;
  for (int k = 0; k < c.task.n_keys; ++k) p.keys.push_back(draw_key(d, c.words, used));
  std::vector<std::string> texts;
  for (int k = 0; k < c.task.n_keys; ++k) {
    for (int v = 0; v < c.task.n_values; ++v) {
      p.values.push_back(draw_value(d, 1000000, 9000000, values));
      texts.push_back(needle(p.keys[static_cast<std::size_t>(k)], p.values.back()));
      if (k < c.task.n_queries) p.answers.push_back(p.values.back());
    }
  }
  p.sentences = haystack_sentences(c, d, start, used);
  const auto n = static_cast<std::uint64_t>(c.n);
  p.inserts.emplace_back((c.depth * c.n + 50) / 100, texts[0]);
  for (std::size_t j = 1; j < texts.size(); ++j) {
    p.inserts.emplace_back(static_cast<std::int64_t>(d.at(kPositionDraws + j, n + 1)), texts[j]);
  }
  p.query = join_query(std::vector<std::string>(p.keys.begin(), p.keys.begin() + c.task.n_queries));
  return p;
}

PromptParts vt_parts(const Ctx& c, Draws& d) {
  PromptParts p;
  p.haystack = c.haystack;
  const std::uint64_t start = essay_start(c, d);
  std::set<std::string> names;
  while (p.keys.size() < 5) {
    std::string name;
    for (int i = 0; i < 5; ++i) name += static_cast<char>('A' + d.next(26));
    if (names.insert(name).second) p.keys.push_back(name);
  }
  p.values.push_back(std::to_string(10000 + d.next(90000)));
  p.sentences = haystack_sentences(c, d, start, {});
  std::vector<std::int64_t> pos;
  for (std::uint64_t j = 0; j < 5; ++j) {
    pos.push_back(static_cast<std::int64_t>(d.at(kPositionDraws + j, static_cast<std::uint64_t>(c.n) + 1)));
  }
  std::sort(pos.begin(), pos.end());
  p.inserts.emplace_back(pos[0], "VAR " + p.keys[0] + " = " + p.values[0]);
  for (std::size_t j = 1; j < 5; ++j) {
    p.inserts.emplace_back(pos[j], "VAR " + p.keys[j] + " = VAR " + p.keys[j - 1] + " ");
  }
  p.query = p.values[0];
  p.answers = p.keys;
  return p;
}

PromptParts cwe_parts(const Ctx& c, Draws& d) {
  PromptParts p;
  p.haystack = Haystack::kWords;
  std::vector<std::string> perm = c.words;
  for (std::size_t i = perm.size(); i-- > 1;) std::swap(perm[i], perm[d.next(i + 1)]);
  const int common_reps = c.length < 4096 ? 6 : 30, rare_reps = c.length < 4096 ? 1 : 3;
  for (int r = 0; r < common_reps; ++r) p.sentences.insert(p.sentences.end(), perm.begin(), perm.begin() + 10);
  for (int r = 0; r < rare_reps; ++r) {
    p.sentences.insert(p.sentences.end(), perm.begin() + 10, perm.begin() + 10 + c.n);
  }
  shuffle(p.sentences, d, kShuffleDraws);
  p.answers.assign(perm.begin(), perm.begin() + 10);
  p.keys = p.answers;
  return p;
}

// fwe's count of the word of rank k (1-based) among N: floor(N k^-2 / zeta(2)).
std::int64_t zipf_count(std::int64_t n, std::int64_t k) {
  constexpr double kZeta2 = 1.6449340668482264;  // pi^2 / 6
  return static_cast<std::int64_t>(
      std::floor(static_cast<double>(n) * std::pow(static_cast<double>(k), -2.0) / kZeta2));
}

std::int64_t fwe_vocab(std::int64_t length) { return std::max<std::int64_t>(5, length / 50); }

PromptParts fwe_parts(const Ctx& c, Draws& d) {
  PromptParts p;
  p.haystack = Haystack::kCoded;
  std::vector<std::string> vocab;
  std::set<std::string> seen;
  while (static_cast<std::int64_t>(vocab.size()) < fwe_vocab(c.length)) {
    std::string w;
    for (int i = 0; i < 6; ++i) w += static_cast<char>('a' + d.next(26));
    if (seen.insert(w).second) vocab.push_back(w);
  }
  vocab[0] = "...";  // the most frequent "word" is noise, as RULER
  for (std::size_t k = 0; k < vocab.size(); ++k) {
    const std::int64_t count = zipf_count(c.n, static_cast<std::int64_t>(k) + 1);
    p.sentences.insert(p.sentences.end(), static_cast<std::size_t>(count), vocab[k]);
  }
  shuffle(p.sentences, d, kShuffleDraws);
  p.answers.assign(vocab.begin() + 1, vocab.begin() + 4);
  p.keys = vocab;
  return p;
}

}  // namespace

PromptParts TaskGenerator::parts(const TaskSpec& task, Haystack haystack, QuestionAt question,
                                 std::int64_t length, std::int64_t depth, std::int64_t index,
                                 std::int64_t units) const {
  Draws d(seed_, task_number(task), static_cast<std::uint64_t>(length), depth,
          static_cast<std::uint64_t>(index));
  const Ctx c{task, haystack, length, depth, units, essay_, words_};
  PromptParts p = is_niah(task)               ? niah_parts(c, d)
                  : task.kind == TaskKind::kVt ? vt_parts(c, d)
                  : task.kind == TaskKind::kCwe ? cwe_parts(c, d)
                                                : fwe_parts(c, d);
  p.task = task.kind;
  p.question = question;
  return p;
}

TaskSample TaskGenerator::make(const TaskSpec& task, Haystack haystack, QuestionAt question,
                               std::int64_t length, std::int64_t depth, std::int64_t index) const {
  if (haystack == Haystack::kEssay && essay_.empty()) {
    throw Error(ErrorCode::kInvalidArgument,
                "--text: the essay haystack's text holds no sentence (an empty or blank file); "
                "give a text with sentences, or --haystack noise");
  }
  TaskSample s;
  s.length = length;
  s.depth = task.has_depth ? depth : -1;
  s.index = index;
  auto build = [&](std::int64_t units) {
    s.parts = parts(task, haystack, question, length, s.depth, index, units);
    s.text = render_prompt(s.parts);
    s.ids = encode_(s.text);
    s.units = units;
    return static_cast<std::int64_t>(s.ids.size()) <= length;
  };
  const std::int64_t lo = task.kind == TaskKind::kFwe ? 1 : 0;
  std::int64_t hi = task.kind == TaskKind::kCwe   ? static_cast<std::int64_t>(words_.size()) - 10
                    : task.kind == TaskKind::kFwe ? 4 * length
                                                  : length;
  if (!build(lo)) {
    too_short(task, length, "the prompt with the smallest haystack takes " +
                                std::to_string(s.ids.size()) + " tokens");
  }
  // Galloping up from lo (sizes 8, 16, 32, ...), then bisection between the last size that fits
  // and the first that does not: the prompt's token count grows with the haystack.
  std::int64_t good = lo, bad = hi + 1;
  for (std::int64_t probe = std::max<std::int64_t>(lo + 1, 8); probe <= hi; probe *= 2) {
    if (!build(probe)) {
      bad = probe;
      break;
    }
    good = probe;
  }
  if (bad == hi + 1 && good < hi && !build(hi)) bad = hi;
  if (bad == hi + 1) {
    build(hi);
  } else {
    while (bad - good > 1) {
      const std::int64_t mid = good + (bad - good) / 2;
      (build(mid) ? good : bad) = mid;
    }
    build(good);
  }
  if (task.kind == TaskKind::kFwe) {
    const std::int64_t n = s.units;
    if (zipf_count(n, 4) <= zipf_count(n, 5) || zipf_count(n, 4) < 1) {
      too_short(task, length, "its " + std::to_string(n) +
                                  " coded words cannot rank three words above the rest");
    }
  }
  s.completion = expected_completion(s.parts.answers, s.text.plain().back());
  // Finch's question: the tokens after the context, found by encoding the prompt cut there.
  PromptText cut;
  cut.user = s.text.user.substr(0, s.text.context_end);
  cut.context_end = cut.user.size();
  const std::vector<std::int32_t> head = encode_(cut);
  std::size_t common = 0;
  while (common < head.size() && common < s.ids.size() && head[common] == s.ids[common]) ++common;
  s.question_tokens = static_cast<std::int64_t>(s.ids.size() - common);
  return s;
}

}  // namespace vq::eval
