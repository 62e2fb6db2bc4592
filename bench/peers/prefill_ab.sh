#!/usr/bin/env bash
# Prompt processing of GGUF files, alternating: a VeloxQuant binary built before a change
# (optional), the current one, and llama.cpp's llama-bench, one after the other per file,
# thread count and prompt length, so each ratio comes from neighbouring runs on a shared machine.
#
#   bench/peers/prefill_ab.sh --files "A.gguf B.gguf" [--threads "1 2"] [--tests "pp512 pp4096"]
#       [--new build/veloxquant] [--base OLD_VELOXQUANT] [--llama-bench PATH] [--out FILE.tsv]
#
# VeloxQuant: `veloxquant bench decode --model F --context N --threads T --method full
# --steps 1 --warmup 0 --prefill-real --bandwidth-mib 16` (as bench/peers/run_matrix.sh), ppN =
# N / fill time. llama.cpp: `llama-bench -m F -t T -r 1 -p N -n 0 -o json` (default: the native
# build bench/peers/build_llamacpp_native.sh leaves in build/llamacpp-native/bin). Prints and
# appends one tab-separated line per measurement: file, threads, test, base tokens/s (- without
# --base), new tokens/s, llama.cpp tokens/s, new/base, new/llama.cpp, the 1-minute load average.
# A failed run prints NaN. Never part of the tests or CI.
set -uo pipefail
cd "$(dirname "$0")/../.."

files= threads="1" tests="pp512" new=build/veloxquant base= out=build/peers/prefill_ab.tsv
lb=build/llamacpp-native/bin/llama-bench
die() { echo "prefill_ab.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || die "$1 needs a value"
  case $1 in
    --files) files=$2 ;;
    --threads) threads=$2 ;;
    --tests) tests=$2 ;;
    --new) new=$2 ;;
    --base) base=$2 ;;
    --llama-bench) lb=$2 ;;
    --out) out=$2 ;;
    *) die "unknown flag '$1' (expected --files, --threads, --tests, --new, --base, --llama-bench, --out)" ;;
  esac
  shift 2
done
[ -n "$files" ] || die "--files is required (GGUF files, space-separated)"
for f in $files; do [ -r "$f" ] || die "--files: cannot read '$f'"; done
[ -x "$new" ] || die "--new: '$new' is not an executable VeloxQuant binary"
[ -z "$base" ] || [ -x "$base" ] || die "--base: '$base' is not an executable VeloxQuant binary"
[ -x "$lb" ] || die "--llama-bench: '$lb' is not executable (build it with bench/peers/build_llamacpp_native.sh)"
for x in $tests; do
  [[ $x =~ ^pp[1-9][0-9]*$ ]] || die "--tests: expected ppN (e.g. pp512), found '$x'"
done
for t in $threads; do
  [[ $t =~ ^[1-9][0-9]*$ ]] || die "--threads: expected positive integers, found '$t'"
done
mkdir -p "$(dirname "$out")"

vq_pp() {  # binary file threads n
  local j r
  j=$(mktemp --suffix=.json)
  if "$1" bench decode --model "$2" --context "$4" --threads "$3" --method full --steps 1 \
      --warmup 0 --prefill-real --bandwidth-mib 16 --quiet --json "$j" >/dev/null 2>&1; then
    r=$(python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['rows'][0]; print(int(sys.argv[2]) / (r['fill_ms'] / 1e3))" "$j" "$4") || r=NaN
  else
    r=NaN
  fi
  rm -f "$j"
  echo "$r"
}
llama_pp() {  # file threads n
  "$lb" -m "$1" -t "$2" -r 1 -p "$3" -n 0 -o json 2>/dev/null |
    python3 -c "import json,sys; print(json.load(sys.stdin)[0]['avg_ts'])" 2>/dev/null || echo NaN
}

for f in $files; do
  for t in $threads; do
    for x in $tests; do
      n=${x#pp}
      b=-
      [ -n "$base" ] && b=$(vq_pp "$base" "$f" "$t" "$n")
      v=$(vq_pp "$new" "$f" "$t" "$n")
      l=$(llama_pp "$f" "$t" "$n")
      la=$(cut -d' ' -f1 /proc/loadavg)
      line=$(python3 -c "
import sys
f, t, x, b, v, l, la = sys.argv[1:]
def r(a, c):
    try: return '%.2f' % (float(a) / float(c))
    except (ValueError, ZeroDivisionError): return '-'
print('\t'.join([f, t, x, b, v, l, r(v, b), r(v, l), la]))" "$(basename "$f" .gguf)" "$t" "$x" "$b" "$v" "$l" "$la")
      echo "$line" | tee -a "$out"
    done
  done
done
