#!/usr/bin/env bash
# Runs examples/c/llama.c (a Llama forward in C over the C API's caches) and `veloxquant eval`
# on the same model, text, token count and budget, and checks every method's perplexity agrees
# within RTOL (relative).
# Usage: llama_c_test.sh CLI LLAMA_C DATA_DIR TOKENS BUDGET RTOL SPEC [SPEC...]
set -euo pipefail
cli=$1 llama=$2 data=$3 tokens=$4 budget=$5 rtol=$6
shift 6
model=$data/stories260K.bin tok=$data/tok512.bin text=$data/tinystories_validation_excerpt.txt
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$llama" "$model" "$tok" "$text" "$tokens" "$budget" "$@" >"$work/c.txt"
method_args=()
for m in "$@"; do method_args+=(--method "$m"); done
"$cli" eval --model "$model" --tokenizer "$tok" --text "$text" --tokens "$tokens" \
  --budget "$budget" --json "$work/eval.json" "${method_args[@]}" >/dev/null 2>&1
# Rows of the result file: "method" precedes "ppl" in each (keys are sorted).
awk '/^    {/ {m = ""} /"method":/ {sub(/,$/, "", $2); gsub(/"/, "", $2); m = $2} /"ppl":/ {gsub(/,/, "", $2); if (m != "") print m, $2}' \
  "$work/eval.json" >"$work/cli.txt"

status=0
while read -r spec ppl kept; do
  ref=$(awk -v s="$spec" '$1 == s {print $2}' "$work/cli.txt")
  if [ -z "$ref" ]; then
    echo "no eval row for $spec" >&2
    status=1
    continue
  fi
  if awk -v a="$ppl" -v b="$ref" -v t="$rtol" 'BEGIN { d = (a - b) / b; if (d < 0) d = -d; exit !(d <= t) }'; then
    echo "ok   $spec: C $ppl, eval $ref (kept $kept)"
  else
    echo "FAIL $spec: C $ppl, eval $ref, beyond rtol $rtol" >&2
    status=1
  fi
done <"$work/c.txt"
[ "$(wc -l <"$work/c.txt")" -eq "$#" ] || { echo "expected $# methods from llama.c" >&2; status=1; }
[ $status -eq 0 ] && echo "llama.c: matches veloxquant eval"
exit $status
