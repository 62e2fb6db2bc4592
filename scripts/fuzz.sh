#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) with clang, ASan, UBSan and fuzzer coverage in
# build-fuzz/, then runs each for SECONDS (default 45) from its seed corpus (fuzz/corpus/NAME,
# plus seeds taken from ../shared/data when present). Fails on any crash, leak, timeout, or
# exception other than vq::Error. New inputs are written to build-fuzz/corpus/NAME (not the
# committed corpus); a crash leaves its input in build-fuzz/crashes/ — add it to
# fuzz/corpus/NAME/ as a regression input once fixed.
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-45}
shift || true
scripts/setup.sh --fuzz
export VQ_BUILD_DIR=build-fuzz
CXX=clang++ CC=clang scripts/build.sh -DVELOXQUANT_FUZZ=ON -DVELOXQUANT_BUILD_TESTS=OFF \
  -DVELOXQUANT_BUILD_BENCH=OFF -DVELOXQUANT_NATIVE=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" \
  -DCMAKE_CXX_COMPILER=clang++ -DVELOXQUANT_WERROR=OFF

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(spec llama2c tokenizer_bin safetensors config_json tokenizer_json result_table gguf
           gguf_tokenizer capi_steps validate safetensors_index rope_config)
  targets+=(registry)  # issue 33: the custom-method registry
  # Issue 33: the server's OpenAI request mapper and the chat template renderer.
  targets+=(openai_request chat_template)
  targets+=(state_load)  # issue 32: cache state loading
fi
shared=${VELOXQUANT_SHARED_DIR:-../shared}/data
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
mkdir -p build-fuzz/crashes
failed=()
for t in "${targets[@]}"; do
  work=build-fuzz/corpus/$t
  mkdir -p "$work"
  # Seeds that cannot ship with the project (TinyStories-656K's files) when they are here.
  case $t in
    llama2c) cp data/stories260K.bin "$work/" ;;
    tokenizer_bin) cp data/tok512.bin "$work/" ;;
    gguf) cp data/ggml-vocab-llama-spm.gguf "$work/" ;;
    config_json) cp "$shared/models/tinystories-656K/config.json" "$work/" 2>/dev/null || true ;;
    tokenizer_json) cp "$shared/models/tinystories-656K/tokenizer.json" "$work/" 2>/dev/null || true ;;
    safetensors)
      st=$shared/models/tinystories-656K/model.safetensors
      if [ -f "$st" ]; then  # the header and the first 4 KiB of data
        n=$(od -An -t u8 -N 8 "$st" | tr -d ' ')
        head -c $((8 + n + 4096)) "$st" >"$work/tinystories_head.safetensors"
      fi ;;
  esac
  dict=()
  [ -f "fuzz/$t.dict" ] && dict=(-dict="fuzz/$t.dict")
  if [ "$t" = spec ]; then  # the method ids from the registry, beside the dictionary's keys
    cp fuzz/spec.dict build-fuzz/spec.dict
    build-fuzz/veloxquant list --ids | sed 's/.*/"&"/' >>build-fuzz/spec.dict
    dict=(-dict=build-fuzz/spec.dict)
  fi
  echo "fuzz: $t for ${seconds}s" >&2
  if ! build-fuzz/fuzz/fuzz_"$t" "${dict[@]}" -max_total_time="$seconds" -max_len=1100000 \
      -timeout=20 -rss_limit_mb=3072 -malloc_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix=build-fuzz/crashes/"$t"- "$work" "fuzz/corpus/$t" \
      >build-fuzz/"$t".log 2>&1; then
    echo "fuzz: $t FAILED (build-fuzz/$t.log):" >&2
    tail -40 build-fuzz/"$t".log >&2
    failed+=("$t")
  else
    grep -E "stat::number_of_executed_runs|cov:" build-fuzz/"$t".log | tail -2 >&2 || true
  fi
done
if [ ${#failed[@]} -ne 0 ]; then
  echo "fuzz: failed: ${failed[*]} (inputs in build-fuzz/crashes/)" >&2
  exit 1
fi
echo "fuzz: ${#targets[@]} targets, ${seconds}s each, no failures" >&2
