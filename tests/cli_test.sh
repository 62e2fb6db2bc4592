#!/usr/bin/env bash
# Command-line behaviour: listings, help, errors and exit codes, the README's method table.
# Usage: cli_test.sh VELOXQUANT_BINARY PROJECT_DIR
set -uo pipefail
bin=$1
root=$2
fails=0
passes=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

check() {  # check NAME EXPECTED_RC PATTERN -- CMD...
  local name=$1 want_rc=$2 pattern=$3
  shift 4
  "$@" >"$tmp/out" 2>&1
  local rc=$?
  if [ "$rc" -ne "$want_rc" ]; then
    echo "FAIL $name: exit $rc, expected $want_rc"; sed 's/^/    /' "$tmp/out" | head -20
    fails=$((fails + 1)); return
  fi
  if ! grep -qE -- "$pattern" "$tmp/out"; then
    echo "FAIL $name: output lacks /$pattern/"; sed 's/^/    /' "$tmp/out" | head -20
    fails=$((fails + 1)); return
  fi
  passes=$((passes + 1))
}

for id in $("$bin" list | awk '{print $1}'); do
  check "list $id" 0 "^$id: " -- "$bin" list "$id"
  check "list $id fields" 0 "seed +int +42" -- "$bin" list "$id"
done
for id in full streaming_llm h2o tova morphkv cam; do
  check "list shows $id" 0 "^$id " -- "$bin" list
done
check "help" 0 "list" -- "$bin" --help
for cmd in list demo generate eval; do
  check "$cmd --help" 0 "Usage|Options" -- "$bin" "$cmd" --help
done
check "generate --help flags" 0 "--temperature.*--top-p|--top-p" -- "$bin" generate --help
check "eval --help flags" 0 "--prefill" -- "$bin" eval --help
check "no command" 2 "subcommand is required" -- "$bin"
check "unknown command" 2 "unknown command 'frobnicate'; commands: list, demo" -- "$bin" frobnicate
check "unknown option" 2 "--nope" -- "$bin" list --nope
check "unknown method" 2 "unknown method 'nope'; known methods: full" -- "$bin" list nope
check "bad spec" 2 "unknown key 'budgett'" -- "$bin" demo --method cam:budgett=3 --seq 10
check "out of range" 2 "h2o_decay must be in \[0, 1\], got 2" -- "$bin" demo --method h2o:decay=2 --seq 10
check "bad geometry" 2 "unknown geometry 'round'" -- "$bin" demo --geometry round --seq 10
check "demo runs" 0 "cam:cam_budget=32" -- "$bin" demo --seq 64 --budget 32 --heads 2 --head-dim 8 --probes 4

# generate: run.c's greedy output for stories260K, byte for byte on stdout.
data="$root/data"
"$bin" generate --model "$data/stories260K.bin" --steps 200 >"$tmp/gen.out" 2>"$tmp/gen.err"
rc=$?
if [ "$rc" -eq 0 ] && cmp -s "$tmp/gen.out" "$data/reference/stories260K_runc_t0_noprompt_n200.stdout.txt" \
    && grep -qE "generate: 201 tokens \(1 prompt incl. BOS, 199 decode steps\); decode [0-9]+ tok/s" "$tmp/gen.err"; then
  passes=$((passes + 1))
else
  echo "FAIL generate greedy: exit $rc, stdout differs from run.c's or no stats on stderr"; head -5 "$tmp/gen.out" "$tmp/gen.err"
  fails=$((fails + 1))
