// `veloxquant bench ...`: benchmarks that write result files.
//   bench perturb  the model-free perturbation benchmark (src/eval/perturb/perturb_bench.h)
//   bench table    markdown tables of perturb result files (docs/benchmarks.md's tables)
//   bench decode   decode speed at real model shapes and long contexts (src/eval/model/decode_bench.h)
//   bench kernels  the roofline: this machine's peaks and the kernels as fractions of them
//                  (src/eval/roofline/roofline.h)
#include <fmt/format.h>

#include <iostream>
#include <memory>

#include "base/validate.h"
#include "base/input_file.h"
#include "cli.h"
#include "eval/model/decode_bench.h"
#include "engine/formats/json_limits.h"
#include "engine/formats/mapped_file.h"
#include "eval/report/output_set.h"
#include "eval/perturb/perturb_bench.h"
#include "eval/roofline/roofline.h"
#include "engine/run/resources.h"
#include "eval/report/results.h"
#include "engine/compute/parallel.h"
#include "veloxquant/errors.h"
#include "veloxquant/registry.h"

namespace vq::cli {
namespace {

struct PerturbArgs {
  std::vector<std::string> methods;
  std::string seq = "256,512,1024", budget = "64,128";
  std::int64_t heads = 4, head_dim = 64, probes = 32, seeds = 5;
  std::string geometry = "spans", feed = "prefill";
  std::string json, plot;
  bool quiet = false;
  std::vector<std::string> argv;  // the command line, for the result file
  std::uint64_t max_memory = 0;   // --max-memory; 0: the available memory
  bool budget_given = false;      // --budget on the command line
};

std::string budget_text(const CacheConfig& c) {
  return has_token_budget(c) ? std::to_string(token_budget(c)) : "-";
}

void run_bench_perturb(const PerturbArgs& a) {
  eval::PerturbOptions o;
  o.methods = a.methods;
  o.seqs = parse_int_list(a.seq, "--seq", 1);
  o.budgets = parse_int_list(a.budget, "--budget", 1);
  o.budgets_given = a.budget_given;
  o.heads = a.heads;
  o.head_dim = a.head_dim;
  o.probes = a.probes;
  o.seeds = a.seeds;
  o.geometry = eval::parse_geometry(a.geometry);
  o.feed = eval::parse_feed(a.feed);
  // Everything is checked before the first row runs; a failed run writes nothing.
  const std::vector<eval::PerturbCase> cases = eval::plan_perturb(o);
  engine::check_memory("bench perturb", eval::perturb_bytes(o),
                     "synthetic K/V of every seed at the longest --seq, probes and caches",
                     a.max_memory);
  eval::OutputSet out;  // checked now, written together at the end (eval/report/output_set.h)
  out.declare("--json", a.json);
  if (!a.plot.empty()) out.declare("--plot", a.plot);

  auto progress = [&](std::size_t i, std::size_t n, const eval::PerturbCase& c,
                      const eval::PerturbMeasure& m, double seconds) {
    if (a.quiet) return;
    std::string extra;
    if (m.late_topic_fraction) extra = fmt::format(", late-topic {:.3f}", *m.late_topic_fraction);
    if (m.planted_survival) extra = fmt::format(", planted kept {:.3f}", *m.planted_survival);
    std::cerr << fmt::format(
        "[perturb {}/{}] seq {} budget {} {}: perturbation {:.4f} ± {:.4f}{}, {:.1f} rows/head, "
        "{:.2f} us/token ({:.2f} s)\n",
        i, n, c.seq, budget_text(c.config), c.method_arg, m.perturbation_mean, m.perturbation_std,
        extra, m.kept_tokens, m.time_per_token_us, seconds);
  };
  if (!a.quiet) {
    std::cerr << fmt::format("[perturb] {} rows x {} seeds, geometry {}, feed {}\n", cases.size(),
                             o.seeds, a.geometry, a.feed);
  }
  const nlohmann::json doc = eval::run_perturb(o, eval::command_line(a.argv), progress);
  out.stage("--json", doc.dump(2) + "\n");
  if (out.has("--plot")) out.stage("--plot", eval::perturb_plot_svg(doc));
  out.commit();

  std::cout << fmt::format("{:<44} {:>6} {:>6} {:>7} {:>22} {:>9} {:>10}\n", "method", "seq",
                           "budget", "ratio", "perturbation (± std)", "extra", "us/token");
  for (const auto& r : doc["rows"]) {
    std::string extra = "-";
    if (r["late_topic_fraction"].is_number()) {
      extra = fmt::format("{:.3f}", r["late_topic_fraction"].get<double>());
    } else if (r["planted_survival"].is_number()) {
      extra = fmt::format("{:.3f}", r["planted_survival"].get<double>());
    }
    std::cout << fmt::format(
        "{:<44} {:>6} {:>6} {:>7.2f} {:>13.4f} ± {:<6.4f} {:>9} {:>10.2f}\n",
        r["method_arg"].get<std::string>(), r["seq"].get<std::int64_t>(),
        r["budget"].is_number() ? std::to_string(r["budget"].get<std::int64_t>()) : "-",
        r["compression_ratio"].get<double>(), r["perturbation_mean"].get<double>(),
        r["perturbation_std"].get<double>(), extra, r["time_per_token_us"].get<double>());
  }
  std::cout << "\nperturbation = mean over probes and KV heads of 1 - cos(full-cache attention "
               "output, compressed output); extra = "
            << (o.geometry == eval::Geometry::kPlanted ? "planted token survival"
                : o.geometry == eval::Geometry::kShift || o.geometry == eval::Geometry::kStable
                    ? "late-topic fraction of kept rows"
                    : "-")
            << "\nwrote " << a.json << (a.plot.empty() ? "" : " and " + a.plot) << "\n";
}

struct DecodeArgs {
  eval::DecodeBenchOptions o;
  std::string contexts = "2048", threads = "0", weights = "bf16";
  std::string json, plot;
  bool quiet = false;
  std::vector<std::string> argv;
};

void run_bench_decode(DecodeArgs& a) {
  eval::DecodeBenchOptions& o = a.o;
  o.contexts = parse_int_list(a.contexts, "--context", 1, eval::kMaxDecodeContext);
  o.threads.clear();
  const int cores = engine::available_cores();
  for (const std::int64_t t : parse_int_list(a.threads, "--threads", 0, 1 << 30)) {
    validate::check_threads(t, "--threads values", cores);
    o.threads.push_back(t == 0 ? cores : static_cast<int>(t));
  }
  o.weight_type = parse_weight_type(a.weights, "--weights");
  eval::validate_decode_options(o);
  // Every output is checked before the run and all are written together at the end, or none
  // is (eval/report/output_set.h).
  name_input("--model", o.model_path);  // an output naming it is refused (base/input_file.h)
  eval::OutputSet out;
  if (!a.json.empty()) out.declare("--json", a.json);
  if (!a.plot.empty()) out.declare("--plot", a.plot);
  const nlohmann::json doc = eval::run_decode_bench(
      o, eval::command_line(a.argv), [&](const eval::DecodeProgress& p) {
        if (!a.quiet) std::cerr << p.line << "\n";
      });
  if (out.has("--json")) out.stage("--json", doc.dump(2) + "\n");
  if (out.has("--plot")) out.stage("--plot", eval::decode_plot_svg(doc));
  out.commit();
  std::cout << fmt::format("{:<28} {:>7} {:>4} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9}\n",
                           "method", "context", "thr", "ms/token", "tok/s", "weights", "attn",
                           "cache", "vs full", "xBW bound");
  for (const auto& r : doc["rows"]) {
    std::cout << fmt::format(
        "{:<28} {:>7} {:>4} {:>9.2f} {:>8.2f} {:>8.2f} {:>8.2f} {:>8.2f} {:>8} {:>9.2f}\n",
        r["method_arg"].get<std::string>(), r["context"].get<std::int64_t>(),
        r["threads"].get<int>(), r["ms_per_token"].get<double>(), r["tokens_per_s"].get<double>(),
        r["weights_ms"].get<double>(), r["attention_ms"].get<double>(),
        r["cache_ms"].get<double>(),
        r["speedup_vs_full"].is_number() ? fmt::format("{:.2f}x", r["speedup_vs_full"].get<double>())
                                         : std::string("-"),
        r["bandwidth_ratio"].get<double>());
  }
  if (!a.json.empty()) std::cout << "wrote " << a.json << (a.plot.empty() ? "" : " and " + a.plot) << "\n";
}

// A result file, read with the text-file size limit and parsed with the JSON depth limit.
nlohmann::json read_json_file(const std::string& path) {
  return engine::parse_json_limited(engine::read_text_file(path), path, "result file");
}

// Runs `f` (reading result documents), turning any error into one that names `file`.
template <typename F>
auto naming_file(const std::string& file, F&& f) {
  try {
    return f();
  } catch (const Error& e) {
    if (e.path() == file) throw;
    throw Error(ErrorCode::kFileError, "'" + file + "': " + e.what(), file);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kFileError,
                "'" + file + "': not a perturb result document (" +
                    engine::text_excerpt(e.what(), 160) + ")",
                file);
  }
}

// `bench perturb`: its flags, and the run on the parsed arguments.
void add_bench_perturb(CLI::App& bench, int argc, const char* const* argv) {
  auto a = std::make_shared<PerturbArgs>();
  a->argv.assign(argv, argv + argc);
  auto* perturb = bench.add_subcommand(
      "perturb",
      "Model-free perturbation benchmark: how far attention over each method's kept (or merged) "
      "rows moves from attention over the full cache, on synthetic K/V");
  perturb->add_option("--method", a->methods,
                      "Method spec ID[:key=value,...]; repeatable; each gets every --budget")
      ->required();
  perturb->add_option("--seq", a->seq, "Sequence lengths, comma-separated (each >= 8)")
      ->capture_default_str();
  perturb->add_option("--budget", a->budget,
                      "Token budgets per KV head, comma-separated (methods without a budget, "
                      "e.g. full, run once per seq)")
      ->capture_default_str();
  perturb->add_option("--heads", a->heads, "KV heads")
      ->capture_default_str()
      ->check(int_range(1, eval::kMaxBenchHeads));
  perturb->add_option("--head-dim", a->head_dim, "Head dimension")
      ->capture_default_str()
      ->check(int_range(1, eval::kMaxBenchHeadDim));
  perturb->add_option("--probes", a->probes, "Probe queries per head")
      ->capture_default_str()
      ->check(int_range(1, eval::kMaxBenchProbes));
  perturb->add_option("--seeds", a->seeds, "Data seeds: seed s of N is data seed s (0..N-1)")
      ->capture_default_str()
      ->check(int_range(1, eval::kMaxBenchSeeds));
  perturb
      ->add_option("--geometry", a->geometry,
                   "spans (CaM's planted spans) | shift | stable (topic shift and its null "
                   "control) | planted (a planted heavy token)")
      ->capture_default_str();
  perturb->add_option("--feed", a->feed, "prefill (one call) | stream (one token per call)")
      ->capture_default_str();
  perturb->add_option("--json", a->json, "Result file (written whole or not at all)")
      ->required()
      ->check(non_empty_path());
  perturb->add_option("--plot", a->plot, "SVG plot of the results")->check(non_empty_path());
  add_max_memory_option(*perturb, a->max_memory);
  perturb->add_flag("--quiet", a->quiet, "No progress lines on stderr");
  perturb->callback([a, perturb]() {
    a->budget_given = perturb->count("--budget") > 0;
    run_bench_perturb(*a);
  });
}

// Flags that shape a random model mean nothing with --model: refuses them, naming both.
void refuse_shape_flags_with_model(const CLI::App& decode, const std::string& model_path) {
  if (model_path.empty()) return;
  for (const char* flag : {"--weights", "--layers"}) {
    if (decode.count(flag) > 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  std::string("bench decode: ") + flag + " applies to --shape only; it " +
                      "conflicts with --model " + model_path +
                      " (the checkpoint has its own weights)");
    }
  }
}

