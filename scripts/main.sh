#!/usr/bin/env bash
# The main job on a fresh Debian machine: installs what is missing, builds the command-line tool
# (only that target: the tests, benchmarks and Python module are scripts/test.sh's; both configure
# build/ alike, so test.sh reuses these objects), then evaluates every
# registered KV-cache method on a real trained model as it would be used: stories260K
# (data/stories260K.bin) reads the first 512 tokens of the TinyStories excerpt (data/), the first
# 256 as one prefill (a long prompt: prefill-time methods such as snapkv compress it, and every
# method makes its prefill decision), then the other 256 teacher-forced, one decoded token per
# step, through each method at budgets 32, 64 and 128 rows per KV head, against the full cache.
# Perplexity, KL and top-1 agreement count the 255 decoded predictions. Prints the table
# (perplexity, KL, top-1 agreement, kept tokens and bytes, compression ratio or "keeps all",
# time per token) and writes results/eval/main.json and results/eval/main.svg. Flags after the
# script go to `veloxquant eval` and override these (e.g. --prefill 0 for token-by-token reading,
# --method h2o:source=attention).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh --target veloxquant_cli
build/veloxquant eval --model data/stories260K.bin --text data/tinystories_validation_excerpt.txt \
  --tokens 512 --prefill 256 --budget 32,64,128 --json results/eval/main.json --plot results/eval/main.svg "$@"
