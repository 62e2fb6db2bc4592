#!/usr/bin/env python3
"""`veloxquant bench kernels` (the roofline, src/eval/roofline/roofline.h): a --quick run's JSON
has the documented structure, every fraction is a finite positive number, and the FLOP and byte
counts at llama-110m's shape equal the counts derived by hand below (from the published shape
and ggml's block sizes, not from the tool). Bad --shape / --tokens / --out / --types / --context
give clear errors naming the flag and write nothing. No speed pass/fail.
Usage: bench_kernels_test.py VELOXQUANT_BINARY
"""
import json
import math
import os
import subprocess
import sys
import tempfile

BIN = sys.argv[1]
FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what)


def run(*args):
    return subprocess.run([BIN, "bench", "kernels", *args], capture_output=True, text=True,
                          timeout=600)


# llama-110m (llama2.c stories110M): dim 768, SwiGLU 2048, 12 layers, 12 heads, 12 KV heads,
# head_dim 64, vocabulary 32000.
DIM, FFN, LAYERS, KV_HEADS, HEAD_DIM, VOCAB = 768, 2048, 12, 12, 64, 32000
M = 16  # --quick's prompt tokens

# ggml's blocks (ggml-common.h): values per block, bytes per block.
BLOCKS = {"f32": (1, 4), "f16": (1, 2), "bf16": (1, 2), "q8_0": (32, 34), "q4_0": (32, 18),
          "q4_1": (32, 20), "q5_0": (32, 22), "q5_1": (32, 24), "q2_k": (256, 84),
          "q3_k": (256, 110), "q4_k": (256, 144), "q5_k": (256, 176), "q6_k": (256, 210)}
FLOAT_TYPES = {"f32", "f16", "bf16"}

# The distinct projection shapes (N out, K in) and their names, counted by hand.
PROJECTIONS = {("q", "k", "v", "o"): (768, 768), ("gate", "up"): (2048, 768),
               ("down",): (768, 2048), ("classifier",): (32000, 768)}
# 2 M N K, multiplied out by hand: 2*16*768*768, 2*16*2048*768, 2*16*768*2048, 2*16*32000*768.
PREFILL_FLOPS = {("q", "k", "v", "o"): 18874368, ("gate", "up"): 50331648,
                 ("down",): 50331648, ("classifier",): 786432000}
# A whole forward: per layer 4 * 768^2 + 3 * 2048 * 768 = 7,077,888 weights, times 12 layers,
# plus the 24,576,000 of the classifier = 109,510,656; times 2 M = 32.
FORWARD_FLOPS = 3504340992
# Bytes the kernels read per head and position for D = 64 (groups of 32): f16 keys and values
# 128 + 128 and a 4-byte position; q8_0 64 codes + 2 fp16 scales (4 bytes), twice, + 4; q4_0 32
# + 4, twice, + 4; kivi2 keys 16 code bytes + 64 channels x (scale, zero) x 2 bytes / 32 tokens
# = 8, values 16 + 2 groups x (scale, zero) x 2 bytes = 8, + 4; kivi4 32 + 8 + 32 + 8 + 4.
ATTN_BYTES_PER_POSITION = {"f16": 260, "q8_0": 140, "q4_0": 76, "kivi2": 52, "kivi4": 84}

PEAK_NAMES = ["fma_avx2", "fma_avx512", "muladd_avx2", "vnni_avx512", "vnni_avx", "bf16_avx512",
              "amx_int8", "amx_bf16", "read_bw"]


