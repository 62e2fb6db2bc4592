#!/usr/bin/env bash
# VeloxQuant and llama.cpp side by side on the same GGUF files of every common weight type.
#
#   bench/peers/run_types.sh [--types f16,q8_0,q4_0,q4_k_m,q5_k_m,q6_k] [--contexts 1024]
#                            [--threads 1,2] [--reps 1] [--steps 16] [--out FILE.json]
#
# llama-110m's deterministic random weights (`veloxquant make-model`, seed 1, f16) converted to
# GGUF f16 and q8_0 by `veloxquant convert` (Llama 2's 32000-piece vocabulary), and to q4_0,
# q4_k_m, q5_k_m, q6_k by llama.cpp's own quantizer (llama_model_quantize, npm prebuilt, through
# bench/peers/llamacpp/llamacpp_driver.c). Per type, context N and thread count T, REPS rounds of
# two processes, alternating: llama.cpp (driver `bench`: prefill N tokens in batches of 512,
# f16 KV cache, then STEPS greedy decode steps) and `veloxquant bench decode --method full
# --prefill-real` (prefill in chunks of 64, f16 KV storage by default, STEPS steps). Reported:
# the median decode step (ms/token) and the prefill throughput (tokens/s) of each, and their
# ratios. Files are kept in build/peers/types/. Never part of the unit tests.
set -uo pipefail
cd "$(dirname "$0")/../.."
types=f16,q8_0,q4_0,q4_k_m,q5_k_m,q6_k
contexts=1024
threads=1,2
reps=1
steps=16
out=results/decode/peers_types.json
while [ $# -gt 0 ]; do
  case $1 in
    --types) types=$2; shift 2 ;;
    --contexts) contexts=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "run_types: unknown argument '$1' (see the header of $0)" >&2; exit 1 ;;
  esac
done
driver=$(bench/peers/llamacpp/setup.sh) || { echo "run_types: llama.cpp is unavailable" >&2; exit 0; }
export LLAMACPP_LIB_DIR
LLAMACPP_LIB_DIR=$(cd build/llamacpp/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64 && pwd)
vq=build/veloxquant
vqx=build/bench/peers/llamacpp/vq_crosscheck
files=build/peers/types
mkdir -p "$files"
[ -f "$files/l110-f16/model.safetensors" ] ||
  "$vq" make-model --shape llama-110m --dtype f16 --out "$files/l110-f16" >&2 || exit 1
[ -f "$files/spm.bin" ] || "$vqx" tokenizer-bin data/ggml-vocab-llama-spm.gguf "$files/spm.bin" || exit 1
for ty in ${types//,/ }; do
  f=$files/l110-$ty.gguf
  [ -f "$f" ] && continue
  case $ty in
    f16 | q8_0 | f32 | bf16)
      "$vq" convert --from "$files/l110-f16" --to "$f" --type "$ty" --tokenizer "$files/spm.bin" >&2 || exit 1 ;;
    *)
      [ -f "$files/l110-f16.gguf" ] ||
        "$vq" convert --from "$files/l110-f16" --to "$files/l110-f16.gguf" --type f16 --tokenizer "$files/spm.bin" >&2 || exit 1
      "$driver" quantize "$files/l110-f16.gguf" "$f" "$ty" >/dev/null 2>&1 || { echo "run_types: quantize $ty failed" >&2; exit 1; } ;;
  esac
