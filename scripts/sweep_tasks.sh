#!/usr/bin/env bash
# The long-context task sweep (docs/tasks.md, issue 29): every registered method at 4x, 8x and
# 16x equal memory against the full cache, on the shipped task model (data/task-model.bin, or
# MODEL=FILE: any llama2.c, Hugging Face or GGUF model the engine loads), RULER-style tasks at
# three prompt lengths and five needle depths, greedy answers scored by string_match_all, 95%
# intervals paired with the full cache. Prints the accuracy table and writes
# results/tasks/<name>.json and .svg (the length x depth heatmaps).
#   scripts/sweep_tasks.sh [extra `veloxquant eval` flags]
# Flags after the script go to every `veloxquant eval` it runs (e.g. --method NAME, repeated).
# Environment: MODEL (data/task-model.bin), TASKS (niah_single,niah_multikey), LENGTHS (512,768,1024 on the task model: niah_multikey needs at least 358 tokens),
# SAMPLES (10 per task x length x depth), RATIOS (4,8,16), NAME (sweep), THREADS (all cores).
# Installs what is missing (apt) and builds the CLI first, as scripts/main.sh does.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-data/task-model.bin}
NAME=${NAME:-sweep}
if [ ! -f "$MODEL" ]; then
  echo "sweep_tasks: no model file $MODEL (the task model is built by scripts/train/train_cpu.sh;" \
       "see docs/tasks.md) - set MODEL=FILE to sweep another model" >&2
  exit 2
fi
scripts/setup.sh
scripts/build.sh --target veloxquant_cli
mkdir -p results/tasks
lengths=()
if [ -n "${LENGTHS:-}" ] || [ "$MODEL" = data/task-model.bin ]; then
  lengths=(--lengths "${LENGTHS:-512,768,1024}")
fi
start=$(date +%s)
build/veloxquant eval --model "$MODEL" --task "${TASKS:-niah_single,niah_multikey}" \
  "${lengths[@]}" --samples "${SAMPLES:-10}" --ratio "${RATIOS:-4,8,16}" \
  --threads "${THREADS:-$(nproc)}" \
  --json "results/tasks/$NAME.json" --plot "results/tasks/$NAME.svg" "$@"
echo "sweep_tasks: $(( $(date +%s) - start )) s on $(nproc) cores; results/tasks/$NAME.json, results/tasks/$NAME.svg"
