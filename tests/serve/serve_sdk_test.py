#!/usr/bin/env python3
"""`veloxquant serve` driven by the official OpenAI Node SDK (tests/serve/openai_sdk_test.mjs):
a multi-turn chat that feeds the SDK's own reply objects back, streamed and not, with logprobs,
penalties, logit_bias, n=2, seed 0 and response_format text (issue 32). Traffic goes only to
127.0.0.1; every wait is bounded.

The SDK (npm package `openai`, pinned to SDK_VERSION) is installed into SDK_DIR (in the build
tree) with `npm install --prefix SDK_DIR` when absent. Without node/npm, or when the registry
cannot be reached, the test is skipped (exit 77, ctest's SKIP_RETURN_CODE) with a message.

Usage: serve_sdk_test.py VELOXQUANT_BINARY PROJECT_ROOT SDK_DIR"""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Server  # noqa: E402

SDK_VERSION = "6.49.0"
SKIP = 77


def installed_version(sdk_dir):
    try:
        with open(os.path.join(sdk_dir, "node_modules", "openai", "package.json")) as f:
            return json.load(f).get("version")
    except (OSError, ValueError):
        return None


def ensure_sdk(sdk_dir):
    """True when openai@SDK_VERSION is in sdk_dir; otherwise installs it (False: skip)."""
    if installed_version(sdk_dir) == SDK_VERSION:
        return True
    os.makedirs(sdk_dir, exist_ok=True)
    cmd = ["npm", "install", "--prefix", sdk_dir, "--no-audit", "--no-fund", "--no-save",
           "openai@" + SDK_VERSION]
    print("installing the SDK: " + " ".join(cmd), flush=True)
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        print("SKIP: npm install timed out after 240 s (registry unreachable?)")
        return False
    if r.returncode != 0 or installed_version(sdk_dir) != SDK_VERSION:
        tail = (r.stderr or r.stdout).strip().splitlines()[-5:]
        print("SKIP: npm could not install openai@%s (registry unreachable?):\n  %s" %
              (SDK_VERSION, "\n  ".join(tail)))
        return False
    return True


def main():
    binary, root, sdk_dir = sys.argv[1], sys.argv[2], os.path.abspath(sys.argv[3])
    node, npm = shutil.which("node") or shutil.which("nodejs"), shutil.which("npm")
    if not node or not npm:
        print("SKIP: the OpenAI SDK test needs node and npm (Debian: nodejs, npm); not found")
        return SKIP
    if not ensure_sdk(sdk_dir):
        return SKIP
    model = os.path.join(root, "data", "stories260K.bin")
    srv = Server(binary, model, "--kv-memory", "16M", "--threads", "1", "--api-key", "k3y")
    try:
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "openai_sdk_test.mjs")
        r = subprocess.run([node, script, sdk_dir, "http://127.0.0.1:%d/v1" % srv.port, "k3y"],
                           timeout=240)
        return r.returncode
    finally:
        srv.stop()


if __name__ == "__main__":
    sys.exit(main())
