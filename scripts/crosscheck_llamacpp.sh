#!/usr/bin/env bash
# Cross-checks VeloxQuant against llama.cpp on the same GGUF files.
#
# Installs the prebuilt llama.cpp from npm (@node-llama-cpp/linux-x64 and, for its headers, the
# llama.cpp source bundled in node-llama-cpp, both 3.22.1; optional GPU packages omitted) into
# build/llamacpp/, builds bench/peers/llamacpp/llamacpp_driver.c against it, converts the shipped
# stories260K to GGUF (f32 and q8_0 weights) and compares, model by model:
#   - greedy ids from BOS for the model's whole context (f32 KV cache): must be identical;
#   - per-token NLL of the first 512 tokens of the TinyStories excerpt, token by token, f32 KV:
#     |mean difference| must be <= 1e-5 for f32 weights and <= 1e-3 for q8_0 weights (both
#     engines quantize the activations of a Q8_0 matmul to Q8_0 blocks and sum integer block
#     dots; the q8_0 line also reports VeloxQuant with fp32 activations, no target);
#   - tokenizer ids of every shipped text (BOS added): must be identical;
#   - every tensor dequantized to fp32 by ggml and by VeloxQuant: must be bit-identical;
#   - llama.cpp's own tokenizer tests (models/ggml-vocab-*.gguf with .inp/.out, the .out
#     files written from the Hugging Face tokenizers) for llama-spm, llama-bpe and qwen2: both
#     tokenizers must reproduce the .out files; the two byte-level vocabularies are also
#     checked as tokenizer.json files (Llama 3 / Qwen2 pre-tokenizers) through VeloxQuant's
#     tokenizer.json reader.
# The f32 stories260K file is also rewritten (scripts/gguf_variant.py) as a 'qwen2' file with q/k/v
# biases, with Llama 3 rope_freqs factors and with linear RoPE scaling, each checked as f32.
# With ../shared/data present, TinyStories-656K (a Hugging Face checkpoint: rotate-half RoPE
# permuted by the converter, tokenizer.json vocabulary) is checked the same way, plus its Q4_0
# file from llama.cpp's quantizer. A random 256-wide model (vq_crosscheck synth) is checked at
# f32 and as llama.cpp's Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K_M, Q4_K_M, Q5_K_M and Q6_K files
# (each: dequantization bit-identical; NLL mean within 1e-2 of llama.cpp's; greedy reported).
# Why 1e-2 and not 1e-3 for that random model: its NLL mean (about 13) is chaotic at the 1e-3
# level between any two correct implementations. The run measures llama.cpp against itself on
# the same file (the same library with repacking off, LLAMACPP_NO_REPACK=1, and with its
# haswell and generic x64 CPU variants instead of the best one; each is a folder of links
# holding one libggml-cpu variant) and prints that spread beside VeloxQuant's difference.
# Measured (docs/own-models.md): llama.cpp's variants differ from its default run by up to
# 2.8e-3 on this text and by up to 4.3e-3 from each other on another TinyStories text; a code
# rounded to the other side of a boundary moves one token's NLL by 0.02-0.1 on this model (its
# generic x64 and AVX2 builds already differ by 0.028 at the first token of the q5_1 file). So
# 1e-3 cannot be a target there; 1e-2 is about 2.3x llama.cpp's own largest measured spread.
# (VeloxQuant's block products against the double-precision product of ggml's values:
# tests/test_block_quants.cpp, CloseToTheDoublePrecisionProductOfTheStoredValues.)
# Without npm or the registry, it says so and exits 0. Prints a report and writes it to
# results/crosscheck/crosscheck.txt (or $VQ_CROSSCHECK_OUT). Exit status 1 when a check fails.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
version=3.22.1
work=build/llamacpp
out=${VQ_CROSSCHECK_OUT:-results/crosscheck/crosscheck.txt}

# llama.cpp from npm and the driver: bench/peers/llamacpp/setup.sh (exit 3: npm or the registry
# is unavailable, so the cross-check is skipped and the rest of CI still runs).
lc=$(bench/peers/llamacpp/setup.sh)
case $? in
  0) ;;
  3) echo "crosscheck: llama.cpp is unavailable (see the message above); skipping the llama.cpp cross-check"
     exit 0 ;;
  *) echo "crosscheck: setting up llama.cpp failed" >&2
     exit 1 ;;
esac
bins_abs=$(cd "$work/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64" && pwd)
scripts/build.sh >/dev/null || { echo "crosscheck: building veloxquant failed" >&2; exit 1; }
export LLAMACPP_LIB_DIR=$bins_abs
vq=build/bench/peers/llamacpp/vq_crosscheck
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
report=$tmp/report.txt
say() { echo "$*" | tee -a "$report"; }

