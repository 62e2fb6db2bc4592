#!/usr/bin/env bash
# The bad-input catalogue, round three (issue 33), the files and the command line: inputs that
# block (FIFOs), outputs that would replace an input, files that lie (settings that overflow
# float32, tensors the model does not use, NaN biases, metadata that amplifies), names with
# control and bidi characters, selection files of the wrong shape, unsigned flags given -1, and
# a spec's budget without --budget. Each case asserts the exit status, that stderr names the
# file or flag, that nothing is left under $tmp/out and that every existing file (inputs
# included) is unchanged. Fixtures are written at test time by bad_input3_fixtures.py.
# Usage: bad_input3_test.sh VELOXQUANT_BINARY PROJECT_DIR
set -uo pipefail
bin=$1
root=$2
data=$root/data
model=$data/stories260K.bin
tok=$data/tok512.bin
text=$data/tinystories_validation_excerpt.txt
tmp=$(mktemp -d)
logs=$(mktemp -d)
trap 'rm -rf "$tmp" "$logs"' EXIT
fails=0
passes=0

python3 "$root/tests/bad_input3_fixtures.py" "$tmp/fx" || { echo "FAIL fixtures"; exit 1; }
fx=$tmp/fx
mkfifo "$tmp/fifo"
# Inputs of the output-path cases: copies, so a failure cannot damage the repository's data.
cp "$model" "$tmp/model.bin"
cp "$tok" "$tmp/tok.bin"
cp "$text" "$tmp/text.txt"
ln "$tmp/model.bin" "$tmp/model_hardlink.bin"
snapshot() { (cd "$tmp" && find . -path ./out -prune -o -print | sort && find . -path ./out -prune -o -type f -print0 | sort -z | xargs -0 md5sum) | md5sum; }

# bad NAME RC PATTERN -- ARGS...: runs veloxquant ARGS (`ev ...`: eval --method full with the
# copied stories260K model, tokenizer and text and --tokens 32 unless given) under a 60 s
# timeout (a FIFO must not block) and checks everything above; stderr must also hold no raw
# ESC byte and no raw U+202E.
bad() {
  local name=$1 want_rc=$2 pattern=$3
  shift 4
  local before args=("$@") flag
  if [ "${args[0]}" = ev ]; then
    args=(eval --method full "${args[@]:1}")
    for flag in --model --tokenizer --text --tokens; do
      case " ${args[*]} " in
        *" $flag "*) ;;
        *) case $flag in
             --model) args+=(--model "$tmp/model.bin") ;;
             --tokenizer) args+=(--tokenizer "$tmp/tok.bin") ;;
             --text) args+=(--text "$tmp/text.txt") ;;
             --tokens) args+=(--tokens 32) ;;
           esac ;;
      esac
    done
  fi
  before=$(snapshot)
  timeout 60 "$bin" "${args[@]}" >"$logs/stdout" 2>"$logs/stderr"
  local rc=$? ok=1
  if [ "$rc" -ne "$want_rc" ]; then
    echo "FAIL $name: exit $rc, expected $want_rc"; ok=0
  elif ! grep -qE -- "$pattern" "$logs/stderr"; then
    echo "FAIL $name: stderr lacks /$pattern/"; ok=0
  elif grep -q $'\x1b' "$logs/stderr" || grep -q $'\xe2\x80\xae' "$logs/stderr"; then
    echo "FAIL $name: stderr holds a raw control or bidi character"; ok=0
  elif [ -e "$tmp/out" ]; then
    echo "FAIL $name: left $(find "$tmp/out" | tail -1) behind"; ok=0
  elif [ "$(snapshot)" != "$before" ]; then
    echo "FAIL $name: an existing file changed"; ok=0
  elif [ ! -p "$tmp/fifo" ]; then
    echo "FAIL $name: the FIFO was replaced"; ok=0
  fi
  if [ "$ok" -eq 1 ]; then
    passes=$((passes + 1))
  else
    fails=$((fails + 1)); sed 's/^/    /' "$logs/stderr" | head -8
  fi
  rm -rf "$tmp/out"
}

out=$tmp/out/r.json
fifo_msg="is not a regular file \(a FIFO\)"

