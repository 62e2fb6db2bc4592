"""The task model's training side (scripts/train/) against the engine, without PyTorch:
- the Python llama2.c tokenizer (exact and piecewise) gives the engine's ids;
- generated training prompts tokenize as the engine tokenizes them, fit their length, and hold
  their needles where docs/tasks.md says;
- render() against prompts written out by hand from docs/tasks.md;
- the engine's forward on a tiny exported model equals PyTorch's (committed fixture)."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest

import veloxquant as vq
from conftest import DATA, MODEL, SOURCE_DIR, TOKENIZER

sys.path.insert(0, str(SOURCE_DIR / "scripts" / "train"))
import tasklib as T  # noqa: E402

TRAIN_TEXT = DATA / "tasks" / "tinystories_train.txt"
WORDS = DATA / "tasks" / "words.txt"


@pytest.fixture(scope="module")
def engine_tok():
    return vq.Tokenizer.load(vq.Model.load(str(MODEL)), str(TOKENIZER))


@pytest.fixture(scope="module")
def tok():
    return T.Tok512(str(TOKENIZER))


@pytest.fixture(scope="module")
def gen(tok):
    return T.TaskGenerator(tok, T.read_words(str(WORDS)), TRAIN_TEXT.read_text(encoding="utf-8"))


TRICKY = [
    "Once upon a time",
    "  two leading spaces and  a double one",
    "numbers 1234567, 9999999 and 10000.",
    "line one\nline two\n\nafter a blank line\n",
    "\nstarts with a newline",
    "trailing space ",
    "VAR ABCDE = VAR FGHIJ \nVAR KLMNO = 12345",
    "bytes outside the pieces: = { } ^ \t tab, caf\u00e9, \u20ac, \u2019quote\u2019, \U0001F600",
    "mojibake as in TinyStories: \u00e2\u20ac\u2122",
    "amber-falcon: One of the special magic numbers for amber-falcon is: 4821937.",
    " ",
    "x",
]


def test_tokenizer_matches_the_engine(tok, engine_tok):
    texts = TRICKY + [TRAIN_TEXT.read_text(encoding="utf-8")[i:i + 300] for i in range(0, 30000, 997)]
    for text in texts:
        want = engine_tok.encode(text, True)
        assert tok.encode_exact(text) == want, text
        assert tok.encode(text) == want, text
        assert tok.decode(want) == " " + text, text  # with the dummy-prefix space


def test_whole_training_text_piecewise(tok, engine_tok):
    # The LM rows are slices of this encoding, so it must be the engine's for the whole file.
    text = TRAIN_TEXT.read_text(encoding="utf-8")[:200000]
    assert tok.encode(text) == engine_tok.encode(text, True)


def _items_and_n(s):
    return T.context_items(s["parts"]), len(s["parts"]["sentences"])


def test_generated_samples(gen, tok, engine_tok):
    n_checked = 0
    for i in range(48):
        rng = T.sample_rng("pytest", 0, "samples", i)
        task = T.TASKS[i % len(T.TASKS)]
        hay = "noise" if task == "vt" else T.HAYSTACKS[(i // 5) % 3]
        question = T.QUESTIONS[(i // 15) % 2]
        length = (512, 1024, 2048)[i % 3]
        s = gen.sample(rng, task, question, hay, length)
        ids = s["prompt_ids"]
        # Tokenized exactly as the engine tokenizes the prompt, and within the length.
        assert ids == engine_tok.encode(s["prompt"], True)
        assert len(ids) <= length
        # render() of the parts is the prompt.
        assert T.render(task, question, s["parts"]) == s["prompt"]
        # n is the largest count that fits: with the noise haystack one more sentence would
        # overflow the length; elsewhere the room left is under one (long) sentence.
        if hay == "noise":
            more = dict(s["parts"], sentences=s["parts"]["sentences"] + [T.NOISE])
            assert len(engine_tok.encode(T.render(task, question, more), True)) > length
        else:
            assert length - len(ids) < 128, (task, hay, length, len(ids))
        # Completion: answers joined by ", " and ".", a space first unless the prompt ends
        # with one; its ids are the engine's for that text after a line break; EOS last.
        body = ", ".join(s["answers"]) + "."
        assert s["completion"] == (body if s["prompt"].endswith(" ") else " " + body)
        assert s["completion_ids"][-1] == T.EOS
        assert s["completion_ids"][:-1] == engine_tok.encode("\n" + s["completion"], False)[2:]
        # Every answer occurs exactly once in the prompt (7-digit values; vt names).
        counts = [s["prompt"].count(a) for a in s["answers"]]
        if task == "vt":
            assert counts == [2, 2, 2, 2, 1]  # each name is assigned, and read by the next
        else:
            assert counts == [1] * len(counts)
        items, n = _items_and_n(s)
        if task != "vt":
            # The queried needle sits right before haystack sentence round(depth / 100 * n).
            pos = math.floor(s["depth"] / 100.0 * n + 0.5)
            needle = T.NEEDLE.format(key=s["parts"]["keys"][0],
                                     value=s["parts"]["values"][0])
            assert s["parts"]["inserts"][0] == [pos, needle]
            k = items.index(needle)
            assert sum(1 for x in items[:k] if x not in [t for _, t in s["parts"]["inserts"]]) == pos
        n_checked += 1
    assert n_checked == 48


# Prompts written out by hand from docs/tasks.md (templates, singular rewrite, joins).
HAND = [
    ("niah_single", "last",
     {"haystack": "noise", "sentences": ["S1.", "S2."], "inserts": [[1, "N."]],
      "query": "amber-falcon", "keys": [], "values": []},
     "A special magic number is hidden within the following text. Make sure to memorize it. "
     "I will quiz you about the number afterwards.\nS1.\nN.\nS2.\n"
     "What is the special magic number for amber-falcon mentioned in the provided text?"
     " The special magic number for amber-falcon mentioned in the provided text is"),
    ("niah_multiquery", "first",
     {"haystack": "essay", "sentences": ["A b.", "C d!"], "inserts": [[0, "X."], [2, "Y."]],
      "query": ["k1-a", "k2-b", "k3-c"], "keys": [], "values": []},
     "Some special magic numbers are hidden within the following text. Make sure to memorize "
     "it. I will quiz you about the numbers afterwards.\n"
     "What are all the special magic numbers for k1-a, k2-b, and k3-c mentioned in the "
     "provided text?\nX. A b. C d! Y.\nAnswer:"),
    ("niah_multivalue", "last",
     {"haystack": "needle", "sentences": ["P."], "inserts": [[1, "Q."], [1, "R."]],
      "query": ["one-two"], "keys": [], "values": []},
     "Some special magic numbers are hidden within the following text. Make sure to memorize "
     "it. I will quiz you about the numbers afterwards.\nP.\nQ.\nR.\n"
     "What are all the special magic numbers for one-two mentioned in the provided text?"
     " The special magic numbers for one-two mentioned in the provided text are"),
    ("vt", "last",
     {"haystack": "noise", "sentences": ["Z."], "inserts": [[0, "VAR AAAAA = 12345"],
                                                            [1, "VAR BBBBB = VAR AAAAA "]],
      "query": "12345", "keys": [], "values": []},
     "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
     "VAR AAAAA = 12345\nZ.\nVAR BBBBB = VAR AAAAA \n"
     "Question: Find all variables that are assigned the value 12345 in the text above."
     " Answer: According to the chain(s) of variable assignment in the text above, 5 variables "
     "are assigned the value 12345, they are: "),
    ("vt", "first",
     {"haystack": "noise", "sentences": [], "inserts": [[0, "VAR AAAAA = 12345"]],
      "query": 12345, "keys": [], "values": []},
     "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
     "Question: Find all variables that are assigned the value 12345 in the text above.\n"
     "VAR AAAAA = 12345\nAnswer:"),
]


@pytest.mark.parametrize("task,question,parts,want", HAND)
def test_render_by_hand(task, question, parts, want):
    assert T.render(task, question, parts) == want


def test_render_rejects_bad_parts():
    parts = {"haystack": "noise", "sentences": ["a"], "inserts": [[2, "x"]], "query": "k"}
    with pytest.raises(ValueError, match="insert position 2"):
        T.render("niah_single", "last", parts)
    with pytest.raises(ValueError, match="unknown task"):
        T.render("niah_bogus", "last", dict(parts, inserts=[]))
    with pytest.raises(ValueError, match="question placement"):
        T.render("niah_single", "middle", dict(parts, inserts=[]))


def test_completion_and_scorer_by_hand():
    assert T.completion_text("... text is", ["1234567"]) == " 1234567."
    assert T.completion_text("they are: ", ["AB", "CD"]) == "AB, CD."
    assert T.string_match_all(" 1234567, 7654321.", ["1234567", "7654321"]) == 1.0
    assert T.string_match_all("abcde", ["ABCDE", "FGHIJ"]) == 0.5
    assert T.string_match_all("", ["1"]) == 0.0


def test_exported_fixture_runs_in_the_engine_as_in_pytorch():
    # data/reference/task_model_fixture.*: a tiny model in the task model's architecture,
    # exported by scripts/train/model.py, with the logits PyTorch computed for it (float64;
    # scripts/train/make_fixture.py). The engine's per-token NLL and argmax must agree.
    ref = DATA / "reference"
    ids = [int(x) for x in (ref / "task_model_fixture.ids.txt").read_text().split()]
    logits = np.fromfile(ref / "task_model_fixture.logits.f32", dtype="<f4")
    logits = logits.reshape(len(ids), 512).astype(np.float64)
    top = logits.max(-1)
    lse = top + np.log(np.exp(logits - top[:, None]).sum(-1))
    want = lse[:-1] - logits[np.arange(len(ids) - 1), ids[1:]]
    model = vq.Model.load(str(ref / "task_model_fixture.bin"))
    c = model.config
    assert (c["dim"], c["n_layers"], c["n_heads"], c["n_kv_heads"], c["vocab_size"]) == (32, 2, 4, 2, 512)
    r = vq.run_forced(model, ids, "full:kv_dtype=f32")
    assert np.abs(r["nll"] - want).max() < 1e-4
    assert (r["top1"] == logits[:-1].argmax(-1)).all()
    # The check discriminates: the NLLs are far from uniform and vary along the prompt.
    assert want.std() > 0.5 and abs(want.mean() - math.log(512)) > 0.5


def _dump_line(s, seed, index):
    # A sample in the C++ generator's --dump-samples fields.
    return json.dumps({"task": s["task"], "question": s["question"], "length": s["length"],
                       "depth": s["depth"], "seed": seed, "index": index, "prompt": s["prompt"],
                       "answers": s["answers"], "completion": s["completion"],
                       "n_tokens": len(s["prompt_ids"]), "parts": s["parts"]})


def test_render_cross_check_script(gen, tmp_path):
    # tests/check_task_render.py (run by the integrator on the C++ dump) accepts samples that
    # follow the contract and reports the first differing byte of one that does not.
    lines = []
    for i, task in enumerate(T.TASKS):
        s = gen.sample(T.sample_rng("pytest", 0, "dump", i), task, T.QUESTIONS[i % 2],
                       "noise" if task == "vt" else T.HAYSTACKS[i % 3], 600)
        lines.append(_dump_line(s, 0, i))
    good = tmp_path / "good.jsonl"
    good.write_text("\n".join(lines) + "\n" + json.dumps({"task": "cwe", **{
        k: v for k, v in json.loads(lines[0]).items() if k != "task"}}) + "\n")
    script = str(SOURCE_DIR / "tests" / "check_task_render.py")
    r = subprocess.run([sys.executable, script, str(good)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "5 samples checked, 0 mismatched" in r.stdout and "cwe (1)" in r.stdout
    broken = json.loads(lines[0])
    broken["prompt"] = broken["prompt"].replace("\n", " \n", 1)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(broken) + "\n")
    r = subprocess.run([sys.executable, script, str(bad)], capture_output=True, text=True)
    assert r.returncode == 1 and "render() differs" in r.stdout and "n_tokens" in r.stdout
    missing = tmp_path / "missing.jsonl"
    missing.write_text(json.dumps({k: v for k, v in json.loads(lines[0]).items()
                                   if k != "n_tokens"}) + "\n")
    r = subprocess.run([sys.executable, script, str(missing)], capture_output=True, text=True)
    assert r.returncode == 2 and "missing fields n_tokens" in r.stderr
