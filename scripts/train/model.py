"""The task model in PyTorch: a Llama in the engine's llama2.c conventions, and its export.

Architecture (what the engine's llama2.c loader computes, engine/model/transformer.cpp):
  x = tok_emb[token]
  per layer: x += wo(attn(rope(wq(rms(x))), rope(wk(rms(x))), wv(rms(x))))      (GQA, causal)
             x += w2(silu(w1(rms(x))) * w3(rms(x)))
  logits = rms(x) @ tok_emb^T                                                     (tied)
RMSNorm: x * rsqrt(mean(x^2) + 1e-5) * weight. RoPE: llama2.c's interleaved pairs (2i, 2i+1)
of each head rotated by pos * 10000^(-2i / head_dim). Query head h reads KV head
h // (n_heads / n_kv_heads).

export_llama2c() writes the legacy v0 file: 7 int32 (dim, hidden_dim, n_layers, n_heads,
n_kv_heads, vocab_size, seq_len; a positive vocab_size means a tied classifier), then float32
tok_emb, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, freq_cis_real
[seq_len][head_dim/2], freq_cis_imag; each matrix [out][in], layers stacked per tensor.
"""

import array
import math
import os
import struct
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

EPS = 1e-5
HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


class Config:
    def __init__(self, dim=256, hidden_dim=768, n_layers=4, n_heads=4, n_kv_heads=2,
                 vocab_size=512, seq_len=4224):
        if dim % n_heads or n_heads % n_kv_heads or (dim // n_heads) % 2:
            raise ValueError(f"bad shape: dim {dim}, n_heads {n_heads}, n_kv_heads {n_kv_heads}")
        self.dim, self.hidden_dim, self.n_layers = dim, hidden_dim, n_layers
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.vocab_size, self.seq_len = vocab_size, seq_len
        self.head_dim = dim // n_heads

    def as_dict(self):
        return {k: getattr(self, k) for k in ("dim", "hidden_dim", "n_layers", "n_heads",
                                              "n_kv_heads", "vocab_size", "seq_len", "head_dim")}


def rope_tables(head_dim, n_pos, device=None):
    """cos, sin [n_pos, head_dim/2] in float32 (float64 math, as the tables are defined)."""
    i = torch.arange(0, head_dim, 2, dtype=torch.float64, device=device)
    freq = 1.0 / (10000.0 ** (i / head_dim))
    ang = torch.outer(torch.arange(n_pos, dtype=torch.float64, device=device), freq)
    return ang.cos().float(), ang.sin().float()


def _wide(x):
    """x in float32 at least (bf16/fp16 under autocast are widened; float64 stays)."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def apply_rope(x, cos, sin):
    """x [B, T, H, hd]; cos/sin [T, hd/2]: rotates pairs (2i, 2i+1)."""
    xf = _wide(x).reshape(*x.shape[:-1], -1, 2)
    x0, x1 = xf[..., 0], xf[..., 1]
    c = cos[None, :, None, :]
    s = sin[None, :, None, :]
    out = torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1)
    return out.reshape(x.shape).type_as(x)


class RMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = _wide(x)
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).type_as(x) * self.weight


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        hd = c.head_dim
        self.attention_norm = RMSNorm(c.dim)
        self.wq = nn.Linear(c.dim, c.n_heads * hd, bias=False)
        self.wk = nn.Linear(c.dim, c.n_kv_heads * hd, bias=False)
        self.wv = nn.Linear(c.dim, c.n_kv_heads * hd, bias=False)
        self.wo = nn.Linear(c.n_heads * hd, c.dim, bias=False)
        self.ffn_norm = RMSNorm(c.dim)
        self.w1 = nn.Linear(c.dim, c.hidden_dim, bias=False)
        self.w2 = nn.Linear(c.hidden_dim, c.dim, bias=False)
        self.w3 = nn.Linear(c.dim, c.hidden_dim, bias=False)

    def forward(self, x, cos, sin):
        c = self.c
        B, T, _ = x.shape
        h = self.attention_norm(x)
        q = apply_rope(self.wq(h).view(B, T, c.n_heads, c.head_dim), cos, sin)
        k = apply_rope(self.wk(h).view(B, T, c.n_kv_heads, c.head_dim), cos, sin)
        v = self.wv(h).view(B, T, c.n_kv_heads, c.head_dim)
        rep = c.n_heads // c.n_kv_heads
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H, T, hd]
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        if HAS_SDPA:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            s = (q @ k.transpose(-2, -1)) / math.sqrt(c.head_dim)
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            s = s.masked_fill(mask, float("-inf"))
            a = torch.softmax(_wide(s), dim=-1).type_as(q) @ v
        x = x + self.wo(a.transpose(1, 2).reshape(B, T, -1))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.tok_emb = nn.Embedding(c.vocab_size, c.dim)
        self.layers = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.norm = RMSNorm(c.dim)
        cos, sin = rope_tables(c.head_dim, c.seq_len)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def reset_parameters(self, std=0.02):
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(p)
            elif name.endswith("wo.weight") or name.endswith("w2.weight"):
                nn.init.normal_(p, 0.0, std / math.sqrt(2 * self.c.n_layers))
            else:
                nn.init.normal_(p, 0.0, std)

    def forward(self, tokens):
        """tokens [B, T] (T <= seq_len) -> logits [B, T, vocab]."""
        T = tokens.shape[1]
        if T > self.c.seq_len:
            raise ValueError(f"sequence of {T} tokens exceeds seq_len {self.c.seq_len}")
        x = self.tok_emb(tokens)
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        for layer in self.layers:
            x = layer(x, cos, sin)
        return F.linear(self.norm(x), self.tok_emb.weight)


def export_llama2c(model, path):
    """Writes the llama2.c legacy v0 file atomically (a temporary file, then a rename)."""
    c = model.c
    L = model.layers
    ts = [model.tok_emb.weight]
    ts += [l.attention_norm.weight for l in L]
    for name in ("wq", "wk", "wv", "wo"):
        ts += [getattr(l, name).weight for l in L]
    ts += [l.ffn_norm.weight for l in L]
    for name in ("w1", "w2", "w3"):
        ts += [getattr(l, name).weight for l in L]
    ts += [model.norm.weight]
    cos, sin = rope_tables(c.head_dim, c.seq_len)
    ts += [cos, sin]
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<7i", c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads,
                            c.vocab_size, c.seq_len))
        for t in ts:
            a = array.array("f", t.detach().to("cpu", torch.float32).reshape(-1).tolist())
            if sys.byteorder != "little":
                a.byteswap()
            f.write(a.tobytes())
    os.replace(tmp, path)


def load_llama2c(path, device="cpu"):
    """Reads a file export_llama2c wrote (for tests and re-evaluation)."""
    import numpy as np
    with open(path, "rb") as f:
        head = f.read(28)
        dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = struct.unpack("<7i", head)
        data = np.frombuffer(f.read(), dtype="<f4")
    c = Config(dim, hidden, n_layers, n_heads, n_kv, abs(vocab), seq_len)
    m = Llama(c)
    at = 0

    def take(shape):
        nonlocal at
        n = int(np.prod(shape))
        t = torch.from_numpy(data[at:at + n].copy()).view(*shape)
        at += n
        return t

    hd = c.head_dim
    with torch.no_grad():
        m.tok_emb.weight.copy_(take((vocab, dim)))
        for name, shape in (("attention_norm", (dim,)), ("wq", (n_heads * hd, dim)),
                            ("wk", (n_kv * hd, dim)), ("wv", (n_kv * hd, dim)),
                            ("wo", (dim, n_heads * hd)), ("ffn_norm", (dim,)),
                            ("w1", (hidden, dim)), ("w2", (dim, hidden)), ("w3", (hidden, dim))):
            for l in m.layers:
                mod = getattr(l, name)
                mod.weight.copy_(take(shape))
        m.norm.weight.copy_(take((dim,)))
    expected = at + 2 * seq_len * (hd // 2)
    if expected != data.size:
        raise ValueError(f"{path}: {data.size} floats after the header, expected {expected}")
    return m.to(device)
