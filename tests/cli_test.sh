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
for id in $("$bin" list --ids); do
  check "list shows $id" 0 "^$id " -- "$bin" list
done
check "list --ids" 0 "^full$" -- "$bin" list --ids
check "list --ids --with budget leaves out full" 0 "^streaming_llm$" -- "$bin" list --ids --with budget
check "list --ids is list's first column" 0 "^same$" -- \
  bash -c '[[ $("$0" list --ids) == $("$0" list | awk "{print \$1}") ]] && echo same' "$bin"
check "list --ids --with budget has no full, no kivi" 0 "^none$" -- \
  bash -c '"$0" list --ids --with budget | grep -x -e full -e kivi || echo none' "$bin"
check "list --ids --with an unknown key" 2 "no registered method takes key 'nope'" -- "$bin" list --ids --with nope
check "list --with needs --ids" 2 "--with requires --ids|requires" -- "$bin" list --with budget
check "list kivi lists {2, 4}" 0 "bit_width_inlier +int +2 +\{2, 4\}" -- "$bin" list kivi
check "help" 0 "list" -- "$bin" --help
for cmd in list demo bench "bench perturb" "bench table" "bench decode" "bench kernels" make-model generate eval; do
  # shellcheck disable=SC2086
  check "$cmd --help" 0 "Usage|Options" -- "$bin" $cmd --help
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
check "demo takes a spec's budget" 0 "streaming_llm:stream_window_size=16 +20 " -- "$bin" demo --seq 64 --heads 2 --head-dim 8 --probes 4 --method streaming_llm:budget=20
check "demo --budget contradicting a spec's budget" 2 "--budget 24 contradicts budget 20 written in the spec 'h2o:budget=20'" -- "$bin" demo --seq 64 --budget 24 --heads 2 --head-dim 8 --probes 4 --method h2o:budget=20
check "demo --budget equal to a spec's budget" 0 "h2o:h2o_budget=20 +20 " -- "$bin" demo --seq 64 --budget 20 --heads 2 --head-dim 8 --probes 4 --method h2o:budget=20
check "demo --budget applies to a spec without one" 0 "h2o:h2o_budget=24,h2o_grace=2 +24 " -- "$bin" demo --seq 64 --budget 24 --heads 2 --head-dim 8 --probes 4 --method h2o:grace=2

