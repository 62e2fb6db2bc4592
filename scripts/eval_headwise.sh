#!/usr/bin/env bash
# Head-wise budgets (docs/methods.md "Head-wise budgets") in the main job's scenario (scripts/main.sh):
# stories260K reads the first 512 tokens of the TinyStories excerpt, 256 as one prefill, then
# 255 scored decode predictions; every method that has the option, with uniform budgets and
# with headwise=true (default floor 0.2), at budgets 32 and 64, against the full cache.
# Writes results/eval/headwise.json and results/eval/headwise.txt (the table). Needs a build
# (scripts/build.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
args=()
# Every method with head-wise budgets (the registry's, in its order), snapkv also with a window
# of 16.
heads=()
for id in $(build/veloxquant list --ids --with headwise); do
  heads+=("$id")
  [[ $id == snapkv ]] && heads+=(snapkv:obs_window=16)
done
for m in "${heads[@]}"; do
  case "$m" in
    *:*) hw="$m,headwise=true" ;;
    *) hw="$m:headwise=true" ;;
  esac
  args+=(--method "$m" --method "$hw")
done
build/veloxquant eval --model data/stories260K.bin --text data/tinystories_validation_excerpt.txt \
  --tokens 512 --prefill 256 --budget 32,64 "${args[@]}" \
  --json results/eval/headwise.json "$@" 2>/dev/null | tee results/eval/headwise.txt
