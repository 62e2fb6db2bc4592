#!/usr/bin/env python3
"""NumPy reference for ThinK's key-channel pruning (think=; tests/test_think.cpp pastes what this
prints between its `BEGIN think_reference` and `END think_reference` lines).

An independent implementation of the rule of Xu et al., "ThinK: Thinner Key Cache by Query-Driven
Pruning" (ICLR 2025), as documented in src/policies/think.cpp, written from the formula with
explicit d x d rotation matrices, not from the C++ code:
  - the prompt of S tokens is one step; Q_w = its last w queries of the KV head's g query heads,
    turned to their positions by the full RoPE matrix R(p) (pair i = (2i, 2i+1) interleaved,
    angle p * inv_freq[i]), stacked (w g rows); K = the head's S prompt keys (already rotated);
  - s_c = ||Q_w[:, c]|| * ||K[:, c]|| (np.linalg.norm over the rows), the Frobenius norm of the
    rank-1 matrix Q_w[:, c] K[:, c]^T;
  - keep D - floor(ratio * D) channels with the highest s_c (ties: the lower channel);
  - proxy (no queries): Q_w = the window rows' keys;
  - a decode token's key stays whole; a probe query q attends over all rows:
    o = softmax((q . k_r) / sqrt(D)) V with k_r's pruned channels zero.
  - bytes held (f32 rows): 4 * (S * kept + (n - S) * D + n * D) + 2 * kept.
Run with --check FILE to compare the printed block with the one pasted in FILE (ctest does).
Inputs (exact in fp32):
  key[t][h][c]   = (((7 t^2 + 13 t c + 31 h + 5 c^2 + 3) mod 29) - 14) / 8
  value[t][h][c] = (((3 t^2 + 11 t c + 17 h + 2 c^2 + 1) mod 23) - 11) / 8
  query[t][q][c] = (((5 t^2 + 3 t c + 19 q + 7 c^2 + 2) mod 31) - 15) / 8
  probe[q][c]    = (((3 q + 5 c + 1) mod 7) - 3) / 4
  inv_freq[i]    = theta^(-2 i / d) with theta = 50, rounded to fp32.
"""
import sys

import numpy as np

HKV, HQ, D, S, W, RATIO = 2, 4, 8, 6, 3, 0.5
G = HQ // HKV


def key(t, h, c):
    return ((7 * t * t + 13 * t * c + 31 * h + 5 * c * c + 3) % 29 - 14) / 8


def value(t, h, c):
    return ((3 * t * t + 11 * t * c + 17 * h + 2 * c * c + 1) % 23 - 11) / 8


def query(t, q, c):
    return ((5 * t * t + 3 * t * c + 19 * q + 7 * c * c + 2) % 31 - 15) / 8


def probe(q, c):
    return ((3 * q + 5 * c + 1) % 7 - 3) / 4


def inv_freq(theta=50.0):
    return np.array([np.float32(theta ** (-2.0 * i / D)) for i in range(D // 2)], dtype=np.float64)


def rope_matrix(p, freq):
    R = np.zeros((D, D))
    for i in range(D // 2):
        a, b = 2 * i, 2 * i + 1
        ang = p * freq[i]
        R[a, a], R[a, b], R[b, a], R[b, b] = np.cos(ang), -np.sin(ang), np.sin(ang), np.cos(ang)
    return R


def kept_channels(qw, k):
    s = np.linalg.norm(qw, axis=0) * np.linalg.norm(k, axis=0)
    n_keep = D - int(np.floor(RATIO * D))
    order = sorted(range(D), key=lambda c: (-s[c], c))
    return sorted(order[:n_keep]), s


def case(use_queries):
    freq = inv_freq()
    lines = []
    for h in range(HKV):
        K = np.array([[key(t, h, c) for c in range(D)] for t in range(S + 1)])  # + 1 decode row
        V = np.array([[value(t, h, c) for c in range(D)] for t in range(S + 1)])
        if use_queries:
            rows = []
            for g in range(G):
                for t in range(S - W, S):
                    qpre = np.array([query(t, h * G + g, c) for c in range(D)])
                    rows.append(rope_matrix(t, freq) @ qpre)
            qw = np.array(rows)
        else:
            qw = K[S - W:S]
        kept, s = kept_channels(qw, K[:S])
        mask = np.zeros(D)
        mask[kept] = 1.0
        Kp = K.copy()
        Kp[:S] *= mask  # the prompt rows pruned, the decode row whole
        outs = []
        for g in range(G):
            q = np.array([probe(h * G + g, c) for c in range(D)])
            z = Kp @ q / np.sqrt(D)
            p = np.exp(z - z.max())
            p /= p.sum()
            outs.append(p @ V)
        lines.append("  // head %d: scores %s" % (h, " ".join("%.4f" % x for x in s)))
        lines.append("  {%d, {%s}, {%s}}," % (
            h, ", ".join(str(c) for c in kept),
            ", ".join("%.9g" % x for o in outs for x in o)))
    kept_n = D - int(np.floor(RATIO * D))
    n = S + 1
    bytes_ = HKV * (4 * (S * kept_n + (n - S) * D + n * D) + 2 * kept_n)
    return lines, bytes_


def block():
    out = ["// BEGIN think_reference"]
    for use_queries in (True, False):
        lines, bytes_ = case(use_queries)
        out.append("// %s: {kv head, kept channels, probe outputs [G][D]}; kept_bytes %d" %
                   ("queries" if use_queries else "proxy (keys as queries)", bytes_))
        out.append("const RefHead k%sRef[] = {" % ("Queries" if use_queries else "Proxy"))
        out.extend(lines)
        out.append("};")
        out.append("constexpr std::int64_t k%sBytes = %d;" %
                   ("Queries" if use_queries else "Proxy", bytes_))
    out.append("// END think_reference")
    return out


def main():
    text = block()
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        src = open(sys.argv[2]).read().splitlines()
        try:
            a = src.index("// BEGIN think_reference")
            b = src.index("// END think_reference")
        except ValueError:
            print("think_reference: no BEGIN/END think_reference block in " + sys.argv[2])
            return 1
        pasted = src[a:b + 1]
        if pasted != text:
            print("think_reference: the block pasted in %s differs from this script's output:" %
                  sys.argv[2])
            print("\n".join(text))
            return 1
        print("think_reference: the pasted block matches")
        return 0
    print("\n".join(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