# 1. A FIFO as any input: refused at once (opened non-blocking, checked before reading).
bad "model is a FIFO" 2 "'$tmp/fifo': $fifo_msg" -- ev --model "$tmp/fifo" --json "$out"
bad "gguf model is a FIFO" 2 "$fifo_msg" -- generate --model "$tmp/fifo" --tokenizer "$tmp/tok.bin"
bad "tokenizer is a FIFO" 2 "'$tmp/fifo': $fifo_msg" -- ev --tokenizer "$tmp/fifo" --json "$out"
bad "text is a FIFO" 2 "'$tmp/fifo': $fifo_msg" -- ev --text "$tmp/fifo" --json "$out"
mkdir -p "$tmp/fifo_cfg"
cp "$fx/hf_good/model.safetensors" "$tmp/fifo_cfg/"
mkfifo "$tmp/fifo_cfg/config.json"
bad "config.json is a FIFO" 2 "fifo_cfg/config.json': $fifo_msg" -- generate --model "$tmp/fifo_cfg" --tokenizer "$tmp/tok.bin"
mkdir -p "$tmp/fifo_st"
cp "$fx/hf_good/config.json" "$tmp/fifo_st/"
mkfifo "$tmp/fifo_st/model.safetensors"
bad "safetensors is a FIFO" 2 "fifo_st/model.safetensors': $fifo_msg" -- generate --model "$tmp/fifo_st" --tokenizer "$tmp/tok.bin"
mkdir -p "$tmp/fifo_index"
cp "$fx/hf_good/config.json" "$tmp/fifo_index/"
mkfifo "$tmp/fifo_index/model.safetensors.index.json"
bad "index is a FIFO" 2 "model.safetensors.index.json': $fifo_msg" -- generate --model "$tmp/fifo_index/model.safetensors.index.json" --tokenizer "$tmp/tok.bin"
mkdir -p "$tmp/fifo_shard"
cp "$fx/hf_good/config.json" "$tmp/fifo_shard/"
python3 - "$fx/hf_good/model.safetensors" "$tmp/fifo_shard/model.safetensors.index.json" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
names = [k for k in json.loads(b[8:8 + struct.unpack("<Q", b[:8])[0]]) if k != "__metadata__"]
json.dump({"weight_map": {n: "model-00001-of-00001.safetensors" for n in names}}, open(sys.argv[2], "w"))
PY
mkfifo "$tmp/fifo_shard/model-00001-of-00001.safetensors"
bad "shard is a FIFO" 2 "model-00001-of-00001.safetensors': $fifo_msg" -- generate --model "$tmp/fifo_shard" --tokenizer "$tmp/tok.bin"
bad "select-from is a FIFO" 2 "'$tmp/fifo': $fifo_msg" -- ev --windows 2 --tokens 16 --ratio 2 --method h2o --select-from "$tmp/fifo" --json "$out"
bad "convert from a FIFO" 2 "'$tmp/fifo': $fifo_msg" -- convert --from "$tmp/fifo" --tokenizer "$tmp/tok.bin" --to "$tmp/out/m.gguf"
bad "bench table of a FIFO" 2 "'$tmp/fifo': $fifo_msg" -- bench table "$tmp/fifo"

# 2. An output that is an input: refused naming both, the input untouched.
bad "eval --json MODEL" 2 "--json: cannot write '$tmp/model.bin': it is the input '$tmp/model.bin' \(--model\)" -- ev --json "$tmp/model.bin"
bad "eval --json hard link to MODEL" 2 "--json: cannot write '$tmp/model_hardlink.bin': it is the input '$tmp/model.bin' \(--model\)" -- ev --json "$tmp/model_hardlink.bin"
bad "eval --plot TEXT" 2 "--plot: cannot write '$tmp/text.txt': it is the input .*\(--text\)" -- ev --json "$out" --plot "$tmp/text.txt"
bad "eval --per-token TOKENIZER" 2 "--per-token: cannot write '$tmp/tok.bin': it is the input .*\(--tokenizer\)" -- ev --json "$out" --per-token "$tmp/tok.bin"
bad "eval --json via ./.." 2 "--json: cannot write '$tmp/out/../model.bin': it is the input" -- ev --json "$tmp/out/../model.bin"
bad "bench decode --json MODEL" 2 "--json: cannot write '$tmp/model.bin': it is the input .*\(--model\)" -- bench decode --model "$tmp/model.bin" --method full --context 16 --steps 1 --warmup 0 --bandwidth-mib 16 --quiet --json "$tmp/model.bin"
echo '{"kind": "eval"}' >"$tmp/sel.json"
bad "--select-from F --json F" 2 "--json: cannot write '$tmp/sel.json': it is the input .*\(--select-from\)" -- ev --windows 2 --tokens 16 --ratio 2 --method h2o --select-from "$tmp/sel.json" --json "$tmp/sel.json"
mkdir -p "$tmp/hf_out"
cp "$fx/hf_good/"* "$tmp/hf_out/"
bad "eval --json a file the loader read" 2 "--json: cannot write '$tmp/hf_out/config.json': it is the input '$tmp/hf_out/config.json'" -- ev --model "$tmp/hf_out" --json "$tmp/hf_out/config.json"
cp "$tok" "$tmp/tok.gguf"
bad "convert --to TOKENIZER" 2 "--to: cannot write '$tmp/tok.gguf': it is the input .*\(--tokenizer\)" -- convert --from "$tmp/model.bin" --tokenizer "$tmp/tok.gguf" --to "$tmp/tok.gguf"