// `bench decode`: its flags, and the run on the parsed arguments.
void add_bench_decode(CLI::App& bench, int argc, const char* const* argv) {
  auto d = std::make_shared<DecodeArgs>();
  d->argv.assign(argv, argv + argc);
  auto* decode = bench.add_subcommand(
      "decode",
      "Decode speed at real model shapes and long contexts: fill every layer's cache with N "
      "positions (synthetic K/V, or --prefill-real), then time greedy decode steps through the "
      "real forward, split into weights, attention and cache work");
  decode->add_option("--shape", d->o.shape, "Named shape with random weights (make-model --list)");
  decode->add_option("--model", d->o.model_path,
                     "Or a checkpoint: a llama2.c .bin, a Hugging Face directory / "
                     "model.safetensors, or a GGUF file")
      ->check(non_empty_path());
  decode->add_option("--layers", d->o.layers, "Shape: layers to build (0 = the shape's default)")
      ->capture_default_str()
      ->check(int_range(0, eval::kMaxDecodeLayers));
  decode->add_option("--weights", d->weights, "Shape: weight type f32, f16, bf16 or q8_0")
      ->capture_default_str();
  decode->add_option("--seed", d->o.seed, "Shape weights and synthetic K/V seed")
      ->capture_default_str()
      ->check(uint_range(0, UINT64_MAX));
  decode->add_option("--context", d->contexts, "Contexts N, comma-separated")->capture_default_str();
  decode->add_option("--method", d->o.methods, "Method spec; repeatable")->required();
  decode->add_option("--budget", d->o.budget,
                     "Token budget for methods that have one, where the spec writes none (0 = "
                     "each method's default); a spec's own budget=B wins over the default, and "
                     "an explicit --budget that contradicts it is an error")
      ->capture_default_str()
      ->check(int_range(0, eval::kMaxDecodeContext));
  decode->add_option("--threads", d->threads, "Thread counts, comma-separated (0 = every core)")
      ->capture_default_str();
  add_q8_activations_option(decode);
  decode->add_option("--steps", d->o.steps, "Timed decode steps")
      ->capture_default_str()
      ->check(int_range(1, eval::kMaxDecodeSteps));
  decode->add_option("--warmup", d->o.warmup, "Untimed decode steps first")
      ->capture_default_str()
      ->check(int_range(0, eval::kMaxDecodeSteps));
  decode->add_option("--fill-chunk", d->o.fill_chunk, "Positions per synthetic fill step")
      ->capture_default_str()
      ->check(int_range(1, eval::kMaxDecodeContext));
  decode->add_flag("--prefill-real", d->o.prefill_real,
                   "Fill by running the model over N tokens (slow at long contexts)");
  decode->add_option("--prefill-chunk", d->o.prefill_chunk,
                     "With --prefill-real: prompt tokens per forward step (llama-bench's default "
                     "micro-batch is 512)")
      ->capture_default_str()
      ->check(int_range(1, eval::kMaxDecodeContext));
  decode->add_option("--bandwidth-mib", d->o.bandwidth_mib,
                     "Buffer size for the read-bandwidth measurement")
      ->capture_default_str()
      ->check(int_range(16, eval::kMaxBandwidthMib));
  decode->add_option("--json", d->json, "Result file (veloxquant.results/1, kind decode)")
      ->check(non_empty_path());
  decode->add_option("--plot", d->plot, "SVG plot: ms/token against context per method")
      ->check(non_empty_path());
  add_max_memory_option(*decode, d->o.max_memory);
  add_head_pattern_option(*decode, d->o.head_pattern);
  decode->add_flag("--quiet", d->quiet, "No progress lines on stderr");
  decode->callback([d, decode]() {
    d->o.budget_given = decode->count("--budget") > 0;
    if (decode->count("--prefill-chunk") > 0 && !d->o.prefill_real) {
      throw Error(ErrorCode::kInvalidArgument,
                  "bench decode: --prefill-chunk sets the prompt's chunks of --prefill-real; "
                  "without --prefill-real the cache is filled synthetically (--fill-chunk)");
    }
    refuse_shape_flags_with_model(*decode, d->o.model_path);
    run_bench_decode(*d);
  });
}

