#!/usr/bin/env bash
# The main job on a fresh Debian machine: installs what is missing, builds, and runs every
# registered method on synthetic K/V (kept tokens, bytes, compression ratio, perturbation).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
build/veloxquant demo "$@"
