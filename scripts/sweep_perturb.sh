#!/usr/bin/env bash
# The perturbation benchmark sweep (docs/benchmarks.md "Perturbation benchmark"): runs
# `veloxquant bench perturb` for every registered method and writes
# results/perturb/<geometry>.json and .svg, then rewrites the perturbation tables of
# docs/benchmarks.md from those files (`veloxquant bench table`).
#
#   scripts/sweep_perturb.sh                 builds, runs every sweep, refreshes the tables
#   scripts/sweep_perturb.sh --tables-only   only refreshes the tables from the committed files
#                                            (--readme-only, its former name, does the same)
#   VQ_BIN=path/to/veloxquant scripts/sweep_perturb.sh   uses that binary instead of building
#
# Sweeps (seq 256,512,1024 x budget 64,128, 20 data seeds, 4 KV heads x 64, 32 probes, prefill):
#   spans    full; cam merge drop/mean/sim_weighted x gate on/off; h2o (defaults, and grace=0,
#            decay=1: the paper's rule); tova; streaming_llm; morphkv window 1, 8, 32;
#            keyformer tau 0, 2, 6 (constant temperature) when registered; every other
#            registered method with its defaults.
#   shift    morphkv window 1, 8, 32 vs h2o (both), tova, streaming_llm, full;
#   stable   the same methods (the null control);
#   planted  keyformer tau 0, 2, 6 vs h2o (both) and full, when keyformer is registered.
# Runtime: a few minutes on two cores.
set -euo pipefail
cd "$(dirname "$0")/.."

readme_only=false
case "${1:-}" in
  "") ;;
  --tables-only | --readme-only) readme_only=true ;;
  *) echo "usage: scripts/sweep_perturb.sh [--tables-only]" >&2; exit 2 ;;
esac

if [ -n "${VQ_BIN:-}" ]; then
  bin=$VQ_BIN
else
  scripts/build.sh >/dev/null
  bin=build/veloxquant
fi
out=results/perturb
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

ids=$("$bin" list | awk '{print $1}')
registered() { grep -qx "$1" <<<"$ids"; }

# Methods the sweep names explicitly; every other registered id joins the spans sweep.
explicit="full cam h2o tova streaming_llm morphkv keyformer"
spans=(full)
registered cam && spans+=(cam:merge=drop cam cam:merge_gate=false cam:target=nearest
                          cam:target=nearest,merge_gate=false cam:target=nearest,merge=sim_weighted
                          cam:target=nearest,merge=sim_weighted,merge_gate=false)
registered h2o && spans+=(h2o h2o:grace=0,decay=1)
registered tova && spans+=(tova)
registered streaming_llm && spans+=(streaming_llm)
morph=()
registered morphkv && morph=(morphkv:window=1 morphkv:window=8 morphkv:window=32)
spans+=("${morph[@]}")
keyformer=()
if registered keyformer; then
  # tau 0, 2, 6 as a constant temperature: keyformer_tau if it has one, else tau_init = tau_end
  # (with anneal_steps 0, its default, the temperature is tau_init throughout).
  fields=$("$bin" list keyformer | awk '{print $1}')
  if grep -qx keyformer_tau <<<"$fields"; then
    keyformer=(keyformer:tau=0 keyformer:tau=2 keyformer:tau=6)
  elif grep -qx keyformer_tau_init <<<"$fields" && grep -qx keyformer_tau_end <<<"$fields"; then
    keyformer=(keyformer:tau_init=0,tau_end=0 keyformer:tau_init=2,tau_end=2
               keyformer:tau_init=6,tau_end=6)
  else
    echo "sweep: keyformer has no tau field; running it with its defaults" >&2
    keyformer=(keyformer)
  fi
  spans+=("${keyformer[@]}")
fi
for id in $ids; do
  case " $explicit " in *" $id "*) continue ;; esac
  # A method whose defaults do not fit the sweep's budgets is reported and left out, so one new
  # method cannot stop the sweep.
  if err=$("$bin" bench perturb --quiet --method "$id" --seq 8 --budget 64,128 --seeds 1 \
             --heads 1 --head-dim 8 --probes 1 --json "$tmp/check.json" 2>&1 >/dev/null); then
    spans+=("$id")
  else
    echo "sweep: leaving out $id: $err" >&2
  fi
done

common=(--seq 256,512,1024 --budget 64,128 --seeds 20 --heads 4 --head-dim 64 --probes 32
        --feed prefill)
run() {  # run GEOMETRY METHOD...
  local geometry=$1 args=()
  shift
  for m in "$@"; do args+=(--method "$m"); done
  echo "sweep: $geometry (${#@} methods)" >&2
  "$bin" bench perturb "${common[@]}" --geometry "$geometry" "${args[@]}" \
    --json "$out/$geometry.json" --plot "$out/$geometry.svg" >/dev/null
}

if ! $readme_only; then
  start=$(date +%s)
  run spans "${spans[@]}"
  topic=(full)
  registered h2o && topic+=(h2o h2o:grace=0,decay=1)
  registered tova && topic+=(tova)
  registered streaming_llm && topic+=(streaming_llm)
  topic+=("${morph[@]}")
  run shift "${topic[@]}"
  run stable "${topic[@]}"
  if [ ${#keyformer[@]} -gt 0 ]; then
    planted=(full "${keyformer[@]}")
    registered h2o && planted+=(h2o h2o:grace=0,decay=1)
    run planted "${planted[@]}"
  else
    rm -f "$out/planted.json" "$out/planted.svg"
    echo "sweep: keyformer is not registered; no planted sweep" >&2
  fi
  echo "sweep: done in $(($(date +%s) - start)) s" >&2
fi

# The block of docs/benchmarks.md between the perturb markers is `bench table` of these files;
# the begin marker names them so tests/cli_test.sh can check the block against them.
doc=docs/benchmarks.md
files=()
for g in spans shift stable planted; do
  [ -f "$out/$g.json" ] && files+=("$out/$g.json")
done
if [ ${#files[@]} -eq 0 ]; then
  echo "sweep: no result files in $out" >&2
  exit 1
fi
if ! grep -q '<!-- perturb:begin' "$doc" || ! grep -q '<!-- perturb:end -->' "$doc"; then
  echo "sweep: $doc lacks the <!-- perturb:begin ... --> / <!-- perturb:end --> markers" >&2
  exit 1
fi
"$bin" bench table "${files[@]}" >"$tmp/table.md"
awk -v files="${files[*]}" -v table="$tmp/table.md" '
  /<!-- perturb:begin/ {
    print "<!-- perturb:begin files: " files " -->"
    while ((getline line < table) > 0) print line
    skip = 1
    next
  }
  /<!-- perturb:end -->/ { skip = 0 }
  !skip { print }
' "$doc" >"$tmp/doc.md"
cp "$tmp/doc.md" "$doc"
echo "sweep: $doc perturbation tables updated from ${files[*]}" >&2