struct KernelsArgs {
  eval::RooflineOptions o;
  std::string types, contexts, out;
  int threads = 0;
  bool quiet = false;
  std::vector<std::string> argv;
};

void run_bench_kernels(KernelsArgs& a, const CLI::App& cmd) {
  eval::RooflineOptions& o = a.o;
  const int cores = engine::available_cores();
  validate::check_threads(a.threads, "--threads", cores);
  o.threads = a.threads == 0 ? cores : a.threads;
  // --quick: small sizes and few repetitions, for tests (flags given explicitly still win).
  if (o.quick) {
    if (cmd.count("--tokens") == 0) o.tokens = 16;
    if (cmd.count("--bandwidth-mib") == 0) o.bandwidth_mib = 64;
    if (cmd.count("--repeats") == 0) o.repeats = 1;
  }
  o.types.clear();
  if (!a.types.empty()) {
    std::string item;
    for (std::size_t i = 0; i <= a.types.size(); ++i) {
      if (i == a.types.size() || a.types[i] == ',') {
        o.types.push_back(eval::parse_roofline_weight_type(item, "--types"));
        item.clear();
      } else {
        item += a.types[i];
      }
    }
  }
  o.contexts.clear();
  if (!a.contexts.empty()) {
    o.contexts = parse_int_list(a.contexts, "--context", 1, eval::kMaxRooflineContext);
  }
  eval::validate_roofline_options(o);
  eval::OutputSet out;  // checked now, written at the end or not at all
  if (!a.out.empty()) out.declare("--out", a.out);
  const nlohmann::json doc =
      eval::run_roofline(o, eval::command_line(a.argv), [&](const std::string& line) {
        if (!a.quiet) std::cerr << line << "\n";
      });
  if (out.has("--out")) {
    out.stage("--out", doc.dump(2) + "\n");
    out.commit();
  }
  std::cout << eval::roofline_table(doc);
  if (!a.out.empty()) std::cout << "wrote " << a.out << "\n";
}

