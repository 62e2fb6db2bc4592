#!/usr/bin/env bash
# Writes data/ggml_blocks/<TYPE>.txt: for each GGUF block type, the first 2048 values of a
# tensor that llama.cpp's own quantizer (llama_model_quantize, the npm prebuilt's libllama)
# stored in that type, as the raw blocks and as ggml's to_float of them (hex). The model is
# vq_crosscheck's random 256-wide Llama (rows of 256 and 768 values). tests/test_ggml_fixtures.cpp
# checks VeloxQuant's dequantization and kernels against these files in CI, where llama.cpp is
# not available. Needs npm (bench/peers/llamacpp/setup.sh) and a build (scripts/build.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
lc=$(bench/peers/llamacpp/setup.sh)
export LLAMACPP_LIB_DIR
LLAMACPP_LIB_DIR=$(cd build/llamacpp/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64 && pwd)
vq=build/bench/peers/llamacpp/vq_crosscheck
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$vq" synth data/tok512.bin "$tmp/synth-f32.gguf"
mkdir -p data/ggml_blocks
for spec in q4_0:2:Q4_0 q4_1:3:Q4_1 q5_0:6:Q5_0 q5_1:7:Q5_1 q8_0:8:Q8_0 q2_k:10:Q2_K \
            q3_k_m:11:Q3_K q4_k_m:12:Q4_K q5_k_m:13:Q5_K q6_k:14:Q6_K; do
  IFS=: read -r kind id name <<<"$spec"
  "$lc" quantize "$tmp/synth-f32.gguf" "$tmp/synth-$kind.gguf" "$kind"
  "$lc" blocks "$tmp/synth-$kind.gguf" "$id" 2048 >"data/ggml_blocks/$name.txt"
  echo "data/ggml_blocks/$name.txt: $(head -1 "data/ggml_blocks/$name.txt") of llama.cpp's $kind file"
done
