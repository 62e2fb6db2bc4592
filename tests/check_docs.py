#!/usr/bin/env python3
"""Checks README.md and docs/*.md against what they describe, so a doc cannot drift:

- every `veloxquant ...` / `build/veloxquant ...` command (in code blocks, and in inline code
  that starts with the binary) names a subcommand the built CLI has, and every --flag in it is
  one that subcommand's `--help` lists;
- every `scripts/NAME.sh` or `bench/peers/NAME.sh` command names a script that exists, and each
  of its --flags appears in that script (scripts/main.sh, and a script whose header says "Flags after the script go to every
  `veloxquant eval`", pass their flags to `veloxquant eval`,
  so they are checked against `eval --help`);
- every relative link and image points at a file that exists, and a #anchor into a markdown
  file at one of its headings;
- a code block after `<!-- excerpt: PATH -->` is an excerpt of PATH (built and run by the tests):
  its lines, whitespace aside, appear in PATH in the same order (lines that are only a `// ...`
  or `/* ... */` comment mark an elision).

Usage: check_docs.py CLI ROOT        (ctest `docs`)
       check_docs.py CLI --self-test (ctest `docs_self_test`: plants one fault of each kind in a
                                      scratch tree and expects each to be reported)
"""

import os
import pathlib
import re
import shlex
import subprocess
import sys
import tempfile

BINARIES = ("veloxquant", "build/veloxquant")
SCRIPT_RE = re.compile(r"^(?:scripts|bench/peers)/[\w.-]+\.sh$")
FLAG_RE = re.compile(r"(?<![\w-])(--[A-Za-z][\w-]*)")
HELP_OPTION_RE = re.compile(r"^\s+(?:-\w,)?(--[A-Za-z][\w-]*)")
LINK_RE = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
ELISION_RE = re.compile(r"^(//\s*\.\.\.|/\*\s*\.\.\.)")


class Cli:
    """The built CLI's subcommands and options, read from its --help output."""

    def __init__(self, binary):
        self.binary = binary
        self.cache = {}

    def help(self, path):
        key = tuple(path)
        if key not in self.cache:
            out = subprocess.run([self.binary, *path, "--help"], capture_output=True, text=True,
                                 timeout=60)
            if out.returncode != 0:
                raise SystemExit(f"check_docs: '{self.binary} {' '.join(path)} --help' failed: "
                                 f"{out.stderr.strip()}")
            options, subcommands, section = set(), set(), None
            for line in out.stdout.splitlines():
                if re.match(r"^\S.*:$", line):
                    section = line[:-1].strip()
                    continue
                m = HELP_OPTION_RE.match(line)
                if m and section == "Options":
                    options.add(m.group(1))
                elif section == "Subcommands" and line.strip():
                    subcommands.add(line.split()[0])
            self.cache[key] = (options, subcommands)
        return self.cache[key]


def split_command(text):
    """The words of one shell command: stops at a pipe, ;, && or a comment."""
    text = text.replace("\\|", "|")
    try:
        words = shlex.split(text, comments=True, posix=True)
    except ValueError:
        words = text.split()
    out = []
    for w in words:
        if w in ("|", ";", "&&", "||") or w.startswith(("|", ";")):
            break
        out.append(w)
    return out


def check_cli_command(cli, words, where, errors):
    """words[0] is the binary; checks the subcommand path and every --flag after it."""
    path, rest = [], words[1:]
    while rest:
        _, subs = cli.help(path)
        if not subs or rest[0].startswith("-"):
            break
        if rest[0] not in subs:
            if path:  # an argument (a method id, a file): the subcommand path ends here
                break
            errors.append(f"{where}: `{' '.join(words)}`: no subcommand '{rest[0]}' "
                          f"(veloxquant has: {', '.join(sorted(subs))})")
            return
        path.append(rest[0])
        rest = rest[1:]
    options, _ = cli.help(path)
    for word in rest:
        for flag in FLAG_RE.findall(word):
            if flag not in options:
                errors.append(f"{where}: `{' '.join(words)}`: 'veloxquant {' '.join(path)}' has "
                              f"no option {flag} (its --help lists: {', '.join(sorted(options))})")


