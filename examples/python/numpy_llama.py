#!/usr/bin/env python3
"""A Llama forward pass in NumPy whose KV cache lives in VeloxQuant caches.

Why use VeloxQuant from Python: the model code stays yours (here: 60 lines of NumPy reading a
llama2.c checkpoint), and any of the library's KV-cache compression methods drops in as the
cache, one LayerCache per layer. The attention runs over the rows the cache hands back (the
kept rows plus the new one) and the probabilities go back to the cache, so attention-scored
methods (h2o:source=attention, ...) see real attention.

The script reads the shipped stories260K model and a text teacher-forced, one token per step,
and reproduces `veloxquant eval`'s perplexity for each method (computed by veloxquant.eval, the
same code as the CLI). The two forwards differ only in float32 rounding order; with fp16 cache
storage (the default) that occasionally flips a key's fp16 rounding, so the perplexities agree
to a relative 5e-4 (default --rtol), and to ~1e-7 with kv_dtype=f32.

    PYTHONPATH=build/python /usr/bin/python3 examples/python/numpy_llama.py --tokens 256
"""

import argparse
import pathlib
import sys

import numpy as np

import veloxquant as vq

DATA = pathlib.Path(__file__).resolve().parents[2] / "data"


# ---- The llama2.c checkpoint, read with NumPy ------------------------------------------------

