#!/usr/bin/python3
"""Q-Filters reference for tests/test_qfilters.cpp, written from the paper (Godey et al. 2025),
independently of the C++ code.

For a head with queries Q (T x D), the filter is the first right singular vector of Q (no
centring), its sign chosen so that the mean projection of the queries on it is positive. A KV
head's filter is the mean of its group's query-head filters. np.linalg.svd does the work.

The synthetic queries (computed in float64, rounded to float32 as the test feeds them):
  q_t[i] = s * (2 + sin(0.37 t)) * p[i] + 0.6 * cos(0.9 t (i + 1) + 0.4 i),  t = 0..T-1
with p a unit vector (planted direction) and s = +1 or -1.
Run: /usr/bin/python3 tests/qfilters_reference.py  (prints the expected filters).
"""
import numpy as np

T, D = 64, 6


def unit(v):
    v = np.asarray(v, dtype=np.float64)
    return v / np.linalg.norm(v)


P_A = unit([3, -1, 2, 0.5, -2, 1])
P_C = unit([1, 2, -1, 0, 1, -3])


def queries(p, s):
    t = np.arange(T, dtype=np.float64)[:, None]
    i = np.arange(D, dtype=np.float64)[None, :]
    q = s * (2 + np.sin(0.37 * t)) * p[None, :] + 0.6 * np.cos(0.9 * t * (i + 1) + 0.4 * i)
    return q.astype(np.float32).astype(np.float64)


def filt(q):
    _, sv, vt = np.linalg.svd(q, full_matrices=False)
    u = vt[0]
    if (q @ u).mean() < 0:
        u = -u
    return u, sv


def show(name, v):
    print(f"{name}: " + ", ".join(f"{x:.7f}" for x in v))


if __name__ == "__main__":
    qa, qb, qc = queries(P_A, 1.0), queries(P_A, -1.0), queries(P_C, 1.0)
    ua, sa = filt(qa)
    ub, sb = filt(qb)
    uc, sc = filt(qc)
    show("A (s=+1, p_A)", ua)
    show("B (s=-1, p_A)", ub)
    show("C (s=+1, p_C)", uc)
    show("mean(A, C)   ", (ua + uc) / 2)
    print("singular value ratios s2/s1:", sa[1] / sa[0], sb[1] / sb[0], sc[1] / sc[0])
    print("cos(u_A, p_A) =", ua @ P_A, " cos(u_B, p_A) =", ub @ P_A)
