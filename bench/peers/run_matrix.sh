#!/usr/bin/env bash
# VeloxQuant and llama.cpp side by side on the same GGUF files: prompt processing (pp512,
# pp4096) and decode at a filled context (tg at 1k and 4k), per weight type and thread count,
# the engines alternating. One command for the whole matrix; flags choose subsets.
#
#   bench/peers/run_matrix.sh [--models llama-110m,llama-3.2-1b]
#       [--types f16,q8_0,q4_k_m,q5_k_m,q6_k,q4_0]      llama-110m's weight types (also bf16)
#       [--threads 1,2]                                 llama-110m's thread counts
#       [--tests pp512,pp4096,tg1024,tg4096]            llama-110m's tests
#       [--types-1b q8_0,q4_k_m] [--threads-1b 2] [--tests-1b pp512,tg1024]
#       [--engines veloxquant,native,npm] [--reps 1] [--steps 16]
#       [--out results/decode/peers.json] [--samples build/peers/matrix/samples.tsv] [--fresh]
#
# Files (kept in build/peers/matrix/, reused): the shape's deterministic random weights
# (`veloxquant make-model --shape S --dtype f16`, seed 1), `veloxquant convert --type f16` (and
# `--type q8_0` for Q8_0, `--type bf16` for BF16) with a vocabulary of the shape's size (llama-110m: Llama 2's 32000
# SentencePiece pieces from data/ggml-vocab-llama-spm.gguf; llama-3.2-1b: Llama 3's 128256-id
# byte-level BPE from llama.cpp's models/ggml-vocab-llama-bpe.gguf, as a tokenizer.json), and
# llama.cpp's own `llama-quantize` (the native build; without --engines native and no native
# build, the npm library's llama_model_quantize, the same code) for q4_0, q4_k_m, q5_k_m, q6_k.
# llama.cpp and VeloxQuant read the very same file.
#
# Engines (--engines):
#   veloxquant  `veloxquant bench decode --model F --method full --prefill-real --prefill-chunk
#               512` (f16 KV, the prompt in chunks of 512 tokens, llama-bench's micro-batch;
#               chunks of 64 before 2026-12-07): ppN = N / its fill time; tgN = 1000 / its median step
#               (ms) after N real prompt tokens (STEPS timed steps after 2 warmup steps).
#   native      llama.cpp built for this CPU (bench/peers/build_llamacpp_native.sh, -march=native
#               without AMX): `llama-bench -m F -t T -r 1 -o json`, ppN as `-p N -n 0`, tgN as
#               `-p 0 -n STEPS -d N` (f16 KV, flash attention auto, ubatch 512: its defaults).
#   npm         the npm prebuilt (@node-llama-cpp/linux-x64) through
#               bench/peers/llamacpp/llamacpp_driver.c `bench F N T f16 STEPS 2`: ppN from its
#               prefill time (batches of 512), tgN from its median step.
# Order: for each model, weight type, thread count, test and round, the engines run one after
# the other (veloxquant, native, npm): ratios come from neighbouring runs on a shared machine.
# Each measurement is one process (cold page cache apart, nothing is shared between them).
#
# Resumable: every measurement is appended to the samples file as it finishes (tab-separated:
# model, type, threads, test, engine, round, tokens/s, detail, 1-minute load average after it);
# a rerun skips what the file
# already holds (same model, type, threads, test, engine and round), so an interrupted run
# continues where it stopped; --fresh empties it first. A failed measurement is reported and
# skipped (not written), so a rerun retries it. At the end the samples become OUT
# (bench/peers/peers_json.py matrix: the median of the rounds per row, VeloxQuant's ratio to each
# llama.cpp, the CPU flags, the commit, the load averages) and a table is printed.
#
# Cost: the llama-110m files take about 0.9 GB; llama-3.2-1b's f16 checkpoint, f16, q8_0 and
# q4_k_m files about 7 GB. Time was measured only in parts, on a loaded 2-core machine (load
# average about 11): 12 measurements of pp512/tg1024 at 1 thread (two types, three engines)
# 125 s; the native pp4096 plus tg4096 of one type at 1 thread 147 s. The 4k tests dominate:
# run `--tests pp512,tg1024` first and `--tests pp4096,tg4096` next if time is short (the
# samples file keeps both). Never part of the unit tests or CI.
set -uo pipefail
cd "$(dirname "$0")/../.."

