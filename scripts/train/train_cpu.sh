#!/usr/bin/env bash
# The shipped task model's training run, on a CPU (docs/tasks.md, "The task model").
#   OUT=/path/to/folder scripts/train/train_cpu.sh [extra train_task_model.py flags]
# Environment: OUT (required), PYTHON (default /usr/bin/python3: Debian's python3-torch; install
# libopenblas0-pthread too, or PyTorch runs on the reference BLAS, about 4x slower),
# TIME_BUDGET (training seconds, default 2700; the shipped model used 5100), SEED (default 1),
# CURRICULUM (the --stages file, default scripts/train/curriculum_cpu.json), OMP_NUM_THREADS
# (default 1: on the 2-core machine one torch thread trains 2-3x faster than two).
# Trains a 0.85M-parameter Llama (dim 128, 4 layers, 2 query heads of 64, 1 KV head, context
# 1152) through the curriculum: copy rows only (random 8-32-token segments written twice, 176-token
# rows) until their loss falls under 1 nat (the induction heads retrieval needs have formed; or
# 20% of the run); niah_single on a noise haystack at 256 tokens until the answer's loss falls
# under 0.3 (or 50%); niah_single and niah_multikey at 512 tokens until the same (or 70%); then
# every training task at 512 and 1024 tokens. Writes $OUT/task_model.bin, $OUT/task_model.json
# (configuration, data sha256, stages, loss curve, held-out accuracy) and $OUT/train.log.
# The shipped data/task-model.bin: OUT=... OMP_NUM_THREADS=1 TIME_BUDGET=5100 (docs/tasks.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ -z "${OUT:-}" ]; then
  echo "train_cpu.sh: set OUT to the folder to write into" >&2
  exit 2
fi
mkdir -p "$OUT"
PY=${PYTHON:-/usr/bin/python3}
{
  echo "[train_cpu] $(date -u +%FT%TZ) $(uname -n), $(nproc) cores, $($PY --version 2>&1)"
  OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} $PY -u scripts/train/train_task_model.py \
    --out "$OUT" --device cpu --time-budget "${TIME_BUDGET:-2700}" --workers 1 \
    --seed "${SEED:-1}" --stages "@${CURRICULUM:-scripts/train/curriculum_cpu.json}" \
    --lengths 512,1024 --length-weights 1,2 --min-length 200 \
    --dim 128 --hidden-dim 384 --n-heads 2 --n-kv-heads 1 --n-layers 4 --lr 3e-3 \
    --eval-lengths 512,1024 --eval-samples 20 --eval-batch 10 --log-every 20 "$@"
  echo "[train_cpu] $(date -u +%FT%TZ) finished"
  ls -l "$OUT"
} 2>&1 | tee "$OUT/train.log"
