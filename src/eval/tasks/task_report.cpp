// Rendering `veloxquant eval --task` results: the result file (kind "task"), the terminal
// table, the SVG heatmaps and the sample dump (docs/tasks.md).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "eval/report/results.h"
#include "eval/tasks/task_eval.h"

namespace vq::eval {

namespace {

const char* task_name(TaskKind kind) {
  for (const TaskSpec& s : task_specs()) {
    if (s.kind == kind) return s.name;
  }
  return "?";
}

nlohmann::json number_or_null(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(); }

std::string setting_label(const TaskSetting& s) {
  if (s.target_ratio > 0) return fmt::format("{:g}x", s.target_ratio);
  if (s.budget > 0) return fmt::format("b={}", s.budget);
  return s.is_reference ? "reference" : "-";
}

nlohmann::json settings_json(const TaskEvalResult& r) {
  const TaskEvalOptions& o = r.options;
  nlohmann::json haystacks = nlohmann::json::object();
  for (const std::string& t : o.tasks) {
    haystacks[t] = o.haystack.empty() ? to_string(task_spec(t).haystack) : o.haystack;
  }
  nlohmann::json s = {{"model", o.model},
                      {"model_format", r.model_format},
                      {"model_config", r.model_config},
                      {"tokenizer", r.tokenizer_path},
                      {"chat_template", r.chat_template},
                      {"tasks", o.tasks},
                      {"lengths", r.lengths},
                      {"depths", o.depths},
                      {"samples", o.samples},
                      {"seed", o.seed},
                      {"haystack", haystacks},
                      {"essay", r.essay},
                      {"question", to_string(o.question)},
                      {"methods", o.methods},
                      {"reference", o.reference},
                      {"bootstrap", o.bootstrap_samples},
                      {"bootstrap_seed", o.bootstrap_seed}};
  if (o.budgets.empty()) s["ratios"] = o.ratios;
  else s["budgets"] = o.budgets;
  return s;
}

nlohmann::json cell_json(const TaskEvalResult& r, const TaskCell& c) {
  const TaskSetting& s = r.settings[c.setting];
  nlohmann::json j = method_json(s.configs[s.at(c.task, c.length)]);
  j["series"] = s.series;
  j["is_reference"] = s.is_reference;
  j["target_ratio"] = s.target_ratio > 0 ? nlohmann::json(s.target_ratio) : nlohmann::json();
  j["task"] = r.options.tasks[c.task];
  j["length"] = r.lengths[c.length];
  j["depth"] = c.depth >= 0 ? nlohmann::json(c.depth) : nlohmann::json();
  j["n"] = c.n;
  j["accuracy"] = c.accuracy;
  j["ci"] = {c.ci.lo, c.ci.hi};
  j["interval"] = c.wilson ? "wilson" : "bootstrap";
  j["relative"] = number_or_null(c.relative);
  j["delta_ci"] = {c.delta_ci.lo, c.delta_ci.hi};
  j["kept_bytes"] = c.kept_bytes;
  j["compression_ratio"] = c.compression_ratio;
  j["time_per_sample_ms"] = 1000.0 * c.seconds;
  nlohmann::json scores = nlohmann::json::array(), outputs = nlohmann::json::array();
  for (const std::size_t i : c.samples) {
    scores.push_back(r.runs[c.setting][i].score);
    if (c.depth >= 0 || !task_spec(r.options.tasks[c.task]).has_depth) {
      outputs.push_back(r.runs[c.setting][i].output);
    }
  }
  j["scores"] = scores;
  if (!outputs.empty()) j["outputs"] = outputs;
  return j;
}

std::string interval_text(const Interval& i) { return fmt::format("[{:.2f}, {:.2f}]", i.lo, i.hi); }

// Red (0) through yellow to green (1).
std::string heat_color(double v) {
  const double t = std::clamp(v, 0.0, 1.0);
  const int red = t < 0.5 ? 215 : static_cast<int>(215 - (t - 0.5) * 2 * 189);
  const int green = t < 0.5 ? static_cast<int>(48 + t * 2 * 143) : 191 - static_cast<int>((t - 0.5) * 2 * 28);
  return fmt::format("#{:02x}{:02x}{:02x}", red, green, 60);
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    if (c == '&') out += "&amp;";
    else if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else out += c;
  }
  return out;
}

// One panel: a setting on a task, lengths across, depths down (one "all" row without depth).
std::string heat_panel(const TaskEvalResult& r, std::size_t setting, std::size_t task, int x0, int y0,
                       int cw, int ch) {
  const TaskSetting& s = r.settings[setting];
  const bool depth = task_spec(r.options.tasks[task]).has_depth;
  const std::vector<std::int64_t> depths = depth ? r.options.depths : std::vector<std::int64_t>{-1};
  std::string out = fmt::format(
      "<text x=\"{}\" y=\"{}\" font-size=\"13\" font-weight=\"bold\">{} {}</text>\n"
      "<text x=\"{}\" y=\"{}\" font-size=\"12\">{}</text>\n",
      x0, y0 + 14, xml_escape(s.series), xml_escape(setting_label(s)), x0, y0 + 30,
      xml_escape(r.options.tasks[task]));
  const int gx = x0 + 56, gy = y0 + 38;
  for (std::size_t d = 0; d < depths.size(); ++d) {
    out += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"11\" text-anchor=\"end\">{}</text>\n",
                       gx - 4, gy + static_cast<int>(d) * ch + ch / 2 + 4,
                       depths[d] >= 0 ? fmt::format("{}%", depths[d]) : std::string("all"));
    for (std::size_t l = 0; l < r.lengths.size(); ++l) {
      const int x = gx + static_cast<int>(l) * cw, y = gy + static_cast<int>(d) * ch;
      const TaskCell* cell = nullptr;
      for (const TaskCell& c : r.cells) {
        if (c.setting == setting && c.task == task && c.length == l && c.depth == depths[d]) cell = &c;
      }
      const std::string fill = cell ? heat_color(cell->accuracy) : "#dddddd";
      out += fmt::format(
          "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\" stroke=\"#ffffff\"/>\n", x,
          y, cw, ch, fill);
      out += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"11\" text-anchor=\"middle\">{}</text>\n",
                         x + cw / 2, y + ch / 2 + 4,
                         cell ? fmt::format("{:.0f}", 100 * cell->accuracy) : std::string("-"));
    }
  }
  for (std::size_t l = 0; l < r.lengths.size(); ++l) {
    out += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"11\" text-anchor=\"middle\">{}</text>\n",
                       gx + static_cast<int>(l) * cw + cw / 2,
                       gy + static_cast<int>(depths.size()) * ch + 14, r.lengths[l]);
  }
  return out;
}

}  // namespace

