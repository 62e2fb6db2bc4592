#!/usr/bin/env python3
"""NumPy reference for criticalkv / criticaladakv (tests/test_criticalkv.cpp pastes what this prints).

An independent implementation of the rule of Feng et al. 2025 (arXiv 2502.03805) as the doc block
of src/policies/methods/criticalkv.cpp states it, written from the formulas, not from the C++:

  base score (SnapKV, proxy source): the last w = obs_window live rows act as queries with their
    keys; window row r gives softmax_j(k_j . k_r / sqrt(D)) over live rows j <= r; these are
    summed over the window rows for every row j before the window, then max-pooled along the
    sequence (kernel 3, padding 1, clipped at both ends);
  kept: the n_sink first rows, the w window rows, and c = budget - n_sink - w candidates:
    stage 1: the floor(ratio * c) of highest pooled score;
    stage 2: the rest by (pooled + eps) * N_i, N_i = mean over the KV head's query heads g of
      ||W_o[:, g D:(g+1) D] @ v_i||_2 -- the projected value itself, computed from W_o directly
      (no Gram matrix); with plain=True, N_i = ||v_i||_2;
  ties to the lowest index.
  criticaladakv (head-wise): the H x budget rows of the layer are allocated by the pooled score:
    every head keeps its sinks and window (p = n_sink + w) and its floor(alpha (budget - p)) best
    candidates, the remaining slots go to the best remaining candidates of all heads together;
    each head then runs the two stages with c = its allocation - p.
Inputs (identical in the C++ test): u(seed, i) a splitmix64 hash of i in [-0.5, 0.5),
  key[h][t][c] = f32(3 u(1, (h T + t) D + c)), value = f32(2 u(2, same index)),
  W_o[r][j] = f32(u(3, r Hq D + j)) (dim x Hq D).
"""
import numpy as np

from reference_inputs import u  # the script's directory is on sys.path





def inputs(Hkv, T, D, dim, Hq):
    K = np.array([[[np.float32(3 * u(1, (h * T + t) * D + c)) for c in range(D)] for t in range(T)]
                  for h in range(Hkv)], dtype=np.float64)
    V = np.array([[[np.float32(2 * u(2, (h * T + t) * D + c)) for c in range(D)] for t in range(T)]
                  for h in range(Hkv)], dtype=np.float64)
    Wo = np.array([[np.float32(u(3, r * Hq * D + j)) for j in range(Hq * D)] for r in range(dim)],
                  dtype=np.float64)
    return K, V, Wo


def pooled_scores(Kl, n_win, kernel):
    n, D = Kl.shape
    w = min(n_win, n)
    m = n - w
    mass = np.zeros(m)
    for r in range(m, n):
        logits = Kl[: r + 1] @ Kl[r] / np.sqrt(D)
        p = np.exp(logits - logits.max())
        p /= p.sum()
        mass += p[:m]
    half = kernel // 2
    pooled = np.array([mass[max(0, j - half): min(m, j + half + 1)].max() for j in range(m)])
    return pooled, m


def norms(Vl, Wo, kv, G, D, plain):
    if plain:
        return np.linalg.norm(Vl, axis=1)
    out = np.zeros(len(Vl))
    for g in range(kv * G, (kv + 1) * G):
        out += np.linalg.norm(Vl @ Wo[:, g * D:(g + 1) * D].T, axis=1)
    return out / G


def two_stages(pooled, N, n_sink, m, c, ratio, eps, gaps):
    cand = list(range(n_sink, m))
    if len(cand) <= c:
        return cand
    c1 = int(np.floor(ratio * c))
    order = sorted(cand, key=lambda i: (-pooled[i], i))
    s1, rest = order[:c1], order[c1:]
    if c1 > 0:
        gaps.append(pooled[s1[-1]] - pooled[rest[0]])
    s2score = {i: (pooled[i] + eps) * N[i] for i in rest}
    order2 = sorted(rest, key=lambda i: (-s2score[i], i))
    c2 = c - c1
    if 0 < c2 < len(order2):
        gaps.append(s2score[order2[c2 - 1]] - s2score[order2[c2]])
    return s1 + order2[:c2]


def run(Hkv, T, D, dim, Hq, budget, n_sink, win, kernel, ratio, chunk, headwise=False,
        alpha=0.2, plain=False, eps=1e-4):
    K, V, Wo = inputs(Hkv, T, D, dim, Hq)
    G = Hq // Hkv
    live = [[] for _ in range(Hkv)]
    gaps = []
    for start in range(0, T, chunk):
        for h in range(Hkv):
            live[h] += list(range(start, min(T, start + chunk)))
        if min(chunk, T - start) <= 1:
            continue
        info = []
        for h in range(Hkv):
            Kl, Vl = K[h][live[h]], V[h][live[h]]
            pooled, m = pooled_scores(Kl, win, kernel)
            info.append((pooled, m, norms(Vl, Wo, h, G, D, plain)))
        if headwise:
            if sum(len(l) for l in live) <= Hkv * budget:
                continue
            alloc = []
            pool = []
            for h in range(Hkv):
                pooled, m, _ = info[h]
                n = len(live[h])
                p = n_sink + (n - m)
                f = int(np.floor(alpha * max(0, budget - p)))
                order = sorted(range(n_sink, m), key=lambda i: (-pooled[i], i))
                alloc.append(p + min(f, len(order)))
                pool += [(-pooled[i], i, h) for i in order[f:]]
            pool.sort()
            slots = Hkv * budget - sum(alloc)
            if 0 < slots < len(pool):
                gaps.append(pool[slots][0] - pool[slots - 1][0])
            for (_, _, h) in pool[:slots]:
                alloc[h] += 1
        else:
            alloc = [budget] * Hkv
        for h in range(Hkv):
            pooled, m, N = info[h]
            n = len(live[h])
            if n <= alloc[h]:
                continue
            chosen = two_stages(pooled, N, n_sink, m, alloc[h] - n_sink - (n - m), ratio, eps, gaps)
            keep = sorted(list(range(n_sink)) + chosen + list(range(m, n)))
            live[h] = [live[h][i] for i in keep]
    return live, gaps


CASES = [
    # name, kwargs
    ("A one chunk", dict(chunk=32)),
    ("B chunks of 16", dict(chunk=16)),
    ("C plain ||v||", dict(chunk=32, plain=True)),
    ("D headwise", dict(chunk=32, headwise=True)),
    ("E ratio 0", dict(chunk=32, ratio=0.0)),
]

if __name__ == "__main__":
    base = dict(Hkv=2, T=32, D=4, dim=8, Hq=4, budget=14, n_sink=2, win=4, kernel=3, ratio=0.5)
    for name, kw in CASES:
        args = dict(base)
        args.update(kw)
        live, gaps = run(**args)
        print(name, {k: v for k, v in kw.items()})
        for h in range(args["Hkv"]):
            print("  head", h, live[h])
        # Exact ties (max pooling copies one mass to its neighbours) are decided by the index in
        # both implementations; what float rounding could flip is a small nonzero gap.
        nz = [g for g in gaps if g != 0]
        print("  smallest nonzero gap at a stage boundary: %.3g (%d boundaries, %d exact ties)"
              % (min(nz), len(gaps), len(gaps) - len(nz)))
