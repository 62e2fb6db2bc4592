#!/usr/bin/env python3
"""NumPy reference for expected_attention (tests/test_expected_attention.cpp pastes what this prints).

An independent implementation of the rule documented in src/policies/methods/expected_attention.cpp
(kvpress's ExpectedAttentionPress, Devoto et al. 2025), written from the formula with explicit
d x d rotation matrices, not from the C++ code:
  - per query head g: mu_g, Sigma_g = mean and population covariance (np.cov(bias=True)) of the
    last n_window pre-RoPE queries of positions >= n_sink;
  - Rbar = (1/F) sum_{f=1..F} R(t + f), R(p) the full d x d RoPE matrix at position p (pair i =
    (2i, 2i+1) interleaved or (i, i + d/2) half-split turned by p * inv_freq[i]), t the newest
    position; mubar = Rbar mu, Sigmabar = Rbar Sigma Rbar^T;
  - l_g(i) = mubar_g . k_i / sqrt(d) + k_i^T Sigmabar_g k_i / (2 d) for the non-sink rows,
    p_i = mean_g softmax_i(l_g), score_i = (p_i + eps) * ||v_i|| (vnorm) or p_i;
  - the n_sink first rows are kept; the rest keep the highest scores (ties: the lower index
    leaves first).
When: with queries, a chunk (S > 1) adds its rows and queries, refreshes the statistics at its
last position and cuts to the budget at once; a single token adds its row and query, refreshes
(every live row re-scored) when no statistics exist yet or `interval` tokens passed since the
last refresh, else scores only its own row with the statistics in force, then evicts the
lowest row while over budget. Without queries (keys fallback) every token is handled like a
single token, its key turned back by R(pos)^T standing in for the query (one group).
Inputs (exact in fp32):
  key[t][h][c]   = (((7 t^2 + 13 t c + 31 h + 5 c^2 + 3) mod 29) - 14) / 8
  value[t][h][c] = (((3 t^2 + 11 t c + 17 h + 2 c^2 + 1) mod 23) - 11) / 8
  query[t][q][c] = (((5 t^2 + 3 t c + 19 q + 7 c^2 + 2) mod 31) - 15) / 8
  inv_freq[i]    = theta^(-2 i / d) with theta = 50, rounded to fp32.
"""
import numpy as np


def key(t, h, c):
    return ((7 * t * t + 13 * t * c + 31 * h + 5 * c * c + 3) % 29 - 14) / 8


def value(t, h, c):
    return ((3 * t * t + 11 * t * c + 17 * h + 2 * c * c + 1) % 23 - 11) / 8


def query(t, q, c):
    return ((5 * t * t + 3 * t * c + 19 * q + 7 * c * c + 2) % 31 - 15) / 8


