#!/usr/bin/env python3
"""Trains the project's task model (docs/tasks.md, "The task model") and exports it for the engine.

  python3 scripts/train/train_task_model.py --out DIR [--device cuda|cpu] [--time-budget S] ...

Writes DIR/task_model.bin (llama2.c v0, loads with `veloxquant ... --model`), and
DIR/task_model.json (configuration, seed, commit, data sources with sha256, loss curve, tokens,
time, device, held-out accuracy). Both are rewritten every --checkpoint-every seconds while
training, so a run stopped from outside still leaves a usable model.

Data (built on the fly by DataLoader workers, scripts/train/tasklib.py): each batch has one row
length (a prompt budget L drawn from --lengths, plus room for the completion) and about
--tokens-per-batch tokens. A row is one task sample (prompt ids then completion ids, padded) or,
with probability --lm-fraction, a run of plain TinyStories text. Loss: the mean cross-entropy
over completion tokens (EOS included) plus --lm-weight times the mean over every other target
(prompt text and plain text). The completion tokens are under 1% of the tokens, so averaging
them on their own gives the task a fixed share of the gradient; the text term keeps the model a
language model and trains the copy-from-context heads (induction) that retrieval builds on.
"""

import argparse
import json
import math
import os
import platform
import random
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import tasklib as T  # noqa: E402
from model import Config, Llama, export_llama2c, load_llama2c, HAS_SDPA  # noqa: E402

TASK_WEIGHTS = {"niah_single": 0.2, "niah_multikey": 0.3, "niah_multivalue": 0.15,
                "niah_multiquery": 0.15, "vt": 0.2}
HAYSTACK_WEIGHTS = {"essay": 0.5, "noise": 0.25, "needle": 0.25}
STAGE_DATA_KEYS = ("tasks", "haystacks", "lengths", "length_weights", "lm_fraction",
                   "copy_fraction", "copy_segment", "tokens_per_batch")
STAGE_KEYS = STAGE_DATA_KEYS + ("name", "until_completion", "until_text", "end", "min_steps")
COMPLETION_ROOM = 48  # row length = L + this: the longest completion (vt, multivalue) fits


def log(*a):
    print(f"[train {time.strftime('%H:%M:%S')}]", *a, flush=True)


def parse_list(s, cast=int):
    return [cast(x) for x in s.split(",") if x.strip()]


def read_train_text(args):
    with open(args.text, "rb") as f:
        raw = f.read()
    return raw.decode("utf-8")


