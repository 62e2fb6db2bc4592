#!/usr/bin/env python3
"""Training throughput of the task model (forward, backward, AdamW step) on random tokens.

  python3 scripts/train/bench_step.py [--device cpu] [--lengths 1024,4096] [--steps 3]
      [--tokens 4096] [--threads N] [--dim 256 ...]

Prints, per sequence length, the median step time and tokens/s (rows of that length, about
--tokens tokens a step, after one untimed warm-up step)."""

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import Config, Llama, HAS_SDPA  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--lengths", default="1024,4096")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=4096, help="tokens per step")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--hidden-dim", type=int, default=768)
    ap.add_argument("--n-layers", type=int, default=4)
    ap.add_argument("--n-heads", type=int, default=4)
    ap.add_argument("--n-kv-heads", type=int, default=2)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    lengths = [int(x) for x in a.lengths.split(",")]
    dev = torch.device(a.device)
    c = Config(a.dim, a.hidden_dim, a.n_layers, a.n_heads, a.n_kv_heads, 512, max(lengths))
    m = Llama(c).to(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    n_params = sum(p.numel() for p in m.parameters())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, sdpa {HAS_SDPA}, "
          f"{n_params} parameters, config {c.as_dict()}", flush=True)
    for L in lengths:
        B = max(1, a.tokens // L)
        times = []
        for i in range(a.steps + 1):
            x = torch.randint(0, 512, (B, L + 1), device=dev)
            t0 = time.time()
            loss = F.cross_entropy(m(x[:, :-1]).view(-1, 512), x[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            if i:
                times.append(time.time() - t0)
        t = statistics.median(times)
        print(f"length {L}: {B} x {L} tokens, median step {t:.2f} s over {a.steps} steps, "
              f"{B * L / t:.0f} tokens/s", flush=True)


if __name__ == "__main__":
    main()
