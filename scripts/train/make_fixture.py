#!/usr/bin/env python3
"""Writes the torch-free export check's fixture: a tiny seeded random model in the task model's
architecture (GQA 2:1, interleaved RoPE, SwiGLU, tied classifier), exported by model.py, and the
logits PyTorch computes for it (float64 forward of the same weights).

  python3 scripts/train/make_fixture.py [--out data/reference]

Files: task_model_fixture.bin (llama2.c v0), task_model_fixture.ids.txt (the prompt, one id a
line), task_model_fixture.logits.f32 ([positions][vocab] little-endian float32).
python/tests/test_task_train.py runs the engine on them; test_task_train_torch.py rebuilds them
and checks they equal the committed files.
"""

import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import tasklib as T  # noqa: E402
from model import Config, Llama, export_llama2c  # noqa: E402

PROMPT = "One of the special magic numbers for amber-falcon is: 4821937.\nAnswer:"


def build():
    """The fixture model (float32 weights) and its prompt ids."""
    g = torch.Generator().manual_seed(20261204)
    c = Config(dim=32, hidden_dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=512,
               seq_len=64)
    m = Llama(c)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(0.5 + torch.rand(p.shape, generator=g))  # not all ones: order shows
            else:
                # Large enough that attention is far from uniform, so positions matter.
                p.copy_(torch.randn(p.shape, generator=g) * 0.35)
    tok = T.Tok512(os.path.join(ROOT, "data", "tok512.bin"))
    ids = tok.encode(PROMPT)
    return m, ids


def logits64(m, ids):
    import copy
    m64 = copy.deepcopy(m).double()
    m64.rope_cos = m64.rope_cos.double()
    m64.rope_sin = m64.rope_sin.double()
    with torch.no_grad():
        return m64(torch.tensor([ids]))[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "data", "reference"))
    a = ap.parse_args()
    m, ids = build()
    if len(ids) > m.c.seq_len:
        raise SystemExit(f"prompt of {len(ids)} ids exceeds the fixture's seq_len {m.c.seq_len}")
    export_llama2c(m, os.path.join(a.out, "task_model_fixture.bin"))
    with open(os.path.join(a.out, "task_model_fixture.ids.txt"), "w") as f:
        f.write("".join(f"{i}\n" for i in ids))
    lg = logits64(m, ids).float().numpy().astype("<f4")
    with open(os.path.join(a.out, "task_model_fixture.logits.f32"), "wb") as f:
        f.write(lg.tobytes())
    print(f"wrote the fixture ({len(ids)} ids) to {a.out}")


if __name__ == "__main__":
    main()
