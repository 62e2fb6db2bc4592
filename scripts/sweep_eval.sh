#!/usr/bin/env bash
# The committed evaluation sweep (results/eval/): stories260K on the first 512 tokens of the
# TinyStories and WikiText-2 excerpts (data/), every registered method with its defaults plus
# the variants docs/benchmarks.md discusses, at budgets 32, 64, 128 and 256 rows per KV head; each
# attention-scored method twice: with its default source=auto, which the engine's probabilities
# resolve to true attention, and with the key-as-query proxy (source=proxy). A third run reads TinyStories after a 256-token prefill, where
# prefill-time methods (snapkv) compress and every method makes its prefill decision; its
# summaries count the 255 decoded predictions. Writes results/eval/stories260K_<run>.{json,svg,txt}.
# Expects a build (scripts/build.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/veloxquant
methods=()
for id in $("$bin" list | awk '{print $1}'); do methods+=(--method "$id"); done
# The paper's H2O rule (no grace window, no decay), CaM with its gate off, and CaM's merge as
# the disposition of other eviction methods.
methods+=(--method "h2o:grace=0,decay=1" --method "cam:merge_gate=false"
          --method "h2o:merge=sim_weighted" --method "streaming_llm:merge=sim_weighted"
          --method "streaming_llm:merge=mean,target=window")
# The same methods scored by the key-as-query proxy (every method with a `source` field), the
# paper's H2O rule with the proxy, and CaM's other gate and the seed's nearest blend.
for id in $("$bin" list | awk '{print $1}'); do
  if "$bin" list "$id" | grep -q '^source '; then methods+=(--method "$id:source=proxy"); fi
done
methods+=(--method "h2o:grace=0,decay=1,source=proxy"
          --method "cam:merge_attention=cumulative"
          --method "cam:target=nearest,merge=sim_weighted")
# The methods whose defaults are H2O's paper rule (no recent window: pyramidkv, squeeze, chunkkv,
# keyformer) on H2O's usable base (grace 16, decay 0.98, as h2o's defaults), with both sources,
# and CaM's merging on that base.
for base in "pyramidkv:grace=16,decay=0.98" "squeeze:grace=16,decay=0.98" \
            "chunkkv:grace=16,decay=0.98" "keyformer:recent=16" \
            "h2o:merge=sim_weighted,merge_gate=false" "h2o:target=window,merge=mean"; do
  methods+=(--method "$base" --method "$base,source=proxy")
done
mkdir -p results/eval
run() {  # run NAME TEXT [extra eval flags]
  local name=$1 file=$2
  shift 2
  local out=results/eval/stories260K_$name
  "$bin" eval --model data/stories260K.bin --text "$file" --tokens 512 --budget 32,64,128,256 \
    "${methods[@]}" "$@" --json "$out.json" --plot "$out.svg" | tee "$out.txt"
}
run tinystories data/tinystories_validation_excerpt.txt
run wikitext2 data/wikitext2_test_excerpt.txt
run tinystories_prefill256 data/tinystories_validation_excerpt.txt --prefill 256
