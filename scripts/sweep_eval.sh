#!/usr/bin/env bash
# The committed evaluation sweep (results/eval/): stories260K on the first 512 tokens of the
# TinyStories and WikiText-2 excerpts (data/), every registered method with its defaults plus
# the variants the README discusses, at budgets 32, 64, 128 and 256 rows per KV head.
# Writes results/eval/stories260K_<text>.{json,svg,txt}. Expects a build (scripts/build.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/veloxquant
methods=()
for id in $("$bin" list | awk '{print $1}'); do methods+=(--method "$id"); done
# The paper's H2O rule (no grace window, no decay), CaM with its gate off, and CaM's merge as
# the disposition of other eviction methods.
methods+=(--method "h2o:grace=0,decay=1" --method "cam:merge_gate=false"
          --method "h2o:merge=sim_weighted" --method "streaming_llm:merge=sim_weighted")
mkdir -p results/eval
for text in tinystories:data/tinystories_validation_excerpt.txt wikitext2:data/wikitext2_test_excerpt.txt; do
  name=${text%%:*}
  file=${text#*:}
  out=results/eval/stories260K_$name
  "$bin" eval --model data/stories260K.bin --text "$file" --tokens 512 --budget 32,64,128,256 \
    "${methods[@]}" --json "$out.json" --plot "$out.svg" | tee "$out.txt"
done
