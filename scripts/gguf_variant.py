#!/usr/bin/env python3
"""Rewrites an F32 `llama` GGUF (e.g. stories260K from `veloxquant convert`) as a variant that
exercises one architecture feature, for scripts/crosscheck_llamacpp.sh (llama.cpp and
VeloxQuant must compute the same function of the same file):

  gguf_variant.py IN.gguf OUT.gguf qwen2    architecture 'qwen2' (rotate-half RoPE) with random
                                            q/k/v biases (uniform in [-0.3, 0.3), seed 5)
  gguf_variant.py IN.gguf OUT.gguf freqs    Llama 3 style 'rope_freqs.weight' = 1, 2, 4, 8, ...
                                            (head_dim / 2 values, powers of two)
  gguf_variant.py IN.gguf OUT.gguf linear   'llama.rope.scaling.type' = linear, factor 4

Reads GGUF v2/v3 (F32 tensors only), writes v3 with 32-byte alignment. Python standard library
only."""
import struct, sys
src, dst, mode = sys.argv[1], sys.argv[2], sys.argv[3]
b = open(src, 'rb').read()
p = 0
def rd(fmt):
    global p
    v = struct.unpack_from('<' + fmt, b, p); p += struct.calcsize('<' + fmt); return v[0]
def rstr():
    global p
    n = rd('Q'); s = b[p:p+n]; p += n; return s
SZ = {0:'B',1:'b',2:'H',3:'h',4:'I',5:'i',6:'f',7:'?',10:'Q',11:'q',12:'d'}
def rval(t):
    global p
    if t == 8: return rstr()
    if t == 9:
        et = rd('I'); n = rd('Q'); return (et, [rval(et) for _ in range(n)])
    return rd(SZ[t])
assert b[:4] == b'GGUF'; p = 4
ver = rd('I'); nt = rd('Q'); nkv = rd('Q')
kvs = []
for _ in range(nkv):
    k = rstr(); t = rd('I'); kvs.append((k, t, rval(t)))
tens = []
for _ in range(nt):
    name = rstr(); nd = rd('I'); dims = [rd('Q') for _ in range(nd)]; ty = rd('I'); off = rd('Q')
    tens.append([name, dims, ty, off])
align = 32
start = (p + align - 1) // align * align
def nbytes(t):
    n = 1
    for d in t[1]: n *= d
    assert t[2] == 0; return 4 * n
datas = [b[start + t[3]: start + t[3] + nbytes(t)] for t in tens]
# rename
out_kv = []
for k, t, v in kvs:
    if mode == 'qwen2' and k == b'general.architecture': v = b'qwen2'
    if mode == 'qwen2' and k.startswith(b'llama.'): k = b'qwen2.' + k[6:]
    out_kv.append((k, t, v))
import random
random.seed(5)
L = sum(1 for t in tens if t[0].endswith(b'.attn_norm.weight'))
qd = [t for t in tens if t[0] == b'blk.0.attn_q.weight'][0][1][1]
kvd = [t for t in tens if t[0] == b'blk.0.attn_k.weight'][0][1][1]
if mode == 'linear':
    out_kv.append((b'llama.rope.scaling.type', 8, b'linear')); out_kv.append((b'llama.rope.scaling.factor', 6, 4.0))
if mode == 'freqs':
    hd = [kv for kv in out_kv if kv[0].endswith(b'.rope.dimension_count')][0][2]
    tens.append([b'rope_freqs.weight', [hd // 2], 0, 0])
    datas.append(struct.pack('<%df' % (hd // 2), *[float(2 ** (i % 4)) for i in range(hd // 2)]))
for l in range(L if mode == 'qwen2' else 0):
    for nm, n in ((b'attn_q.bias', qd), (b'attn_k.bias', kvd), (b'attn_v.bias', kvd)):
        vals = [random.uniform(-0.3, 0.3) for _ in range(n)]
        tens.append([b'blk.%d.' % l + nm, [n], 0, 0]); datas.append(struct.pack('<%df' % n, *vals))
def wstr(s): return struct.pack('<Q', len(s)) + s
def wval(t, v):
    if t == 8: return wstr(v)
    if t == 9:
        et, arr = v; return struct.pack('<IQ', et, len(arr)) + b''.join(wval(et, x) for x in arr)
    return struct.pack('<' + SZ[t], v)
o = bytearray(b'GGUF' + struct.pack('<IQQ', ver, len(tens), len(out_kv)))
for k, t, v in out_kv: o += wstr(k) + struct.pack('<I', t) + wval(t, v)
off = 0; offs = []
for t, d in zip(tens, datas):
    offs.append(off); off += (len(d) + align - 1) // align * align
for t, o_ in zip(tens, offs):
    o += wstr(t[0]) + struct.pack('<I', len(t[1])) + b''.join(struct.pack('<Q', d) for d in t[1]) + struct.pack('<IQ', t[2], o_)
while len(o) % align: o += b'\0'
for d in datas:
    o += d
    while len(o) % align: o += b'\0'
open(dst, 'wb').write(o)