class TaskStream(torch.utils.data.IterableDataset):
    """Endless batches: (inputs int32 [B, R], targets int32 [B, R] with -1 = no loss,
    kind int8 [B, R]: 0 none, 1 text, 2 completion, bucket L)."""

    def __init__(self, args, stage=None, salt=0):
        super().__init__()
        # A curriculum stage overrides the data settings of args (tasks, haystacks, lengths,
        # length_weights, lm_fraction, tokens_per_batch); salt keeps the stages' streams apart.
        a = argparse.Namespace(**vars(args))
        if stage:
            for k, v in stage.items():
                if k in STAGE_DATA_KEYS:
                    setattr(a, k, v)
            a.short_phase = 0.0
        self.a = a
        self.salt = salt

    def _setup(self):
        a = self.a
        tok = T.Tok512(a.tokenizer)
        text = read_train_text(a)
        gen = T.TaskGenerator(tok, T.read_words(a.words), text)
        text_ids = tok.encode(text, bos=False)
        return tok, gen, text_ids

    def __iter__(self):
        a = self.a
        info = torch.utils.data.get_worker_info()
        wid = info.id if info is not None else 0
        tok, gen, text_ids = self._setup()
        tasks, tw = zip(*[(t, w) for t, w in TASK_WEIGHTS.items() if t in a.tasks])
        hays, hw = zip(*[(h, w) for h, w in HAYSTACK_WEIGHTS.items() if h in a.haystacks])
        n_workers = info.num_workers if info is not None else 1
        short = [(L, w) for L, w in zip(a.lengths, a.length_weights) if L <= a.short_max]
        k = 0
        while True:
            rng = (T.sample_rng("vq-train", a.seed, wid, k) if self.salt == 0 else
                   T.sample_rng("vq-train", a.seed, f"stage{self.salt}/{wid}", k))
            # Progress of the run as this worker sees it: the batch's place among all workers'
            # (step schedule) or the wall clock since the loader started (time budget).
            if a.steps > 0:
                progress = (k * n_workers + wid) / a.steps
            else:
                progress = (time.time() - a.loader_start) / a.time_budget
            k += 1
            if progress < a.short_phase and short:
                L = rng.choices([x for x, _ in short], weights=[w for _, w in short])[0]
            else:
                L = rng.choices(a.lengths, weights=a.length_weights)[0]
            R = L + COMPLETION_ROOM
            B = max(1, a.tokens_per_batch // R)
            inp = torch.zeros((B, R), dtype=torch.int32)
            tgt = torch.full((B, R), -1, dtype=torch.int32)
            kind = torch.zeros((B, R), dtype=torch.int8)
            for b in range(B):
                if a.copy_fraction > 0 and rng.random() < a.copy_fraction:
                    self._copy_row(rng, tok, inp[b], tgt[b], kind[b], a.copy_segment)
                    continue
                if rng.random() < a.lm_fraction:
                    ids = torch.tensor(gen.lm_ids(rng, text_ids, R + 1), dtype=torch.int32)
                    inp[b] = ids[:-1]
                    tgt[b] = ids[1:]
                    kind[b] = 1
                    continue
                task = rng.choices(tasks, weights=tw)[0]
                hay = "noise" if task == "vt" else rng.choices(hays, weights=hw)[0]
                question = rng.choice(T.QUESTIONS)
                n = L if rng.random() < 0.7 else rng.randint(max(a.min_length, L // 4), L)
                try:
                    s = gen.sample(rng, task, question, hay, n)
                except ValueError:
                    s = gen.sample(rng, task, question, hay, L)
                p, c = s["prompt_ids"], s["completion_ids"]
                ids = torch.tensor(p + c, dtype=torch.int32)
                m = len(ids) - 1
                inp[b, :m] = ids[:-1]
                tgt[b, :m] = ids[1:]
                kind[b, :m] = 1
                kind[b, len(p) - 1:m] = 2
            yield inp, tgt, kind, L

    @staticmethod
    def _copy_row(rng, tok, inp, tgt, kind, seg_len=(8, 64)):
        """A copy row: BOS, then segments of seg_len[0]..seg_len[1] random tokens (--copy-segment),
        each written twice. Only the
        second writing is a target (kind 1, from its second token on: the first cannot be
        known), so its loss falls only when the model looks the segment up in its context and
        copies what followed (the induction mechanism retrieval needs); a needle is such a
        lookup."""
        R = inp.shape[0]
        ids = [T.BOS]
        mask = [0]
        while len(ids) < R + 1:
            seg = [rng.randrange(3, len(tok.pieces)) for _ in range(rng.randint(*seg_len))]
            ids += seg + seg
            mask += [0] * len(seg) + [0] + [1] * (len(seg) - 1)
        ids, mask = ids[:R + 1], mask[:R + 1]
        inp[:] = torch.tensor(ids[:-1], dtype=torch.int32)
        tgt[:] = torch.tensor(ids[1:], dtype=torch.int32)
        kind[:] = torch.tensor(mask[1:], dtype=torch.int8)


def git_info():
    def run(*cmd):
        try:
            return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                                  timeout=10).stdout.strip()
        except Exception:
            return ""
    commit = run("git", "rev-parse", "HEAD")
    dirty = run("git", "status", "--porcelain", "--untracked-files=no")
    return {"commit": commit or "unknown (no git repository here)",
            "dirty": bool(dirty) if commit else None}


def lr_at(args, progress):
    """Linear warm-up over --warmup-frac of the run, then cosine down to --min-lr-frac."""
    if progress < args.warmup_frac:
        return args.lr * max(progress / args.warmup_frac, 0.01)
    p = min(1.0, (progress - args.warmup_frac) / max(1e-9, 1.0 - args.warmup_frac))
    return args.lr * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * p)))


def wilson(k, n, z=1.959963984540054):
    if n == 0:
        return [0.0, 1.0]
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return [round(max(0.0, c - h), 6), round(min(1.0, c + h), 6)]


