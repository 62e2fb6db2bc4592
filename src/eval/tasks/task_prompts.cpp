#include "eval/tasks/task_prompts.h"

#include <cmath>

#include "veloxquant/errors.h"

namespace vq::eval {

namespace {

// RULER's templates (scripts/data/synthetic/constants.py), cut at {context}: the instruction
// before it, the question after it, and the answer prefix.
struct Template {
  const char* instruction;
  const char* question;
  const char* answer_prefix;
};

constexpr Template kNiah = {
    "Some special magic {type} are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {type} afterwards.\n",
    "What are all the special magic {type} for {query} mentioned in the provided text?",
    " The special magic {type} for {query} mentioned in the provided text are"};
constexpr Template kVt = {
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n",
    "Question: Find all variables that are assigned the value {query} in the text above.",
    " Answer: According to the chain(s) of variable assignment in the text above, {num_v} "
    "variables are assigned the value {query}, they are: "};
constexpr Template kCwe = {
    "Below is a numbered list of words. In these words, some appear more often than others. "
    "Memorize the ones that appear most often.\n",
    "Question: What are the 10 most common words in the above list?",
    " Answer: The top 10 words that appear most often in the list are:"};
constexpr Template kFwe = {
    "Read the following coded text and track the frequency of each coded word. Find the three "
    "most frequently appeared coded words. ",
    "Question: Do not provide any explanation. Please ignore the dots '....'. What are the three "
    "most frequently appeared words in the above coded text?",
    " Answer: According to the coded text above, the three most frequently appeared words are:"};

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (std::size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) {
    s.replace(at, from.size(), to);
  }
}

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

std::string strip(const std::string& s) {
  std::size_t a = 0, b = s.size();
  while (a < b && is_space(s[a])) ++a;
  while (b > a && is_space(s[b - 1])) --b;
  return s.substr(a, b - a);
}

const Template& template_of(TaskKind kind) {
  switch (kind) {
    case TaskKind::kVt:
      return kVt;
    case TaskKind::kCwe:
      return kCwe;
    case TaskKind::kFwe:
      return kFwe;
    default:
      return kNiah;
  }
}

// One piece of the context as it is written (cwe numbers its words from 1).
std::string piece(const PromptParts& p, std::size_t i, const std::string& text) {
  return p.haystack == Haystack::kWords ? std::to_string(i + 1) + ". " + text : text;
}

const char* separator(Haystack h) {
  return h == Haystack::kNoise || h == Haystack::kNeedle ? "\n" : " ";
}

}  // namespace

const std::vector<TaskSpec>& task_specs() {
  static const std::vector<TaskSpec> specs = {
      {TaskKind::kNiahSingle, "niah_single", 1, 1, 1, Haystack::kEssay, 128, true},
      {TaskKind::kNiahMultikey, "niah_multikey", 4, 1, 1, Haystack::kEssay, 128, true},
      {TaskKind::kNiahMultivalue, "niah_multivalue", 1, 4, 1, Haystack::kEssay, 128, true},
      {TaskKind::kNiahMultiquery, "niah_multiquery", 4, 1, 4, Haystack::kEssay, 128, true},
      {TaskKind::kVt, "vt", 0, 0, 0, Haystack::kNoise, 30, false},
      {TaskKind::kCwe, "cwe", 0, 0, 0, Haystack::kWords, 120, false},
      {TaskKind::kFwe, "fwe", 0, 0, 0, Haystack::kCoded, 50, false},
  };
  return specs;
}

const TaskSpec& task_spec(const std::string& name) {
  std::string names;
  for (const TaskSpec& s : task_specs()) {
    if (name == s.name) return s;
    names += (names.empty() ? "" : ", ") + std::string(s.name);
  }
  throw Error(ErrorCode::kInvalidArgument,
              "--task expects task names from " + names + ", got '" + name + "'");
}

const char* to_string(Haystack h) noexcept {
  switch (h) {
    case Haystack::kNoise:
      return "noise";
    case Haystack::kEssay:
      return "essay";
    case Haystack::kNeedle:
      return "needle";
    case Haystack::kWords:
      return "words";
    case Haystack::kCoded:
      return "coded";
  }
  return "?";
}

Haystack parse_haystack(const std::string& name) {
  for (const Haystack h : {Haystack::kNoise, Haystack::kEssay, Haystack::kNeedle}) {
    if (name == to_string(h)) return h;
  }
  throw Error(ErrorCode::kInvalidArgument,
              "--haystack expects noise, essay or needle, got '" + name + "'");
}

