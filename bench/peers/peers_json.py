#!/usr/bin/env python3
"""Writes results/decode/peers.json from the samples of a side-by-side run, and prints the table.

peers_json.py --samples ... (bench/peers/run_llamacpp.sh; docs/results.md, kind `peers`):
  one line per (round, engine, cache): engine, weights, cache, context, threads, round,
  ms_per_token (that process's median step), prefill_s; tab-separated.
peers_json.py matrix --samples ... (bench/peers/run_matrix.sh; kind `peers_matrix`, described in
  docs/own-models.md): one line per measurement: model, type, threads, test (ppN / tgN), engine
  (veloxquant, native, npm), round, tokens_per_s, detail, the 1-minute load average after it;
  tab-separated.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def git(*args):
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def cpu_flags():
    flags = set()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                flags.update(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    wanted = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
              "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")
    return [f for f in wanted if f in flags]


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def write_json_atomically(doc, out):
    """Writes doc to out through a temporary file in the same folder, renamed over out."""
    out_dir = os.path.dirname(out) or "."
    os.makedirs(out_dir, exist_ok=True)
    fd, path = tempfile.mkstemp(dir=out_dir, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    os.replace(path, out)


def matrix_main(argv):
    p = argparse.ArgumentParser(prog="peers_json.py matrix")
    for name in ("samples", "out", "command", "llama_cpp", "native_bin", "load_before",
                 "load_after"):
        p.add_argument("--" + name.replace("_", "-"), required=True)
    p.add_argument("--steps", type=int, required=True)
    a = p.parse_args(argv)
    commit = git("rev-parse", "--short=12", "HEAD")
    if git("status", "--porcelain", "--untracked-files=no"):
        commit += "-dirty"
    groups = {}
    loads = {}
    order = []
    with open(a.samples) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 7:
                continue
            model, typ, threads, test, engine, _round, tps = parts[:7]
            key = (model, typ, int(threads), test)
            if key not in groups:
                groups[key] = {}
                order.append(key)
            groups[key].setdefault(engine, []).append(float(tps))
            if len(parts) >= 9:
                loads.setdefault(key, []).append(float(parts[8]))
    if not groups:
        sys.exit("peers_json: no samples in " + a.samples)
    rows = []
    for key in order:
        model, typ, threads, test = key
        by = groups[key]
        row = {"model": model, "type": typ, "threads": threads, "test": test,
               "kind": "prompt processing" if test.startswith("pp") else "decode",
               "tokens": int(test[2:])}
        for engine in ("veloxquant", "native", "npm"):
            if engine in by:
                row[engine + "_tokens_per_s"] = statistics.median(by[engine])
                row[engine + "_rounds"] = by[engine]
        if key in loads:
            row["load_average_1min"] = loads[key]
        for ref in ("native", "npm"):
            if "veloxquant" in by and ref in by:
                row["ratio_veloxquant_over_" + ref] = (row["veloxquant_tokens_per_s"] /
                                                       row[ref + "_tokens_per_s"])
        rows.append(row)
    doc = {
        "schema": "veloxquant.results/1", "kind": "peers_matrix", "git_commit": commit,
        "command": a.command,
        "machine": {"cpu": cpu_model(), "cpu_flags": cpu_flags(), "cores": os.cpu_count(),
                    "load_average_before": a.load_before, "load_average_after": a.load_after},
        "settings": {
            "models": "make-model shapes, seed 1, random weights; f16/q8_0 by veloxquant "
                      "convert, the others by llama.cpp's llama-quantize (native build)",
            "tests": "ppN: N prompt tokens from an empty cache, tokens/s; tgN: decode "
                     "tokens/s after N prompt tokens",
            "steps": a.steps,
            "llama_cpp": a.llama_cpp,
            "veloxquant": "bench decode --method full --prefill-real --prefill-chunk 512 (f16 "
                          "KV, prompt chunks of 512, llama-bench's ubatch); pp from the fill "
                          "time, tg from the median step",
            "native": "llama-bench -r 1 -o json (" + a.native_bin + "): pp as -p N -n 0, tg as "
                      "-p 0 -n STEPS -d N; f16 KV, flash attention auto, ubatch 512",
            "npm": "npm @node-llama-cpp/linux-x64@3.22.1 through llamacpp_driver bench: pp "
                   "from its prefill time (batches of 512), tg from its median step",
        },
        "rows": rows,
    }
    write_json_atomically(doc, a.out)
    print("| model | type | threads | test | VeloxQuant tok/s | llama.cpp native | llama.cpp npm "
          "| VQ / native | VQ / npm |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")

    def fmt(r, k, spec):
        return format(r[k], spec) if k in r else "-"

    for r in rows:
        print(f"| {r['model']} | {r['type']} | {r['threads']} | {r['test']} | "
              f"{fmt(r, 'veloxquant_tokens_per_s', '.1f')} | {fmt(r, 'native_tokens_per_s', '.1f')} | "
              f"{fmt(r, 'npm_tokens_per_s', '.1f')} | {fmt(r, 'ratio_veloxquant_over_native', '.2f')} | "
              f"{fmt(r, 'ratio_veloxquant_over_npm', '.2f')} |")
    print("wrote " + a.out, file=sys.stderr)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "matrix":
        return matrix_main(sys.argv[2:])
    p = argparse.ArgumentParser()
    for name in ("samples", "out", "vq_json", "command", "shape", "weights", "contexts",
                 "threads", "methods", "llama_cpp", "load_before", "load_after"):
        p.add_argument("--" + name.replace("_", "-"), required=True)
    for name in ("rounds", "steps", "warmup", "budget"):
        p.add_argument("--" + name, type=int, required=True)
    p.add_argument("--note", default="")
    a = p.parse_args()

    commit = git("rev-parse", "--short=12", "HEAD")
    if git("status", "--porcelain", "--untracked-files=no"):
        commit += "-dirty"
    last = json.load(open(a.vq_json))
    groups = {}
    with open(a.samples) as f:
        for line in f:
            e, w, cache, n, t, _round, ms, pf = line.rstrip("\n").split("\t")
            groups.setdefault((e, w, cache, int(n), int(t)), []).append((float(ms), float(pf)))
    if not groups:
        sys.exit("peers_json: no samples in " + a.samples)
    rows = []
    for (e, w, cache, n, t), v in groups.items():
        ms = statistics.median(x for x, _ in v)
        rows.append({"engine": e, "weights": w, "cache": cache, "context": n, "threads": t,
                     "ms_per_token": ms, "tokens_per_s": 1e3 / ms,
                     "round_ms_per_token": [x for x, _ in v],
                     "prefill_s": statistics.median(pf for _, pf in v)})
    for row in rows:
        ref = groups.get(("llama.cpp", row["weights"], "f16", row["context"], row["threads"]))
        row["speedup_vs_llamacpp_f16"] = (statistics.median(x for x, _ in ref) /
                                          row["ms_per_token"] if ref else None)
    rows.sort(key=lambda r: (r["weights"], r["context"], r["threads"], r["engine"] != "llama.cpp",
                             r["engine"] == "llama.cpp" and r["cache"] != "f16"))
    settings = {
        "model": "shape:" + a.shape, "model_config": last["settings"]["model_config"], "seed": 1,
        "weights": a.weights.split(","), "contexts": [int(x) for x in a.contexts.split(",")],
        "threads": [int(x) for x in a.threads.split(",")], "rounds": a.rounds, "steps": a.steps,
        "warmup": a.warmup, "budget": a.budget, "methods": a.methods.split(),
        "llama_cpp": a.llama_cpp,
        "llama_cpp_settings": "llamacpp_driver bench: flash_attn auto (llama.cpp's default), "
                              "n_batch 512, prompt ids i mod vocab",
        "veloxquant_settings": "bench decode --prefill-real: chunks of 64, prompt ids from the "
                               "seed, the methods compressing as the prompt arrives",
        "matmul_isa": last["settings"].get("matmul_isa"),
        "load_average_before": a.load_before, "load_average_after": a.load_after,
    }
    if a.note:
        settings["note"] = a.note
    doc = {"schema": "veloxquant.results/1", "kind": "peers",
           "veloxquant_version": last.get("veloxquant_version"), "git_commit": commit,
           "machine": last.get("machine"), "command": a.command, "settings": settings,
           "rows": rows}
    write_json_atomically(doc, a.out)

    print(f"| weights | context | threads | engine, cache | ms/token (median of {a.rounds}) "
          "| tok/s | vs llama.cpp f16 KV |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if r["engine"] == "llama.cpp":
            name = f"llama.cpp, {r['cache']} KV"
        else:
            spec, _, rest = r["cache"].partition(" (")
            name = f"veloxquant, `{spec}`" + (f" ({rest}" if rest else "")
        sp = r["speedup_vs_llamacpp_f16"]
        print(f"| {r['weights']} | {r['context']} | {r['threads']} | {name} | "
              f"{r['ms_per_token']:.1f} | {r['tokens_per_s']:.1f} | "
              + (f"{sp:.2f}x |" if sp is not None else "- |"))
    print("wrote " + a.out, file=sys.stderr)


if __name__ == "__main__":
    main()
