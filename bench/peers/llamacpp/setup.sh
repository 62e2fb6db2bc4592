#!/usr/bin/env bash
# Installs the prebuilt llama.cpp from npm into build/llamacpp/ and builds llamacpp_driver.c
# against it: @node-llama-cpp/linux-x64 (libllama, libggml and its CPU backends, one per
# instruction set) and node-llama-cpp of the same version, whose bundled llama.cpp source gives
# llama.h / ggml.h. Optional GPU packages are omitted; install scripts are not run.
#
# Run from anywhere; prints nothing on success but the driver's path on stdout.
# Exit status: 0 ready; 3 npm or the registry is unavailable (a message says so; callers skip);
# 1 something else failed (message on stderr).
set -uo pipefail
cd "$(dirname "$0")/../../.."
version=3.22.1
work=build/llamacpp

if ! command -v npm >/dev/null 2>&1; then
  echo "llama.cpp setup: npm is not installed; no llama.cpp" >&2
  exit 3
fi
bins=$work/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
bundle=$work/node_modules/node-llama-cpp/llama/gitRelease.bundle
if [ ! -f "$bins/libllama.v0.5.0.so" ] || [ ! -f "$bundle" ]; then
  mkdir -p "$work"
  if ! timeout 60 npm view "@node-llama-cpp/linux-x64@$version" version >/dev/null 2>&1; then
    echo "llama.cpp setup: the npm registry is not reachable (or has no @node-llama-cpp/linux-x64@$version); no llama.cpp" >&2
    exit 3
  fi
  echo "llama.cpp setup: installing node-llama-cpp@$version and @node-llama-cpp/linux-x64@$version into $work" >&2
  (cd "$work" && timeout 600 npm install --omit=optional --ignore-scripts --no-audit --no-fund \
     "node-llama-cpp@$version" "@node-llama-cpp/linux-x64@$version" >npm.log 2>&1) || {
    echo "llama.cpp setup: npm install failed (see $work/npm.log)" >&2
    exit 1
  }
fi
libllama=$(ls "$bins"/libllama.v*.so 2>/dev/null | head -1)
libggml=$(ls "$bins"/libggml.v*.so 2>/dev/null | head -1)
if [ -z "$libllama" ] || [ -z "$libggml" ]; then
  echo "llama.cpp setup: no libllama in $bins" >&2
  exit 1
fi
if [ ! -f "$work/src/include/llama.h" ]; then
  rm -rf "$work/src"
  git clone -q "$bundle" "$work/src" 2>/dev/null || {
    echo "llama.cpp setup: cannot clone $bundle" >&2
    exit 1
  }
fi
bins_abs=$(cd "$bins" && pwd)
driver=$work/llamacpp_driver
if [ ! -x "$driver" ] || [ bench/peers/llamacpp/llamacpp_driver.c -nt "$driver" ]; then
  ${CC:-cc} -O2 -std=c11 -Wall -Wextra -o "$driver" bench/peers/llamacpp/llamacpp_driver.c \
    -I"$work/src/include" -I"$work/src/ggml/include" -L"$bins_abs" \
    -l:"$(basename "$libllama")" -l:"$(basename "$libggml")" -l:libggml-base.so -lm \
    -Wl,-rpath,"$bins_abs" || {
    echo "llama.cpp setup: building the driver failed" >&2
    exit 1
  }
fi
echo "$(pwd)/$driver"