// `bench kernels`: its flags, and the run on the parsed arguments.
void add_bench_kernels(CLI::App& bench, int argc, const char* const* argv) {
  auto k = std::make_shared<KernelsArgs>();
  k->argv.assign(argv, argv + argc);
  auto* cmd = bench.add_subcommand(
      "kernels",
      "The roofline, measured: this machine's peak FMA / VNNI / BF16 / AMX throughput and read "
      "bandwidth (microbenchmarks), then the engine's prefill GEMM, decode GEMV and packed-KV "
      "attention at a model shape's sizes as fractions of those peaks");
  cmd->add_option("--shape", k->o.shape, "Named shape whose sizes are measured (make-model --list)")
      ->capture_default_str();
  cmd->add_option("--tokens", k->o.tokens, "Prompt tokens M of the prefill GEMMs (--quick: 16)")
      ->capture_default_str()
      ->check(int_range(1, eval::kMaxRooflineTokens));
  add_threads_option(cmd, k->threads);
  cmd->add_option("--types", k->types,
                  "Weight types, comma-separated (default: every type the engine has)");
  cmd->add_option("--context", k->contexts,
                  "Attention positions, comma-separated multiples of 32 (default 8192,32768; "
                  "--quick: 512,2048)");
  cmd->add_option("--repeats", k->o.repeats, "Timed runs per kernel row, best kept (--quick: 1)")
      ->capture_default_str()
      ->check(int_range(1, 1000));
  cmd->add_option("--bandwidth-mib", k->o.bandwidth_mib,
                  "Buffer of the read-bandwidth measurement, MiB (--quick: 64)")
      ->capture_default_str()
      ->check(int_range(1, eval::kMaxRooflineBandwidthMib));
  cmd->add_option("--seed", k->o.seed, "Random weights and rows seed")
      ->capture_default_str()
      ->check(uint_range(0, UINT64_MAX));
  add_q8_activations_option(cmd);
  cmd->add_flag("--quick", k->o.quick,
                "Small sizes and few repetitions (for tests; the numbers are not measurements)");
  cmd->add_option("--out", k->out, "JSON result file (kind kernels; written whole or not at all)")
      ->check(non_empty_path());
  add_max_memory_option(*cmd, k->o.max_memory);
  cmd->add_flag("--quiet", k->quiet, "No progress lines on stderr");
  cmd->callback([k, cmd]() { run_bench_kernels(*k, *cmd); });
}

