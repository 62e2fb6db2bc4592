#!/usr/bin/env python3
"""Re-renders `veloxquant eval --task --dump-samples` lines from their parts by the rules of
docs/tasks.md, written here independently of the C++ renderer, and compares the bytes of the
prompt and the expected completion; then has the task model's training generator
(tests/check_task_render.py, scripts/train/tasklib.py) render the same dumps.

Usage: task_dump_check.py VELOXQUANT_BINARY PROJECT_DIR   (ctest `task_dump`)
"""

import json
import subprocess
import sys
import tempfile

NIAH = ("Some special magic {type} are hidden within the following text. Make sure to memorize "
        "it. I will quiz you about the {type} afterwards.\n",
        "What are all the special magic {type} for {query} mentioned in the provided text?",
        " The special magic {type} for {query} mentioned in the provided text are")
TEMPLATES = {
    "vt": ("Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n",
           "Question: Find all variables that are assigned the value {query} in the text above.",
           " Answer: According to the chain(s) of variable assignment in the text above, {num_v} "
           "variables are assigned the value {query}, they are: "),
    "cwe": ("Below is a numbered list of words. In these words, some appear more often than others. "
            "Memorize the ones that appear most often.\n",
            "Question: What are the 10 most common words in the above list?",
            " Answer: The top 10 words that appear most often in the list are:"),
    "fwe": ("Read the following coded text and track the frequency of each coded word. Find the "
            "three most frequently appeared coded words. ",
            "Question: Do not provide any explanation. Please ignore the dots '....'. What are the "
            "three most frequently appeared words in the above coded text?",
            " Answer: According to the coded text above, the three most frequently appeared words "
            "are:"),
}


def context(parts):
    sentences, inserts = parts["sentences"], parts["inserts"]
    pieces = []
    for i in range(len(sentences) + 1):
        pieces += [text for pos, text in inserts if pos == i]
        if i < len(sentences):
            pieces.append(sentences[i])
    kind = parts["haystack"]
    if kind == "words":
        return " ".join(f"{i + 1}. {w}" for i, w in enumerate(pieces))
    return ("\n" if kind in ("noise", "needle") else " ").join(pieces)


def render(d):
    parts = d["parts"]
    instruction, question, prefix = TEMPLATES.get(d["task"], NIAH)
    kind = "numbers"
    if d["task"].startswith("niah") and len(d["answers"]) == 1:
        rewrite = lambda s: s.replace("Some", "A").replace("are all", "is").replace("are", "is")
        instruction, question, prefix = map(rewrite, (instruction, question, prefix))
        kind = "number"
    fill = lambda s: (s.replace("{type}", kind).replace("{num_v}", str(len(d["answers"])))
                      .replace("{query}", parts["query"]))
    instruction, question, prefix = map(fill, (instruction, question, prefix))
    if d["question"] == "last":
        return instruction + context(parts) + "\n" + question + prefix
    return instruction + question + "\n" + context(parts) + "\nAnswer:"


def completion(d):
    lead = "" if d["prompt"].endswith(" ") else " "
    return lead + ", ".join(d["answers"]) + "."


def main():
    binary, root = sys.argv[1], sys.argv[2]
    runs = [["--task", "niah_single,niah_multikey,niah_multivalue,niah_multiquery,vt,fwe"],
            ["--task", "niah_single,vt", "--haystack", "noise", "--question", "first"],
            ["--task", "niah_multikey", "--haystack", "needle"]]
    checked, bad = 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        for k, extra in enumerate(runs):
            dump = f"{tmp}/d{k}.jsonl"
            cmd = [binary, "eval", "--model", f"{root}/data/stories260K.bin", "--lengths", "448",
                   "--depths", "0,60,100", "--samples", "2", "--method", "full", "--threads", "1",
                   "--dump-samples", dump, *extra]
            subprocess.run(cmd, check=True, capture_output=True, timeout=600)
            for line in open(dump, encoding="utf-8"):
                d = json.loads(line)
                checked += 1
                if render(d) != d["prompt"] or completion(d) != d["completion"]:
                    bad += 1
                    print(f"MISMATCH {d['task']} index {d['index']} depth {d['depth']}")
        # The task model's training generator (scripts/train/tasklib.py) renders the same dumps:
        # what the model is trained on is what evaluation asks, byte for byte and token for token.
        trainer = subprocess.run(
            [sys.executable, f"{root}/tests/check_task_render.py",
             *[f"{tmp}/d{k}.jsonl" for k in range(len(runs))],
             "--tokenizer", f"{root}/data/tok512.bin"], capture_output=True, text=True, timeout=600)
        print(trainer.stdout.strip())
        if trainer.returncode != 0:
            print(trainer.stderr.strip())
            bad += 1
    print(f"task_dump: {checked} samples re-rendered, {bad} mismatches")
    return 1 if bad or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