models=llama-110m,llama-3.2-1b
types=f16,q8_0,q4_k_m,q5_k_m,q6_k,q4_0
threads=1,2
tests=pp512,pp4096,tg1024,tg4096
types_1b=q8_0,q4_k_m
threads_1b=2
tests_1b=pp512,tg1024
engines=veloxquant,native,npm
reps=1
steps=16
out=results/decode/peers.json
samples=build/peers/matrix/samples.tsv
fresh=0
args=("$@")
while [ $# -gt 0 ]; do
  case $1 in
    --models) models=$2; shift 2 ;;
    --types) types=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --tests) tests=$2; shift 2 ;;
    --types-1b) types_1b=$2; shift 2 ;;
    --threads-1b) threads_1b=$2; shift 2 ;;
    --tests-1b) tests_1b=$2; shift 2 ;;
    --engines) engines=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --samples) samples=$2; shift 2 ;;
    --fresh) fresh=1; shift ;;
    *) echo "run_matrix: unknown argument '$1' (see the header of $0)" >&2; exit 1 ;;
  esac
done
die() { echo "run_matrix: $*" >&2; exit 1; }
for v in "$reps" "$steps"; do
  case $v in '' | 0 | *[!0-9]*) die "--reps and --steps must be positive integers, got '$v'" ;; esac
done
for m in ${models//,/ }; do
  case $m in llama-110m | llama-3.2-1b) ;; *) die "--models lists llama-110m and/or llama-3.2-1b, got '$m'" ;; esac
done
for ty in ${types//,/ } ${types_1b//,/ }; do
  case $ty in f16 | bf16 | q8_0 | q4_0 | q4_k_m | q5_k_m | q6_k) ;; *) die "--types/--types-1b list f16, bf16, q8_0, q4_0, q4_k_m, q5_k_m, q6_k; got '$ty'" ;; esac
done
for t in ${threads//,/ } ${threads_1b//,/ }; do
  case $t in '' | 0 | *[!0-9]*) die "--threads/--threads-1b list positive integers, got '$t'" ;; esac
done
for x in ${tests//,/ } ${tests_1b//,/ }; do
  case $x in pp[1-9]* | tg[1-9]*) [[ ${x:2} =~ ^[0-9]+$ ]] || die "a test is ppN or tgN (N tokens), got '$x'" ;;
    *) die "a test is ppN or tgN (N tokens), got '$x'" ;; esac
done
for e in ${engines//,/ }; do
  case $e in veloxquant | native | npm) ;; *) die "--engines lists veloxquant, native, npm; got '$e'" ;; esac
done
command -v python3 >/dev/null 2>&1 || die "python3 is needed to write $out"

has_engine() { [[ ",$engines," == *",$1,"* ]]; }
driver=$(bench/peers/llamacpp/setup.sh)
case $? in
  0) ;;
  3) echo "run_matrix: llama.cpp is unavailable (see above); no side-by-side run"; exit 0 ;;
  *) die "llama.cpp setup failed" ;;
esac
export LLAMACPP_LIB_DIR
LLAMACPP_LIB_DIR=$(cd build/llamacpp/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64 && pwd)
# The native build (for the native engine and its llama-quantize). Without the native engine the
# quantized files come from the npm library's quantizer (llama_model_quantize through the
# driver: the same llama.cpp commit, the same code).
native_bin=
if has_engine native; then
  native_bin=$(bench/peers/build_llamacpp_native.sh) || die "building llama.cpp natively failed (bench/peers/build_llamacpp_native.sh)"
elif [ -x build/llamacpp-native/bin/llama-quantize ]; then
  native_bin=$(cd build/llamacpp-native/bin && pwd)
fi
scripts/build.sh --target veloxquant_cli --target vq_crosscheck >/dev/null || die "building veloxquant failed"
vq=${VQ_BIN:-build/veloxquant}  # VQ_BIN: another VeloxQuant binary (e.g. a copy, so build/ can change meanwhile)
vqx=build/bench/peers/llamacpp/vq_crosscheck
files=build/peers/matrix
mkdir -p "$files" "$(dirname "$samples")"
[ "$fresh" = 1 ] && : >"$samples"
touch "$samples"

