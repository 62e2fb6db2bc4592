#!/usr/bin/env bash
# Builds llama.cpp's own tools (llama-bench, llama-quantize, llama-perplexity, llama-server) natively for this
# CPU from the llama.cpp source that npm's node-llama-cpp bundles (the same commit as the
# prebuilt libraries bench/peers/llamacpp/setup.sh installs), into build/llamacpp-native/bin/.
#
#   bench/peers/build_llamacpp_native.sh [-jN]
#
# CMake, Release, -DGGML_NATIVE=ON (-march=native), static libraries, no CURL, no tests or
# examples beyond the four tools (llama-server: bench/serve_load.py --peer-llama-server). AMX
# is switched off (-mno-amx-tile -mno-amx-int8 -mno-amx-bf16): on this project's machine (CPU flags amx_tile, amx_int8) a -march=native
# build compiles ggml's AMX extra buffer type, and llama-bench then segfaults in
# ggml_backend_amx_mul_mat on the first prompt batch of a Q4_0 file (gdb backtrace:
# llama_decode -> ggml_cpu_extra_compute_forward -> amx::tensor_traits::compute_forward ->
# ggml_backend_amx_mul_mat, at its first ldtilecfg; Q5_0, which has no AMX kernel, runs). The
# kernel grants AMX here (arch_prctl ARCH_REQ_XCOMP_PERM succeeds and a test program's tile
# instructions run) and the npm prebuilt's sapphirerapids (AMX) variant runs the same prompts,
# so it is this build's AMX code path; the cause inside it was not found. Everything else
# native stays (AVX-512, VNNI, the repacked Q4_0 / Q4_K / Q2_K layouts); the npm library's
# default run on this CPU does use AMX for Q4_0/Q4_1/Q8_0/Q4_K/Q5_K/Q6_K weights.
# Idempotent: an up-to-date build only re-runs make (which does nothing). Not run by CI.
# Prints the bin folder on stdout. Exit status 3 when npm/the bundle is unavailable (setup.sh),
# 1 on a failed build.
set -uo pipefail
cd "$(dirname "$0")/../.."
jobs=${1:--j2}
bench/peers/llamacpp/setup.sh >/dev/null
case $? in
  0) ;;
  3) echo "build_llamacpp_native: llama.cpp's source is unavailable (see above)" >&2; exit 3 ;;
  *) echo "build_llamacpp_native: setup failed" >&2; exit 1 ;;
esac
src=build/llamacpp/src
out=build/llamacpp-native
launcher=()
if command -v ccache >/dev/null 2>&1; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
noamx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
cmake -S "$src" -B "$out" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
  -DCMAKE_C_FLAGS="$noamx" -DCMAKE_CXX_FLAGS="$noamx" "${launcher[@]}" >"$out.cmake.log" 2>&1 || {
  echo "build_llamacpp_native: cmake configure failed (see $out.cmake.log)" >&2
  exit 1
}
cmake --build "$out" "$jobs" --target llama-bench llama-quantize llama-perplexity llama-server >"$out.build.log" 2>&1 || {
  echo "build_llamacpp_native: build failed (see $out.build.log)" >&2
  exit 1
}
for t in llama-bench llama-quantize llama-perplexity llama-server; do
  [ -x "$out/bin/$t" ] || { echo "build_llamacpp_native: $out/bin/$t is missing" >&2; exit 1; }
done
echo "$(pwd)/$out/bin"