done
samples=$(mktemp)
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for n in ${contexts//,/ }; do
  for t in ${threads//,/ }; do
    for r in $(seq 1 "$reps"); do
      for ty in ${types//,/ }; do
        f=$files/l110-$ty.gguf
        line=$("$driver" bench "$f" "$n" "$t" f16 "$steps" 2) || { echo "run_types: llama.cpp bench failed" >&2; exit 1; }
        ms=$(sed -n 's/.*median \([0-9.]*\) ms.*/\1/p' <<<"$line")
        pf=$(sed -n 's/.*prefill \([0-9.]*\) s.*/\1/p' <<<"$line")
        printf 'llama.cpp\t%s\t%s\t%s\t%s\t%s\t%s\n' "$ty" "$n" "$t" "$r" "$ms" "$pf" >>"$samples"
        "$vq" bench decode --model "$f" --context "$n" --threads "$t" --method full --steps "$steps" \
          --warmup 2 --prefill-real --bandwidth-mib 16 --quiet --json "$samples.vq.json" >/dev/null ||
          { echo "run_types: veloxquant bench decode failed" >&2; exit 1; }
        python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["rows"][0]; print("veloxquant\t%s\t%s\t%s\t%s\t%r\t%r\t%d" % (sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], r["ms_per_token"], r["fill_ms"] / 1e3, r["peak_rss_bytes"]))' \
          "$samples.vq.json" "$ty" "$n" "$t" "$r" >>"$samples"
        tail -2 "$samples" | tr '\t' ' ' >&2
      done
    done
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
python3 - "$samples" "$out" "$load_before" "$load_after" "$types" "$contexts" "$threads" "$reps" "$steps" <<'PY'
import json, statistics, sys, os, subprocess
samples, out, lb, la, types, contexts, threads, reps, steps = sys.argv[1:]
rows = {}
for line in open(samples):
    f = line.rstrip("\n").split("\t")
    key = (f[1], int(f[2]), int(f[3]))
    rows.setdefault(key, {}).setdefault(f[0], []).append((float(f[5]), float(f[6])))
table = []
for (ty, n, t), by in sorted(rows.items()):
    lc, vq = by.get("llama.cpp", []), by.get("veloxquant", [])
    lms = statistics.median(x[0] for x in lc); vms = statistics.median(x[0] for x in vq)
    lpf = n / statistics.median(x[1] for x in lc); vpf = n / statistics.median(x[1] for x in vq)
    table.append({"type": ty, "context": n, "threads": t,
                  "llamacpp_ms_per_token": lms, "veloxquant_ms_per_token": vms,
                  "decode_speed_ratio_vq_over_llamacpp": lms / vms,
                  "llamacpp_prefill_tok_s": lpf, "veloxquant_prefill_tok_s": vpf,
                  "prefill_speed_ratio_vq_over_llamacpp": vpf / lpf})
flags = open("/proc/cpuinfo").read()
doc = {"kind": "peers_types", "model": "llama-110m (make-model seed 1, random weights)",
       "command": f"bench/peers/run_types.sh --types {types} --contexts {contexts} --threads {threads} --reps {reps} --steps {steps}",
       "machine": {"cpu_flags": [x for x in ("avx2", "avx512f", "avx512_vnni", "avx_vnni") if f" {x} " in flags],
                   "shared": "shared with other engineers' builds while measured",
                   "load_average_before": lb, "load_average_after": la},
       "llamacpp": "npm @node-llama-cpp/linux-x64@3.22.1 prebuilt, through bench/peers/llamacpp/llamacpp_driver.c bench (f16 KV, prefill batches of 512)",
       "veloxquant": "bench decode --method full --prefill-real (chunks of 64)",
       "rows": table}
os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
json.dump(doc, open(out, "w"), indent=1)
print(f"{'type':8} {'ctx':>5} {'thr':>3} {'lc ms/tok':>10} {'vq ms/tok':>10} {'decode x':>8} {'lc pp tok/s':>11} {'vq pp tok/s':>11} {'prefill x':>9}")
for r in table:
    print(f"{r['type']:8} {r['context']:>5} {r['threads']:>3} {r['llamacpp_ms_per_token']:>10.2f} {r['veloxquant_ms_per_token']:>10.2f} {r['decode_speed_ratio_vq_over_llamacpp']:>8.2f} {r['llamacpp_prefill_tok_s']:>11.1f} {r['veloxquant_prefill_tok_s']:>11.1f} {r['prefill_speed_ratio_vq_over_llamacpp']:>9.2f}")
PY
rm -f "$samples" "$samples.vq.json"
