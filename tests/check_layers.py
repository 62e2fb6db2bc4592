#!/usr/bin/env python3
"""The layering rule, checked over every #include of the library, engine and front ends.

Layers, lowest first (docs/design.md, "Layers"). A file may include only files of its own layer
or a layer below it; the engine's subfolders are ordered the same way among themselves. A file
under src/, include/, tools/ or python/src/ that no layer claims is an error too, so a new
folder has to be placed before it can be used. Tests, benchmarks and fuzz targets sit above
everything and are not checked. A quoted include must name a file of the project; an
angle-bracket include is checked when it names one (<veloxquant/cache.h> from include/, or a
path under src/) and is otherwise a system or third-party header.

Usage: check_layers.py [ROOT]      (exit 0: clean; 1: violations, each printed with its line)
       check_layers.py --self-test  (plants upward includes, quoted and angle-bracket, and a
                                     file in no layer in a scratch tree; exit 0 when exactly
                                     those are reported)
"""
import os
import re
import sys

# (rank, name, path prefixes relative to the root). Public headers are placed by what they hold.
LAYERS = [
    (0, "base", ["src/base/", "include/veloxquant/export.h", "include/veloxquant/types.h",
                 "include/veloxquant/errors.h", "include/veloxquant/version.h",
                 "include/veloxquant/rows.h"]),
    (1, "store", ["src/store/"]),
    (2, "policies", ["src/policies/", "include/veloxquant/config.h",
                     "include/veloxquant/registry.h"]),
    (3, "cache", ["src/cache/", "include/veloxquant/cache.h", "include/veloxquant/builder.h"]),
    (4.0, "engine/compute", ["src/engine/compute/"]),
    (4.1, "engine/formats", ["src/engine/formats/"]),
    (4.2, "engine/model", ["src/engine/model/"]),
    (4.3, "engine/tokenizers", ["src/engine/tokenizers/"]),
    (4.4, "engine/run", ["src/engine/run/"]),
    (5, "eval", ["src/eval/"]),
    (5.5, "serve", ["src/serve/"]),
    (6, "front ends", ["src/capi/", "tools/", "python/src/", "include/veloxquant/veloxquant.h",
                       "include/veloxquant/veloxquant_c.h"]),
]
SOURCE = re.compile(r"\.(h|hpp|c|cc|cpp|inc)$")
INCLUDE = re.compile(r'^\s*#\s*include\s+(?:"([^"]+)"|<([^>]+)>)')


def layer_of(rel):
    best = None
    for rank, name, prefixes in LAYERS:
        for p in prefixes:
            if rel == p or (p.endswith("/") and rel.startswith(p)):
                if best is None or len(p) > best[2]:
                    best = (rank, name, len(p))
    return None if best is None else best[:2]


def resolve(root, including, target, quoted=True):
    """The file an include names: beside the including file (quoted only), then src/, then
    include/; None when it names no file of the project."""
    bases = ((os.path.dirname(including),) if quoted else ()) + ("src", "include")
    for base in bases:
        rel = os.path.normpath(os.path.join(base, target))
        if os.path.isfile(os.path.join(root, rel)):
            return rel
    return None


def check(root):
    problems = []
    checked = 0
    for top in ("src", "include", "tools", "python/src"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if not SOURCE.search(f):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, f), root)
                mine = layer_of(rel)
                if mine is None:
                    problems.append(f"{rel}: in no layer (add its folder to tests/check_layers.py)")
                    continue
                checked += 1
                with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as fh:
                    for n, line in enumerate(fh, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        quoted = m.group(1) is not None
                        name = m.group(1) if quoted else m.group(2)
                        target = resolve(root, rel, name, quoted)
                        if target is None:
                            if quoted:
                                problems.append(f"{rel}:{n}: includes \"{name}\", which is no "
                                                "file of the project")
                            continue  # <...>: a system or third-party header
                        theirs = layer_of(target)
                        if theirs is None:
                            problems.append(f"{rel}:{n}: includes {target}, which is in no layer")
                        elif theirs[0] > mine[0]:
                            problems.append(f"{rel}:{n}: {mine[1]} includes {target} from "
                                            f"{theirs[1]}, a layer above it")
    return problems, checked


def self_test():
    import tempfile
    with tempfile.TemporaryDirectory() as root:
        def put(rel, text):
            os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w") as fh:
                fh.write(text)
        put("src/policies/policy.h", '#include "store/store.h"\n#include <store/store.h>\n')
        put("src/store/store.h", "#include <vector>\n#include <nlohmann/json.hpp>\n")
        put("include/veloxquant/cache.h", '#include <veloxquant/rows.h>\n')
        put("include/veloxquant/rows.h", "#include <cstdint>\n")
        clean, _ = check(root)
        put("src/store/store.h", '#include "policies/policy.h"\n#include <vector>\n')
        put("src/store/rows.h", '#include <veloxquant/cache.h>\n')
        put("src/newfolder/x.h", "// unplaced\n")
        found, _ = check(root)
    want = ["src/store/store.h:1: store includes src/policies/policy.h from policies, a layer "
            "above it",
            "src/store/rows.h:1: store includes include/veloxquant/cache.h from cache, a layer "
            "above it",
            "src/newfolder/x.h: in no layer (add its folder to tests/check_layers.py)"]
    ok = clean == [] and sorted(found) == sorted(want)
    print("layers self-test:", "ok" if ok else f"FAILED: clean={clean} found={found}")
    return 0 if ok else 1


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), ".."))
    problems, checked = check(root)
    for p in problems:
        print(p)
    print(f"layers: {checked} files checked, {len(problems)} violations")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
