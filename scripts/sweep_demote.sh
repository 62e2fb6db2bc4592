#!/usr/bin/env bash
# Mixed precision (demote=, docs/methods.md "Composition") against fp16 eviction at equal bytes, in the
# main job's scenario: stories260K reads the first 512 tokens of the TinyStories excerpt, the
# first 256 as one prefill, then 255 decoded predictions. Every method with a token budget runs
# with demote=kivi4 and demote=kivi2 at budgets 32 and 64 (demote_budget = the budget), and in
# fp16 at the budgets of equal kept bytes at head_dim 8 (a demoted row costs 16 bytes at 4 bits,
# 12 at 2 bits, against 32 for an fp16 row: budget b + b demoted rows = 1.5 b fp16 rows at
# 4 bits, 1.375 b at 2 bits), so 48, 96, 44 and 88. cam runs with merge=drop beside demote (the
# two are exclusive). Writes results/eval/demote_stories260K_tinystories.{json,txt} and
# results/eval/demote_fp16_stories260K_tinystories.{json,txt}. Expects a build.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/veloxquant
common=(--model data/stories260K.bin --text data/tinystories_validation_excerpt.txt --tokens 512
        --prefill 256)
mixed=()
fp16=()
# Every method with a token budget (the registry's, in its order) but cam, whose default merge
# excludes demote= and which follows with merge=drop.
for id in $("$bin" list --ids --with budget); do
  [[ $id == cam ]] && continue
  mixed+=(--method "$id:demote=kivi4" --method "$id:demote=kivi2")
  fp16+=(--method "$id")
done
mixed+=(--method "cam:merge=drop,demote=kivi4" --method "cam:merge=drop,demote=kivi2")
fp16+=(--method cam --method "cam:merge=drop")
out=results/eval
"$bin" eval "${common[@]}" --budget 32,64 "${mixed[@]}" \
  --json "$out/demote_stories260K_tinystories.json" > "$out/demote_stories260K_tinystories.txt"
"$bin" eval "${common[@]}" --budget 32,44,48,64,88,96 "${fp16[@]}" \
  --json "$out/demote_fp16_stories260K_tinystories.json" > "$out/demote_fp16_stories260K_tinystories.txt"
