// Seeded generators of RULER-style samples (docs/tasks.md): for a task, a length L in tokens,
// a depth and a sample index, the pieces of the prompt (PromptParts) drawn from a counter RNG,
// with the haystack grown to the largest size whose tokenized prompt is at most L tokens.
// A sample depends only on (seed, task, haystack, question, L, depth, index) and the inputs
// (word list, essay text, tokenizer), never on the order samples are made in.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "eval/tasks/task_prompts.h"

namespace vq::eval {

// The word list built into the binary (data/tasks/words.txt, one word a line) and the default
// essay text (data/tasks/haystack_wikitext.txt).
const std::vector<std::string>& task_words();
const std::string& default_essay_text();

struct TaskSample {
  PromptParts parts;
  PromptText text;
  std::vector<std::int32_t> ids;  // the prompt's tokens as evaluation feeds them (BOS included)
  std::string completion;         // expected_completion(parts.answers, ...)
  std::int64_t length = 0;        // L asked for
  std::int64_t depth = -1;        // percent; -1 for tasks without a depth
  std::int64_t index = 0;
  std::int64_t units = 0;         // haystack size chosen (sentences, words of cwe/fwe)
  // The prompt's last tokens after its context (PromptText::context_end): the tokens of `ids`
  // past the longest common prefix of `ids` and the encoding of the prompt cut at the context's
  // end (a token that spans the cut counts as the question's). The evaluation hands it to the
  // cache (set_question_length: finch's window).
  std::int64_t question_tokens = 0;
};

// Turns a prompt into the token ids evaluation feeds (the chat template, if any, and BOS).
using PromptEncoder = std::function<std::vector<std::int32_t>(const PromptText&)>;

class TaskGenerator {
 public:
  // `essay`: the text of the essay haystack (split into sentences here); `words`: the key and
  // word vocabulary (at least 20 distinct words).
  TaskGenerator(PromptEncoder encode, const std::string& essay, std::vector<std::string> words,
                std::uint64_t seed);

  // Throws Error(kInvalidArgument) naming --lengths when even the smallest haystack does not fit
  // in `length` tokens, or (fwe) the largest that fits cannot rank three words.
  TaskSample make(const TaskSpec& task, Haystack haystack, QuestionAt question,
                  std::int64_t length, std::int64_t depth, std::int64_t index) const;

  // The pieces for a given haystack size (no fitting); `units` as TaskSample::units.
  PromptParts parts(const TaskSpec& task, Haystack haystack, QuestionAt question,
                    std::int64_t length, std::int64_t depth, std::int64_t index,
                    std::int64_t units) const;

  std::size_t n_essay_sentences() const noexcept { return essay_.size(); }

 private:
  PromptEncoder encode_;
  std::vector<std::string> essay_, words_;
  std::uint64_t seed_;
};

}  // namespace vq::eval