const char* to_string(QuestionAt q) noexcept { return q == QuestionAt::kLast ? "last" : "first"; }

QuestionAt parse_question(const std::string& name) {
  if (name == "last") return QuestionAt::kLast;
  if (name == "first") return QuestionAt::kFirst;
  throw Error(ErrorCode::kInvalidArgument, "--question expects last or first, got '" + name + "'");
}

std::string render_context(const PromptParts& p) {
  std::vector<std::string> out;
  out.reserve(p.sentences.size() + p.inserts.size());
  const auto n = static_cast<std::int64_t>(p.sentences.size());
  for (std::int64_t i = 0; i <= n; ++i) {
    for (const auto& [pos, text] : p.inserts) {
      if (pos == i) out.push_back(text);
    }
    if (i < n) out.push_back(p.sentences[static_cast<std::size_t>(i)]);
  }
  std::string text;
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (i > 0) text += separator(p.haystack);
    text += piece(p, i, out[i]);
  }
  return text;
}

PromptText render_prompt(const PromptParts& p) {
  const Template& t = template_of(p.task);
  std::string instruction = t.instruction, question = t.question, prefix = t.answer_prefix;
  std::string type = "numbers";
  const bool niah = p.task != TaskKind::kVt && p.task != TaskKind::kCwe && p.task != TaskKind::kFwe;
  if (niah && p.answers.size() == 1) {
    // RULER's singular rewrite, on the raw template before substitution.
    for (std::string* s : {&instruction, &question, &prefix}) {
      replace_all(*s, "Some", "A");
      replace_all(*s, "are all", "is");
      replace_all(*s, "are", "is");
    }
    type = "number";
  }
  for (std::string* s : {&instruction, &question, &prefix}) {
    replace_all(*s, "{type}", type);
    replace_all(*s, "{num_v}", std::to_string(p.answers.size()));
    replace_all(*s, "{query}", p.query);
  }
  const std::string context = render_context(p);
  if (p.question == QuestionAt::kLast) {
    return {instruction + context + "\n" + question, prefix, instruction.size() + context.size()};
  }
  std::string user = instruction + question + "\n" + context;
  const std::size_t end = user.size();
  return {std::move(user), "\nAnswer:", end};
}

std::string expected_completion(const std::vector<std::string>& answers, char prompt_end) {
  std::string s = prompt_end == ' ' ? "" : " ";
  for (std::size_t i = 0; i < answers.size(); ++i) s += (i > 0 ? ", " : "") + answers[i];
  return s + ".";
}

std::string join_query(const std::vector<std::string>& keys) {
  if (keys.size() == 1) return keys[0];
  std::string s;
  for (std::size_t i = 0; i + 1 < keys.size(); ++i) s += keys[i] + ", ";
  return s + "and " + keys.back();
}

double string_match_all(const std::string& prediction, const std::vector<std::string>& refs) {
  auto lower = [](std::string s) {
    for (char& c : s) {
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    }
    return s;
  };
  const std::string pred = lower(prediction);
  double hits = 0;
  for (const std::string& r : refs) hits += pred.find(lower(r)) != std::string::npos ? 1.0 : 0.0;
  return hits / static_cast<double>(refs.size());
}

std::vector<std::string> split_sentences(const std::string& text) {
  std::vector<std::string> out;
  auto flush = [&](std::size_t from, std::size_t to) {
    std::string s = strip(text.substr(from, to - from));
    if (!s.empty()) out.push_back(std::move(s));
  };
  std::size_t start = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n') {
      flush(start, i);
      start = i + 1;
    } else if ((c == '.' || c == '!' || c == '?') && i + 1 < text.size() && is_space(text[i + 1])) {
      flush(start, i + 1);
      start = i + 1;
    }
  }
  flush(start, text.size());
  return out;
}

Interval wilson_interval(std::int64_t successes, std::int64_t n) {
  const double nn = static_cast<double>(n), p = static_cast<double>(successes) / nn;
  const double z2 = kWilsonZ * kWilsonZ, denom = 1.0 + z2 / nn;
  const double center = (p + z2 / (2.0 * nn)) / denom;
  const double half = kWilsonZ * std::sqrt(p * (1.0 - p) / nn + z2 / (4.0 * nn * nn)) / denom;
  return {center - half, center + half};
}

}  // namespace vq::eval