@torch.no_grad()
def greedy_batch(model, prompts, max_new, device, amp):
    """Greedy continuation of each prompt (lists of ids) until EOS, newline or max_new tokens
    (right-padded batch; causal attention makes each row's logits independent of its padding)."""
    B = len(prompts)
    lens = [len(p) for p in prompts]
    buf = torch.zeros(B, max(lens) + max_new, dtype=torch.long)
    for b, p in enumerate(prompts):
        buf[b, :len(p)] = torch.tensor(p)
    buf = buf.to(device)
    out = [[] for _ in range(B)]
    done = [False] * B
    for _ in range(max_new):
        T_ = max(lens)
        with amp():
            logits = model(buf[:, :T_])
        idx = torch.tensor([l - 1 for l in lens], device=device)
        nxt = logits[torch.arange(B, device=device), idx].float().argmax(-1).tolist()
        for b in range(B):
            if done[b]:
                continue
            t = nxt[b]
            if t in (T.EOS, T.NEWLINE_ID):
                done[b] = True
                continue
            out[b].append(t)
            buf[b, lens[b]] = t
            lens[b] += 1
        if all(done):
            break
    return out


def heldout_eval(model, args, device, amp):
    tok = T.Tok512(args.tokenizer)
    with open(args.heldout_text, encoding="utf-8") as f:
        gen = T.TaskGenerator(tok, T.read_words(args.words), f.read())
    model.eval()
    rows = []
    for task in ("niah_single", "niah_multikey"):
        for L in args.eval_lengths:
            for q in T.QUESTIONS:
                samples = [gen.sample(T.sample_rng("vq-heldout", args.seed, f"{task}/{L}/{q}", i),
                                      task, q, "essay", L) for i in range(args.eval_samples)]
                outs = []
                for i in range(0, len(samples), args.eval_batch):
                    chunk = samples[i:i + args.eval_batch]
                    outs += greedy_batch(model, [s["prompt_ids"] for s in chunk], 32, device, amp)
                scores = [T.string_match_all(tok.decode(o), s["answers"])
                          for o, s in zip(outs, samples)]
                k = sum(scores)
                row = {"task": task, "length": L, "question": q, "haystack": "essay",
                       "n": len(scores), "accuracy": k / len(scores),
                       "wilson95": wilson(k, len(scores)),
                       "example": {"answers": samples[0]["answers"],
                                   "generated": tok.decode(outs[0])}}
                rows.append(row)
                log(f"held-out {task} L={L} question={q}: {k:.0f}/{len(scores)} "
                    f"(e.g. want {row['example']['answers']} got {row['example']['generated']!r})")
    model.train()
    return rows


def parse_segment(ap, what, s):
    """'MIN,MAX' -> (MIN, MAX), 1 <= MIN <= MAX."""
    try:
        lo, hi = (int(x) for x in s.split(","))
    except ValueError:
        ap.error(f"{what}: expected MIN,MAX (two integers), found '{s}'")
    if not 1 <= lo <= hi:
        ap.error(f"{what}: expected 1 <= MIN <= MAX, found {lo},{hi}")
    return (lo, hi)


