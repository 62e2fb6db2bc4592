#!/usr/bin/env python3
"""A NumPy reference for `veloxquant eval --windows` (ctest `bootstrap_reference`).

Recomputes, from a result file's per-window values alone, every row's means, paired differences
to the full cache and 95% percentile-bootstrap intervals, replaying the resampling indices from
the definition in src/eval/report/bootstrap.h (CounterRng of src/base/rng.h, written here again from its
definition: SplitMix64's output function over key + (counter + 1) * golden ratio), and the
best-per-ratio "indistinguishable" sets. Checks a fresh small run of the binary, and every
committed windowed result under results/eval.

The replay is exact (same indices, same sequential sums), so values agree to rounding: the
intervals to 1e-12 relative. NumPy does the quantiles (np.quantile, method 'linear').

usage: bootstrap_reference.py VELOXQUANT_BINARY SOURCE_DIR
"""
import glob
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def rng_key(seed, layer=0, head=0):
    k = mix64((seed + GOLDEN) & M64)
    k = mix64(k ^ ((layer + 0x632BE59BD9B4E019) & M64))
    return mix64(k ^ ((head + 0x8CB92BA72F3D8DD7) & M64))


def uniform(key, counter):
    return (mix64((key + (counter + 1) * GOLDEN) & M64) >> 11) * 2.0**-53


def indices(n, samples, seed):
    key = rng_key(seed)
    return np.array([int(uniform(key, c) * n) for c in range(samples * n)],
                    dtype=np.int64).reshape(samples, n)


def seq_mean(values):
    s = 0.0
    for v in values:
        s += v
    return s / len(values)


def interval(x, idx):
    x = np.asarray(x, dtype=np.float64)
    # Sequential sums per resample, as the C++ does (NumPy's pairwise sum could differ in the
    # last bit): cumulative sums along the row are sequential.
    means = np.cumsum(x[idx], axis=1)[:, -1] / idx.shape[1]
    tail = (1.0 - 0.95) / 2.0
    return np.quantile(means, [tail, 1.0 - tail], method="linear")


failures = []


def close(what, got, want, rel=1e-12):
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if not np.allclose(got, want, rtol=rel, atol=1e-12):
        failures.append(f"{what}: file {got.tolist()} vs reference {want.tolist()}")


def check_file(path):
    doc = json.load(open(path))
    s = doc["settings"]
    b = s["bootstrap"]
    n = s["windows_total"]
    idx = indices(n, b["samples"], b["seed"])
    rows = doc["rows"]
    ref = next(r for r in rows if r["reference"])
    ref_nll = [w["nll_mean"] for w in ref["windows"]]
    for i, r in enumerate(rows):
        where = f"{os.path.basename(path)} row {i} ({r['method']})"
        nll = [w["nll_mean"] for w in r["windows"]]
        if len(nll) != n:
            failures.append(f"{where}: {len(nll)} windows, settings say {n}")
            continue
        close(where + " nll_mean", r["nll_mean"], seq_mean(nll))
        close(where + " ppl", r["ppl"], math.exp(seq_mean(nll)))
        close(where + " kl_mean", r["kl_mean"], seq_mean([w["kl_mean"] for w in r["windows"]]))
        lo_hi = interval(nll, idx)
        close(where + " ci nll", r["ci"]["nll_mean"], lo_hi)
        close(where + " ci ppl", r["ci"]["ppl"], np.exp(lo_hi))
        close(where + " ci kl", r["ci"]["kl_mean"],
              interval([w["kl_mean"] for w in r["windows"]], idx))
        close(where + " ci top1", r["ci"]["top1_agreement"],
              interval([w["top1_agreement"] for w in r["windows"]], idx))
        d = [a - c for a, c in zip(nll, ref_nll)]
        close(where + " delta_nll", r["delta_nll"], seq_mean(d))
        d_ci = interval(d, idx)
        close(where + " delta_nll_ci", r["delta_nll_ci"], d_ci)
        close(where + " ppl_change_pct", r["ppl_change_pct"], 100 * (math.exp(seq_mean(d)) - 1))
        close(where + " ppl_change_pct_ci", r["ppl_change_pct_ci"], 100 * (np.exp(d_ci) - 1))
    for e in doc.get("best_per_ratio", []):
        if e.get("row") is None:
            continue
        best_nll = [w["nll_mean"] for w in rows[e["row"]]["windows"]]
        want, seen = [], {rows[e["row"]]["method"]}
        for i, r in enumerate(rows):
            if r["reference"] or not r["compression_ratio"] >= e["ratio"] or r["method"] in seen:
                continue
            seen.add(r["method"])
            lo, hi = interval([a - c for a, c in zip([w["nll_mean"] for w in r["windows"]],
                                                     best_nll)], idx)
            if lo <= 0.0 <= hi:
                want.append(i)
        got = [x["row"] for x in e["indistinguishable"]]
        if got != want:
            failures.append(f"{os.path.basename(path)} ratio {e['ratio']}: indistinguishable "
                            f"rows {got}, reference {want}")
    return len(rows)


def main():
    binary, source = sys.argv[1], sys.argv[2]
    # SplitMix64's published first output for seed 0 (state += golden, then the output
    # function): checks mix64 against an outside value, not against the code under test.
    if mix64(GOLDEN) != 0xE220A8397B1DCDAF:
        sys.exit("mix64 does not reproduce SplitMix64's first output for seed 0")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "w.json")
        subprocess.run([binary, "eval", "--model", f"{source}/data/stories260K.bin",
                        "--text", f"{source}/data/tinystories_dev.txt", "--tokens", "48",
                        "--prefill", "24", "--windows", "6", "--bootstrap", "3000",
                        "--bootstrap-seed", "11", "--ratio", "4,8", "--method", "h2o",
                        "--method", "streaming_llm", "--method", "tova", "--json", out],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        checked = {out: check_file(out)}
    for path in sorted(glob.glob(f"{source}/results/eval/*.json")):
        doc = json.load(open(path))
        if doc.get("kind") == "eval" and "bootstrap" in doc.get("settings", {}):
            checked[path] = check_file(path)
    for f in failures[:20]:
        print("FAIL", f)
    print(f"bootstrap_reference: {len(checked)} result files, "
          f"{sum(checked.values())} rows, {len(failures)} mismatches")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
