#!/usr/bin/env python3
"""NumPy reference for finch (tests/test_finch.cpp pastes what this prints).

An independent implementation of Finch's score (Corallo & Papotti, TACL 2024, as kvpress's
FinchPress computes it) written from the formula, not from the C++:

  one prefill step of T tokens; the window is the last w rows (w = the question's q tokens, at
  most budget - n_sink; without a question w = obs_window); query row r (0-based position) has
  per query head g the causal softmax p_g[r][j] = softmax_j(q_g,r . k_j / sqrt(D)) over j <= r,
  folded over the KV head's G query heads by their mean (the source=attention rule; proxy: the
  key k_r as the one query); normalized: multiplied by r, the number of keys before query r;
  score[j] = mean over the window rows r of (r x p[r][j]) for every j before the window (the
  cache's row_scores: that score for the kept rows before the window, sinks included; 0 for the
  window rows);
  kept: the n_sink first rows, the w window rows and the budget - n_sink - w rows of highest
  score among the others (ties to the lowest index).
Inputs (identical in the C++ test): u(seed, i) a splitmix64 hash of i in [-0.5, 0.5),
  key[h][t][c] = f32(3 u(1, (h T + t) D + c)), query[g][t][c] = f32(3 u(4, (g T + t) D + c)).
The C++ test hands the cache these probabilities (computed in double, rounded to f32): the
printed gap is the smallest distance between a kept and a dropped score, far above f32 rounding.
"""
import numpy as np

from reference_inputs import u  # the script's directory is on sys.path





def tensor(seed, heads, T, D):
    return np.array([[[np.float32(3 * u(seed, (h * T + t) * D + c)) for c in range(D)]
                      for t in range(T)] for h in range(heads)], dtype=np.float64)


def causal_softmax(Qh, Kh):
    T, D = Kh.shape
    P = np.zeros((T, T))
    for r in range(T):
        logits = Kh[: r + 1] @ Qh[r] / np.sqrt(D)
        e = np.exp(logits - logits.max())
        P[r, : r + 1] = e / e.sum()
    return P


def run(Hkv, Hq, T, D, budget, n_sink, question, obs_window, normalize, attention):
    K, Q = tensor(1, Hkv, T, D), tensor(4, Hq, T, D)
    G = Hq // Hkv
    w = min(question, budget - n_sink) if question > 0 else min(obs_window, T)
    m = T - w
    out = []
    for h in range(Hkv):
        if attention:
            P = np.mean([causal_softmax(Q[g], K[h]) for g in range(h * G, (h + 1) * G)], axis=0)
        else:
            P = causal_softmax(K[h], K[h])
        score = np.zeros(m)
        for r in range(m, T):
            score += (r if normalize else 1.0) * P[r, :m]
        score /= w
        order = sorted(range(n_sink, m), key=lambda j: (-score[j], j))
        c = budget - n_sink - w
        chosen, dropped = order[:c], order[c:]
        gap = score[chosen[-1]] - score[dropped[0]] if chosen and dropped else float("inf")
        keep = sorted(list(range(n_sink)) + chosen + list(range(m, T)))
        out.append((keep, [score[j] if j < m else 0.0 for j in keep], gap))
    return out


# name, spec changes, question, normalize, attention
CASES = [
    ("A", "", 5, True, True),         # the question's 5 tokens, true attention
    ("B", ",normalize=false", 5, False, True),
    ("C", "", 0, True, True),         # no question: the fixed window of obs_window = 3 rows
    ("D", "", 5, True, False),        # proxy source: the keys as queries
    ("E", "", 12, True, True),        # a question longer than budget - n_sink = 9
]
SPEC = "finch:budget=10,n_sink=1,obs_window=3"


def cpp_lines():
    """One line of test_finch.cpp's kCases table per case."""
    lines, gaps = [], []
    for name, extra, q, normalize, attention in CASES:
        res = run(Hkv=2, Hq=4, T=16, D=4, budget=10, n_sink=1, question=q, obs_window=3,
                  normalize=normalize, attention=attention)
        lines.append('    {"%s", "%s%s", %d, %s,' % (name, SPEC, extra, q,
                                                    "true" if attention else "false"))
        kept = ", ".join("{" + ", ".join(str(j) for j in keep) + "}" for keep, _, _ in res)
        lines.append("     {%s},  // %s kept" % (kept, name))
        for h, (_, sc, _) in enumerate(res):
            lines.append("     %s{%s}%s  // %s h%d" % (
                "{" if h == 0 else " ", ", ".join("%.7g" % x for x in sc),
                "," if h == 0 else "}},", name, h))
        gaps += [g for _, _, g in res]
    return lines, min(gaps)


if __name__ == "__main__":
    import sys
    lines, gap = cpp_lines()
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        # ctest: every line must be in the C++ test's table, as printed here.
        have = {l.strip() for l in open(sys.argv[2])}
        missing = [l for l in lines if l.strip() not in have]
        for l in missing:
            print("not in %s:\n%s" % (sys.argv[2], l))
        sys.exit(1 if missing else 0)
    print("\n".join(lines))
    print("// smallest gap between a kept and a dropped score: %.3g" % gap)