class Llama:
    """llama2.c legacy format: 7 int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads,
    vocab_size, seq_len; a negative vocab_size means an untied classifier), then float32
    weights, every matrix [out][in]."""

    def __init__(self, path):
        raw = np.fromfile(path, dtype=np.int32, count=7)
        dim, hidden, n_layers, n_heads, n_kv_heads, vocab, seq_len = (int(x) for x in raw)
        tied = vocab > 0
        vocab = abs(vocab)
        self.dim, self.n_layers, self.n_heads, self.n_kv_heads = dim, n_layers, n_heads, n_kv_heads
        self.vocab, self.seq_len = vocab, seq_len
        self.head_dim = hd = dim // n_heads
        w = np.fromfile(path, dtype=np.float32, offset=7 * 4)
        at = 0

        def take(*shape):
            nonlocal at
            n = int(np.prod(shape))
            out = w[at:at + n].reshape(shape)
            at += n
            return out

        L, kv = n_layers, n_kv_heads * hd
        self.embedding = take(vocab, dim)      # [vocab][dim]
        self.attn_norm = take(L, dim)          # [L][dim]
        self.wq = take(L, dim, dim)            # [L][Hq*D][dim]
        self.wk = take(L, kv, dim)             # [L][Hkv*D][dim]
        self.wv = take(L, kv, dim)             # [L][Hkv*D][dim]
        self.wo = take(L, dim, dim)            # [L][dim][Hq*D]
        self.ffn_norm = take(L, dim)           # [L][dim]
        self.w1 = take(L, hidden, dim)         # [L][hidden][dim] gate
        self.w2 = take(L, dim, hidden)         # [L][dim][hidden] down
        self.w3 = take(L, hidden, dim)         # [L][hidden][dim] up
        self.final_norm = take(dim)            # [dim]
        take(seq_len, hd // 2)                 # the legacy RoPE tables (unused)
        take(seq_len, hd // 2)
        self.classifier = self.embedding if tied else take(vocab, dim)
        # RoPE, llama2.c pairing: dims (2i, 2i+1) rotate by pos * 10000^(-2i/D), in fp32 as
        # run.c computes it.
        f32 = np.float32
        freq = f32(1) / np.power(f32(10000), np.arange(0, hd, 2, dtype=f32) / f32(hd))  # [D/2]
        angle = np.arange(seq_len, dtype=f32)[:, None] * freq[None, :]   # [seq_len][D/2]
        self.rope_cos = np.cos(angle)
        self.rope_sin = np.sin(angle)


def rmsnorm(x, weight, eps=1e-5):
    return (x / np.sqrt(np.mean(x * x, dtype=np.float32) + np.float32(eps))) * weight


def rope(x, cos, sin):
    """x: [heads][D]; rotates each (even, odd) pair."""
    even, odd = x[:, 0::2], x[:, 1::2]
    out = np.empty_like(x)
    out[:, 0::2] = even * cos - odd * sin
    out[:, 1::2] = even * sin + odd * cos
    return out


# ---- The forward pass over VeloxQuant caches -------------------------------------------------

def forward(m, token, pos, caches):
    """Logits [vocab] for `token` at `pos`; each layer's K/V go through caches.layer(l)."""
    Hq, Hkv, D = m.n_heads, m.n_kv_heads, m.head_dim
    group = Hq // Hkv
    x = m.embedding[token].copy()                                              # [dim]
    for l in range(m.n_layers):
        xb = rmsnorm(x, m.attn_norm[l])
        q = rope((m.wq[l] @ xb).reshape(Hq, D), m.rope_cos[pos], m.rope_sin[pos])   # [Hq][D]
        k = rope((m.wk[l] @ xb).reshape(Hkv, D), m.rope_cos[pos], m.rope_sin[pos])  # [Hkv][D]
        v = (m.wv[l] @ xb).reshape(Hkv, D)                                          # [Hkv][D]

        cache = caches.layer(l)
        # The new row goes in as [B=1, Hkv, S=1, D]; the view holds the kept rows + this one.
        view = cache.begin_step(k[None, :, None, :], v[None, :, None, :])
        probs = np.zeros((1, Hq, 1, view.n_rows), np.float32)                  # [B][Hq][S][R]
        att_out = np.empty((Hq, D), np.float32)
        for h in range(Hkv):
            keys = view.keys(0, h).astype(np.float32)      # [n][D], read from cache storage
            values = view.values(0, h).astype(np.float32)  # [n][D]; n <= R (head-wise budgets)
            for qh in range(h * group, (h + 1) * group):
                scores = keys @ q[qh] / np.float32(np.sqrt(D))                 # [n]
                p = np.exp(scores - scores.max())
                p /= p.sum()
                probs[0, qh, 0, :len(p)] = p  # columns past this head's rows stay 0
                att_out[qh] = p @ values
        cache.end_step(probs)  # methods with source=attention rank rows by these

        x = x + m.wo[l] @ att_out.reshape(-1)
        xb = rmsnorm(x, m.ffn_norm[l])
        gate, up = m.w1[l] @ xb, m.w3[l] @ xb
        x = x + m.w2[l] @ (gate / (1.0 + np.exp(-gate)) * up)
    return m.classifier @ rmsnorm(x, m.final_norm)


def perplexity(m, tokens, config):
    """Teacher-forced: exp(mean NLL of token t+1 given tokens 0..t), one token per step."""
    caches = vq.ModelCache(config, m.n_layers, m.n_kv_heads, m.head_dim, m.n_heads)
    nll = []
    for pos in range(len(tokens) - 1):
        logits = forward(m, tokens[pos], pos, caches).astype(np.float64)
        top = logits.max()
        log_z = top + np.log(np.exp(logits - top).sum())
        nll.append(log_z - logits[tokens[pos + 1]])
    return float(np.exp(np.mean(nll))), caches.stats()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(DATA / "stories260K.bin"))
    ap.add_argument("--tokenizer", default=str(DATA / "tok512.bin"))
    ap.add_argument("--text", default=str(DATA / "tinystories_validation_excerpt.txt"))
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--budget", type=int, default=32)
    ap.add_argument("--method", action="append",
                    help="method specs (default: full, streaming_llm, h2o:source=attention)")
    ap.add_argument("--rtol", type=float, default=5e-4,
                    help="relative tolerance against veloxquant eval's perplexity (fp16 caches: "
                         "a key that differs in its last fp32 bit can round to a different fp16 "
                         "value, which moves single NLLs by up to ~2e-3; with kv_dtype=f32 the "
                         "two agree to ~1e-7)")
    args = ap.parse_args()
    methods = args.method or ["full", "streaming_llm", "h2o:source=attention"]

    model = Llama(args.model)
    tokenizer = vq.Tokenizer.load(vq.Model.load(args.model), args.tokenizer)
    tokens = tokenizer.encode(pathlib.Path(args.text).read_text())[:args.tokens]

    # The CLI's numbers (veloxquant.eval runs the same code as `veloxquant eval`).
    reference = vq.eval(args.model, args.text, tokenizer=args.tokenizer, tokens=args.tokens,
                        methods=methods, budgets=[args.budget])
    cli_ppl = {row["method"]: row["ppl"] for row in reference["rows"]}

    ok = True
    print(f"{'method':44s} {'numpy ppl':>10s} {'eval ppl':>10s} {'rel diff':>9s}  kept/ratio")
    for spec in methods:
        config = vq.CacheConfig.parse(spec)
        if config.token_budget is not None:
            config = config.with_token_budget(args.budget)
        ppl, stats = perplexity(model, tokens, config)
        ref = cli_ppl[config.spec()]
        rel = abs(ppl - ref) / ref
        ok &= rel <= args.rtol
        print(f"{config.spec():44s} {ppl:10.5f} {ref:10.5f} {rel:9.1e}  "
              f"{stats['tokens_kept']}/{stats['tokens_seen']} {stats['compression_ratio']:.2f}x")
    print("numpy_llama: " + ("matches veloxquant eval" if ok else f"MISMATCH beyond rtol {args.rtol}"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
