#!/usr/bin/env bash
# Decode speed of VeloxQuant and llama.cpp (its native build and the npm prebuilt) on the same
# GGUF files, alternating process by process (for a shared machine, where only ratios of neighbouring runs mean
# anything). Lighter than run_matrix.sh: decode only, no prompt processing, and VeloxQuant's
# cache is filled with synthetic K/V (the same attention work per step as a real prompt; the
# values do not change the time).
#
#   bench/peers/decode_side_by_side.sh FILE.gguf [FILE.gguf ...]
#       [--threads 1,2] [--depth 1024] [--steps 32] [--reps 2]
#       [--vq build/veloxquant] [--base OTHER_VELOXQUANT_BINARY]
#       [--llama-bench build/llamacpp-native/bin/llama-bench] [--driver build/llamacpp/llamacpp_driver]
#
# Per file, thread count and round, in this order: VeloxQuant (`--vq`; `bench decode --model F
# --context DEPTH --method full --threads T --steps STEPS --warmup 2`, tokens/s = 1000 / its
# median ms per step), the `--base` binary if given (the same command: a before/after of two
# builds), llama.cpp's native build (bench/peers/build_llamacpp_native.sh: `llama-bench -m F -p 0
# -n STEPS -d DEPTH -t T -r 1`, its avg_ts; its defaults otherwise: f16 KV, flash attention
# auto), the npm prebuilt through bench/peers/llamacpp/llamacpp_driver.c (`bench F DEPTH T f16
# STEPS 2`, 1000 / its median ms per token; its CPU backends from the folder next to libllama).
# An engine whose binary is missing is skipped. Prints every sample, then per file and thread
# count the medians of the rounds and VeloxQuant's ratio to each llama.cpp, to the faster of
# the two, and to --base.
# Never part of the tests or CI.
set -euo pipefail
cd "$(dirname "$0")/../.."
threads=1,2
depth=1024
steps=32
reps=2
vq=build/veloxquant
base=
llama=build/llamacpp-native/bin/llama-bench
driver=build/llamacpp/llamacpp_driver
files=()
while [ $# -gt 0 ]; do
  case $1 in
    --threads) threads=$2; shift 2 ;;
    --depth) depth=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --vq) vq=$2; shift 2 ;;
    --base) base=$2; shift 2 ;;
    --llama-bench) llama=$2; shift 2 ;;
    --driver) driver=$2; shift 2 ;;
    -*) echo "decode_side_by_side.sh: unknown flag '$1'" >&2; exit 2 ;;
    *) files+=("$1"); shift ;;
  esac
done
if [ ${#files[@]} -eq 0 ]; then
  echo "decode_side_by_side.sh: no GGUF file given" >&2
  exit 2
fi
for f in "${files[@]}"; do
  [ -f "$f" ] || { echo "decode_side_by_side.sh: no file '$f'" >&2; exit 2; }
done
for b in "$vq" ${base:+"$base"}; do
  [ -x "$b" ] || { echo "decode_side_by_side.sh: '$b' is not an executable" >&2; exit 2; }
done
[ -x "$llama" ] || { echo "decode_side_by_side.sh: no '$llama': skipping the native build" >&2; llama=; }
[ -x "$driver" ] || { echo "decode_side_by_side.sh: no '$driver': skipping the npm build" >&2; driver=; }
[ -n "$driver" ] && libdir=$(cd "$(dirname "$driver")" && pwd)/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64

vq_tps() {  # binary file threads -> tokens/s
  "$1" bench decode --model "$2" --context "$depth" --method full --threads "$3" \
    --steps "$steps" --warmup 2 --bandwidth-mib 16 --quiet 2>/dev/null |
    awk '$1 == "full" { print $5 }'
}
llama_tps() {  # file threads -> tokens/s
  "$llama" -m "$1" -p 0 -n "$steps" -d "$depth" -t "$2" -r 1 -o csv 2>/dev/null |
    python3 -c 'import csv, sys; rows = list(csv.DictReader(sys.stdin)); print(rows[-1]["avg_ts"])'
}
npm_tps() {  # file threads -> tokens/s
  LLAMACPP_LIB_DIR=$libdir "$driver" bench "$1" "$depth" "$2" f16 "$steps" 2 2>/dev/null |
    sed -n 's/.*median \([0-9.]*\) ms.*/\1/p' | awk '{ printf "%.4f\n", 1000 / $1 }'
}

samples=$(mktemp)
trap 'rm -f "$samples"' EXIT
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); flags:" \
  "$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512bw|avx512vl|avx512_vnni|avx512vbmi|avx_vnni|amx_int8)$' | tr '\n' ' ')"
echo "# commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo -dirty); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
printf 'file\tthreads\tround\tengine\ttokens/s\tload1\n'
for f in "${files[@]}"; do
  for t in ${threads//,/ }; do
    for r in $(seq 1 "$reps"); do
      v=$(vq_tps "$vq" "$f" "$t")
      printf '%s\t%s\t%s\tveloxquant\t%s\t%s\n' "$(basename "$f")" "$t" "$r" "$v" "$(cut -d' ' -f1 /proc/loadavg)" | tee -a "$samples"
      if [ -n "$base" ]; then
        v=$(vq_tps "$base" "$f" "$t")
        printf '%s\t%s\t%s\tbase\t%s\t%s\n' "$(basename "$f")" "$t" "$r" "$v" "$(cut -d' ' -f1 /proc/loadavg)" | tee -a "$samples"
      fi
      if [ -n "$llama" ]; then
        v=$(llama_tps "$f" "$t")
        printf '%s\t%s\t%s\tnative\t%s\t%s\n' "$(basename "$f")" "$t" "$r" "$v" "$(cut -d' ' -f1 /proc/loadavg)" | tee -a "$samples"
      fi
      if [ -n "$driver" ]; then
        v=$(npm_tps "$f" "$t")
        printf '%s\t%s\t%s\tnpm\t%s\t%s\n' "$(basename "$f")" "$t" "$r" "$v" "$(cut -d' ' -f1 /proc/loadavg)" | tee -a "$samples"
      fi
    done
  done
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$samples" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    f, t, r, e, v, _ = line.rstrip("\n").split("\t")
    rows.setdefault((f, int(t)), {}).setdefault(e, []).append(float(v))
print("file\tthreads\tveloxquant\tbase\tnative\tnpm\tvq/native\tvq/npm\tvq/faster\tvq/base"
      "\t(median tokens/s of the rounds)")
for (f, t), e in rows.items():
    med = {k: statistics.median(v) for k, v in e.items()}
    vq, b, nat, npm = (med.get(k) for k in ("veloxquant", "base", "native", "npm"))
    faster = max([x for x in (nat, npm) if x is not None], default=None)
    fmt = lambda x: "-" if x is None else f"{x:.2f}"
    ratio = lambda a, c: "-" if a is None or not c else f"{a / c:.2f}x"
    print(f"{f}\t{t}\t{fmt(vq)}\t{fmt(b)}\t{fmt(nat)}\t{fmt(npm)}\t{ratio(vq, nat)}"
          f"\t{ratio(vq, npm)}\t{ratio(vq, faster)}\t{ratio(vq, b)}")
EOF
