#!/usr/bin/env python3
"""Fixtures for tests/bad_input3_test.sh (issue 33, the files and CLI part), written at test time
with the standard library only.

Usage: bad_input3_fixtures.py OUT_DIR

Writes, under OUT_DIR, tiny Hugging Face Llama checkpoints (config.json + model.safetensors,
hidden 8, 2 layers, vocab 512 so tok512.bin fits) that differ from a good one (hf_good) in one
way each:
  hf_extra_layer   a third layer's tensors with num_hidden_layers 2
  hf_q_bias        a q_proj bias in a Llama (attention_bias false)
  hf_misspelt      one extra tensor with a misspelt name ('weigth')
  hf_inv_freq      rotary_emb.inv_freq tables (harmless: must load)
  hf_theta         rope_theta 1e39 (inf as float32)
  hf_eps           rms_norm_eps 1e-46 (0 as float32)
  hf_factor_big    rope_scaling linear factor 1e39
  hf_factor_tiny   rope_scaling llama3 factor 1e-50
  hf_nan_bias      a Qwen2 checkpoint whose layer-1 k_proj bias holds a NaN
  hf_escape_name   an extra tensor whose name holds ESC, a newline and U+202E (RIGHT-TO-LEFT
                   OVERRIDE)
  hf_bidi_shard    an index naming a missing shard whose name holds U+202E
and meta_bomb.gguf: a GGUF file whose one metadata value is an array of 3,000,000 empty strings
(24 MB on disk, about 96 MB as parsed objects).
"""
import json
import os
import struct
import sys

DIM, HID, LAYERS, HEADS, VOCAB = 8, 16, 2, 2, 512
HEAD_DIM = DIM // HEADS


def config(**changes):
    c = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "attention_bias": False, "mlp_bias": False, "hidden_size": DIM,
        "intermediate_size": HID, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS, "max_position_embeddings": 64, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "rope_scaling": None, "tie_word_embeddings": True,
        "vocab_size": VOCAB, "bos_token_id": 1, "eos_token_id": 2,
    }
    c.update(changes)
    return c


def values(n, seed):
    # Small deterministic values in [-0.05, 0.05] (a linear congruential sequence).
    out, x = [], seed * 2654435761 % 2**32
    for _ in range(n):
        x = (1103515245 * x + 12345) % 2**31
        out.append((x / 2**31 - 0.5) * 0.1)
    return out


def layer_tensors(i, bias=False):
    p = "model.layers.%d." % i
    t = {
        p + "input_layernorm.weight": [DIM],
        p + "self_attn.q_proj.weight": [DIM, DIM],
        p + "self_attn.k_proj.weight": [DIM, DIM],
        p + "self_attn.v_proj.weight": [DIM, DIM],
        p + "self_attn.o_proj.weight": [DIM, DIM],
        p + "post_attention_layernorm.weight": [DIM],
        p + "mlp.gate_proj.weight": [HID, DIM],
        p + "mlp.up_proj.weight": [HID, DIM],
        p + "mlp.down_proj.weight": [DIM, HID],
    }
    if bias:
        for k in ("q", "k", "v"):
            t[p + "self_attn.%s_proj.bias" % k] = [DIM]
    return t


def tensors(layers=LAYERS, bias=False):
    t = {"model.embed_tokens.weight": [VOCAB, DIM], "model.norm.weight": [DIM]}
    for i in range(layers):
        t.update(layer_tensors(i, bias))
    return t


def write_safetensors(path, shapes, overrides=None):
    overrides = overrides or {}
    header, blobs, offset = {}, [], 0
    for seed, (name, shape) in enumerate(sorted(shapes.items())):
        n = 1
        for d in shape:
            n *= d
        vals = [1.0] * n if name.endswith("norm.weight") else values(n, seed + 1)
        for at, v in overrides.get(name, {}).items():
            vals[at] = v
        blob = struct.pack("<%df" % n, *vals)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def checkpoint(out, name, cfg, shapes, overrides=None):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    write_safetensors(os.path.join(d, "model.safetensors"), shapes, overrides)
    return d


def gguf_string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def meta_bomb(path, n_strings):
    # GGUF v3, no tensors, two metadata pairs: general.architecture and a huge string array.
    kv = gguf_string("general.architecture") + struct.pack("<I", 8) + gguf_string("llama")
    kv += gguf_string("bomb.strings") + struct.pack("<IIQ", 9, 8, n_strings)
    with open(path, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + kv)
        f.write(b"\0" * (8 * n_strings))  # n_strings empty strings (length 0)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    checkpoint(out, "hf_good", config(), tensors())
    extra = tensors(3)
    checkpoint(out, "hf_extra_layer", config(), extra)
    t = tensors()
    t["model.layers.0.self_attn.q_proj.bias"] = [DIM]
    checkpoint(out, "hf_q_bias", config(), t)
    t = tensors()
    t["model.layers.1.mlp.gate_proj.weigth"] = [HID, DIM]
    checkpoint(out, "hf_misspelt", config(), t)
    t = tensors()
    for i in range(LAYERS):
        t["model.layers.%d.self_attn.rotary_emb.inv_freq" % i] = [HEAD_DIM // 2]
    checkpoint(out, "hf_inv_freq", config(), t)
    checkpoint(out, "hf_theta", config(rope_theta=1e39), tensors())
    checkpoint(out, "hf_eps", config(rms_norm_eps=1e-46), tensors())
    checkpoint(out, "hf_factor_big", config(rope_scaling={"rope_type": "linear", "factor": 1e39}),
               tensors())
    checkpoint(out, "hf_factor_tiny", config(rope_scaling={
        "rope_type": "llama3", "factor": 1e-50, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32}), tensors())
    checkpoint(out, "hf_nan_bias", config(model_type="qwen2", use_sliding_window=False),
               tensors(bias=True),
               {"model.layers.1.self_attn.k_proj.bias": {3: float("nan")}})
    t = tensors()
    t["model.layers.0.\x1b[31mred\nline\u202eevil"] = [DIM]
    checkpoint(out, "hf_escape_name", config(), t)
    d = checkpoint(out, "hf_bidi_shard", config(), {})
    os.remove(os.path.join(d, "model.safetensors"))
    shard = "model-\u202egpj.exe-00001-of-00001.safetensors"
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"weight_map": {name: shard for name in tensors()}}, f)
    meta_bomb(os.path.join(out, "meta_bomb.gguf"), 3_000_000)


if __name__ == "__main__":
    main()