# The GGUF file of a model and type, made once.
make_file() {  # model type -> prints the path
  local m=$1 ty=$2 dir=$files/$1-f16 f=$files/$1-$2.gguf tmpf=$files/$1-$2.partial.gguf tok
  if [ -f "$f" ]; then echo "$f"; return 0; fi
  if [ ! -f "$dir/model.safetensors" ]; then
    echo "run_matrix: make-model $m (f16)" >&2
    "$vq" make-model --shape "$m" --dtype f16 --out "$dir" >&2 || return 1
  fi
  case $m in
    llama-110m)
      tok=$files/llama-spm-tokenizer.bin
      [ -f "$tok" ] || "$vqx" tokenizer-bin data/ggml-vocab-llama-spm.gguf "$tok" || return 1 ;;
    llama-3.2-1b)
      tok=$files/llama3-tokenizer.json
      [ -f "$tok" ] || "$vqx" hf-json build/llamacpp/src/models/ggml-vocab-llama-bpe.gguf llama3 "$tok" || return 1 ;;
  esac
  case $ty in
    f16 | bf16 | q8_0)
      echo "run_matrix: convert $m --type $ty" >&2
      "$vq" convert --from "$dir" --to "$tmpf" --type "$ty" --tokenizer "$tok" >&2 || { rm -f "$tmpf"; return 1; } ;;
    *)
      make_file "$m" f16 >/dev/null || return 1
      if [ -n "$native_bin" ]; then
        echo "run_matrix: llama-quantize $m $ty (native build)" >&2
        "$native_bin/llama-quantize" "$files/$m-f16.gguf" "$tmpf" "${ty^^}" >"$files/quantize-$m-$ty.log" 2>&1
      else
        echo "run_matrix: llama.cpp quantize $m $ty (npm library, through the driver)" >&2
        "$driver" quantize "$files/$m-f16.gguf" "$tmpf" "$ty" >"$files/quantize-$m-$ty.log" 2>&1
      fi || { rm -f "$tmpf"; echo "run_matrix: quantizing failed (see $files/quantize-$m-$ty.log)" >&2; return 1; } ;;
  esac
  mv "$tmpf" "$f" && echo "$f"
}

have() {  # model type threads test engine round: already in the samples file?
  awk -F'\t' -v k="$1	$2	$3	$4	$5	$6" 'BEGIN { found = 1 } $1"\t"$2"\t"$3"\t"$4"\t"$5"\t"$6 == k { found = 0; exit } END { exit found }' "$samples"
}

# One process: prints "test<TAB>tokens_per_s<TAB>detail" per figure, or fails. VeloxQuant and
# the npm driver fill N prompt tokens from an empty cache before they decode, so one tgN run
# also gives ppN (printed when the 5th argument is 1); llama-bench's depth fill is not timed.
measure() {  # engine file threads test with_pp
  local e=$1 f=$2 t=$3 x=$4 n=${4:2} kind=${4:0:2} with_pp=${5:-0} tmpj line
  case $e in
    veloxquant)
      tmpj=$(mktemp --suffix=.json)
      local vs=$steps vw=2
      [ "$kind" = pp ] && { vs=1; vw=0; }
      "$vq" bench decode --model "$f" --context "$n" --threads "$t" --method full --steps "$vs" \
        --warmup "$vw" --prefill-real --prefill-chunk 512 --bandwidth-mib 16 --quiet --json "$tmpj" >/dev/null 2>"$tmpj.err" ||
        { echo "veloxquant: $(tail -c 300 "$tmpj.err")" >&2; rm -f "$tmpj" "$tmpj.err"; return 1; }
      python3 - "$tmpj" "$kind" "$n" "$with_pp" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["rows"][0]
kind, n, with_pp = sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
if kind == "pp" or with_pp:
    print("pp%d\t%r\tfill_ms %r peak_rss_bytes %d" % (n, n / (r["fill_ms"] / 1e3), r["fill_ms"], r["peak_rss_bytes"]))
if kind == "tg":
    print("tg%d\t%r\tms_per_token %r peak_rss_bytes %d" % (n, 1e3 / r["ms_per_token"], r["ms_per_token"], r["peak_rss_bytes"]))
PY
      rm -f "$tmpj" "$tmpj.err" ;;
    native)
      local lb=("$native_bin/llama-bench" -m "$f" -t "$t" -r 1 -o json)
      if [ "$kind" = pp ]; then lb+=(-p "$n" -n 0); else lb+=(-p 0 -n "$steps" -d "$n"); fi
      tmpj=$(mktemp --suffix=.json)
      "${lb[@]}" >"$tmpj" 2>"$tmpj.err" ||
        { echo "llama-bench (exit $?): $(tail -c 300 "$tmpj.err")" >&2; rm -f "$tmpj" "$tmpj.err"; return 1; }
      python3 - "$tmpj" "$x" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))[0]