nlohmann::json task_sample_json(const TaskSample& s, std::uint64_t seed,
                                const std::string& chat_template) {
  const PromptParts& p = s.parts;
  nlohmann::json inserts = nlohmann::json::array();
  for (const auto& [pos, text] : p.inserts) inserts.push_back({pos, text});
  return {{"task", task_name(p.task)},
          {"question", to_string(p.question)},
          {"length", s.length},
          {"depth", s.depth >= 0 ? nlohmann::json(s.depth) : nlohmann::json()},
          {"seed", seed},
          {"index", s.index},
          {"prompt", s.text.plain()},
          {"answer_prefix", s.text.answer_prefix},
          {"chat_template", chat_template},
          {"answers", p.answers},
          {"completion", s.completion},
          {"n_tokens", s.ids.size()},
          {"parts",
           {{"haystack", to_string(p.haystack)},
            {"sentences", p.sentences},
            {"inserts", inserts},
            {"query", p.query},
            {"keys", p.keys},
            {"values", p.values}}}};
}

std::string task_samples_jsonl(const TaskEvalResult& r) {
  std::string out;
  for (const TaskSample& s : r.samples) {
    out += task_sample_json(s, r.options.seed, r.chat_template).dump() + "\n";
  }
  return out;
}

nlohmann::json task_eval_json(const TaskEvalResult& r, const std::string& command) {
  nlohmann::json j = results_envelope("task", command, settings_json(r));
  for (const TaskCell& c : r.cells) j["rows"].push_back(cell_json(r, c));
  nlohmann::json skipped = nlohmann::json::array();
  for (const TaskSetting& s : r.settings) {
    for (std::size_t t = 0; t < r.options.tasks.size(); ++t) {
      for (std::size_t l = 0; l < r.lengths.size(); ++l) {
        if (s.skipped[s.at(t, l)].empty()) continue;
        skipped.push_back({{"series", s.series},
                           {"setting", setting_label(s)},
                           {"task", r.options.tasks[t]},
                           {"length", r.lengths[l]},
                           {"reason", s.skipped[s.at(t, l)]}});
      }
    }
  }
  j["skipped"] = skipped;
  j["wall_time_ms"] = 1000.0 * r.seconds;
  return j;
}