def finite_positive(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def main():
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "k.json")
        r = run("--quick", "--quiet", "--out", out)
        check(r.returncode == 0, f"--quick run exits 0 (got {r.returncode}: {r.stderr[-2000:]})")
        if r.returncode != 0:
            return
        check("wrote " + out in r.stdout, "the table ends with the written file")
        check("Packed-KV attention" in r.stdout and "peak" in r.stdout, "a readable table")
        doc = json.load(open(out))

        # The envelope, the CPU and the settings.
        check(doc.get("schema") == "veloxquant.results/1", "schema")
        check(doc.get("kind") == "kernels", "kind kernels")
        check("bench kernels --quick" in doc.get("command", ""), "the command is recorded")
        s = doc["settings"]
        check(s["shape"] == "llama-110m" and s["tokens"] == M and s["quick"] is True,
              "settings: the default shape, --quick's 16 tokens")
        check(s["types"] == list(BLOCKS), "every weight type, in the engine's order")
        check(s["contexts"] == [512, 2048], "--quick's attention positions")
        threads = s["threads"]
        check(isinstance(threads, int) and threads >= 1, "thread count")
        cpu = doc["cpu"]
        check(isinstance(cpu["model"], str) and cpu["model"], "CPU model")
        check(isinstance(cpu["features"], list), "CPU features")

        # Peaks: every one named, each absent with a reason or measured at 1 and T threads.
        peaks = {p["name"]: p for p in doc["peaks"]}
        check(list(peaks) == PEAK_NAMES, f"peaks in order (got {list(peaks)})")
        for name, p in peaks.items():
            if p["available"]:
                want = {"1", str(threads)}
                check(set(p["per_threads"]) == want, f"{name}: measured at {sorted(want)}")
                check(all(finite_positive(v) for v in p["per_threads"].values()),
                      f"{name}: finite positive rates")
            else:
                check(p["note"].startswith("not available"), f"{name}: says why it is absent")
                check(p["per_threads"] == {}, f"{name}: absent, so no rate")
        check(peaks["read_bw"]["available"], "bandwidth is always measured")
        # The family reported present is the family measured (AVX2 with FMA on any x86-64 that
        # runs the engine's AVX2 kernels).
        has = lambda f: any(x.startswith(f) for x in cpu["features"])
        check(peaks["fma_avx2"]["available"] == (has("avx2") and has("fma")), "fma_avx2 iff AVX2+FMA")
        check(peaks["vnni_avx512"]["available"] == has("avx512_vnni"), "vnni_avx512 iff AVX512_VNNI")
        check(peaks["bf16_avx512"]["available"] == has("avx512_bf16"), "bf16_avx512 iff AVX512_BF16")
        check(peaks["amx_int8"]["available"] == ("amx_tile (OS grants tiles)" in cpu["features"]
                                                 and has("amx_int8")), "amx_int8 iff AMX granted")

        # Rows: every fraction finite and positive, every count equal to the hand counts.
        rows = doc["rows"]
        for row in rows:
            tag = f"{row['kind']} {row.get('type', row.get('format'))}"
            check(finite_positive(row.get("fraction")), f"{tag}: fraction {row.get('fraction')}")
            check(finite_positive(row.get("rate")) and finite_positive(row.get("time_s")),
                  f"{tag}: rate and time")
            check(finite_positive(row.get("peak_value")) and isinstance(row.get("peak"), str),
                  f"{tag}: the peak used is named")
            check(abs(row["fraction"] - row["rate"] / row["peak_value"]) <= 1e-9 * row["fraction"],
                  f"{tag}: fraction = rate / peak")
        kinds = [r["kind"] for r in rows]
        check(kinds.count("prefill") == 13 * 4 and kinds.count("decode") == 13 * 4,
              "one prefill and one decode row per type and distinct projection")
        check(kinds.count("prefill_forward") == 13 and kinds.count("decode_forward") == 13,
              "a whole-forward row per type")
        check(kinds.count("attention") == 5 * 2, "five row formats at two contexts")
        for row in rows:
            if row["kind"] in ("prefill", "decode"):
                names = tuple(row["projections"])
                check(names in PROJECTIONS, f"projection group {names}")
                if names not in PROJECTIONS:
                    continue
                N, K = PROJECTIONS[names]
                check((row["N"], row["K"]) == (N, K), f"{names}: N x K")
                block, block_bytes = BLOCKS[row["type"]]
                if row["kind"] == "prefill":
                    check(row["M"] == M and row["flops"] == PREFILL_FLOPS[names],
                          f"prefill {row['type']} {names}: flops {row['flops']}")
                    is_float = row["type"] in FLOAT_TYPES
                    check(row["path"] == ("float" if is_float else "integer"),
                          f"prefill {row['type']}: path")
                    fam = ("fma_avx2", "fma_avx512") if is_float else ("vnni_avx512", "vnni_avx")
                    if not is_float and not any(peaks[f]["available"] for f in fam):
                        fam = ("fma_avx2", "fma_avx512")
                    check(row["peak"] in fam, f"prefill {row['type']}: peak {row['peak']}")
                    best = max(peaks[f]["per_threads"].get(str(threads), 0) for f in fam)
                    check(row["peak_value"] == best, f"prefill {row['type']}: the best of {fam}")
                else:
                    check(row["M"] == 1 and row["bytes"] == N * (K // block) * block_bytes,
                          f"decode {row['type']} {names}: bytes {row['bytes']}")
                    check(row["peak"] == "read_bw", "decode: against the read bandwidth")
            elif row["kind"] == "prefill_forward":
                check(row["flops"] == FORWARD_FLOPS and row["layers"] == LAYERS,
                      f"whole-forward flops {row['flops']}")
            elif row["kind"] == "attention":
                n = row["positions"]
                per = ATTN_BYTES_PER_POSITION[row["format"]] * n
                check(row["bytes_per_head"] == per, f"attention {row['format']} {n}: bytes/head")
                check(row["bytes"] == per * row["heads"], f"attention {row['format']}: bytes")
                check(row["head_dim"] == HEAD_DIM and row["queries_per_head"] == 1,
                      "attention: D and queries per KV head")
                check(1 <= row["heads"] <= LAYERS * KV_HEADS, "attention: heads of one step")
                check(row["peak"] == "read_bw", "attention: against the read bandwidth")

        # Errors: clear, naming the flag, nothing written.
        bad_out = os.path.join(tmp, "bad.json")
        base = ["--quick", "--quiet"]  # each case fails before any measurement
        cases = [
            (["--shape", "llama-9000"], "--shape", "unknown model shape 'llama-9000'"),
            (["--tokens", "0"], "--tokens", "got 0"),
            (["--tokens", "many"], "--tokens", "got 'many'"),
            (["--types", "q9_0"], "--types", "got 'q9_0'"),
            (["--context", "100"], "--context", "got 100"),
            # Qwen2.5-0.5B's rows of 896 values are not whole 256-value K-quant blocks.
            (["--shape", "qwen2.5-0.5b", "--types", "f16,q4_k"], "--types",
             "rows of 896 values, not a multiple of q4_k's 256-value blocks"),
        ]
        for extra, flag, detail in cases:
            r = run(*base, *extra, "--out", bad_out)
            msg = r.stderr
            check(r.returncode == 2, f"{extra}: exit 2 (got {r.returncode})")
            check(flag in msg and detail in msg, f"{extra}: message names {flag}: {msg!r}")
            check(not os.path.exists(bad_out), f"{extra}: nothing written")
        r = run(*base, "--out", tmp)  # a directory
        check(r.returncode == 2 and "--out" in r.stderr and "directory" in r.stderr,
              f"--out DIR: {r.stderr!r}")
        r = run(*base, "--out", "")
        check(r.returncode == 2 and "--out" in r.stderr, f"--out '': {r.stderr!r}")


if __name__ == "__main__":
    main()
    if FAILURES:
        print(f"{len(FAILURES)} check(s) failed")
        sys.exit(1)
    print("bench kernels: all checks passed")
