#!/usr/bin/env python3
"""State size and save/load time of a ModelCache (docs/api.md, "Saving and restoring a cache").

At llama-110m's shape (12 layers, 12 KV heads, head_dim 64; stories110M) each method's cache is
fed a prompt of PROMPT tokens in one step and DECODE single-token steps of fixed pseudo-random
keys and values, then saved and loaded REPEAT times. Prints, per method: kept_bytes, the state's
size, their ratio, and the median save and load times.

Usage: PYTHONPATH=build/python /usr/bin/python3 bench/state_size.py [PROMPT] [DECODE] [REPEAT]
"""

import statistics
import sys
import time

import numpy as np

import veloxquant as vq

LAYERS, H, D = 12, 12, 64
METHODS = ["full", "h2o:budget=256", "snapkv:budget=256", "tova:budget=256,kv_dtype=q8_0",
           "kivi", "h2o:budget=256,demote=kivi4", "squeeze:budget=256",
           "snapkv:budget=256,think=0.5"]


def main():
    prompt = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
    decode = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    repeat = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    rng = np.random.default_rng(0)
    k = rng.standard_normal((1, H, prompt + decode, D)).astype(np.float32)
    v = rng.standard_normal((1, H, prompt + decode, D)).astype(np.float32)
    print(f"{'method':32} {'kept_bytes':>12} {'state bytes':>12} {'ratio':>6} {'save ms':>8} {'load ms':>8}")
    for spec in METHODS:
        config = vq.CacheConfig.parse(spec)
        m = vq.ModelCache(config, n_layers=LAYERS, n_kv_heads=H, head_dim=D)
        for layer in range(LAYERS):
            m.layer(layer).update(k[:, :, :prompt], v[:, :, :prompt])
        for t in range(prompt, prompt + decode):
            for layer in range(LAYERS):
                m.layer(layer).update(k[:, :, t:t + 1], v[:, :, t:t + 1])
        target = vq.ModelCache(config, n_layers=LAYERS, n_kv_heads=H, head_dim=D)
        saves, loads = [], []
        for _ in range(repeat):
            t0 = time.perf_counter()
            state = m.save_state()
            t1 = time.perf_counter()
            target.load_state(state)
            t2 = time.perf_counter()
            saves.append(t1 - t0)
            loads.append(t2 - t1)
        assert target.save_state() == state
        kept = m.stats()["kept_bytes"]
        print(f"{spec:32} {kept:12d} {len(state):12d} {len(state) / kept:6.3f} "
              f"{1e3 * statistics.median(saves):8.2f} {1e3 * statistics.median(loads):8.2f}")


if __name__ == "__main__":
    main()
