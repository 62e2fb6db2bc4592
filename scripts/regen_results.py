#!/usr/bin/env python3
"""Regenerates every committed result file whose numbers depend on the numeric definition, by
running the command recorded in the file itself (its "command" field), so that a change of the
definition (issue 31: fused multiply-add) lands with results that its build reproduces.

  scripts/regen_results.py [--bin build/veloxquant] [--only SUBSTRING ...] [--dry-run]

Which files: results/**/*.json whose command is `veloxquant eval ...` or `veloxquant bench
perturb ...` (quality: perplexity, KL, top-1, task accuracy, perturbation recall). A sibling
.txt (the table the sweep scripts tee from the command's stdout) is rewritten from the rerun's
stdout. Files measuring time (bench decode, serve_load.py, llama.cpp peers, bench_serve_batch)
are measurements of the machine and code of their day and are listed as skipped, with the reason;
training logs have no command. A command reading another result (--select-from) runs after it.
The JSON files are written by the binary itself (atomically); a .txt goes to a temporary file
renamed over the old one only when the command succeeds. Prints each file's wall time.
A recorded --threads N above the cores this process may use (the CLI refuses it) runs with all of
them instead, and says so: results do not depend on the thread count (the determinism rule).
After it: `scripts/sweep_perturb.sh --tables-only` rewrites the docs' perturbation tables and
`python3 scripts/quality_table.py results/eval/pareto_*_tinystories-test.json` prints the
quality targets' table.
"""
import argparse
import glob
import json
import os
import shlex
import subprocess
import sys
import time


def recorded(path):
    with open(path, encoding="utf-8") as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as e:
            raise SystemExit(f"regen_results: {path}: not JSON ({e})")
    return data.get("command") if isinstance(data, dict) else None


def classify(argv):
    """'rerun' for quality commands, else the reason the file is skipped."""
    if not argv:
        return "no recorded command"
    prog = os.path.basename(argv[0])
    if prog == "veloxquant" and len(argv) > 1 and argv[1] == "eval":
        return "rerun"
    if prog == "veloxquant" and argv[1:3] == ["bench", "perturb"]:
        return "rerun"
    return f"a timing measurement ({' '.join(argv[:3])})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="build/veloxquant", help="the veloxquant binary to run")
    ap.add_argument("--only", action="append", default=[],
                    help="rerun only files whose path contains this (repeatable)")
    ap.add_argument("--dry-run", action="store_true", help="print what would run")
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.chdir(root)
    if not args.dry_run and not os.access(args.bin, os.X_OK):
        raise SystemExit(f"regen_results: --bin {args.bin}: not an executable file "
                         "(build it first: scripts/build.sh --target veloxquant_cli)")

    jobs, skipped = [], []
    for path in sorted(glob.glob("results/**/*.json", recursive=True)):
        command = recorded(path)
        argv = shlex.split(command) if command else []
        # A recorded command may chain a setup step (make-model ... && bench ...): not quality.
        if "&&" in argv:
            skipped.append((path, f"a timing measurement ({' '.join(argv[:3])} ...)"))
            continue
        verdict = classify(argv)
        if verdict != "rerun":
            skipped.append((path, verdict))
            continue
        if args.only and not any(s in path for s in args.only):
            continue
        deps = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--select-from"]
        jobs.append((path, argv, deps))

    # Files that others read (--select-from) first, keeping the sorted order otherwise.
    order, done = [], set()
    pending = list(jobs)
    while pending:
        progressed = False
        for job in list(pending):
            if all(d in done or d not in {j[0] for j in jobs} for d in job[2]):
                order.append(job)
                done.add(job[0])
                pending.remove(job)
                progressed = True
        if not progressed:
            raise SystemExit("regen_results: --select-from files form a cycle: "
                             + ", ".join(j[0] for j in pending))

    for path, why in skipped:
        print(f"skip  {path}: {why}", flush=True)
    total = time.time()
    for path, argv, _ in order:
        run = [args.bin] + argv[1:]
        cores = len(os.sched_getaffinity(0))
        for i, a in enumerate(run[:-1]):
            if a == "--threads" and run[i + 1].isdigit() and int(run[i + 1]) > cores:
                print(f"note  {path}: --threads {run[i + 1]} recorded, {cores} cores here: "
                      f"--threads {cores}", flush=True)
                run[i + 1] = str(cores)
        txt = os.path.splitext(path)[0] + ".txt"
        print(f"run   {path}: {shlex.join(run)}", flush=True)
        if args.dry_run:
            continue
        start = time.time()
        tmp = txt + ".regen-tmp"
        with open(tmp if os.path.exists(txt) else os.devnull, "w", encoding="utf-8") as out:
            rc = subprocess.run(run, stdout=out).returncode
        if rc != 0:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise SystemExit(f"regen_results: {path}: the command exited with status {rc}")
        if os.path.exists(tmp):
            os.replace(tmp, txt)
        print(f"done  {path}: {time.time() - start:.0f} s", flush=True)
    print(f"regen_results: {len(order)} files rerun, {len(skipped)} skipped, "
          f"{time.time() - total:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