print("%s\t%r\tllama-bench n_prompt %d n_gen %d n_depth %d flash_attn %s type_k %s" % (
    sys.argv[2], r["avg_ts"], r["n_prompt"], r["n_gen"], r["n_depth"], r["flash_attn"], r["type_k"]))
PY
      rm -f "$tmpj" "$tmpj.err" ;;
    npm)
      if [ "$kind" = pp ]; then line=$("$driver" bench "$f" "$n" "$t" f16 1 0); else line=$("$driver" bench "$f" "$n" "$t" f16 "$steps" 2); fi ||
        { echo "llamacpp_driver bench failed" >&2; return 1; }
      local ms pf
      ms=$(sed -n 's/.*median \([0-9.]*\) ms.*/\1/p' <<<"$line")
      pf=$(sed -n 's/.*prefill \([0-9.]*\) s.*/\1/p' <<<"$line")
      [ -n "$ms" ] && [ -n "$pf" ] || { echo "llamacpp_driver: unexpected output '$line'" >&2; return 1; }
      if [ "$kind" = pp ] || [ "$with_pp" = 1 ]; then
        awk -v n="$n" -v p="$pf" 'BEGIN { printf "pp%d\t%.6g\tprefill_s %s (batches of 512)\n", n, n / p, p }'
      fi
      if [ "$kind" = tg ]; then
        awk -v n="$n" -v ms="$ms" 'BEGIN { printf "tg%d\t%.6g\tms_per_token %s\n", n, 1e3 / ms, ms }'
      fi ;;
  esac
}

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
started=$(date +%s)
failed=0
for m in ${models//,/ }; do
  if [ "$m" = llama-110m ]; then mtypes=$types mthreads=$threads mtests=$tests; else mtypes=$types_1b mthreads=$threads_1b mtests=$tests_1b; fi
  for ty in ${mtypes//,/ }; do
    f=$(make_file "$m" "$ty") || die "cannot make the $m $ty file"
    for t in ${mthreads//,/ }; do
      for x in ${mtests//,/ }; do
        for r in $(seq 1 "$reps"); do
          for e in veloxquant native npm; do
            has_engine "$e" || continue
            # VeloxQuant and npm: ppN comes with tgN's run when both are asked for.
            n=${x:2} with_pp=0 run=$x
            if [ "$e" != native ] && [[ ",$mtests," == *",tg$n,"* ]] && [[ ",$mtests," == *",pp$n,"* ]]; then
              [ "${x:0:2}" = pp ] && continue
              have "$m" "$ty" "$t" "pp$n" "$e" "$r" || with_pp=1
              if have "$m" "$ty" "$t" "$x" "$e" "$r"; then
                [ "$with_pp" = 1 ] || continue
                run=pp$n with_pp=0
              fi
            else
              have "$m" "$ty" "$t" "$x" "$e" "$r" && continue
            fi
            if res=$(measure "$e" "$f" "$t" "$run" "$with_pp"); then
              while IFS=$'\t' read -r test tps detail; do
                printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$m" "$ty" "$t" "$test" "$e" "$r" "$tps" "$detail" "$(cut -d' ' -f1 /proc/loadavg)" >>"$samples"
                printf '  %s %s threads %s %s round %s: %-10s %s tokens/s\n' "$m" "$ty" "$t" "$test" "$r" "$e" "$tps" >&2
              done <<<"$res"
            else
              echo "run_matrix: FAILED $m $ty threads $t $run round $r $e (not recorded; a rerun retries it)" >&2
              failed=$((failed + 1))
            fi
          done
        done
      done
    done
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
echo "run_matrix: measured in $(( $(date +%s) - started )) s; load average $load_before -> $load_after" >&2

lc_version=$(git -C build/llamacpp/src describe --tags --always 2>/dev/null || echo unknown)
python3 bench/peers/peers_json.py matrix --samples "$samples" --out "$out" \
  --command "bench/peers/run_matrix.sh ${args[*]}" --llama-cpp "$lc_version" \
  --native-bin "${native_bin:-none}" --load-before "$load_before" --load-after "$load_after" \
  --steps "$steps" || exit 1
[ "$failed" -eq 0 ] || { echo "run_matrix: $failed measurements failed (rerun to retry them)" >&2; exit 1; }
