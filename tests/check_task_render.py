#!/usr/bin/env python3
"""Cross-check of the two task generators (docs/tasks.md): samples dumped by the C++ one
(`veloxquant eval --task ... --dump-samples FILE.jsonl`) are rendered again from their parts by
the training side's render() (scripts/train/tasklib.py), and must come out byte for byte.

  tests/check_task_render.py FILE.jsonl [FILE.jsonl ...] [--tokenizer data/tok512.bin]

Per sample (one JSON object a line: task, question, length, depth, seed, index, prompt, answers,
completion, n_tokens, parts{haystack, sentences, inserts, query, keys, values}):
- render(task, question, parts) == prompt;
- n_tokens == the Python tokenizer's count for the prompt (BOS included), and <= length;
- completion == the answers joined by ", " then ".", with a space first unless the prompt ends
  with one;
- every answer occurs in the prompt.
Tasks without a Python renderer (cwe, fwe) are counted and listed, not checked. Exit status 1 on
any mismatch (the first few are printed with the first differing byte), or when no sample was
checked; 2 on unreadable input."""

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts", "train"))
import tasklib as T  # noqa: E402

FIELDS = ("task", "question", "length", "prompt", "answers", "completion", "n_tokens", "parts")
PART_FIELDS = ("haystack", "sentences", "inserts", "query")


def first_difference(a, b):
    ab, bb = a.encode("utf-8"), b.encode("utf-8")
    i = 0
    while i < min(len(ab), len(bb)) and ab[i] == bb[i]:
        i += 1
    return i, ab[max(0, i - 40):i + 40], bb[max(0, i - 40):i + 40]


def check_sample(s, tok):
    """A list of problems (empty when the sample agrees)."""
    problems = []
    rendered = T.render(s["task"], s["question"], s["parts"])
    if rendered != s["prompt"]:
        at, want, got = first_difference(s["prompt"], rendered)
        problems.append(f"render() differs from the dumped prompt at byte {at}: dumped "
                        f"{want!r}, rendered {got!r}")
    n = len(tok.encode(s["prompt"]))
    if n != s["n_tokens"]:
        problems.append(f"n_tokens {s['n_tokens']} but the Python tokenizer gives {n}")
    if n > s["length"]:
        problems.append(f"{n} prompt tokens exceed the length {s['length']}")
    want = T.completion_text(s["prompt"], s["answers"])
    if s["completion"] != want:
        problems.append(f"completion {s['completion']!r}, expected {want!r}")
    for a in s["answers"]:
        if str(a) not in s["prompt"]:
            problems.append(f"answer {a!r} is not in the prompt")
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dumps", nargs="+", help="JSONL files written by --dump-samples")
    ap.add_argument("--tokenizer", default=os.path.join(ROOT, "data", "tok512.bin"))
    a = ap.parse_args()
    tok = T.Tok512(a.tokenizer)
    checked, skipped, bad = 0, {}, 0
    for path in a.dumps:
        try:
            lines = open(path, encoding="utf-8").read().splitlines()
        except OSError as e:
            print(f"check_task_render: cannot read {path}: {e}", file=sys.stderr)
            return 2
        for no, line in enumerate(lines, 1):
            if not line.strip():
                continue
            where = f"{path}:{no}"
            try:
                s = json.loads(line)
            except json.JSONDecodeError as e:
                print(f"check_task_render: {where}: not JSON ({e})", file=sys.stderr)
                return 2
            missing = [f for f in FIELDS if f not in s]
            missing += [f"parts.{f}" for f in PART_FIELDS if f not in s.get("parts", {})]
            if missing:
                print(f"check_task_render: {where}: missing fields {', '.join(missing)}",
                      file=sys.stderr)
                return 2
            if s["task"] not in T.TASKS:
                skipped[s["task"]] = skipped.get(s["task"], 0) + 1
                continue
            problems = check_sample(s, tok)
            checked += 1
            if problems:
                bad += 1
                if bad <= 5:
                    tag = (f"{s['task']} question={s['question']} length={s['length']} "
                           f"depth={s.get('depth')} seed={s.get('seed')} index={s.get('index')}")
                    print(f"MISMATCH {where} ({tag}):")
                    for p in problems:
                        print(f"  - {p}")
    skip = ", ".join(f"{k} ({v})" for k, v in sorted(skipped.items()))
    print(f"check_task_render: {checked} samples checked, {bad} mismatched"
          + (f"; not checked (no Python renderer): {skip}" if skip else ""))
    if checked == 0:
        print("check_task_render: no sample of a task with a Python renderer", file=sys.stderr)
        return 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
