#!/usr/bin/env python3
"""NumPy reference for the leverage method (tests/test_leverage.cpp, Leverage.*, pastes what this prints).

An independent implementation of the rule in src/policies/methods/leverage.cpp: at a prefill
chunk that leaves more than `budget` rows, X = K - mean(K) over the head's live rows,
G = X^T X + lambda I with lambda = ridge * trace(X^T X) / d, score_i = x_i^T G^{-1} x_i
(np.linalg.solve, no Cholesky), keep the first n_sink rows, the newest `grace` rows and the
(budget - n_sink - grace) other rows of highest score (ties to the lowest index).
Inputs: key[t][c] = ((3 t^2 + 5 t c + 2 c) mod 17) - 8 + c / 4 + (t mod 3) / 8, one head.
"""
import numpy as np


def keys(T, D):
    k = np.zeros((T, D))
    for t in range(T):
        for c in range(D):
            k[t, c] = (3 * t * t + 5 * t * c + 2 * c) % 17 - 8 + c / 4 + (t % 3) / 8
    return k


def kept(T, D, budget, n_sink, grace, ridge, chunk):
    K = keys(T, D).astype(np.float32).astype(np.float64)
    live = []  # positions
    margins = []
    for start in range(0, T, chunk):
        live += list(range(start, min(T, start + chunk)))
        if min(chunk, T - start) <= 1 or len(live) <= budget:
            continue
        X = K[live] - K[live].mean(axis=0)
        G = X.T @ X
        lam = ridge * np.trace(G) / D
        score = np.einsum("ij,ij->i", X, np.linalg.solve(G + lam * np.eye(D), X.T).T)
        n = len(live)
        cand = list(range(n_sink, n - grace))
        order = sorted(cand, key=lambda i: (-score[i], i))
        keep_n = budget - n_sink - grace
        win, lose = order[:keep_n], order[keep_n:]
        if win and lose:
            margins.append(min(score[i] for i in win) - max(score[i] for i in lose))
        keep = sorted(list(range(n_sink)) + win + list(range(n - grace, n)))
        live = [live[i] for i in keep]
    return live, margins


if __name__ == "__main__":
    for (T, D, budget, n_sink, grace) in [(24, 4, 10, 2, 3), (40, 8, 16, 1, 4)]:
        for chunk in (T, 8, 1):
            live, margins = kept(T, D, budget, n_sink, grace, 1e-3, chunk)
            print(f"T={T} D={D} budget={budget} n_sink={n_sink} grace={grace} chunk={chunk}:",
                  ", ".join(map(str, live)), " min margin", min(margins) if margins else None)