def check_script_command(cli, root, words, where, errors):
    script = root / words[0]
    if not script.is_file():
        errors.append(f"{where}: `{' '.join(words)}`: no such script {words[0]}")
        return
    text = script.read_text()
    # main.sh, and any script whose header says so, passes its flags to `veloxquant eval`.
    if words[0] == "scripts/main.sh" or "Flags after the script go to every `veloxquant eval`" in text:
        check_cli_command(cli, ["veloxquant", "eval", *words[1:]], where, errors)
        return
    for word in words[1:]:
        for flag in FLAG_RE.findall(word):
            if flag not in text:
                errors.append(f"{where}: `{' '.join(words)}`: {words[0]} has no {flag}")


def commands_in(markdown):
    """(line number, command text) for each command line in fenced blocks and inline code."""
    found = []
    lines = markdown.split("\n")
    in_block, pending, pending_line = False, "", 0
    prose = []  # (line number, text) outside fenced blocks
    for number, line in enumerate(lines, 1):
        if line.lstrip().startswith("```"):
            in_block = not in_block
            prose.append((number, ""))
            continue
        if not in_block:
            prose.append((number, line))
            continue
        text = line.strip()
        if pending:
            pending += " " + text
        else:
            pending, pending_line = text, number
        if pending.endswith("\\"):
            pending = pending[:-1]
            continue
        command, pending = pending, ""
        if command.startswith("$ "):
            command = command[2:]
        found.append((pending_line, command))
    # Inline code spans, which may wrap across lines inside a paragraph.
    paragraph, start = [], 0
    for number, line in prose + [(len(lines) + 1, "")]:
        if line.strip():
            if not paragraph:
                start = number
            paragraph.append(line)
            continue
        if paragraph:
            text = " ".join(paragraph).replace("\\|", "\x00")
            for span in re.findall(r"`([^`]+)`", text):
                found.append((start, span.replace("\x00", "\\|").strip()))
        paragraph = []
    return found


def slug(heading):
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors_of(path):
    result, seen, in_block = set(), {}, False
    for line in path.read_text().split("\n"):
        if line.lstrip().startswith("```"):
            in_block = not in_block
            continue
        m = re.match(r"^#{1,6}\s+(.*)$", line)
        if m and not in_block:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            result.add(s if n == 0 else f"{s}-{n}")
            seen[s] = n + 1
    return result


def check_links(doc, root, markdown, errors):
    in_block = False
    for number, line in enumerate(markdown.split("\n"), 1):
        if line.lstrip().startswith("```"):
            in_block = not in_block
            continue
        if in_block:
            continue
        for target in LINK_RE.findall(line):
            if re.match(r"^[a-z]+:", target):
                continue  # http:, https:, mailto:
            file_part, _, anchor = target.partition("#")
            where = f"{doc.relative_to(root)}:{number}"
            path = doc if not file_part else (doc.parent / file_part).resolve()
            if not path.exists():
                errors.append(f"{where}: link to {target}: no such file")
                continue
            if anchor and path.suffix == ".md" and anchor not in anchors_of(path):
                errors.append(f"{where}: link to {target}: {path.name} has no heading "
                              f"with the anchor #{anchor}")


def check_excerpts(doc, root, markdown, errors):
    lines = markdown.split("\n")
    for number, line in enumerate(lines, 1):
        m = re.match(r"^<!-- excerpt: (\S+) -->$", line.strip())
        if not m:
            continue
        where = f"{doc.relative_to(root)}:{number}"
        source = root / m.group(1)
        if not source.is_file():
            errors.append(f"{where}: excerpt of {m.group(1)}: no such file")
            continue
        if number >= len(lines) or not lines[number].startswith("```"):
            errors.append(f"{where}: excerpt marker not followed by a code block")
            continue
        block = []
        for body in lines[number + 1:]:
            if body.startswith("```"):
                break
            block.append(body.strip())
        wanted = [b for b in block if b and not ELISION_RE.match(b)]
        have = [s.strip() for s in source.read_text().split("\n")]
        i = 0
        for w in wanted:
            while i < len(have) and have[i] != w:
                i += 1
            if i == len(have):
                errors.append(f"{where}: excerpt line not in {m.group(1)} (in this order): {w}")
                break
            i += 1


