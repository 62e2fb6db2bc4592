"""The README's Python snippet (the code block after `<!-- run: python -->`) runs as printed,
and prints the error its last comment shows."""

import re
import subprocess
import sys

from conftest import SOURCE_DIR


def readme_snippet():
    text = (SOURCE_DIR / "README.md").read_text()
    m = re.search(r"<!-- run: python -->\n```python\n(.*?)\n```", text, re.S)
    assert m, "README.md has no code block after <!-- run: python -->"
    return m.group(1)


def test_readme_python_snippet_runs():
    code = readme_snippet()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    # The snippet's own comment states what it prints for the rejected config.
    expected = re.search(r"print\(e\.code, e\)\s*#\s*(.*)$", code, re.M).group(1).strip()
    assert expected in out.stdout, out.stdout
    assert "kept_bytes" in out.stdout or "tokens_seen" in out.stdout, out.stdout
