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
for id in full streaming_llm h2o tova snapkv pyramidkv squeeze chunkkv keyformer morphkv cam kivi knorm keydiff; do
  check "list shows $id" 0 "^$id " -- "$bin" list
done
check "help" 0 "list" -- "$bin" --help
for cmd in list demo; do
  check "$cmd --help" 0 "Usage|Options" -- "$bin" "$cmd" --help
done
check "no command" 2 "subcommand is required" -- "$bin"
check "unknown command" 2 "unknown command 'frobnicate'; commands: list, demo" -- "$bin" frobnicate
check "unknown option" 2 "--nope" -- "$bin" list --nope
check "unknown method" 2 "unknown method 'nope'; known methods: full" -- "$bin" list nope
check "bad spec" 2 "unknown key 'budgett'" -- "$bin" demo --method cam:budgett=3 --seq 10
check "out of range" 2 "h2o_decay must be in \[0, 1\], got 2" -- "$bin" demo --method h2o:decay=2 --seq 10
check "bad geometry" 2 "unknown geometry 'round'" -- "$bin" demo --geometry round --seq 10
check "demo runs" 0 "cam:cam_budget=32" -- "$bin" demo --seq 64 --budget 32 --heads 2 --head-dim 8 --probes 4

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
