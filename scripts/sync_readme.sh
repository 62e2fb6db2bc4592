#!/usr/bin/env bash
# Rewrites the README's method table from the registry (`veloxquant list --markdown`).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build/veloxquant}
table=$("$bin" list --markdown)
python3 - "$table" <<'PY'
import sys, re
table = sys.argv[1]
text = open("README.md").read()
new = re.sub(r"(<!-- methods:begin -->\n).*?(<!-- methods:end -->)",
             lambda m: m.group(1) + table + "\n" + m.group(2), text, flags=re.S)
open("README.md", "w").write(new)
PY
