// The reference engine from Python: load a model (llama2.c, Hugging Face or GGUF checkpoints, every
// format engine/model.h reads), its tokenizer, generate text, evaluate cache methods
// teacher-forced. Long calls release the GIL.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bindings.h"
#include "engine/run/evaluate.h"
#include "engine/run/generate.h"
#include "engine/model/model.h"
#include "engine/tokenizers/tokenizer.h"
#include "eval/model/model_eval.h"
#include "veloxquant/config.h"

namespace py = pybind11;

namespace vq::python {
namespace {

using engine::Model;
using engine::Tokenizer;

// A method given as a CacheConfig or as a spec string.
CacheConfig config_of(const py::handle& method) {
  if (py::isinstance<CacheConfig>(method)) return method.cast<CacheConfig>();
  if (py::isinstance<py::str>(method)) return CacheConfig::parse(method.cast<std::string>());
  throw py::type_error("method must be a CacheConfig or a spec string");
}

py::dict config_dict(const engine::ModelConfig& c) {
  py::dict d;
  d["format"] = c.format;
  d["dim"] = c.dim;
  d["hidden_dim"] = c.hidden_dim;
  d["n_layers"] = c.n_layers;
  d["n_heads"] = c.n_heads;
  d["n_kv_heads"] = c.n_kv_heads;
  d["head_dim"] = c.head_dim;
  d["vocab_size"] = c.vocab_size;
  d["seq_len"] = c.seq_len;
  d["norm_eps"] = c.norm_eps;
  d["rope_theta"] = c.rope_theta;
  d["rope"] = engine::to_string(c.rope);
  d["tied_classifier"] = c.tied_classifier;
  d["weights_dtype"] = c.weights_dtype;
  d["bos_id"] = c.bos_id;
  d["eos_id"] = c.eos_id;
  d["n_params"] = c.n_params();
  return d;
}

py::object json_to_python(const nlohmann::json& j) {
  return py::module_::import("json").attr("loads")(j.dump());
}

std::shared_ptr<Tokenizer> tokenizer_for(const Model& model, const py::object& tokenizer) {
  if (tokenizer.is_none()) return engine::load_tokenizer("", model);
  if (py::isinstance<Tokenizer>(tokenizer)) return tokenizer.cast<std::shared_ptr<Tokenizer>>();
  return engine::load_tokenizer(tokenizer.cast<std::string>(), model);
}

}  // namespace

void bind_engine(py::module_& m) {
  py::class_<Model, std::shared_ptr<Model>>(m, "Model",
                                            "A Llama-architecture checkpoint (engine/model.h)")
      .def_static(
          "load",
          [](const std::string& path) {
            py::gil_scoped_release release;
            return std::make_shared<Model>(Model::load(path));
          },
          py::arg("path"),
          "Loads a llama2.c .bin, a Hugging Face directory / model.safetensors / "
          "config.json, or a GGUF file; raises Error(file_error) naming the file")
      .def_property_readonly("config",
                             [](const Model& model) { return config_dict(model.config()); })
      .def_property_readonly("path", &Model::path)
      .def_property_readonly("directory", &Model::directory)
      .def("__repr__", [](const Model& model) {
        return "<veloxquant.Model " + model.config().format + " " + model.path() + ">";
      });

  py::class_<Tokenizer, std::shared_ptr<Tokenizer>>(m, "Tokenizer")
      .def_static(
          "load",
          [](const Model& model, const std::string& path) -> std::shared_ptr<Tokenizer> {
            return engine::load_tokenizer(path, model);
          },
          py::arg("model"), py::arg("path") = "",
          "Loads `path` (tokenizer.json, llama2.c tokenizer.bin or a .gguf file's "
          "vocabulary; '' = the default next to the model, or a GGUF model's own) and checks "
          "it fits the model")
      .def("encode", &Tokenizer::encode, py::arg("text"), py::arg("add_special") = true)
      .def("decode", &Tokenizer::decode, py::arg("ids"))
      .def("token_text", &Tokenizer::token_text, py::arg("id"))
      .def_property_readonly("vocab_size", &Tokenizer::vocab_size)
      .def_property_readonly("bos_id", &Tokenizer::bos_id)
      .def_property_readonly("kind", &Tokenizer::kind)
      .def_property_readonly("path", &Tokenizer::path);

  m.def(
      "generate",
      [](const Model& model, const py::object& tokenizer, const std::string& prompt,
         const py::handle& steps, const py::handle& temperature, const py::handle& top_p,
         const py::handle& seed, const py::object& method, const std::string& question) {
        // The CLI's ranges (engine/run/generate.h), named as the arguments.
        const std::string name = "[python] generate: ";
        engine::GenerateOptions o;
        o.prompt = prompt;
        o.question = question;
        o.steps = engine::generate_positions(
            model.config(), int_arg(steps, name + "steps", 0, engine::kMaxGenerateSteps),
            name + "steps");
        o.temperature = static_cast<float>(
            real_arg(temperature, name + "temperature", 0.0, engine::kMaxTemperature, true));
        o.top_p = static_cast<float>(real_arg(top_p, name + "top_p", 0.0, 1.0, true));
        o.seed = uint_arg(seed, name + "seed");
        o.method = config_of(method);
        const std::shared_ptr<Tokenizer> tok = tokenizer_for(model, tokenizer);
        engine::GenerateResult r;
        {
          py::gil_scoped_release release;
          r = engine::generate(model, *tok, o);
        }
        py::dict d;
        d["ids"] = r.ids;
        d["text"] = r.text;
        d["n_prompt"] = r.n_prompt;
        d["n_decode"] = r.n_decode;
        d["stopped"] = r.stopped;
        d["prefill_seconds"] = r.prefill_seconds;
        d["decode_seconds"] = r.decode_seconds;
        d["reconstruction_seconds"] = r.reconstruction_seconds;  // kvzip's pass (0: none)
        d["cache"] = stats_dict(r.cache);
        return d;
      },
      py::arg("model"), py::arg("tokenizer") = py::none(), py::arg("prompt") = "",
      py::arg("steps") = 256, py::arg("temperature") = 0.0, py::arg("top_p") = 0.9,
      py::arg("seed") = 42, py::arg("method") = "full", py::arg("question") = "",
      "Generates as `veloxquant generate` does; returns a dict (ids, text, n_prompt, n_decode, "
      "stopped, timings, cache stats). `question` is appended to the prompt and declared to the "
      "cache as the prompt's question (method finch), as generate --question");

  m.def(
      "run_forced",
      [](const Model& model, const py::handle& token_ids, const py::object& method,
         const py::handle& prefill) {
        // Ids as 32-bit ints here (run_forced checks them against the vocabulary and their
        // count against the model's context); prefill in [0, len(tokens) - 1].
        const std::string name = "[python] run_forced: ";
        const std::vector<std::int64_t> ids =
            int_list_arg(token_ids, name + "tokens", INT32_MIN, INT32_MAX);
        const std::vector<std::int32_t> tokens(ids.begin(), ids.end());
        const CacheConfig config = config_of(method);
        engine::ForcedOptions o;
        o.prefill = int_arg(prefill, name + "prefill", 0,
                            std::max<std::int64_t>(0, static_cast<std::int64_t>(ids.size()) - 1));
        engine::ForcedRun r;
        {
          py::gil_scoped_release release;
          r = engine::run_forced(model, tokens, config, o);
        }
        const engine::ForcedSummary s = engine::summarize(r, nullptr);
        py::dict d;
        d["nll"] = py::array_t<double>(static_cast<py::ssize_t>(r.nll.size()), r.nll.data());
        d["top1"] =
            py::array_t<std::int32_t>(static_cast<py::ssize_t>(r.top1.size()), r.top1.data());
        d["nll_mean"] = s.nll_mean;
        d["ppl"] = s.ppl;
        d["kept_tokens_mean"] = r.kept_tokens_mean;
        // kvzip: its reconstruction pass after the prefill (the context's tokens alone here:
        // run_forced has no tokenizer for the repeat instruction), against the prefill step.
        d["prefill_seconds"] = r.prefill_seconds;
        d["reconstruction_seconds"] = r.reconstruction_seconds;
        d["cache"] = stats_dict(r.cache);
        return d;
      },
      py::arg("model"), py::arg("tokens"), py::arg("method") = "full", py::arg("prefill") = 0,
      "Teacher-forced run of one method over token ids: per-prediction nll [P] and top1 [P], "
      "nll_mean, ppl, kept_tokens_mean, cache stats");

  m.def(
      "eval",
      [](const std::string& model, const std::string& text, const std::string& tokenizer,
         const py::handle& tokens, const py::handle& prefill,
         const std::vector<std::string>& methods, const py::handle& budgets,
         const std::string& reference) {
        // The CLI's ranges (eval/model/model_eval.h), named as the arguments; tokens against the
        // model's context is checked once the model is loaded.
        const std::string name = "[python] eval: ";
        eval::ModelEvalOptions o;
        o.model = model;
        o.text = text;
        o.tokenizer = tokenizer;
        o.tokens = int_arg(tokens, name + "tokens", 2, eval::kMaxEvalTokens);
        o.prefill = int_arg(prefill, name + "prefill", 0, o.tokens - 2);
        o.methods = methods;
        o.budgets = int_list_arg(budgets, name + "budgets", 1, INT64_MAX);
        o.reference = reference;
        nlohmann::json j;
        {
          py::gil_scoped_release release;
          const eval::ModelEvalResult r = eval::run_model_eval(o, nullptr);
          j = eval::model_eval_json(r, "python: veloxquant.eval");
        }
        return json_to_python(j);
      },
      py::arg("model"), py::arg("text"), py::arg("tokenizer") = "", py::arg("tokens") = 512,
      py::arg("prefill") = 0, py::arg("methods") = std::vector<std::string>{},
      py::arg("budgets") = std::vector<std::int64_t>{32, 64, 128, 256},
      py::arg("reference") = "full",
      "Runs `veloxquant eval` and returns its result file (veloxquant.results/1, kind eval) as "
      "a dict: the same settings and rows as --json writes");
}

}  // namespace vq::python