def check_tree(cli, root, docs):
    errors, n_cli, n_scripts = [], 0, 0
    for doc in docs:
        markdown = doc.read_text()
        for number, command in commands_in(markdown):
            words = split_command(command)
            while words and re.match(r"^[A-Z_]+=", words[0]):  # VAR=value prefixes
                words = words[1:]
            if not words:
                continue
            where = f"{doc.relative_to(root)}:{number}"
            if words[0] in BINARIES and len(words) > 1:
                n_cli += 1
                check_cli_command(cli, words, where, errors)
            elif SCRIPT_RE.match(words[0]):
                n_scripts += 1
                check_script_command(cli, root, words, where, errors)
        check_links(doc, root, markdown, errors)
        check_excerpts(doc, root, markdown, errors)
    return errors, n_cli, n_scripts


def self_test(cli):
    """Plants one fault of each kind and expects check_tree to report each."""
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        (root / "docs").mkdir()
        (root / "scripts").mkdir()
        (root / "scripts" / "main.sh").write_text("#!/bin/sh\n")
        (root / "scripts" / "sweep.sh").write_text("#!/bin/sh\n# --fast\n")
        (root / "ex.cpp").write_text("int a = 1;\nint b = 2;\n")
        (root / "docs" / "a.md").write_text("# A\n\n## Real heading\n")
        good = ("# T\n\n```sh\nbuild/veloxquant eval --model m --text t \\\n    --prefill 4\n"
                "scripts/sweep.sh --fast\n```\n\nSee `veloxquant list --markdown` and "
                "[a](docs/a.md#real-heading).\n\n<!-- excerpt: ex.cpp -->\n```cpp\nint a = 1;\n"
                "// ...\nint b = 2;\n```\n")
        (root / "README.md").write_text(good)
        errors, n_cli, n_scripts = check_tree(cli, root, [root / "README.md"])
        if errors or n_cli != 2 or n_scripts != 1:
            print(f"self-test: the clean document gave {errors}, {n_cli} CLI and {n_scripts} "
                  f"script commands (expected none, 2 and 1)")
            return 1
        faults = {
            "no option --no-such-flag": "```sh\nbuild/veloxquant eval --model m \\\n"
                                        "    --no-such-flag 3\n```\n",
            "no subcommand 'serve-all'": "Run `veloxquant serve-all --port 1`.\n",
            "'veloxquant bench perturb' has no option --prefill": "`veloxquant bench perturb "
                                                                  "--prefill 3`\n",
            "scripts/sweep.sh has no --slow": "```sh\nscripts/sweep.sh --slow\n```\n",
            "no such script scripts/gone.sh": "Run `scripts/gone.sh`.\n",
            "'veloxquant eval' has no option --sanitize": "```sh\nscripts/main.sh --sanitize\n```\n",
            "docs/b.md: no such file": "[b](docs/b.md)\n",
            "has no heading with the anchor #missing": "[a](docs/a.md#missing)\n",
            "excerpt line not in ex.cpp": "<!-- excerpt: ex.cpp -->\n```cpp\nint b = 2;\n"
                                          "int a = 1;\n```\n",
        }
        failed = 0
        for expected, text in faults.items():
            (root / "README.md").write_text(good + "\n" + text)
            errors, _, _ = check_tree(cli, root, [root / "README.md"])
            if not any(expected in e for e in errors):
                print(f"self-test: planted fault not reported ({expected}); got {errors}")
                failed += 1
        print(f"self-test: {len(faults) - failed} of {len(faults)} planted faults reported")
        return 1 if failed else 0


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    cli = Cli(argv[1])
    if argv[2] == "--self-test":
        return self_test(cli)
    root = pathlib.Path(argv[2]).resolve()
    docs = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    errors, n_cli, n_scripts = check_tree(cli, root, docs)
    for e in errors:
        print("FAIL " + e)
    print(f"docs: {len(docs)} files, {n_cli} veloxquant commands and {n_scripts} script commands "
          f"checked, {len(errors)} problems")
    if n_cli == 0:
        print("FAIL no veloxquant command found in the docs: the extraction is broken")
        return 1
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