// `bench table`: the result files to tabulate.
void add_bench_table(CLI::App& bench) {
  auto files = std::make_shared<std::vector<std::string>>();
  auto* table = bench.add_subcommand(
      "table",
      "Markdown tables of `bench perturb` result files (the tables in docs/benchmarks.md)");
  table->add_option("files", *files, "Result files (JSON) written by bench perturb")
      ->required()
      ->check(non_empty_path());
  table->callback([files]() {
    std::vector<nlohmann::json> docs;
    for (const auto& f : *files) {
      docs.push_back(read_json_file(f));
      (void)naming_file(f, [&] { return eval::perturb_markdown({docs.back()}); });
    }
    std::string names;
    for (const auto& f : *files) names += (names.empty() ? "" : ", ") + f;
    // Method and series names come from the files: printed escaped (base/validate.h).
    std::cout << validate::printable(
        naming_file(names, [&] { return eval::perturb_markdown(docs); }), true);
  });
}

}  // namespace

void add_bench_command(CLI::App& app, int argc, const char* const* argv) {
  auto* bench = app.add_subcommand("bench", "Benchmarks that write result files (bench perturb, "
                                            "bench decode, bench kernels) and tables of them (bench table)");
  bench->require_subcommand(1);
  add_bench_perturb(*bench, argc, argv);
  add_bench_decode(*bench, argc, argv);
  add_bench_kernels(*bench, argc, argv);
  add_bench_table(*bench);
}

}  // namespace vq::cli