say "# VeloxQuant vs llama.cpp ($(git -C "$work/src" describe --tags --always 2>/dev/null || echo unknown), npm @node-llama-cpp/linux-x64@$version)"
say "# produced by scripts/crosscheck_llamacpp.sh at commit $(git rev-parse --short=12 HEAD)"

check_model() {  # name, checkpoint, type: veloxquant convert, then check_gguf
  local name=$1 src=$2 type=$3
  local gguf=$tmp/$name-$type.gguf
  build/veloxquant convert --from "$src" --to "$gguf" --type "$type" 2>"$tmp/convert.log" || {
    say "FAIL $name $type: convert failed: $(cat "$tmp/convert.log")"; failures=$((failures + 1)); return; }
  check_gguf "$name" "$gguf" "$type"
}

check_gguf() {  # name, file, type (f32: exact checks; q8_0: the 1e-3 target; others: reported)
  local name=$1 gguf=$2 type=$3
  # Every tensor dequantized by ggml and by VeloxQuant: bit-identical fp32.
  "$lc" dequant "$gguf" >"$tmp/lc.txt"
  "$vq" dequant "$gguf" >"$tmp/vq.txt" 2>"$tmp/vq.err"
  local types
  types=$(awk '{print $2}' "$tmp/lc.txt" | sort -n | uniq -c | awk '{printf "%s%s x%s", (NR > 1 ? ", " : ""), $2, $1}')
  if cmp -s "$tmp/lc.txt" "$tmp/vq.txt"; then
    say "ok   $name $type dequantization: $(wc -l <"$tmp/vq.txt") tensors bit-identical to ggml's (ggml type ids: $types)"
  else
    say "FAIL $name $type dequantization differs from ggml's: $(diff "$tmp/lc.txt" "$tmp/vq.txt" | head -2 | tr '\n' ' ')"
    failures=$((failures + 1))
  fi
  # The models here have a 512-token context: BOS, then up to 511 greedy tokens (or EOS).
  if ! "$vq" greedy "$gguf" 512 f32 >"$tmp/vq.txt" 2>"$tmp/vq.err"; then
    say "FAIL $name $type: veloxquant cannot run it: $(head -c 300 "$tmp/vq.err")"
    failures=$((failures + 1))
    return
  fi
  "$lc" greedy "$gguf" 512 f32 >"$tmp/lc.txt"
  if cmp -s "$tmp/lc.txt" "$tmp/vq.txt"; then
    say "ok   $name $type greedy: $(wc -l <"$tmp/vq.txt") ids identical (f32 KV)"
  elif [ "$type" = f32 ]; then
    say "FAIL $name $type greedy: ids differ (first difference at id $(cmp "$tmp/lc.txt" "$tmp/vq.txt" | sed -n 's/.*line \([0-9]*\).*/\1/p'))"
    failures=$((failures + 1))
  else
    say "info $name $type greedy: ids agree up to id $(( $(cmp "$tmp/lc.txt" "$tmp/vq.txt" | sed -n 's/.*line \([0-9]*\).*/\1/p') - 1 )) of $(wc -l <"$tmp/vq.txt") (exact match is required for f32 only)"
  fi
  "$lc" nll "$gguf" data/tinystories_validation_excerpt.txt 512 f32 >"$tmp/lc.txt"
  "$vq" nll "$gguf" data/tinystories_validation_excerpt.txt 512 f32 >"$tmp/vq.txt"
  local lm vm tol
  lm=$(sed -n 's/^mean \([^ ]*\) .*/\1/p' "$tmp/lc.txt")
  vm=$(sed -n 's/^mean \([^ ]*\) .*/\1/p' "$tmp/vq.txt")
  case $type in
    f32) tol=1e-5 ;;
    q8_0) tol=1e-3 ;;
    llama.cpp-*) tol=1e-2 ;;  # the random model: see the header and llama.cpp's own spread below
    *) tol=none ;;
  esac
  local verdict
  verdict=$(awk -v a="$lm" -v b="$vm" -v t="$tol" -v f="$tmp/lc.txt" -v g="$tmp/vq.txt" 'BEGIN {
    d = a - b; if (d < 0) d = -d;
    maxd = 0; n = 0;
    while ((getline x < f) > 0 && (getline y < g) > 0) {
      if (x ~ /^mean/) break; e = x - y; if (e < 0) e = -e; if (e > maxd) maxd = e; n++ }
    tag = t == "none" ? "info" : (d <= t + 0 ? "ok  " : "OVER");
    printf "%s llama.cpp %.9f veloxquant %.9f |diff| %.2e (target %s); max per-token |diff| %.2e over %d\n",
      tag, a, b, d, t, maxd, n }')
  say "$(echo "$verdict" | cut -c1-4) $name $type nll mean (first 512 tokens, f32 KV):$(echo "$verdict" | cut -c5-)"
  case $verdict in
    OVER*) if [ "$tol" != none ]; then failures=$((failures + 1)); fi ;;
  esac
  case $type in
    llama.cpp-*)
      # llama.cpp against itself on the same file: repacking off, and its haswell and generic
      # x64 CPU variants (a folder holding only that variant's libggml-cpu forces it).
      local spread="" vname vmean maxs=0
      for vname in no-repack haswell x64; do
        case $vname in
          no-repack) LLAMACPP_NO_REPACK=1 "$lc" nll "$gguf" data/tinystories_validation_excerpt.txt 512 f32 >"$tmp/lcv.txt" ;;
          *) LLAMACPP_LIB_DIR=$tmp/lib-$vname "$lc" nll "$gguf" data/tinystories_validation_excerpt.txt 512 f32 >"$tmp/lcv.txt" ;;
        esac
        vmean=$(sed -n 's/^mean \([^ ]*\) .*/\1/p' "$tmp/lcv.txt")
        [ -n "$vmean" ] || { spread="$spread $vname: failed;"; continue; }
        spread="$spread $vname $(awk -v a="$lm" -v b="$vmean" 'BEGIN { d = a - b; if (d < 0) d = -d; printf "%.2e", d }'),"
        maxs=$(awk -v a="$lm" -v b="$vmean" -v m="$maxs" 'BEGIN { d = a - b; if (d < 0) d = -d; print (d > m ? d : m) }')
      done
      say "info $name $type llama.cpp against itself (|nll mean diff| to its default run):${spread%,}; max $(awk -v m="$maxs" 'BEGIN { printf "%.2e", m }')"
      ;;
  esac
  if [ "$type" = q8_0 ]; then
    # The accuracy cost of the activation rounding: VeloxQuant with fp32 activations instead.
    VQ_CROSSCHECK_Q8_0_ACTIVATIONS=f32 "$vq" nll "$gguf" data/tinystories_validation_excerpt.txt 512 f32 >"$tmp/vq32.txt"
    local fm
    fm=$(sed -n 's/^mean \([^ ]*\) .*/\1/p' "$tmp/vq32.txt")
    absdiff() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; printf "%.2e", d }'; }
    say "info $name $type nll mean with fp32 activations (no target): veloxquant $fm," \
        "|diff| to llama.cpp $(absdiff "$lm" "$fm"), to veloxquant with q8_0 activations $(absdiff "$vm" "$fm")"
    # How long the two engines' per-token NLLs agree to 1e-5 before a code rounded differently
    # (an activation within an ulp of a rounding boundary) first separates them.
    local agree
    agree=$(awk -v f="$tmp/lc.txt" -v g="$tmp/vq.txt" -v h="$tmp/vq32.txt" 'BEGIN { n = 0; m = -1; k = 0; k32 = -1;
      while ((getline x < f) > 0 && (getline y < g) > 0 && (getline z < h) > 0) {
        if (x ~ /^mean/) break; e = x - y; if (e < 0) e = -e; e32 = x - z; if (e32 < 0) e32 = -e32;
        if (m < 0 && e > 1e-5) m = n; if (k32 < 0 && e32 > 1e-5) k32 = n; n++ }
      printf "%d (q8_0 activations), %d (fp32 activations)", m < 0 ? n : m, k32 < 0 ? n : k32 }')
    say "info $name $type per-token nll within 1e-5 of llama.cpp's for the first $agree tokens"
  fi
  if [ "$type" = f32 ]; then
    for text in data/*.txt; do
      if ! "$lc" tokenize "$gguf" "$text" >"$tmp/lc.txt" 2>"$tmp/lc.err"; then
        say "skip $name tokenizer on $(basename "$text"): llama.cpp aborted ($(grep -m1 what "$tmp/lc.err" | sed 's/^ *//'));" \
            "the vocabulary has no <0xNN> byte tokens, so text outside it has no byte fallback"
        continue
      fi
      "$vq" tokenize "$gguf" "$text" >"$tmp/vq.txt"
      if cmp -s "$tmp/lc.txt" "$tmp/vq.txt"; then
        say "ok   $name tokenizer on $(basename "$text"): $(wc -l <"$tmp/vq.txt") ids identical"
      else
        say "FAIL $name tokenizer on $(basename "$text"): ids differ"
        failures=$((failures + 1))
      fi
    done
  fi
}