def parse_stages(ap, args):
    """--stages -> a list of validated stage dicts (empty: no curriculum)."""
    if not args.stages:
        return []
    text = args.stages
    if text.startswith("@"):
        with open(text[1:], encoding="utf-8") as f:
            text = f.read()
    try:
        stages = json.loads(text)
    except ValueError as e:
        ap.error(f"--stages: not JSON ({e})")
    if not isinstance(stages, list) or not stages:
        ap.error("--stages: expected a non-empty JSON list of objects")
    out = []
    prev_end = 0.0
    for i, st in enumerate(stages):
        if not isinstance(st, dict):
            ap.error(f"--stages[{i}]: expected an object, found {type(st).__name__}")
        bad = [k for k in st if k not in STAGE_KEYS]
        if bad:
            ap.error(f"--stages[{i}]: unknown key(s) {', '.join(bad)} (expected some of "
                     f"{', '.join(STAGE_KEYS)})")
        st = dict(st)
        for k in ("tasks", "haystacks"):
            if k in st:
                st[k] = [x for x in str(st[k]).split(",") if x]
                known = TASK_WEIGHTS if k == "tasks" else HAYSTACK_WEIGHTS
                for x in st[k]:
                    if x not in known:
                        ap.error(f"--stages[{i}].{k}: unknown '{x}'")
        if "lengths" in st:
            st["lengths"] = parse_list(str(st["lengths"]))
            st.setdefault("length_weights", ",".join("1" for _ in st["lengths"]))
        if "copy_segment" in st:
            st["copy_segment"] = parse_segment(ap, f"--stages[{i}].copy_segment",
                                               str(st["copy_segment"]))
        if "length_weights" in st:
            st["length_weights"] = parse_list(str(st["length_weights"]), float)
            if len(st["length_weights"]) != len(st.get("lengths", args.lengths)):
                ap.error(f"--stages[{i}]: length_weights needs one weight per length")
        end = float(st.get("end", 1.0))
        if i == len(stages) - 1:
            end = 1.0
        if not prev_end < end <= 1.0:
            ap.error(f"--stages[{i}].end: {end} must be in ({prev_end}, 1]")
        st["end"] = prev_end = end
        st.setdefault("name", f"stage{i}")
        out.append(st)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output folder (created if missing)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--time-budget", type=float, default=420.0,
                    help="seconds of training; the schedule runs over this time")
    ap.add_argument("--steps", type=int, default=0,
                    help="if > 0: train this many steps, schedule over steps (ignores the budget)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workers", type=int, default=max(1, min(14, (os.cpu_count() or 2) - 2)))
    ap.add_argument("--tokens-per-batch", type=int, default=131072)
    ap.add_argument("--lengths", default="512,1024,2048,4096")
    ap.add_argument("--length-weights", default="1,1,1.5,2.5")
    ap.add_argument("--min-length", type=int, default=384)
    ap.add_argument("--short-phase", type=float, default=0.25,
                    help="fraction of the run that draws only lengths <= --short-max (a "
                         "curriculum: many short samples while retrieval forms)")
    ap.add_argument("--short-max", type=int, default=1024)
    ap.add_argument("--tasks", default=",".join(TASK_WEIGHTS),
                    help="tasks to train on (their weights as in TASK_WEIGHTS)")
    ap.add_argument("--haystacks", default=",".join(HAYSTACK_WEIGHTS),
                    help="niah haystacks to train on (vt always uses noise)")
    ap.add_argument("--stages", default="",
                    help="a curriculum: a JSON list of stages (or @FILE), each overriding "
                         "tasks, haystacks, lengths, length_weights, lm_fraction, "
                         "tokens_per_batch, copy_fraction, and ending when the mean completion "
                         "loss of its last 5 log points is under until_completion (or the text "
                         "loss under until_text; after min_steps) or at "
                         "the fraction 'end' of the run; the last stage runs to the end")
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--hidden-dim", type=int, default=768)
    ap.add_argument("--n-layers", type=int, default=4)
    ap.add_argument("--n-heads", type=int, default=4)
    ap.add_argument("--n-kv-heads", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=0,
                    help="context in the exported header (0: the longest length + 128, RULER's "
                         "niah tokens_to_generate, so a full-length prompt can be answered)")
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--warmup-frac", type=float, default=0.04)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--lm-weight", type=float, default=0.5)
    ap.add_argument("--lm-fraction", type=float, default=0.1)
    ap.add_argument("--copy-fraction", type=float, default=0.0,
                    help="share of rows that are copy rows (random segments written twice, "
                         "the second a target): trains the lookup-and-copy mechanism first")
    ap.add_argument("--copy-segment", default="8,64",
                    help="MIN,MAX: the length range of a copy row's random segments (tokens)")
    ap.add_argument("--init", default="",
                    help="start from the weights of a model this script exported (its "
                         "task_model.bin; dims must match): a run continued in a second, "
                         "recorded run (the optimizer starts fresh)")
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--checkpoint-every", type=float, default=120.0)
    ap.add_argument("--eval-samples", type=int, default=20)
    ap.add_argument("--eval-batch", type=int, default=20)
    ap.add_argument("--eval-lengths", default="1024,2048,4096")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (CUDA)")
    ap.add_argument("--tokenizer", default=os.path.join(ROOT, "data", "tok512.bin"))
    ap.add_argument("--words", default=os.path.join(ROOT, "data", "tasks", "words.txt"))
    ap.add_argument("--text", default=os.path.join(ROOT, "data", "tasks", "tinystories_train.txt"),
                    help="training text (the essay haystack and plain text)")
    ap.add_argument("--heldout-text", default="",
                    help="haystack for the held-out accuracy (default: data/tasks/"
                         "haystack_wikitext.txt if present, else data/wikitext2_test_excerpt.txt)")
    args = ap.parse_args()
    args.lengths = parse_list(args.lengths)
    args.length_weights = parse_list(args.length_weights, float)
    args.eval_lengths = parse_list(args.eval_lengths)
    args.copy_segment = parse_segment(ap, "--copy-segment", args.copy_segment)
    args.tasks = [t for t in args.tasks.split(",") if t]
    args.haystacks = [h for h in args.haystacks.split(",") if h]
    for t in args.tasks:
        if t not in TASK_WEIGHTS:
            ap.error(f"--tasks: unknown task '{t}' (expected some of {', '.join(TASK_WEIGHTS)})")
    for h in args.haystacks:
        if h not in HAYSTACK_WEIGHTS:
            ap.error(f"--haystacks: unknown haystack '{h}' (expected some of "
                     f"{', '.join(HAYSTACK_WEIGHTS)})")
    if not args.tasks or not args.haystacks:
        ap.error("--tasks and --haystacks need at least one entry each")
    if len(args.length_weights) != len(args.lengths):
        ap.error("--length-weights needs one weight per --lengths entry")
    args.stages = parse_stages(ap, args)
    if not args.heldout_text:
        cand = os.path.join(ROOT, "data", "tasks", "haystack_wikitext.txt")
        args.heldout_text = cand if os.path.exists(cand) else os.path.join(
            ROOT, "data", "wikitext2_test_excerpt.txt")
    longest = max([max(args.lengths)] + [max(st["lengths"]) for st in args.stages
                                         if "lengths" in st])
    args.eval_lengths = [L for L in args.eval_lengths if L <= longest]
    if not args.seq_len:
        args.seq_len = longest + 128
    if args.seq_len < longest + COMPLETION_ROOM:
        ap.error(f"--seq-len {args.seq_len} is shorter than the longest row "
                 f"({longest} + {COMPLETION_ROOM})")
    for p in (args.tokenizer, args.words, args.text, args.heldout_text):
        if not os.path.exists(p):
            ap.error(f"missing input file {p}")
    # Pre-flight: every task, placement and haystack fits the shortest length.
    tok = T.Tok512(args.tokenizer)
    with open(args.text, encoding="utf-8") as f:
        gen = T.TaskGenerator(tok, T.read_words(args.words), f.read())
    for si, st in enumerate(args.stages or [{}]):
        where = (f"stage {si} ({st.get('name', 'unnamed')}) of --stages, lengths"
                 if args.stages and "lengths" in st else "--lengths")
        if float(st.get("copy_fraction", args.copy_fraction)) >= 1.0:
            continue  # copy rows only: no task sample is drawn
        s_tasks = st.get("tasks", args.tasks)
        s_hays = st.get("haystacks", args.haystacks)
        s_min = min(st.get("lengths", args.lengths))
        for task in s_tasks:
            for hay in (["noise"] if task == "vt" else s_hays):
                for q in T.QUESTIONS:
                    try:
                        gen.sample(T.sample_rng("vq-preflight", 0, task, 0), task, q, hay, s_min)
                    except ValueError as e:
                        ap.error(f"{where}: {s_min} tokens is too short for {task} "
                                 f"(question {q}, haystack {hay}): {e}")
    with open(args.heldout_text, encoding="utf-8") as f:
        gen = T.TaskGenerator(tok, T.read_words(args.words), f.read())
    for task in ("niah_single", "niah_multikey"):
        for q in T.QUESTIONS:
            for L in args.eval_lengths:
                try:
                    gen.sample(T.sample_rng("vq-preflight", 0, task, 0), task, q, "essay", L)
                except ValueError as e:
                    ap.error(f"--eval-lengths: {L} tokens is too short for the held-out {task} "
                             f"(question {q}): {e}")
    del gen
    os.makedirs(args.out, exist_ok=True)
    bin_path = os.path.join(args.out, "task_model.bin")
    json_path = os.path.join(args.out, "task_model.json")

    random.seed(args.seed)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.set_float32_matmul_precision("high")  # TF32 where an fp32 matmul is left (CUDA)

    def amp():
        if cuda:
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return torch.autocast("cpu", enabled=False)

    cfg = Config(args.dim, args.hidden_dim, args.n_layers, args.n_heads, args.n_kv_heads, 512,
                 args.seq_len)
    model = Llama(cfg)
    if args.init:
        src = load_llama2c(args.init)
        got, want = src.c.as_dict(), cfg.as_dict()
        got.pop("seq_len", None)
        want.pop("seq_len", None)
        if got != want:
            ap.error(f"--init {args.init}: its model is {got}, this run's is {want}")
        with torch.no_grad():
            theirs = dict(src.named_parameters())
            for name, prm in model.named_parameters():
                prm.copy_(theirs[name])
        del src
    model = model.to(device)
    n_params = sum(p.numel() for p in model.parameters())
    fwd = torch.compile(model) if args.compile else model
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    kw = {"fused": True} if cuda and "fused" in torch.optim.AdamW.__init__.__code__.co_varnames else {}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, **kw)
    dev_name = torch.cuda.get_device_name(device) if cuda else (platform.processor() or "cpu")
    log(f"device {device} ({dev_name}), torch {torch.__version__}, sdpa {HAS_SDPA}, "
        f"{n_params} parameters, config {cfg.as_dict()}, workers {args.workers}")

    sources = {}
    for name, path in (("tokenizer", args.tokenizer), ("words", args.words),
                       ("train_text", args.text), ("heldout_text", args.heldout_text)):
        sources[name] = {"path": os.path.relpath(path, ROOT), "sha256": T.sha256_file(path),
                         "bytes": os.path.getsize(path)}
    scripts = {f: T.sha256_file(os.path.join(HERE, f))
               for f in sorted(os.listdir(HERE)) if f.endswith((".py", ".sh"))}
    report = {"kind": "veloxquant task model training", "status": "starting",
              "config": cfg.as_dict(), "parameters": n_params,
              "args": {k: v for k, v in vars(args).items()}, "seed": args.seed,
              "git": git_info(), "scripts_sha256": scripts, "data": sources,
              "task_weights": TASK_WEIGHTS, "haystack_weights": HAYSTACK_WEIGHTS,
              "seed_namespaces": {"train": "vq-train", "heldout": "vq-heldout"},
              "device": {"type": device.type, "name": dev_name, "torch": torch.__version__,
                         "python": platform.python_version(), "sdpa": HAS_SDPA},
              "loss_curve": [], "heldout": None}

    def write_report():
        tmp = json_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(report, f, indent=1)
        os.replace(tmp, json_path)

    args.loader_start = time.time()
    stages = args.stages or [None]
    si = 0

    def make_loader(i):
        return iter(torch.utils.data.DataLoader(
            TaskStream(args, stages[i], salt=i if args.stages else 0), batch_size=None,
            num_workers=args.workers, pin_memory=cuda,
            **({"prefetch_factor": 4, "persistent_workers": False} if args.workers > 0 else {})))

    loader = make_loader(0)
    stage_log = []
    stage_start = {"step": 0, "seconds": 0.0, "tokens": 0}
    if args.stages:
        log(f"stage 0 ({stages[0]['name']}): {json.dumps(stages[0])}")
    report["stages"] = stage_log
    t_start = time.time()
    t_train = None
    last_ckpt = time.time()
    step = 0
    tokens = 0
    completion_tokens = 0
    target_tokens = 0  # positions with a loss (padding excluded)
    acc = {"loss": 0.0, "lc": 0.0, "lt": 0.0, "n": 0}
    pending = []
    model.train()
    while True:
        inp, tgt, kind, L = next(loader)
        if t_train is None:
            t_train = time.time()
            log(f"first batch after {t_train - t_start:.1f} s (worker start-up); training")
        elapsed = time.time() - t_train
        progress = step / args.steps if args.steps > 0 else elapsed / args.time_budget
        if progress >= 1.0:
            break
        lr = lr_at(args, progress)
        for g in opt.param_groups:
            g["lr"] = lr
        inp = inp.to(device, non_blocking=True).long()
        tgt = tgt.to(device, non_blocking=True).long()
        kind = kind.to(device, non_blocking=True)
        with amp():
            logits = fwd(inp)
        ce = F.cross_entropy(logits.float().view(-1, cfg.vocab_size), tgt.view(-1),
                             ignore_index=-1, reduction="none").view(tgt.shape)
        mc = (kind == 2).float()
        mt = (kind == 1).float()
        loss_c = (ce * mc).sum() / mc.sum().clamp(min=1)
        loss_t = (ce * mt).sum() / mt.sum().clamp(min=1)
        loss = loss_c + args.lm_weight * loss_t
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens += int(inp.numel())
        pending.append((loss.detach(), loss_c.detach(), loss_t.detach(), mc.sum().detach(),
                        (kind > 0).sum().float()))
        if step % args.log_every == 0:
            vals = torch.stack([torch.stack(x) for x in pending]).float().cpu()
            pending = []
            completion_tokens += int(vals[:, 3].sum())
            target_tokens += int(vals[:, 4].sum())
            el = time.time() - t_train
            point = {"step": step, "seconds": round(el, 2), "tokens": tokens, "lr": lr,
                     "target_tokens": target_tokens, "loss": float(vals[:, 0].mean()),
                     "loss_completion": float(vals[:, 1].mean()),
                     "loss_text": float(vals[:, 2].mean()), "length": int(L)}
            report["loss_curve"].append(point)
            if args.stages:
                point["stage"] = si
            log(f"step {step} {el:.0f}s tokens {tokens} ({tokens / max(el, 1e-9):.0f}/s) lr {lr:.2e} "
                f"loss {point['loss']:.4f} completion {point['loss_completion']:.4f} "
                f"text {point['loss_text']:.4f} L {int(L)}")
            if args.stages and si + 1 < len(stages):
                st = stages[si]
                # A stage ends when the mean of its last 5 log points of the loss it watches
                # (until_completion: the answers'; until_text: the text and copy rows') is under
                # the bound, after min_steps.
                watch = "until_completion" if "until_completion" in st else "until_text"
                key = "loss_completion" if watch == "until_completion" else "loss_text"
                recent = [p[key] for p in report["loss_curve"][-5:] if p.get("stage") == si]
                done_by_loss = (watch in st and len(recent) == 5 and
                                step - stage_start["step"] >= int(st.get("min_steps", 0)) and
                                sum(recent) / 5 < float(st[watch]))
                if done_by_loss or progress >= st["end"]:
                    why = (key.replace("loss_", "") + " loss" if done_by_loss
                           else "its share of the run")
                    stage_log.append({"stage": si, "name": st["name"], "ended_by": why,
                                      "from_step": stage_start["step"], "to_step": step,
                                      "seconds": round(el - stage_start["seconds"], 2),
                                      "tokens": tokens - stage_start["tokens"]})
                    log(f"stage {si} ({st['name']}) ends at step {step} ({why}); "
                        f"stage {si + 1} ({stages[si + 1]['name']}): {json.dumps(stages[si + 1])}")
                    stage_start = {"step": step, "seconds": el, "tokens": tokens}
                    si += 1
                    del loader
                    loader = make_loader(si)
        if time.time() - last_ckpt >= args.checkpoint_every:
            export_llama2c(model, bin_path)
            report.update(status=f"training (checkpoint at step {step})", steps=step, tokens=tokens)
            write_report()
            last_ckpt = time.time()
            log(f"checkpoint: {bin_path} at step {step}")
    train_seconds = time.time() - (t_train or t_start)
    if args.stages:
        stage_log.append({"stage": si, "name": stages[si]["name"], "ended_by": "end of run",
                          "from_step": stage_start["step"], "to_step": step,
                          "seconds": round(train_seconds - stage_start["seconds"], 2),
                          "tokens": tokens - stage_start["tokens"]})
    if pending:
        vals = torch.stack([torch.stack(x) for x in pending]).float().cpu()
        completion_tokens += int(vals[:, 3].sum())
        target_tokens += int(vals[:, 4].sum())
    del loader
    export_llama2c(model, bin_path)
    report.update(status="trained; held-out evaluation running", steps=step, tokens=tokens,
                  completion_tokens=completion_tokens, target_tokens=target_tokens, train_seconds=round(train_seconds, 2),
                  tokens_per_second=round(tokens / max(train_seconds, 1e-9), 1),
                  model_file={"path": "task_model.bin", "bytes": os.path.getsize(bin_path),
                              "sha256": T.sha256_file(bin_path)})
    write_report()
    log(f"trained {step} steps, {tokens} tokens in {train_seconds:.1f} s; exported {bin_path}")
    t_eval = time.time()
    report["heldout"] = heldout_eval(model, args, device, amp)
    report["heldout_seconds"] = round(time.time() - t_eval, 2)
    report["wall_seconds"] = round(time.time() - t_start, 2)
    report["status"] = "done"
    write_report()
    log(f"done in {report['wall_seconds']} s; wrote {bin_path} and {json_path}")


if __name__ == "__main__":
    main()
