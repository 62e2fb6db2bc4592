#!/usr/bin/env bash
# The quality-per-byte sweep (docs/quality.md, docs/benchmarks.md "Quality per byte", issues 13 and 24): every configuration below at
# the compression ratios in RATIOS (in bytes: full fp16 bytes / kept bytes at the end of a
# window, `veloxquant eval --ratio`), on each model and text, over WINDOWS disjoint windows per
# text (`eval --windows`: means with 95% paired-bootstrap intervals, docs/quality.md). Writes
# results/eval/pareto_<model>_<text>.{json,svg,txt} (docs/results.md, "Equal-memory mode").
#
# Windows: the shipped TinyStories parts are short (stories260K's tokenizer: 7992 / 7740 tokens;
# TinyStories-656K's: 3627 / 3579), so the window is the longest that fits 16 times in the
# shorter one: 224 tokens (BOS + 223 text tokens; 112 as one prefill, then 111 decoded predictions
# scored), for both models and every text. The best configuration per ratio is chosen on the dev
# part and reported on the test part (--select-from). Each model's dev -> test pair and its
# WikiText-2 run go in parallel (each eval also spreads its windows over the cores).
#
# Models: stories260K (data/) and TinyStories-656K (../shared/data/models/tinystories-656K, or
# $VELOXQUANT_SHARED_DIR/data/...; it cannot ship with the project: used when present, and the
# script says so when it is absent). Texts: the TinyStories test part (the reported table), its
# development part (where configurations are chosen) and WikiText-2 (out of domain); see
# data/PROVENANCE.md for the split.
#
# CONFIGS is the one list of configurations (method specs without a budget: the budget, or the
# bit width for methods without one, is solved per ratio). Extend it here. A configuration the
# binary rejects (e.g. an option this build does not have) is skipped with the binary's message.
# Expects a build (scripts/build.sh). Flags after the script go to every `veloxquant eval`.
set -euo pipefail
cd "$(dirname "$0")/.."

# Overridable from the environment (e.g. RATIOS=8,16,32, the targets' ratios, on a busy machine).
RATIOS=${RATIOS:-2,4,8,16,32}
WINDOWS=${WINDOWS:-16}
WINDOW=(--tokens 224 --prefill 112)
bin=build/veloxquant
[[ -x $bin ]] || { echo "sweep_pareto: $bin not found; run scripts/build.sh first" >&2; exit 1; }
# Eviction methods with their defaults: every method with a token budget, in registry order.
mapfile -t evicting < <("$bin" list --ids --with budget)
CONFIGS=(
  "${evicting[@]}"
  # KIVI alone: its bit width is the only lever (residual 128 by default; a shorter fp16 tail
  # reaches more).
  kivi "kivi:residual_length=32" "kivi:residual_length=16,kivi_group_size=16"
  # Eviction + KIVI compositions (the budget is solved; residual = group by default).
  "streaming_llm:quantize=kivi2" "streaming_llm:quantize=kivi4"
  "h2o:quantize=kivi2" "h2o:quantize=kivi4"
  "h2o:quantize=kivi2,kivi_group_size=16,residual_length=16"
  "h2o:quantize=kivi4,kivi_group_size=16,residual_length=16"
  "tova:quantize=kivi4" "cam:quantize=kivi2" "cam:quantize=kivi4"
  "cam:quantize=kivi4,kivi_group_size=16,residual_length=16"
  # Mixed precision (demote=: the rows a method evicts are kept at 4 bits, up to as many as its
  # budget; the budget is solved with the low-bit tier counted).
  "streaming_llm:demote=kivi4" "h2o:demote=kivi4" "tova:demote=kivi4" "pyramidkv:demote=kivi4"
  "squeeze:demote=kivi4" "h2o:demote=kivi2"
  # Head-wise budgets (AdaKV): a layer's rows shared among its KV heads by attention.
  "h2o:headwise=true" "snapkv:headwise=true" "pyramidkv:headwise=true" "squeeze:headwise=true"
  "cam:headwise=true" "h2o:headwise=true,demote=kivi4"
  "h2o:headwise=true,quantize=kivi4,kivi_group_size=16,residual_length=16"
)

shared=${VELOXQUANT_SHARED_DIR:-../shared}
models=("stories260K=data/stories260K.bin")
if [[ -f $shared/data/models/tinystories-656K/model.safetensors ]]; then
  models+=("tinystories-656K=$shared/data/models/tinystories-656K")
else
  echo "sweep_pareto: TinyStories-656K not found at $shared/data/models/tinystories-656K" \
    "(it cannot ship with the project); sweeping stories260K only" >&2
fi

# Keep the configurations this binary accepts; say which it rejects and why.
methods=()
for spec in "${CONFIGS[@]}"; do
  if msg=$("$bin" eval --model data/stories260K.bin --text data/tinystories_dev.txt --tokens 8 \
             --ratio 1 --method "$spec" 2>&1 >/dev/null); then
    methods+=(--method "$spec")
  else
    echo "sweep_pareto: skipping '$spec': the binary rejects it: $(tail -n 1 <<<"$msg")" >&2
  fi
done

mkdir -p results/eval
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
# run MODEL=PATH TEXT=PATH [flags]: one eval, progress lines to a log shown only on failure.
run() {
  local m=$1 t=$2 out=results/eval/pareto_${1%%=*}_${2%%=*} start
  shift 2
  echo "sweep_pareto: ${m%%=*} on ${t%%=*} -> $out.{json,svg,txt}" >&2
  start=$(date +%s)
  if ! "$bin" eval --model "${m#*=}" --text "${t#*=}" "${WINDOW[@]}" --windows "$WINDOWS" \
      --ratio "$RATIOS" "${methods[@]}" --json "$out.json" --plot "$out.svg" "$@" \
      2>"$logs/${m%%=*}_${t%%=*}.log" >"$out.txt"; then
    cat "$logs/${m%%=*}_${t%%=*}.log" >&2
    return 1
  fi
  echo "sweep_pareto: ${m%%=*} on ${t%%=*}: $(($(date +%s) - start)) s" >&2
}
start=$(date +%s)
pids=()
for m in "${models[@]}"; do
  # The dev part first: the test part's run reports the configurations chosen on it.
  (run "$m" "tinystories-dev=data/tinystories_dev.txt" "$@" &&
   run "$m" "tinystories-test=data/tinystories_test.txt" \
     --select-from "results/eval/pareto_${m%%=*}_tinystories-dev.json" "$@") &
  pids+=($!)
  run "$m" "wikitext2=data/wikitext2_test_excerpt.txt" "$@" &
  pids+=($!)
done
failed=0
for p in "${pids[@]}"; do wait "$p" || failed=1; done
[[ $failed == 0 ]] || exit 1
echo "sweep_pareto: done in $(($(date +%s) - start)) s" >&2
# The quality targets (docs/quality.md): the dev-chosen configuration's interval on the test part.
python3 scripts/quality_table.py results/eval/pareto_*_tinystories-test.json