check_model stories260K data/stories260K.bin f32
check_model stories260K data/stories260K.bin q8_0
check_model stories260K data/stories260K.bin f16
check_model stories260K data/stories260K.bin bf16
# Architecture features on the same weights (scripts/gguf_variant.py): 'qwen2' with q/k/v biases
# (rotate-half RoPE), Llama 3's rope_freqs factors, linear RoPE scaling; exact checks as f32.
for v in qwen2 freqs linear; do
  python3 scripts/gguf_variant.py "$tmp/stories260K-f32.gguf" "$tmp/stories260K-$v.gguf" "$v" &&
    check_gguf "stories260K-$v" "$tmp/stories260K-$v.gguf" f32
done
if [ -d ../shared/data/models/tinystories-656K ]; then
  check_model tinystories-656K ../shared/data/models/tinystories-656K f32
  check_model tinystories-656K ../shared/data/models/tinystories-656K q8_0
  # llama.cpp's own quantizer (rows of 128: every matrix Q4_0, one Q8_0).
  "$lc" quantize "$tmp/tinystories-656K-f32.gguf" "$tmp/tinystories-656K-llama-q4_0.gguf" q4_0 &&
    check_gguf tinystories-656K "$tmp/tinystories-656K-llama-q4_0.gguf" q4_0