fi
check "generate needs --model" 2 "--model is required" -- "$bin" generate --prompt hi
check "generate missing model" 2 "nope.bin.*cannot open" -- "$bin" generate --model "$tmp/nope.bin"
head -c 1000 "$data/stories260K.bin" >"$tmp/trunc.bin"
check "generate truncated model" 2 "trunc.bin.*truncated.*needs 1056540 bytes, found 1000" -- "$bin" generate --model "$tmp/trunc.bin" --tokenizer "$data/tok512.bin"
mkdir -p "$tmp/alone" && cp "$data/stories260K.bin" "$tmp/alone/model.bin"
check "generate no tokenizer" 2 "no tokenizer found next to the model.*tok512.bin.*--tokenizer" -- "$bin" generate --model "$tmp/alone/model.bin"
check "generate bad seed" 2 "seed must be nonzero" -- "$bin" generate --model "$data/stories260K.bin" --seed 0 --temperature 1
check "generate bad top-p" 2 "top-p must be in \[0, 1\]" -- "$bin" generate --model "$data/stories260K.bin" --top-p 2
check "generate bad method" 2 "unknown method 'nope'" -- "$bin" generate --model "$data/stories260K.bin" --method nope
check "generate with a method" 0 "cache h2o:h2o_budget=32" -- "$bin" generate --model "$data/stories260K.bin" --steps 40 --method h2o:budget=32 --prompt "Once upon a time"

# eval: table, JSON written whole, reproducible apart from timing; errors before any run.
text="$data/tinystories_validation_excerpt.txt"
check "eval needs --text" 2 "--text is required" -- "$bin" eval --model "$data/stories260K.bin"
check "eval bad budget" 2 "--budget expects comma-separated integers" -- "$bin" eval --model "$data/stories260K.bin" --text "$text" --budget 32,x
check "eval too many tokens" 2 "--tokens 600 exceeds the model's context \(seq_len 512\)" -- "$bin" eval --model "$data/stories260K.bin" --text "$text" --tokens 600
check "eval bad prefill" 2 "--prefill must be in \[0, 63\]" -- "$bin" eval --model "$data/stories260K.bin" --text "$text" --tokens 64 --prefill 64
check "eval missing text" 2 "nope.txt.*cannot open" -- "$bin" eval --model "$data/stories260K.bin" --text "$tmp/nope.txt"
echo x >"$tmp/afile"
check "eval unwritable json" 2 "cannot write.*cannot create directory" -- "$bin" eval --model "$data/stories260K.bin" --text "$text" --json "$tmp/afile/out.json"
[ ! -e "$tmp/afile/out.json" ] && passes=$((passes + 1)) || { echo "FAIL eval left a file behind"; fails=$((fails + 1)); }
eval_args=(eval --model "$data/stories260K.bin" --text "$text" --tokens 64 --method streaming_llm --method h2o
           --budget 16,32 --json "$tmp/e.json" --plot "$tmp/e.svg")
check "eval runs, skipping rejected budgets" 0 "skipped h2o at budget 16: \[h2o\] h2o_n_sink \+ h2o_grace must be < h2o_budget" -- "$bin" "${eval_args[@]}"
cp "$tmp/out" "$tmp/eval.out"
check "eval table" 0 "full \(reference\) +- +[0-9.]+" -- cat "$tmp/eval.out"
check "eval progress" 0 "eval: \[4/4\] h2o:h2o_budget=32" -- cat "$tmp/eval.out"
check "eval json" 0 '"kind": "eval"' -- cat "$tmp/e.json"
check "eval json rows" 0 '"kl_mean"' -- cat "$tmp/e.json"
check "eval plot" 0 "<svg" -- cat "$tmp/e.svg"
mv "$tmp/e.json" "$tmp/e1.json"
"$bin" "${eval_args[@]}" >/dev/null 2>&1
if diff <(grep -v '_ms"' "$tmp/e1.json") <(grep -v '_ms"' "$tmp/e.json") >"$tmp/diff"; then
  passes=$((passes + 1))
else
  echo "FAIL eval results differ between identical runs (timing fields excluded):"; head -20 "$tmp/diff"; fails=$((fails + 1))
fi

# The README's method table is the registry's.
"$bin" list --markdown >"$tmp/table"
awk '/<!-- methods:begin -->/{on=1; next} /<!-- methods:end -->/{on=0} on' "$root/README.md" >"$tmp/readme_table"
if diff -u "$tmp/table" "$tmp/readme_table" >"$tmp/diff"; then
  passes=$((passes + 1))
else
  echo "FAIL README method table differs from the registry (run scripts/sync_readme.sh):"
  cat "$tmp/diff"; fails=$((fails + 1))
fi

echo "cli: $passes passed, $fails failed"
[ "$fails" -eq 0 ]
