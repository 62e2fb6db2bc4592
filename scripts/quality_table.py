#!/usr/bin/env python3
"""Markdown tables of the quality-per-byte targets from windowed equal-memory eval results
(`veloxquant eval --windows N --ratio ... --select-from DEV.json --json TEST.json`).

For each result file (one model on the test part): per ratio, the configuration chosen on the
dev part (selected_per_ratio), its perplexity change against the full cache on the test part with
the 95% paired-bootstrap interval, the target (within 1% at 8x, 3% at 16x, 10% at 32x) and
whether the interval's upper end meets it; then the best configuration on the test part itself
and how many others are statistically indistinguishable from it (docs/quality.md). A file
without a selection (the dev part, WikiText-2) gets its best configuration per ratio with the
interval, the closest by KL and the indistinguishable count.

usage: scripts/quality_table.py RESULT.json...
"""
import json
import sys

TARGETS = {8.0: 1.0, 16.0: 3.0, 32.0: 10.0}  # ratio -> max perplexity change in %


def pct(v):
    return f"{v:+.2f}%"


def ci(v):
    return f"[{v[0]:+.2f}, {v[1]:+.2f}]%"


def full_ppl(doc):
    ref = next(r for r in doc["rows"] if r["reference"])
    return f"{ref['ppl']:.3f} [{ref['ci']['ppl'][0]:.3f}, {ref['ci']['ppl'][1]:.3f}]"


def best_table(doc):
    print("| ratio | best (lowest mean perplexity) | budget | ppl vs full (95% CI) | "
          "indistinguishable | closest (lowest KL) | ppl vs full |")
    print("| ---: | --- | ---: | ---: | ---: | --- | ---: |")
    closest = {c["ratio"]: c for c in doc["closest_per_ratio"]}
    for b in doc["best_per_ratio"]:
        r = b["ratio"]
        if not b.get("series"):
            print(f"| {r:g}x | (none reached it) | | | | | |")
            continue
        c = closest.get(r, {})
        print(f"| {r:g}x | `{b['series']}` | {b['budget'] if b['budget'] is not None else '-'} | "
              f"{pct(b['ppl_change_pct'])} {ci(b['ppl_change_pct_ci'])} | "
              f"{len(b['indistinguishable'])} | `{c.get('series')}` | "
              f"{pct(c['ppl_change_pct']) if c.get('series') else '-'} |")
    print()


def table(path):
    doc = json.load(open(path))
    s = doc["settings"]
    if "windows" not in s:
        sys.exit(f"{path}: not a windowed eval result (eval --windows)")
    model = s["model"].rstrip("/").split("/")[-1]
    chosen = (f", chosen on `{s['selected_on_text']}`" if "selected_per_ratio" in doc else "")
    print(f"**{model}** on `{s['text']}`: {s['windows_total']} windows of {s['tokens']} tokens "
          f"({s['prefill']} prefill, {s['n_scored']} scored predictions each){chosen}; full "
          f"cache perplexity {full_ppl(doc)}; {s['bootstrap']['samples']} bootstrap resamples, "
          f"seed {s['bootstrap']['seed']}\n")
    if "selected_per_ratio" not in doc:
        best_table(doc)
        return
    print("| ratio | chosen on dev | test: ppl vs full | 95% CI | target | holds | best on test | "
          "vs full (95% CI) | indistinguishable |")
    print("| ---: | --- | ---: | ---: | ---: | --- | --- | ---: | ---: |")
    best = {b["ratio"]: b for b in doc["best_per_ratio"]}
    for sel in doc["selected_per_ratio"]:
        r = sel["ratio"]
        target = TARGETS.get(r)
        b = best.get(r, {})
        best_cell = f"`{b['series']}`" if b.get("series") else "-"
        best_ci = (f"{pct(b['ppl_change_pct'])} {ci(b['ppl_change_pct_ci'])}"
                   if b.get("ppl_change_pct_ci") else "-")
        same = len(b.get("indistinguishable", [])) if b.get("series") else "-"
        if sel.get("row") is None:
            print(f"| {r:g}x | {sel.get('series') or '(none)'} | - | - | "
                  f"{'' if target is None else f'{target:g}%'} | no (not run) | {best_cell} | "
                  f"{best_ci} | {same} |")
            continue
        hi = sel["ppl_change_pct_ci"][1]
        holds = "-" if target is None else ("yes" if hi <= target else "no")
        met = "" if sel.get("ratio_met", True) else " (ratio not met on every window)"
        print(f"| {r:g}x | `{sel['series']}`{met} | {pct(sel['ppl_change_pct'])} | "
              f"{ci(sel['ppl_change_pct_ci'])} | {'-' if target is None else f'{target:g}%'} | "
              f"{holds} | {best_cell} | {best_ci} | {same} |")
    print()


def main(argv):
    if not argv:
        sys.exit(__doc__)
    for p in argv:
        table(p)


if __name__ == "__main__":
    main(sys.argv[1:])