else
  say "skip tinystories-656K (../shared/data not present)"
fi
# A random model with 256- and 768-wide rows, so llama.cpp's K-quants apply, written by
# llama.cpp's quantizer as every block type (q3_k_m: Q3_K with Q4_K/Q5_K/Q6_K; q4_k_m: Q4_K and
# Q6_K; ...) and read back by VeloxQuant in the stored blocks: dequantization bit-identical,
# NLL mean within 1e-2 of llama.cpp's (the header says why). Its f32 file is checked exactly too.
# One-variant folders of llama.cpp's CPU backend, for the spread above.
for v in haswell x64; do
  mkdir -p "$tmp/lib-$v"
  for f in "$bins_abs"/*.so; do
    case $(basename "$f") in libggml-cpu-*) ;; *) ln -s "$f" "$tmp/lib-$v/" ;; esac
  done
  ln -s "$bins_abs/libggml-cpu-$v.so" "$tmp/lib-$v/"
done
"$vq" synth data/tok512.bin "$tmp/synthetic-256-f32.gguf"
check_gguf synthetic-256 "$tmp/synthetic-256-f32.gguf" f32
for q in q4_0 q4_1 q5_0 q5_1 q2_k q3_k_m q4_k_m q5_k_m q6_k; do
  "$lc" quantize "$tmp/synthetic-256-f32.gguf" "$tmp/synthetic-256-$q.gguf" "$q" &&
    check_gguf synthetic-256 "$tmp/synthetic-256-$q.gguf" "llama.cpp-$q"
done

for v in llama-spm llama-bpe qwen2; do
  f=$work/src/models/ggml-vocab-$v.gguf
  [ -f "$f" ] || continue
  "$lc" tokenize-tests "$f" "$f.inp" >"$tmp/lc.txt"
  if ! "$vq" tokenize-tests "$f" "$f.inp" >"$tmp/vq.txt" 2>"$tmp/vq.err"; then
    say "FAIL vocab $v: veloxquant cannot read it: $(head -c 300 "$tmp/vq.err")"
    failures=$((failures + 1))
    continue
  fi
  n=$(wc -l <"$f.out")
  lcbad=$(diff "$tmp/lc.txt" "$f.out" | grep -c '^<')
  vqbad=$(diff "$tmp/vq.txt" "$f.out" | grep -c '^<')
  if [ "$vqbad" = 0 ]; then
    say "ok   vocab $v (GGUF): llama.cpp's $n tokenizer tests: veloxquant $((n - vqbad))/$n, llama.cpp $((n - lcbad))/$n"
  else
    say "FAIL vocab $v (GGUF): llama.cpp's $n tokenizer tests: veloxquant $((n - vqbad))/$n, llama.cpp $((n - lcbad))/$n"
    failures=$((failures + 1))
  fi
  # The same vocabulary as the tokenizer.json its Hugging Face model ships (Split regex +
  # ByteLevel; Qwen2 adds an NFC normalizer), read by VeloxQuant's tokenizer.json reader.
  case $v in
    llama-bpe) hf=llama3 ;;
    qwen2) hf=qwen2 ;;
    *) continue ;;
  esac
  "$vq" hf-json "$f" "$hf" "$tmp/tokenizer.json" &&
    "$vq" tokenize-tests "$tmp/tokenizer.json" "$f.inp" >"$tmp/vq.txt" 2>"$tmp/vq.err"
  hfbad=$(diff "$tmp/vq.txt" "$f.out" | grep -c '^<')
  if [ -s "$tmp/vq.txt" ] && [ "$hfbad" = 0 ]; then
    say "ok   vocab $v (as tokenizer.json, $hf pre-tokenizer): veloxquant $n/$n"
  else
    say "FAIL vocab $v (as tokenizer.json, $hf pre-tokenizer): veloxquant $((n - hfbad))/$n $(head -c 200 "$tmp/vq.err")"
    failures=$((failures + 1))
  fi
done

say "# $failures failed checks"
mkdir -p "$(dirname "$out")"
cp "$report" "$out"
[ "$failures" -eq 0 ]
