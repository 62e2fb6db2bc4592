#!/usr/bin/env bash
# VeloxQuant and llama.cpp side by side: decode speed on the very same GGUF file.
#
#   bench/peers/run_llamacpp.sh [--shape NAME] [--weights f16[,q8_0]] [--contexts 1024,4096]
#                               [--threads 1,2] [--reps 3] [--steps 16] [--budget 512]
#                               [--out results/decode/peers.json] [--samples FILE]
#                               [--methods full,kivi,full:kv_dtype=q8_0]
#
# 1. Installs llama.cpp from npm (bench/peers/llamacpp/setup.sh; without npm or the registry it
#    says so and exits 0) and builds VeloxQuant (scripts/build.sh).
# 2. Writes the shape's deterministic random weights (`veloxquant make-model`, seed 1, f16) and
#    converts them to one GGUF file per weight type (`veloxquant convert --type`), with Llama 2's
#    SentencePiece vocabulary (data/ggml-vocab-llama-spm.gguf, 32000 ids) so llama.cpp loads it.
#    Files are kept in build/peers/ and reused.
# 3. Per weight type, context N and thread count T: REPS rounds of four processes, alternating
#    (A B C D A B C D ...): llama.cpp with an f16, a q8_0 and a q4_0 KV cache (-ctk/-ctv; all
#    bench/peers/llamacpp/llamacpp_driver.c `bench`), and `veloxquant bench decode` with every
#    method (the full cache, fp16 storage, the compressed ones at --budget, and the full cache
#    in ggml's q8_0 / q4_0 blocks, kv_dtype=, the same KV types as llama.cpp's). Each process
#    loads the file, prefills N real tokens through its own forward (llama.cpp: batches of 512;
#    VeloxQuant: --prefill-real, chunks of 64, the methods compressing as the prompt arrives),
#    runs 2 untimed and STEPS timed greedy decode steps on T threads, and reports its median
#    step. What is timed is one decode step (one token through the model, attention over the
#    cache, the method's cache work, argmax); loading and prefill are not. A row's figure is the
#    median over the REPS rounds.
#    --methods (comma-separated specs) replaces VeloxQuant's method list.
# 4. Writes OUT (docs/results.md, kind `peers`; bench/peers/peers_json.py) and prints a table.
#    --samples FILE keeps the raw per-round samples (tab-separated, see peers_json.py), so runs
#    of separate contexts or thread counts can be combined with peers_json.py.
# The lead re-runs it after matmul changes: `--weights f16,q8_0` adds the Q8_0 comparison.
# Never part of the unit tests. Exit status 1 when a step fails.
set -uo pipefail
cd "$(dirname "$0")/../.."

shape=llama-110m
weights=f16
contexts=1024,4096
threads=1,2
reps=3
steps=16
budget=512
methods=(full streaming_llm h2o kivi full:kv_dtype=q8_0 full:kv_dtype=q4_0)
out=results/decode/peers.json
keep_samples=
while [ $# -gt 0 ]; do
  case $1 in
    --shape) shape=$2; shift 2 ;;
    --weights) weights=$2; shift 2 ;;
    --contexts) contexts=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --samples) keep_samples=$2; shift 2 ;;
    --methods) IFS=, read -r -a methods <<<"$2"; shift 2 ;;
    *) echo "run_llamacpp: unknown argument '$1' (see the header of $0)" >&2; exit 1 ;;
  esac
done
for v in "$reps" "$steps" "$budget"; do
  case $v in '' | *[!0-9]*) echo "run_llamacpp: --reps, --steps and --budget must be positive integers, got '$v'" >&2; exit 1 ;; esac
done
[ ${#methods[@]} -gt 0 ] || { echo "run_llamacpp: --methods needs at least one method spec" >&2; exit 1; }
for w in ${weights//,/ }; do
  case $w in f16 | bf16 | q8_0 | f32) ;; *) echo "run_llamacpp: --weights must list f32, f16, bf16 or q8_0, got '$w'" >&2; exit 1 ;; esac
done
if ! command -v python3 >/dev/null 2>&1; then
  echo "run_llamacpp: python3 is needed to write $out (scripts/setup.sh installs it)" >&2
  exit 1
fi

driver=$(bench/peers/llamacpp/setup.sh)
case $? in
  0) ;;
  3) echo "run_llamacpp: llama.cpp is unavailable (see above); no side-by-side run"; exit 0 ;;
  *) echo "run_llamacpp: llama.cpp setup failed" >&2; exit 1 ;;
