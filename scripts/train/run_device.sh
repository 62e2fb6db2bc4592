#!/usr/bin/env bash
# One-shot training of the task model on a CUDA machine (docs/tasks.md, "The task model").
#   OUT=/path/to/empty/folder scripts/train/run_device.sh [extra train_task_model.py flags]
# Environment: OUT (required: where the files go), PYTHON (default python3, with PyTorch + CUDA),
# TIME_BUDGET (training seconds, default 420), WORKERS (data workers, default: cores - 2, at
# most 14), SEED (default 1), DEVICE (default cuda; cpu only to try the script out).
# Writes $OUT/task_model.bin (llama2.c v0, < 16 MiB), $OUT/task_model.json (configuration, data
# sha256, loss curve, tokens, time, device, held-out accuracy) and $OUT/train.log (this output).
# Both model files are rewritten every 2 minutes while training, so a run stopped from outside
# still leaves a usable model. Needs no network and no package beyond PyTorch and the standard
# library. Wall time: about TIME_BUDGET + 40 s (start-up, final export, held-out evaluation).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ -z "${OUT:-}" ]; then
  echo "run_device.sh: set OUT to the folder to write into" >&2
  exit 2
fi
mkdir -p "$OUT"
PY=${PYTHON:-python3}
device=${DEVICE:-cuda}
cores=$(nproc)
workers=${WORKERS:-$(( cores > 3 ? (cores - 2 < 14 ? cores - 2 : 14) : 1 ))}
{
  echo "[run_device] $(date -u +%FT%TZ) $(uname -n), $cores cores, $($PY --version 2>&1)"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  $PY - "$device" <<'EOF'
import sys
import torch
print("[run_device] torch", torch.__version__, "cuda", torch.version.cuda,
      "available", torch.cuda.is_available(), flush=True)
if sys.argv[1] == "cuda" and not torch.cuda.is_available():
    raise SystemExit("run_device.sh: CUDA is not available to PyTorch; this script trains on a GPU")
EOF
  $PY -u scripts/train/train_task_model.py --out "$OUT" --device "$device" \
    --time-budget "${TIME_BUDGET:-420}" --workers "$workers" --seed "${SEED:-1}" "$@"
  echo "[run_device] $(date -u +%FT%TZ) finished"
  ls -l "$OUT"
} 2>&1 | tee "$OUT/train.log"