std::string task_eval_table(const TaskEvalResult& r) {
  std::string out = fmt::format("{:<22} {:>9} {:<16} {:>6} {:>6} {:>14} {:>6} {:>10} {:>7} {:>9}\n",
                                "method", "setting", "task", "length", "acc", "95% CI", "rel",
                                "kept KiB", "ratio", "s/sample");
  for (const TaskCell& c : r.cells) {
    if (c.depth >= 0) continue;
    const TaskSetting& s = r.settings[c.setting];
    out += fmt::format("{:<22} {:>9} {:<16} {:>6} {:>6.3f} {:>14} {:>6} {:>10.1f} {:>7.2f} {:>9.3f}\n",
                       s.series, setting_label(s), r.options.tasks[c.task], r.lengths[c.length],
                       c.accuracy, interval_text(c.ci),
                       std::isfinite(c.relative) ? fmt::format("{:.2f}", c.relative) : "-",
                       c.kept_bytes / 1024.0, c.compression_ratio, c.seconds);
  }
  for (const TaskSetting& s : r.settings) {
    for (std::size_t t = 0; t < r.options.tasks.size(); ++t) {
      for (std::size_t l = 0; l < r.lengths.size(); ++l) {
        if (s.skipped[s.at(t, l)].empty()) continue;
        out += fmt::format("skipped: {} {} on {} at length {}: {}\n", s.series, setting_label(s),
                           r.options.tasks[t], r.lengths[l], s.skipped[s.at(t, l)]);
      }
    }
  }
  out += fmt::format("{} samples, question {}, chat template {}; accuracy = mean string_match_all "
                     "score; CI: Wilson for 0/1 scores, else paired percentile bootstrap; rel = "
                     "accuracy / the reference's\n",
                     r.samples.size(), to_string(r.options.question), r.chat_template);
  return out;
}

std::string task_eval_heatmap(const TaskEvalResult& r) {
  const int cw = 56, ch = 22;
  const int cols = static_cast<int>(r.options.tasks.size());  // a row per setting, a column per task
  std::size_t max_depths = 1;
  for (const std::string& t : r.options.tasks) {
    if (task_spec(t).has_depth) max_depths = std::max(max_depths, r.options.depths.size());
  }
  const int pw = std::max(200, 56 + cw * static_cast<int>(r.lengths.size()) + 24);
  const int ph = 38 + ch * static_cast<int>(max_depths) + 30;
  const std::size_t n = r.settings.size() * r.options.tasks.size();
  const int rows = static_cast<int>((n + cols - 1) / cols);
  const int W = std::max(640, 20 + pw * cols), H = 50 + ph * rows + 20;
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"10\" y=\"22\" font-size=\"15\" font-weight=\"bold\">{}</text>\n"
      "<text x=\"10\" y=\"40\" font-size=\"11\">accuracy in % (mean score over the samples); "
      "columns: prompt length in tokens; rows: needle depth</text>\n",
      W, H, xml_escape("eval --task: " + r.options.model));
  std::size_t k = 0;
  for (std::size_t s = 0; s < r.settings.size(); ++s) {
    for (std::size_t t = 0; t < r.options.tasks.size(); ++t, ++k) {
      const int x0 = 10 + pw * static_cast<int>(k % cols), y0 = 50 + ph * static_cast<int>(k / cols);
      out += heat_panel(r, s, t, x0, y0, cw, ch);
    }
  }
  return out + "</svg>\n";
}

}  // namespace vq::eval
