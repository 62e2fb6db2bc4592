#!/usr/bin/env python3
"""A NumPy reference for `lagkv` (tests/test_new_methods.cpp, LagKV.*): the rows a cache keeps.

Written from the paper's definition (Liang et al. 2025, LagKV, section 3) and the method's
documented budget rule (src/policies/methods/lagkv.cpp), not from the C++ code: partitions of L
rows after the sinks; a partition is scored when the next is complete, by min-max normalising
its keys and values with the next partition's per-channel range, the sample standard deviation
over channels, a softmax over the partition, (s_K + s_V) / 2, then its rank in the partition / L;
the newest complete partition and the partial one are kept; over budget the lowest rank leaves
(the oldest first). Prints the kept positions for the inputs the C++ test builds.

usage: python3 tests/lagkv_reference.py
"""
import numpy as np


def inputs(T, D):
    t = np.arange(T)[:, None]
    c = np.arange(D)[None, :]
    keys = ((t * 7 + c * 3) % 11) - 5 + 0.25 * c
    values = ((t * 5 + c * 2) % 13) * 0.5 - 3 + 0.125 * ((t * c) % 3)
    return keys.astype(np.float32).astype(np.float64), values.astype(np.float32).astype(np.float64)


def part_scores(X, R):
    lo, hi = R.min(axis=0), R.max(axis=0)
    rng = hi - lo
    norm = np.where(rng > 0, (X - lo) / np.where(rng > 0, rng, 1), 0.0)
    s = norm.std(axis=1, ddof=1)
    e = np.exp(s - s.max())
    return e / e.sum()


def kept(T, D, budget, n_sink, L):
    keys, values = inputs(T, D)
    live = []  # [position, state, score]; state: 'sink', 'pending', 'scored'
    for t in range(T):
        live.append([t, 'sink' if len(live) < n_sink else 'pending', 0.0])
        pend = [i for i, r in enumerate(live) if r[1] == 'pending']
        if len(pend) == 2 * L:
            tgt, ref = pend[:L], pend[L:]
            P = [live[i][0] for i in tgt]
            Rp = [live[i][0] for i in ref]
            s = (part_scores(keys[P], keys[Rp]) + part_scores(values[P], values[Rp])) / 2
            order = np.argsort(s, kind='stable')
            for r, j in enumerate(order):
                live[tgt[j]][1] = 'scored'
                live[tgt[j]][2] = r / L
        while len(live) > budget:
            cand = [i for i, r in enumerate(live) if r[1] == 'scored']
            loser = min(cand, key=lambda i: (live[i][2], i))
            del live[loser]
    return [r[0] for r in live]


if __name__ == '__main__':
    for (T, D, budget, n_sink, L) in [(20, 4, 10, 2, 3), (40, 8, 16, 1, 4)]:
        print(f"T={T} D={D} budget={budget} n_sink={n_sink} lag_size={L}:",
              kept(T, D, budget, n_sink, L))
