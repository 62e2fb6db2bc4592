// RULER-style task prompts (`veloxquant eval --task`, docs/tasks.md): the task table, the
// pieces that fully determine a prompt (PromptParts, also what --dump-samples writes), the
// rendering of those pieces into text, the expected completion, the scorer and the Wilson
// interval. Pure functions of their arguments; the seeded drawing of the pieces is in
// task_gen.h.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "eval/report/bootstrap.h"

namespace vq::eval {

enum class TaskKind { kNiahSingle, kNiahMultikey, kNiahMultivalue, kNiahMultiquery, kVt, kCwe, kFwe };
// How the context's pieces are joined (docs/tasks.md "Haystacks"): noise, essay and needle
// sentences (niah, vt), a numbered word list (cwe) or coded words (fwe).
enum class Haystack { kNoise, kEssay, kNeedle, kWords, kCoded };
enum class QuestionAt { kLast, kFirst };

struct TaskSpec {
  TaskKind kind;
  const char* name;            // RULER's name: niah_single, ..., vt, cwe, fwe
  int n_keys = 0;              // niah: keys in the text (the queried ones first)
  int n_values = 0;            // niah: values per key
  int n_queries = 0;           // niah: keys asked for
  Haystack haystack;           // the default haystack
  int tokens_to_generate = 0;  // RULER's cap on the answer's tokens
  bool has_depth = false;      // niah only: the queried needle's depth is a parameter
};

// Every task, in the order of docs/tasks.md.
const std::vector<TaskSpec>& task_specs();
// The task named `name`; throws Error(kInvalidArgument) naming --task, the names accepted and
// `name`.
const TaskSpec& task_spec(const std::string& name);
// "noise", "essay", "needle", "words", "coded"; parse_haystack accepts the first three (the
// --haystack values) and throws Error(kInvalidArgument) naming --haystack otherwise.
const char* to_string(Haystack h) noexcept;
Haystack parse_haystack(const std::string& name);
const char* to_string(QuestionAt q) noexcept;  // "last", "first"
QuestionAt parse_question(const std::string& name);  // throws naming --question

// Everything that determines a prompt's text (docs/tasks.md "Samples"): the haystack kind, the
// haystack's pieces in order (sentences, or the word list of cwe/fwe), the insertions
// (position = index in `sentences` before which the text goes; inserts at the same position
// keep their list order; position n = after the last), the query string substituted for
// {query}, and the answers. keys/values: the needles' keys and values (niah), the chain's
// variable names and its value (vt); reported, not needed to render.
struct PromptParts {
  TaskKind task = TaskKind::kNiahSingle;
  QuestionAt question = QuestionAt::kLast;
  Haystack haystack = Haystack::kNoise;
  std::vector<std::string> sentences;
  std::vector<std::pair<std::int64_t, std::string>> inserts;
  std::string query;
  std::vector<std::string> keys, values;
  std::vector<std::string> answers;
};

// The prompt as text, split where a chat template puts the assistant's turn: `user` (the
// instruction, context and question in the order --question says) and `answer_prefix` (what
// the assistant's reply starts with). Without a chat template the prompt is user +
// answer_prefix.
// `context_end` is where the context ends in `user` (a character offset): what follows it
// (the question with --question last; with --question first only the chat template's tail and
// the answer prefix) is Finch's question window (TaskSample::question_tokens).
struct PromptText {
  std::string user, answer_prefix;
  std::size_t context_end = 0;
  std::string plain() const { return user + answer_prefix; }
};
PromptText render_prompt(const PromptParts& parts);

// The context alone: the haystack's pieces with the inserts, joined as its kind says.
std::string render_context(const PromptParts& parts);

// The completion the task model is trained to write: the answers joined by ", ", then "."; a
// leading space unless `prompt_end` (the prompt's last character) is a space.
std::string expected_completion(const std::vector<std::string>& answers, char prompt_end);

// RULER's needle join: "k1" or "k1, k2, and k3".
std::string join_query(const std::vector<std::string>& keys);

// RULER's string_match_all: the fraction of `refs` that occur in `prediction`, case-insensitive
// (ASCII letters). `refs` must not be empty.
double string_match_all(const std::string& prediction, const std::vector<std::string>& refs);

// Splits a text into sentences (docs/tasks.md "Haystacks", essay): a cut after '.', '!' or '?'
// followed by ASCII whitespace, and at every line feed; pieces stripped of ASCII whitespace;
// empty pieces dropped.
std::vector<std::string> split_sentences(const std::string& text);

// The 95% Wilson score interval of `successes` out of `n` (n >= 1), z = 1.959964 (the 97.5%
// normal quantile): (p + z^2/2n -+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n).
Interval wilson_interval(std::int64_t successes, std::int64_t n);
inline constexpr double kWilsonZ = 1.959964;

}  // namespace vq::eval