def inv_freq(d, theta=50.0):
    return np.array([np.float32(theta ** (-2.0 * i / d)) for i in range(d // 2)], dtype=np.float64)


def rope_matrix(p, freq, d, interleaved):
    R = np.zeros((d, d))
    for i in range(d // 2):
        a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + d // 2)
        ang = p * freq[i]
        R[a, a], R[a, b], R[b, a], R[b, b] = np.cos(ang), -np.sin(ang), np.sin(ang), np.cos(ang)
    return R


class Head:
    def __init__(self, cfg, h, G, use_queries):
        self.cfg, self.h, self.G, self.q = cfg, h, G, use_queries
        self.live = []        # positions
        self.logs = {}        # position -> [G] log-scores
        self.window = []      # entries [G][d]
        self.since = 0
        self.stats = None     # (mubar [G][d], Sigmabar [G][d][d])

    def entry(self, t):
        c = self.cfg
        d = c["d"]
        if self.q:
            return np.array([[query(t, self.h * self.G + g, x) for x in range(d)] for g in range(self.G)])
        k = np.array([key(t, self.h, x) for x in range(d)])
        if c["rope"]:
            k = rope_matrix(t, c["freq"], d, c["interleaved"]).T @ k
        return k[None, :]

    def refresh(self, t):
        c = self.cfg
        d = c["d"]
        W = np.array(self.window[-c["n_window"]:]) if self.window else np.zeros((0, self.G, d))
        if c["rope"]:
            Rbar = np.mean([rope_matrix(t + f, c["freq"], d, c["interleaved"])
                            for f in range(1, c["n_future"] + 1)], axis=0)
        else:
            Rbar = np.eye(d)
        mus, sigmas = [], []
        for g in range(self.G):
            X = W[:, g, :] if len(W) else np.zeros((0, d))
            mu = X.mean(axis=0) if len(X) else np.zeros(d)
            sig = np.cov(X, rowvar=False, bias=True).reshape(d, d) if len(X) > 1 else np.zeros((d, d))
            mus.append(Rbar @ mu)
            sigmas.append(Rbar @ sig @ Rbar.T)
        self.stats = (mus, sigmas)
        self.since = 0
        for p in self.live:
            self.score_row(p)

    def score_row(self, p):
        c = self.cfg
        d = c["d"]
        k = np.array([key(p, self.h, x) for x in range(d)])
        mus, sigmas = self.stats
        out = []
        for g in range(self.G):
            l = mus[g] @ k / np.sqrt(d)
            if c["cov"]:
                l += k @ sigmas[g] @ k / (2 * d)
            out.append(l)
        self.logs[p] = np.array(out)

    def scores(self):
        c = self.cfg
        d = c["d"]
        cand = self.live[c["n_sink"]:]
        if not cand:
            return {}
        L = np.array([self.logs[p] for p in cand])  # [n][G]
        P = np.exp(L - L.max(axis=0))
        P = (P / P.sum(axis=0)).mean(axis=1)
        out = {}
        for p, pi in zip(cand, P):
            vn = np.linalg.norm([value(p, self.h, x) for x in range(d)])
            out[p] = (pi + c["eps"]) * vn if c["vnorm"] else pi
        return out

    def cut(self, keep):
        s = self.scores()
        while len(self.live) > keep:
            cand = self.live[self.cfg["n_sink"]:]
            loser = min(cand, key=lambda p: (s[p], self.live.index(p)))
            self.live.remove(loser)
        return s

    def add(self, t):
        self.live.append(t)
        if t >= self.cfg["n_sink"]:
            self.window.append(self.entry(t))
        self.since += 1


def run(cfg, steps, use_queries):
    """steps: list of chunk sizes. Returns per head (kept positions, scores of the last cut)."""
    G = cfg["G"] if use_queries else 1
    heads = [Head(cfg, h, G, use_queries) for h in range(cfg["Hkv"])]
    t = 0
    margins = []
    last = [None] * cfg["Hkv"]
    for S in steps:
        for hd in heads:
            if use_queries and S > 1:
                for j in range(S):
                    hd.add(t + j)
                hd.refresh(t + S - 1)
                before = list(hd.live)
                s = hd.cut(cfg["budget"])
                last[heads.index(hd)] = s
                if len(before) > cfg["budget"]:
                    won = [s[p] for p in hd.live[cfg["n_sink"]:]]
                    lost = [s[p] for p in before if p not in hd.live]
                    margins.append((min(won) - max(lost)) / max(won))
            else:
                for j in range(S):
                    hd.add(t + j)
                    if hd.stats is None or hd.since >= cfg["interval"]:
                        hd.refresh(t + j)
                    else:
                        hd.score_row(t + j)
                    if len(hd.live) > cfg["budget"]:
                        s = hd.scores()
                        vals = sorted(s[p] for p in hd.live[cfg["n_sink"]:])
                        margins.append((vals[1] - vals[0]) / vals[-1])
                        hd.cut(cfg["budget"])
                        last[heads.index(hd)] = s  # the scores the last eviction ranked
        t += S
    return [(hd.live, last[i]) for i, hd in enumerate(heads)], min(margins) if margins else None


def base(**kw):
    cfg = dict(Hkv=2, G=2, d=8, budget=10, n_sink=2, n_future=5, n_window=16, interval=3,
               cov=True, vnorm=True, eps=0.0, rope=True, interleaved=True)
    cfg.update(kw)
    cfg["freq"] = inv_freq(cfg["d"])
    return cfg


CASES = [
    ("prefill", base(), [24], True),
    ("prefill_half_nocov", base(interleaved=False, cov=False, eps=0.05), [24], True),
    ("prefill_novnorm", base(vnorm=False, n_window=6), [24], True),
    ("decode", base(), [16] + [1] * 8, True),
    ("keys", base(), [1] * 20, False),
    ("keys_norope", base(rope=False), [1] * 20, False),
]

if __name__ == "__main__":
    for name, cfg, steps, q in CASES:
        res, margin = run(cfg, steps, q)
        for h, (live, s) in enumerate(res):
            print(f"{name} h{h}: kept {{{', '.join(map(str, live))}}}")
            print(f"{name} h{h}: scores {{{', '.join('%.9g' % s[p] for p in live[cfg['n_sink']:])}}}")
        print(f"{name}: min relative margin {margin:.3g}")
