"""examples/python/numpy_llama.py: a NumPy Llama forward over veloxquant caches reproduces
`veloxquant eval`'s perplexity (the script exits non-zero beyond its tolerance)."""

import os
import subprocess
import sys

from conftest import SOURCE_DIR

SCRIPT = SOURCE_DIR / "examples" / "python" / "numpy_llama.py"


def run(*args):
    out = subprocess.run([sys.executable, str(SCRIPT), "--tokens", "128", *args],
                         capture_output=True, text=True, env=dict(os.environ))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "numpy_llama: matches veloxquant eval" in out.stdout
    return out.stdout


def test_numpy_llama_default_methods_fp16_caches():
    out = run()  # full, streaming_llm, h2o:source=attention at budget 32; rtol 5e-4
    assert "h2o:h2o_budget=32,source=attention" in out


def test_numpy_llama_fp32_caches_agree_tightly():
    run("--rtol", "1e-6", "--method", "full:kv_dtype=f32", "--method",
        "h2o:source=attention,kv_dtype=f32")