# 3. Files that lie: settings that overflow or underflow float32, unused tensors, NaN biases.
bad "rope_theta 1e39" 2 "hf_theta/config.json': 'rope_theta' 1e\+?39 is beyond float32's range" -- generate --model "$fx/hf_theta" --tokenizer "$tok"
bad "convert rope_theta 1e39" 2 "'rope_theta' 1e\+?39 is beyond float32's range" -- convert --from "$fx/hf_theta" --tokenizer "$tok" --to "$tmp/out/t.gguf"
bad "rms_norm_eps 1e-46" 2 "hf_eps/config.json': 'rms_norm_eps' 1e-46 becomes 0 as float32" -- generate --model "$fx/hf_eps" --tokenizer "$tok"
bad "convert rms_norm_eps 1e-46" 2 "'rms_norm_eps' 1e-46 becomes 0 as float32" -- convert --from "$fx/hf_eps" --tokenizer "$tok" --to "$tmp/out/e.gguf"
bad "rope factor 1e39" 2 "hf_factor_big/config.json': 'rope_scaling' 'factor' 1e\+?39 is outside float32's range" -- generate --model "$fx/hf_factor_big" --tokenizer "$tok"
bad "rope factor 1e-50" 2 "hf_factor_tiny/config.json': 'rope_scaling' 'factor' 1e-50 is outside float32's range" -- convert --from "$fx/hf_factor_tiny" --tokenizer "$tok" --to "$tmp/out/f.gguf"
bad "third layer with 2 declared" 2 "hf_extra_layer/model.safetensors': holds tensor 'model.layers.2.[a-z_.]+', which this model does not use \(config.json declares 2 layer" -- generate --model "$fx/hf_extra_layer" --tokenizer "$tok"
bad "convert drops no tensor" 2 "holds tensor 'model.layers.2.[a-z_.]+', which this model does not use" -- convert --from "$fx/hf_extra_layer" --tokenizer "$tok" --to "$tmp/out/x.gguf"
bad "q bias with attention_bias false" 2 "holds tensor 'model.layers.0.self_attn.q_proj.bias', which this model does not use" -- generate --model "$fx/hf_q_bias" --tokenizer "$tok"
bad "misspelt tensor name" 2 "holds tensor 'model.layers.1.mlp.gate_proj.weigth', which this model does not use" -- generate --model "$fx/hf_misspelt" --tokenizer "$tok"
bad "harmless rotary_emb.inv_freq loads" 0 "generate: " -- generate --model "$fx/hf_inv_freq" --tokenizer "$tok" --steps 4
bad "NaN in a bias" 2 "hf_nan_bias/model.safetensors': weight tensor 'model.layers.1.self_attn.k_proj.bias' holds nan at element 3" -- generate --model "$fx/hf_nan_bias" --tokenizer "$tok"
#    Metadata that amplifies: refused before allocating, under --max-memory and at 256 MiB.
bad "GGUF metadata bomb" 2 "meta_bomb.gguf': the metadata and tensor directory would take more than 64 MiB in memory" -- generate --model "$fx/meta_bomb.gguf" --tokenizer "$tok" --max-memory 64M

# 4. Names from files are printed escaped (ESC, newline, U+202E never reach the terminal raw).
bad "tensor name with ESC and RLO" 2 "holds tensor 'model.layers.0.\\\\x1B\[31mred\\\\x0Aline\\\\xE2\\\\x80\\\\xAEevil'" -- generate --model "$fx/hf_escape_name" --tokenizer "$tok"
bad "shard name with RLO" 2 "model-\\\\xE2\\\\x80\\\\xAEgpj.exe-00001-of-00001.safetensors': shard file not found" -- generate --model "$fx/hf_bidi_shard" --tokenizer "$tok"

