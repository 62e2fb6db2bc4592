#!/usr/bin/env bash
# Configures and builds VeloxQuant into build/ (or $VQ_BUILD_DIR).
#   scripts/build.sh [--target T ...] [CMAKE_OPTION ...]
# Every call configures with the same cache options (Release, -Werror), so scripts/main.sh, which
# builds only the command-line tool (--target veloxquant_cli), and scripts/test.sh, which builds
# everything, share one build tree: test.sh after main.sh compiles only what main.sh did not.
# `--target T` (repeatable) builds only T; without it, everything. Other arguments go to CMake's
# configure step and come after the defaults, so they win.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${VQ_BUILD_DIR:-build}
targets=()
cmake_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --target)
      if [ $# -lt 2 ]; then
        echo "build.sh: --target needs a target name" >&2
        exit 2
      fi
      targets+=(--target "$2")
      shift 2
      ;;
    *)
      cmake_args+=("$1")
      shift
      ;;
  esac
done
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DVELOXQUANT_WERROR=ON "${cmake_args[@]}" >/dev/null
cmake --build "$build_dir" -j"$(nproc)" "${targets[@]}"