esac
export LLAMACPP_LIB_DIR
LLAMACPP_LIB_DIR=$(cd build/llamacpp/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64 && pwd)
scripts/build.sh --target veloxquant_cli --target vq_crosscheck >/dev/null || { echo "run_llamacpp: building veloxquant failed" >&2; exit 1; }
vq=build/veloxquant
vqx=build/bench/peers/llamacpp/vq_crosscheck

files=build/peers
mkdir -p "$files"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ ! -f "$files/$shape-f16/model.safetensors" ]; then
  echo "run_llamacpp: make-model $shape (f16)" >&2
  "$vq" make-model --shape "$shape" --dtype f16 --out "$files/$shape-f16" >&2 || exit 1
fi
if [ ! -f "$files/llama-spm-tokenizer.bin" ]; then
  "$vqx" tokenizer-bin data/ggml-vocab-llama-spm.gguf "$files/llama-spm-tokenizer.bin" || exit 1
fi
for w in ${weights//,/ }; do
  if [ ! -f "$files/$shape-$w.gguf" ]; then
    "$vq" convert --from "$files/$shape-f16" --to "$files/$shape-$w.gguf" --type "$w" \
      --tokenizer "$files/llama-spm-tokenizer.bin" >&2 || exit 1
  fi
done

lc_version=$(git -C build/llamacpp/src describe --tags --always 2>/dev/null || echo unknown)
echo "run_llamacpp: $shape, weights $weights, contexts $contexts, threads $threads, $reps rounds of $steps steps; llama.cpp $lc_version; load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
samples=$tmp/samples.tsv  # engine weights cache context threads round ms_per_token prefill_s
: >"$samples"
method_args=()
for m in "${methods[@]}"; do method_args+=(--method "$m"); done
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for w in ${weights//,/ }; do
  gguf=$files/$shape-$w.gguf
  for n in ${contexts//,/ }; do
    for t in ${threads//,/ }; do
      for r in $(seq 1 "$reps"); do
        for kv in f16 q8_0 q4_0; do
          line=$("$driver" bench "$gguf" "$n" "$t" "$kv" "$steps" 2) || { echo "run_llamacpp: llama.cpp bench failed" >&2; exit 1; }
          ms=$(sed -n 's/.*median \([0-9.]*\) ms.*/\1/p' <<<"$line")
          pf=$(sed -n 's/.*prefill \([0-9.]*\) s.*/\1/p' <<<"$line")
          printf 'llama.cpp\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$w" "$kv" "$n" "$t" "$r" "$ms" "$pf" >>"$samples"
          echo "  $w ctx $n threads $t round $r: llama.cpp kv $kv $ms ms/token (prefill $pf s)" >&2
        done
        "$vq" bench decode --model "$gguf" --context "$n" --threads "$t" "${method_args[@]}" \
          --budget "$budget" --steps "$steps" --warmup 2 --prefill-real --quiet \
          --json "$tmp/vq.json" >/dev/null || { echo "run_llamacpp: veloxquant bench decode failed" >&2; exit 1; }
        python3 - "$tmp/vq.json" "$w" "$r" >>"$samples" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
for row in doc["rows"]:
    spec = row["method_arg"] + (f" (budget {row['budget']})" if row.get("budget") else "")
    print("\t".join(["veloxquant", sys.argv[2], spec, str(row["context"]),
                     str(row["threads"]), sys.argv[3], repr(row["ms_per_token"]),
                     repr(row["fill_ms"] / 1e3)]))
PY
        awk -F'\t' -v w="$w" -v n="$n" -v t="$t" -v r="$r" '$1 == "veloxquant" && $2 == w && $4 == n && $5 == t && $6 == r {
          printf "  %s ctx %s threads %s round %s: veloxquant %s %.2f ms/token (prefill %.1f s)\n", w, n, t, r, $3, $7, $8 }' "$samples" >&2
      done
    done
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
[ -n "$keep_samples" ] && cp "$samples" "$keep_samples"

python3 bench/peers/peers_json.py --samples "$samples" --out "$out" --vq-json "$tmp/vq.json" \
  --command "bench/peers/run_llamacpp.sh --shape $shape --weights $weights --contexts $contexts --threads $threads --reps $reps --steps $steps --budget $budget --methods $(IFS=,; echo "${methods[*]}") --out $out" \
  --shape "$shape" --weights "$weights" --contexts "$contexts" --threads "$threads" \
  --rounds "$reps" --steps "$steps" --warmup 2 --budget "$budget" --methods "${methods[*]}" \
  --llama-cpp "$lc_version (npm @node-llama-cpp/linux-x64@3.22.1)" \
  --load-before "$load_before" --load-after "$load_after"
