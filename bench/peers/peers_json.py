#!/usr/bin/env python3
"""Writes results/decode/peers.json (docs/results.md, kind `peers`) from the samples that
bench/peers/run_llamacpp.sh collects, and prints the table.

samples: one line per (round, engine, cache): engine, weights, cache, context, threads, round,
ms_per_token (that process's median step), prefill_s; tab-separated.
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


def main():
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
    out_dir = os.path.dirname(a.out) or "."
    os.makedirs(out_dir, exist_ok=True)
    fd, path = tempfile.mkstemp(dir=out_dir, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    os.replace(path, a.out)

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
