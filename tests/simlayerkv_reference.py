#!/usr/bin/env python3
"""NumPy reference for simlayerkv's proxy path (tests/test_simlayerkv.cpp, SimLayerKV.Proxy*,
pastes what this prints).

An independent reading of the rule in src/policies/methods/simlayerkv.cpp with the key-as-query
proxy: a layer holding R > W = n_initial + n_recent rows after a step decides once; the window is
rows [0, n_initial) and [R - n_recent, R); each of the last q = min(n_last, R) rows r stands in
for a query with its key: p_r = softmax_i(k_r . k_i / sqrt(d)) over rows i <= r (causal); the
mass is the window's share of p_r averaged over KV heads and those rows; lazy iff mass > threshold.
Inputs (one batch element, H = 2 KV heads, d = 2):
  key[h][t] = ((t * (2 h + 3)) mod 5 - 2, (t * t + h) mod 3 - 1) / 2, plus (3, 3) on row 0 of
  every head (a strong first row, an "attention sink").
"""
import numpy as np

H, D = 2, 2


def keys(T):
    k = np.zeros((H, T, D))
    for h in range(H):
        for t in range(T):
            k[h, t] = [((t * (2 * h + 3)) % 5 - 2) / 2, ((t * t + h) % 3 - 1) / 2]
        k[h, 0] += 3
    return k


def mass(K, R, n_initial, n_recent, n_last):
    q = min(n_last, R)
    window = [i for i in range(R) if i < n_initial or i >= R - n_recent]
    total = 0.0
    for h in range(H):
        for r in range(R - q, R):
            logits = K[h, : r + 1] @ K[h, r] / np.sqrt(D)
            p = np.exp(logits - logits.max())
            p /= p.sum()
            total += sum(p[i] for i in window if i <= r)
    return total / (H * q)


if __name__ == "__main__":
    K = keys(12)
    # A prefill of 12 rows, n_initial 1, n_recent 3, n_last 2 (W = 4): decided on all 12 rows.
    print("prefill 12 rows, n_initial=1 n_recent=3 n_last=2: mass %.9f" % mass(K, 12, 1, 3, 2))
    # The same keys fed one row at a time: decided when the cache holds W + 1 = 5 rows.
    print("token by token (R = 5), n_initial=1 n_recent=3 n_last=2: mass %.9f" % mass(K, 5, 1, 3, 2))
