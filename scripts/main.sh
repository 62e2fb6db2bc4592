#!/usr/bin/env bash
# The main job on a fresh Debian machine: installs what is missing, builds, then evaluates every
# registered KV-cache method on a real trained model: stories260K (data/stories260K.bin) reads
# the first 512 tokens of the TinyStories excerpt (data/) teacher-forced, token by token,
# through each method at budgets 32, 64 and 128 rows per KV head, against the full cache.
# Prints the table (perplexity, KL, top-1 agreement, kept tokens and bytes, time per token) and
# writes results/eval/main.json and results/eval/main.svg. Flags after the script go to
# `veloxquant eval` (e.g. --prefill 128, --tokens 256, --method h2o:grace=0,decay=1).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
build/veloxquant eval --model data/stories260K.bin --text data/tinystories_validation_excerpt.txt \
  --budget 32,64,128 --json results/eval/main.json --plot results/eval/main.svg "$@"
