#!/usr/bin/env python3
"""NumPy reference for kvzip (tests/test_kvzip.cpp holds what this prints; ctest runs this with
--check tests/test_kvzip.cpp, which recomputes the kept rows and compares them with the C++ test's
constants, so the two cannot drift apart).

An independent implementation of KVzip's rule (Kim et al. 2025, arXiv 2505.23416) as the doc block
of src/policies/methods/kvzip.cpp states it, written from the paper's formulas, not from the C++:

  a context of T rows is stored; the reconstruction input runs in chunks; query t of chunk c, query
  head q, attends to every stored row and causally to the chunk's rows 0..t:
    p = softmax over [stored rows, chunk rows 0..t] of (q_t . k) / sqrt(D);
  a stored row j's importance for KV head h = max over chunks c, queries t and the query heads q of
  h's group (q // G == h) of p[j];
  kept, uniform: each head keeps its n_sink first rows and the budget - n_sink others of highest
    importance (ties to the lowest index);
  kept, head-wise (floor 0): the sinks of every head, then the H x budget - H x n_sink best of all
    heads' other rows together (ties to the lowest row index, then the lowest head).
Inputs (identical in the C++ test): u(seed, i) a splitmix64 hash of i in [-0.5, 0.5),
  context key[h][t][d] = f32(3 u(1, (h T + t) D + d)),
  chunk c's key[h][t][d] = f32(3 u(10 + c, (h S + t) D + d)),
  chunk c's query[q][t][d] = f32(3 u(20 + c, (q S + t) D + d)).
"""
import re
import sys

import numpy as np

from reference_inputs import u  # the script's directory is on sys.path

H, G, D, T, S, CHUNKS = 2, 2, 4, 24, 10, 2
BUDGET, N_SINK = 10, 2




def tensor(seed, a, b):
    return np.array([[[np.float32(3 * u(seed, (x * b + t) * D + d)) for d in range(D)]
                      for t in range(b)] for x in range(a)], dtype=np.float64)


def importance():
    K = tensor(1, H, T)
    score = np.zeros((H, T))
    for c in range(CHUNKS):
        Kc = tensor(10 + c, H, S)
        Qc = tensor(20 + c, H * G, S)
        for q in range(H * G):
            h = q // G
            for t in range(S):
                keys = np.concatenate([K[h], Kc[h][: t + 1]])
                logits = keys @ Qc[q][t] / np.sqrt(D)
                p = np.exp(logits - logits.max())
                p /= p.sum()
                score[h] = np.maximum(score[h], p[:T])
    return score


def kept_uniform(score):
    out = []
    for h in range(H):
        cand = sorted(range(N_SINK, T), key=lambda j: (-score[h][j], j))
        out.append(sorted(list(range(N_SINK)) + cand[: BUDGET - N_SINK]))
    return out


def kept_headwise(score):
    pool = sorted((-score[h][j], j, h) for h in range(H) for j in range(N_SINK, T))
    keep = [list(range(N_SINK)) for _ in range(H)]
    for (_, j, h) in pool[: H * (BUDGET - N_SINK)]:
        keep[h].append(j)
    return [sorted(k) for k in keep]


def gaps(score):
    """The smallest score gap at each cut boundary (what float rounding could flip)."""
    out = []
    for h in range(H):
        s = sorted(score[h][N_SINK:], reverse=True)
        out.append(s[BUDGET - N_SINK - 1] - s[BUDGET - N_SINK])
    s = sorted((score[h][j] for h in range(H) for j in range(N_SINK, T)), reverse=True)
    out.append(s[H * (BUDGET - N_SINK) - 1] - s[H * (BUDGET - N_SINK)])
    return out


def cpp_table(path, name):
    text = open(path).read()
    m = re.search(name + r"\s*=\s*\{\{(.*?)\}\};", text, re.S)
    if m is None:
        sys.exit("kvzip_reference: %s not found in %s" % (name, path))
    return [[int(x) for x in re.findall(r"-?\d+", row)] for row in re.findall(r"\{([^{}]*)\}", m.group(1))]


if __name__ == "__main__":
    score = importance()
    uni, hw = kept_uniform(score), kept_headwise(score)
    print("uniform (budget %d, n_sink %d):" % (BUDGET, N_SINK))
    for h in range(H):
        print("  head", h, uni[h])
    print("head-wise (floor 0):")
    for h in range(H):
        print("  head", h, hw[h])
    print("smallest gap at a cut boundary: %.3g" % min(gaps(score)))
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        ok = True
        for name, want in (("kUniformKept", uni), ("kHeadwiseKept", hw)):
            got = cpp_table(sys.argv[2], name)
            if got != want:
                print("MISMATCH %s: the C++ test has %s, the reference computes %s" % (name, got, want))
                ok = False
        if min(gaps(score)) < 1e-5:
            print("a cut boundary is within 1e-5: float rounding could decide it")
            ok = False
        sys.exit(0 if ok else 1)