# 5. --select-from files of the wrong shape: exit 2 naming the key, expected and found type.
echo '{"kind": 5}' >"$tmp/sel_kind.json"
bad "select-from kind is a number" 2 "--select-from '$tmp/sel_kind.json': key 'kind' must be a string, found a number \(5\)" -- ev --windows 2 --tokens 16 --ratio 2 --method h2o --select-from "$tmp/sel_kind.json" --json "$out"
echo '{"kind": "eval", "settings": {"windows": 2, "tokens": "16"}, "best_per_ratio": []}' >"$tmp/sel_tokens.json"
bad "select-from tokens is a string" 2 "key 'settings.tokens' must be an integer, found a string \(\"16\"\)" -- ev --windows 2 --tokens 16 --ratio 2 --method h2o --select-from "$tmp/sel_tokens.json" --json "$out"
echo '{"kind": "eval", "settings": [], "best_per_ratio": []}' >"$tmp/sel_settings.json"
bad "select-from settings is an array" 2 "key 'settings' must be an object, found an array" -- ev --windows 2 --tokens 16 --ratio 2 --method h2o --select-from "$tmp/sel_settings.json" --json "$out"

# 6. Unsigned flags: -1 and 2^64 refused naming the flag, never wrapped.
bad "eval --bootstrap-seed -1" 2 "--bootstrap-seed: must be an integer in \[0, 18446744073709551615\], got -1 \(out of range\)" -- ev --bootstrap-seed -1 --json "$out"
bad "eval --bootstrap-seed 2^64" 2 "--bootstrap-seed: must be an integer in \[0, 18446744073709551615\], got 18446744073709551616" -- ev --bootstrap-seed 18446744073709551616 --json "$out"
bad "eval --task --seed -1" 2 "--seed: must be an integer in \[0, 18446744073709551615\], got -1" -- ev --task niah_single --seed -1 --json "$out"
bad "bench decode --seed -1" 2 "--seed: must be an integer in .*got -1" -- bench decode --model "$tmp/model.bin" --method full --seed -1 --json "$out"

# 7. A spec's budget without --budget: eval runs it at the spec's budget, and only there.
for spec in streaming_llm:budget=16 h2o:budget=16; do
  if timeout 120 "$bin" eval --model "$tmp/model.bin" --tokenizer "$tmp/tok.bin" --text "$tmp/text.txt" \
       --tokens 48 --method "$spec" --json "$logs/budget.json" >"$logs/stdout" 2>"$logs/stderr" &&
     python3 - "$logs/budget.json" <<'PY'
import json, sys
rows = [r for r in json.load(open(sys.argv[1]))["rows"] if r["method_id"] != "full"]
budgets = sorted({r["budget"] for r in rows})
sys.exit(0 if budgets == [16] else "budgets run: %s" % budgets)
PY
  then
    passes=$((passes + 1))
  else
    echo "FAIL eval --method $spec without --budget"; sed 's/^/    /' "$logs/stderr" | tail -3
    fails=$((fails + 1))
  fi
done

#    eval --task: a spec-written budget with an explicit --ratio or another --budget is refused.
task=(eval --model "$tmp/model.bin" --tokenizer "$tmp/tok.bin" --task niah_single --lengths 384 --depths 50 --samples 1)
bad "task spec budget and --ratio" 2 "--method 'h2o:budget=16' writes its budget \(16\) and --ratio sets every method's budget" -- "${task[@]}" --method h2o:budget=16 --ratio 4 --json "$out"
bad "task spec budget and --budget" 2 "--method 'streaming_llm:budget=16' writes budget 16 but --budget asks for other budgets" -- "${task[@]}" --method streaming_llm:budget=16 --budget 32 --json "$out"

#    ... and without either flag it runs at the spec's budget only (the default ratios 4, 8, 16
#    used to replace it).
if timeout 300 "$bin" "${task[@]}" --method h2o:budget=16 --json "$logs/task.json" >"$logs/stdout" 2>"$logs/stderr" &&
   python3 - "$logs/task.json" <<'PY'
import json, sys
rows = [r for r in json.load(open(sys.argv[1]))["rows"] if r["series"] != "full"]
budgets = sorted({r["budget"] for r in rows})
sys.exit(0 if budgets == [16] else "budgets run: %s" % budgets)
PY
then
  passes=$((passes + 1))
else
  echo "FAIL eval --task --method h2o:budget=16 without --budget"; sed 's/^/    /' "$logs/stderr" | tail -3
  fails=$((fails + 1))
fi

echo "bad inputs (round three, files and CLI): $passes passed, $fails failed"
[ "$fails" -eq 0 ]