# bench perturb: every bad flag is a clear error (exit 2) that writes nothing, not even the
# --json file's missing directory.
bad_json=$tmp/perturb_out/never/bad.json
bp() {  # bench perturb with small settings for every size flag the arguments do not give
  local small=(--seq 64 --budget 16 --heads 2 --head-dim 8 --probes 4 --seeds 2) extra=() i
  for ((i = 0; i < ${#small[@]}; i += 2)); do
    case " $* " in *" ${small[i]} "*) ;; *) extra+=("${small[i]}" "${small[i + 1]}") ;; esac
  done
  "$bin" bench perturb --quiet "${extra[@]}" "$@"
}
check_bad() {  # check_bad NAME PATTERN -- ARGS...
  local name=$1 pattern=$2
  shift 3
  check "bench perturb $name" 2 "$pattern" -- bp "$@"
  if [ -e "$tmp/perturb_out" ]; then
    echo "FAIL bench perturb $name: wrote $(find "$tmp/perturb_out" | tail -1)"; fails=$((fails + 1))
    rm -rf "$tmp/perturb_out"
  fi
}
check_bad "no method" "--method is required" -- --json "$bad_json"
check_bad "no json" "--json is required" -- --method cam
check_bad "empty seq" "--seq expects comma-separated integers in \\[1, [0-9]+\\] .*got an empty value" -- --method cam --seq "" --json "$bad_json"
check_bad "empty item" "--seq expects .*got ''" -- --method cam --seq 64,,128 --json "$bad_json"
check_bad "zero budget" "--budget expects .*got 0" -- --method cam --budget 0 --json "$bad_json"
check_bad "short seq" "--seq must be in \[8, [0-9]+\], got 4" -- --method cam --seq 4 --json "$bad_json"
check_bad "duplicate seq" "--seq lists 64 twice" -- --method cam --seq 64,64 --json "$bad_json"
check_bad "zero heads" "--heads: must be an integer in \[1, [0-9]+\], got 0" -- --method cam --heads 0 --json "$bad_json"
check_bad "negative seeds" "--seeds: must be an integer in \[1, [0-9]+\], got -2" -- --method cam --seeds -2 --json "$bad_json"
check_bad "zero probes" "--probes: must be an integer in" -- --method cam --probes 0 --json "$bad_json"
check_bad "not a number" "--head-dim: must be an integer in \[1, [0-9]+\], got 'x'" -- --method cam --head-dim x --json "$bad_json"
check_bad "bad geometry" "unknown geometry 'round'; allowed: spans, shift, stable, planted" -- --method cam --geometry round --json "$bad_json"
check_bad "bad feed" "unknown feed 'batch'; allowed: prefill, stream" -- --method cam --feed batch --json "$bad_json"
check_bad "unknown method" "--method 'nope': unknown method 'nope'" -- --method cam --method nope --json "$bad_json"
check_bad "bad spec" "--method 'cam:budgett=3': .*unknown key 'budgett'" -- --method cam:budgett=3 --json "$bad_json"
check_bad "budget a guard rejects" "--budget 16 does not fit --method 'h2o:grace=16': \[h2o\] h2o_n_sink \+ h2o_grace must be < h2o_budget \(16\)" -- --method cam --method h2o:grace=16 --json "$bad_json"
check_bad "duplicate method" "--method 'cam:merge=mean' and --method 'cam' give the same configuration" -- --method cam --method cam:merge=mean --json "$bad_json"
touch "$tmp/a_file"
check_bad "json under a file" "cannot write '$tmp/a_file/x.json': '$tmp/a_file' is not a directory" -- --method cam --json "$tmp/a_file/x.json"
check_bad "json is a directory" "cannot write '$tmp': it is a directory" -- --method cam --json "$tmp"
check_bad "plot under a file" "cannot write '$tmp/a_file/x.svg'" -- --method cam --json "$bad_json" --plot "$tmp/a_file/x.svg"
check_bad "json = plot" "--json and --plot name the same file" -- --method cam --json "$bad_json" --plot "$bad_json"
# bench decode and make-model: a tiny run, and clear errors that write nothing.
bd_json=$tmp/decode/d.json
check "bench decode runs" 0 "wrote .*d.json" -- "$bin" bench decode --shape llama-110m --layers 1 \
  --context 16,40 --method full --method h2o --budget 24 --steps 2 --warmup 1 --threads 1,2 \
  --bandwidth-mib 16 --quiet --json "$bd_json" --plot "$tmp/decode/d.svg"
check "bench decode json" 0 '"kind": "decode"' -- cat "$bd_json"
check "bench decode kept rows" 0 '"kept_rows": 24.0' -- cat "$bd_json"
check "bench decode plot" 0 "<svg" -- cat "$tmp/decode/d.svg"
check "bench decode both models" 2 "exactly one of --shape NAME and --model PATH" -- \
  "$bin" bench decode --shape llama-110m --model x --context 8 --method full --json "$tmp/nd/x.json"
check "bench decode unknown shape" 2 "unknown model shape 'gpt-9'; known: llama-110m" -- \
  "$bin" bench decode --shape gpt-9 --context 8 --method full --json "$tmp/nd/x.json"
check "bench decode bad context" 2 "--context expects comma-separated integers \\(e.g. 64,128\\); each must be an integer in \\[1, 16777216\\], got 0" -- \
  "$bin" bench decode --shape llama-110m --context 0 --method full --json "$tmp/nd/x.json"
check "bench decode too long" 2 "--context 131072 \\+ --warmup [0-9]+ \\+ --steps [0-9]+ \\+ 1 = [0-9]+ positions exceed the model's context \\(seq_len 131072\\)" -- \
  "$bin" bench decode --shape llama-110m --layers 1 --context 131072 --method full --bandwidth-mib 16 --json "$tmp/nd/x.json"
check "bench decode bad weights" 2 "--weights must be one of f32, f16, bf16, q8_0, got 'int4'" -- \
  "$bin" bench decode --shape llama-110m --weights int4 --context 8 --method full
if [ -e "$tmp/nd" ]; then echo "FAIL bench decode errors wrote $tmp/nd"; fails=$((fails + 1)); fi
check "make-model list" 0 "llama-3.2-1b +layers 16" -- "$bin" make-model --list
check "make-model q8_0" 2 "q8_0 has no safetensors type" -- \
  "$bin" make-model --shape llama-110m --dtype q8_0 --out "$tmp/nd"
check "make-model layers" 2 "layers must be in \[1, 12\] for llama-110m, got 13" -- \
  "$bin" make-model --shape llama-110m --layers 13 --out "$tmp/nd"
check "make-model writes" 0 "wrote .*config.json" -- \
  "$bin" make-model --shape llama-110m --layers 1 --out "$tmp/mm"
check "make-model loads" 0 "full +16 +1 " -- \
  "$bin" bench decode --model "$tmp/mm" --context 16 --method full --steps 1 --threads 1 \
  --bandwidth-mib 16 --quiet
check "bench unknown" 2 "unknown bench command 'nope'; bench commands: perturb, decode, kernels, table" -- "$bin" bench nope

# A small run writes the JSON and the plot; the same command again gives the same file apart
# from timing fields (one key per line in the JSON).
run_dir=$tmp/perturb_run
check "bench perturb runs" 0 "wrote $run_dir/r.json and $run_dir/r.svg" -- \
  bp --method cam --method h2o:grace=0,decay=1 --method full --geometry planted --json "$run_dir/r.json" --plot "$run_dir/r.svg"
check "bench perturb progress" 0 "\\[perturb 3/3\\] seq 64 budget - full: perturbation 0.0000" -- \
  "$bin" bench perturb --seq 64 --budget 16 --heads 2 --head-dim 8 --probes 4 --seeds 2 --method cam --method h2o:grace=0,decay=1 --method full --geometry planted --json "$run_dir/progress.json"
mv "$run_dir/r.json" "$run_dir/first.json"
bp --method cam --method h2o:grace=0,decay=1 --method full --geometry planted --json "$run_dir/r.json" --plot "$run_dir/r.svg" >/dev/null 2>&1
if diff <(grep -vE '_(us|ms)"' "$run_dir/first.json") <(grep -vE '_(us|ms)"' "$run_dir/r.json") >"$tmp/diff" &&
   grep -q '"schema": "veloxquant.results/1"' "$run_dir/r.json" && grep -q '"planted_survival": 1' "$run_dir/r.json" &&
   grep -q '^<svg' "$run_dir/r.svg"; then
  passes=$((passes + 1))
else
  echo "FAIL bench perturb: reruns differ or files incomplete"; head -20 "$tmp/diff"; fails=$((fails + 1))
fi
check "bench table" 0 "^\| \`cam\` \| [0-9.]+ ± [0-9.]+ \|" -- "$bin" bench table "$run_dir/r.json"
check "bench table missing" 2 "'$tmp/none.json': cannot open: No such file" -- "$bin" bench table "$tmp/none.json"
echo '{"schema": "veloxquant.results/1", "kind": "eval", "rows": []}' >"$tmp/eval.json"
check "bench table not perturb" 2 "not a perturb result document" -- "$bin" bench table "$tmp/eval.json"

# The perturbation tables of docs/benchmarks.md are the committed result files'.
if ls "$root"/results/perturb/*.json >/dev/null 2>&1; then
  files=$(awk '/<!-- perturb:begin/{print; exit}' "$root/docs/benchmarks.md" | sed -E 's/.*files: (.*) -->/\1/')
  # shellcheck disable=SC2086
  (cd "$root" && "$bin" bench table $files) >"$tmp/perturb_table"
  awk '/<!-- perturb:begin/{on=1; next} /<!-- perturb:end -->/{on=0} on' "$root/docs/benchmarks.md" >"$tmp/readme_perturb"
  if [ -n "$files" ] && diff -u "$tmp/perturb_table" "$tmp/readme_perturb" >"$tmp/diff"; then
    passes=$((passes + 1))
  else
    echo "FAIL docs/benchmarks.md perturbation tables differ from results/perturb (run scripts/sweep_perturb.sh --tables-only):"
    head -40 "$tmp/diff"; fails=$((fails + 1))
  fi
fi

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
check "generate takes budget= and reports the score source" 0 "cache h2o:h2o_budget=16 \(score source attention\): 16 rows/head" -- "$bin" generate --model "$data/stories260K.bin" --steps 40 --method h2o:budget=16
check "generate streaming_llm budget=" 0 "cache streaming_llm:stream_window_size=12 \(score source none\)" -- "$bin" generate --model "$data/stories260K.bin" --steps 40 --method streaming_llm:budget=16
check "generate needs --model" 2 "--model is required" -- "$bin" generate --prompt hi
check "generate missing model" 2 "nope.bin.*cannot open" -- "$bin" generate --model "$tmp/nope.bin"
head -c 1000 "$data/stories260K.bin" >"$tmp/trunc.bin"
check "generate truncated model" 2 "trunc.bin.*truncated.*needs 1056540 bytes, found 1000" -- "$bin" generate --model "$tmp/trunc.bin" --tokenizer "$data/tok512.bin"
mkdir -p "$tmp/alone" && cp "$data/stories260K.bin" "$tmp/alone/model.bin"
check "generate no tokenizer" 2 "no tokenizer found next to the model.*tok512.bin.*--tokenizer" -- "$bin" generate --model "$tmp/alone/model.bin"
check "generate bad seed" 2 "seed must be nonzero" -- "$bin" generate --model "$data/stories260K.bin" --seed 0 --temperature 1
check "generate bad top-p" 2 "--top-p: must be in \[0, 1\], got 2" -- "$bin" generate --model "$data/stories260K.bin" --top-p 2
check "generate bad method" 2 "unknown method 'nope'" -- "$bin" generate --model "$data/stories260K.bin" --method nope
check "generate with a method" 0 "cache h2o:h2o_budget=32" -- "$bin" generate --model "$data/stories260K.bin" --steps 40 --method h2o:budget=32 --prompt "Once upon a time"
check "generate finch with a question" 0 "cache finch:finch_budget=8" -- "$bin" generate --model "$data/stories260K.bin" --steps 40 --method finch:budget=8,obs_window=2 --prompt "Once upon a time there was a little girl" --question " who liked cats"
check "generate question past --steps" 2 "question would be cut off" -- "$bin" generate --model "$data/stories260K.bin" --steps 4 --method finch --prompt "Once upon a time there was" --question " a girl"

# eval: table, JSON written whole, reproducible apart from timing; errors before any run.
text="$data/tinystories_validation_excerpt.txt"
check "eval needs --text" 2 "--text is required" -- "$bin" eval --model "$data/stories260K.bin"
check "eval bad budget" 2 "--budget expects comma-separated integers" -- "$bin" eval --model "$data/stories260K.bin" --text "$text" --budget 32,x
check "eval too many tokens" 2 "--tokens 600 exceeds the model's context \(seq_len 512\)" -- "$bin" eval --model "$data/stories260K.bin" --text "$text" --tokens 600
check "eval bad prefill" 2 "--prefill must be in \[0, 62\]" -- "$bin" eval --model "$data/stories260K.bin" --text "$text" --tokens 64 --prefill 64
check "eval missing text" 2 "nope.txt.*cannot open" -- "$bin" eval --model "$data/stories260K.bin" --text "$tmp/nope.txt"
echo x >"$tmp/afile"
check "eval unwritable json" 2 "--json: cannot write '$tmp/afile/out.json': '$tmp/afile' is not a directory" -- "$bin" eval --model "$data/stories260K.bin" --text "$text" --json "$tmp/afile/out.json"
[ ! -e "$tmp/afile/out.json" ] && passes=$((passes + 1)) || { echo "FAIL eval left a file behind"; fails=$((fails + 1)); }
check "eval unwritable per-token" 2 "--per-token: cannot write '$tmp/afile/t.tsv': '$tmp/afile' is not a directory" -- "$bin" eval --model "$data/stories260K.bin" --text "$text" --per-token "$tmp/afile/t.tsv"
check "eval per-token, later flags win" 0 "first 64 tokens, the first 32 as one prefill, then 31 decoded" -- "$bin" eval --model "$data/stories260K.bin" --text "$text" --tokens 512 --prefill 256 --tokens 64 --prefill 32 --method full:kv_dtype=f32 --per-token "$tmp/t.tsv"
check "eval per-token header" 0 "^run	method	budget	position	token	next_token	scored	nll$" -- head -1 "$tmp/t.tsv"
check "eval per-token fp32 row" 0 "^1	full:kv_dtype=f32	-	32	[0-9]+	[0-9]+	1	[0-9.]+$" -- cat "$tmp/t.tsv"
eval_args=(eval --model "$data/stories260K.bin" --text "$text" --tokens 64 --method streaming_llm --method h2o:grace=16
           --budget 16,32 --json "$tmp/e.json" --plot "$tmp/e.svg")
check "eval runs, skipping rejected budgets" 0 "skipped h2o:h2o_grace=16 at budget 16: \[h2o\] h2o_n_sink \+ h2o_grace must be < h2o_budget" -- "$bin" "${eval_args[@]}"
cp "$tmp/out" "$tmp/eval.out"
check "eval table" 0 "full \(reference\) +- +[0-9.]+" -- cat "$tmp/eval.out"
check "eval progress" 0 "eval: \[4/4\] h2o:h2o_budget=32,h2o_grace=16" -- cat "$tmp/eval.out"
check "eval json" 0 '"kind": "eval"' -- cat "$tmp/e.json"
check "eval json rows" 0 '"kl_mean"' -- cat "$tmp/e.json"
check "eval json records the score source that ran" 0 '"score_source": "attention"' -- cat "$tmp/e.json"
check "eval plot" 0 "<svg" -- cat "$tmp/e.svg"
mv "$tmp/e.json" "$tmp/e1.json"
"$bin" "${eval_args[@]}" >/dev/null 2>&1
if diff <(grep -v '_ms"' "$tmp/e1.json") <(grep -v '_ms"' "$tmp/e.json") >"$tmp/diff"; then
  passes=$((passes + 1))
else
  echo "FAIL eval results differ between identical runs (timing fields excluded):"; head -20 "$tmp/diff"; fails=$((fails + 1))
fi

# eval --ratio: equal memory; errors name the flag; the table reports the ratio reached. 95 rows
# at 8x: 95 / 8 = 11.875 rows -> budget 11, 95 / 11 = 8.64x.
check "eval ratio with budget" 2 "--ratio and --budget cannot be given together" -- "$bin" eval --model "$data/stories260K.bin" --text "$text" --ratio 8 --budget 64
check "eval bad ratio" 2 "--ratio expects comma-separated compression ratios >= 1 \(e.g. 2,4,8,16,32\), got 0.5" -- "$bin" eval --model "$data/stories260K.bin" --text "$text" --ratio 4,0.5
check "eval empty ratio" 2 "--ratio expects .*got an empty value" -- "$bin" eval --model "$data/stories260K.bin" --text "$text" --ratio ""
check "eval ratio" 0 "^streaming_llm +8x +11 .* 8\.64 " -- "$bin" eval --model "$data/stories260K.bin" --text "$text" --tokens 96 --ratio 8 --method streaming_llm --json "$tmp/r.json" --plot "$tmp/r.svg"
check "eval ratio json" 0 '"ratio_reached": 8.636' -- cat "$tmp/r.json"
check "eval ratio best" 0 '"best_per_ratio"' -- cat "$tmp/r.json"

# eval --task (docs/tasks.md): RULER-style tasks on the shipped task model (context 1152). Errors
# name the flag, what was expected and what was found.
task_model="$data/task-model.bin"
task_args=(eval --model "$task_model" --task niah_single,vt --lengths 384 --depths 0,100 --samples 2
           --method streaming_llm --method snapkv --ratio 4)
check "task unknown name" 2 "--task expects task names from niah_single, niah_multikey, niah_multivalue, niah_multiquery, vt, cwe, fwe, got 'niah'" -- "$bin" eval --model "$task_model" --task niah
check "task bad depth" 2 "--depths expects comma-separated integers .*must be an integer in \[0, 100\], got 101" -- "$bin" eval --model "$task_model" --task niah_single --depths 0,101
check "task length over the context" 2 "--lengths 2048 exceeds the model's context \(seq_len 1152\)" -- "$bin" eval --model "$task_model" --task niah_single --lengths 2048
check "task length too short" 2 "--lengths 100 is too short for task niah_single: the prompt with the smallest haystack takes [0-9]+ tokens" -- "$bin" eval --model "$task_model" --task niah_single --lengths 100
check "task repeated depth" 2 "--depths lists 50 twice" -- "$bin" eval --model "$task_model" --task niah_single --depths 50,0,50
check "task bad haystack" 2 "--haystack expects noise, essay or needle, got 'grass'" -- "$bin" eval --model "$task_model" --task niah_single --haystack grass
check "task haystack on cwe" 2 "--haystack applies to the niah_\* tasks and vt; cwe has its own word list" -- "$bin" eval --model "$task_model" --task cwe --haystack noise
check "task bad question" 2 "--question expects last or first, got 'middle'" -- "$bin" eval --model "$task_model" --task vt --question middle
check "task flags need --task" 2 "--lengths needs --task NAME" -- "$bin" eval --model "$task_model" --text "$text" --lengths 256
check "task refuses text-eval flags" 2 "--windows belongs to the text evaluation; --task does not read it" -- "$bin" eval --model "$task_model" --task vt --windows 2
check "task ratio with budget" 2 "--ratio and --budget cannot be given together" -- "$bin" eval --model "$task_model" --task vt --ratio 4 --budget 64
check "task unwritable json" 2 "--json: cannot write '$tmp/afile/t.json': '$tmp/afile' is not a directory" -- "$bin" eval --model "$task_model" --task vt --json "$tmp/afile/t.json"
check "task run" 0 "^full +reference +niah_single +384 +[0-9.]+ +\[[0-9.]+, [0-9.]+\]" -- "$bin" "${task_args[@]}" --threads 1 --json "$tmp/t1.json" --plot "$tmp/t1.svg" --dump-samples "$tmp/t1.jsonl"
cp "$tmp/out" "$tmp/task.out"
check "task table rows" 0 "^snapkv +4x +vt +384 " -- cat "$tmp/task.out"
check "task json" 0 '"kind": "task"' -- cat "$tmp/t1.json"
check "task json interval" 0 '"interval": "wilson"' -- cat "$tmp/t1.json"
check "task heatmap" 0 "<svg .*" -- cat "$tmp/t1.svg"
check "task dump lines" 0 "^6$" -- bash -c "wc -l < '$tmp/t1.jsonl'"
check "task dump fields" 0 '"parts":\{"haystack":"essay","inserts":\[\[0,"One of the special magic numbers for ' -- head -1 "$tmp/t1.jsonl"
threads_b=$(( $(nproc) >= 3 ? 3 : $(nproc) ))
"$bin" "${task_args[@]}" --threads "$threads_b" --json "$tmp/t2.json" --dump-samples "$tmp/t2.jsonl" >/dev/null 2>&1
if diff <(grep -v -e '_ms"' -e '"command"' "$tmp/t1.json") <(grep -v -e '_ms"' -e '"command"' "$tmp/t2.json") >"$tmp/diff" &&
   cmp -s "$tmp/t1.jsonl" "$tmp/t2.jsonl"; then
  passes=$((passes + 1))
else
  echo "FAIL eval --task results differ between --threads 1 and $threads_b (timing excluded):"; head -20 "$tmp/diff"; fails=$((fails + 1))
fi

# convert: llama2.c -> GGUF, then generate and eval read it (tokenizer from the metadata).
check "convert --help" 0 "--type" -- "$bin" convert --help
check "convert q8_0" 0 "wrote .*47 tensors.*vocab 'llama'" -- \
  "$bin" convert --from "$root/data/stories260K.bin" --to "$tmp/s.gguf" --type q8_0
check "generate gguf" 0 "Once upon a time" -- "$bin" generate --model "$tmp/s.gguf" --steps 12
check "eval gguf" 0 "full" -- "$bin" eval --model "$tmp/s.gguf" \
  --text "$root/data/tinystories_validation_excerpt.txt" --tokens 64 --method full
# --q8-activations: Q8_0 weights with Q8_0-quantized (default) or fp32 matmul inputs; the two
# give different perplexities on the q8_0 file, and a bad value names the flag.
for acts in q8_0 f32; do
  check "eval gguf --q8-activations $acts" 0 "full \(reference\)" -- "$bin" eval \
    --model "$tmp/s.gguf" --text "$root/data/tinystories_validation_excerpt.txt" --tokens 64 \
    --method full --q8-activations "$acts"
  grep -E '^full \(reference\)' "$tmp/out" | awk '{print $4}' >"$tmp/ppl_$acts"
done
if [ -s "$tmp/ppl_q8_0" ] && [ -s "$tmp/ppl_f32" ] && ! cmp -s "$tmp/ppl_q8_0" "$tmp/ppl_f32"; then
  passes=$((passes + 1))
else
  echo "FAIL --q8-activations q8_0 and f32 give the same perplexity ($(cat "$tmp/ppl_q8_0") vs $(cat "$tmp/ppl_f32"))"
  fails=$((fails + 1))
fi
check "bad --q8-activations" 2 "--q8-activations must be q8_0 or f32, got 'q8'" -- \
  "$bin" generate --model "$tmp/s.gguf" --steps 4 --q8-activations q8
check "convert bad type" 2 "--type must be one of f32, f16, bf16, q8_0, got 'q4'" -- \
  "$bin" convert --from "$root/data/stories260K.bin" --to "$tmp/x.gguf" --type q4
check "convert not gguf" 2 "--to must name a .gguf file" -- \
  "$bin" convert --from "$root/data/stories260K.bin" --to "$tmp/x.bin"
check "gguf truncated" 2 "s_cut.gguf.*truncated" -- \
  bash -c "head -c 5000 '$tmp/s.gguf' > '$tmp/s_cut.gguf'; '$bin' generate --model '$tmp/s_cut.gguf'"
[ ! -e "$tmp/x.gguf" ] && passes=$((passes + 1)) || { echo "FAIL convert left a file"; fails=$((fails + 1)); }

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
