#!/usr/bin/env python3
"""The chat page in a real headless browser (Debian's chromium): the server runs on 127.0.0.1
with stories260K; the page, loaded with ?prompt=..., sends the prompt, streams the reply and
draws the session's K/V gauge. The DOM must hold the same reply the API gives for the same
request, and a gauge with the session's bytes; a screenshot is kept in OUTDIR as an artefact.
Exit 77 (skipped) when chromium is not installed.

Usage: serve_browser_test.py VELOXQUANT_BINARY PROJECT_ROOT OUTDIR"""
import html
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Server  # noqa: E402


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def main():
    binary, root, outdir = sys.argv[1], sys.argv[2], sys.argv[3]
    browser = chromium()
    if browser is None:
        print("chromium is not installed (scripts/setup.sh installs it): skipped")
        return 77
    os.makedirs(outdir, exist_ok=True)
    srv = Server(binary, os.path.join(root, "data", "stories260K.bin"), "--kv-memory", "16M")
    profile = tempfile.mkdtemp(prefix="vq_chromium_")
    failures = []
    try:
        method, prompt, n = "h2o:budget=16", "Once upon a time", 30
        st, _, body = srv.request("POST", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": prompt}], "max_tokens": n, "temperature": 0,
            "veloxquant": {"method": method}})
        import json
        want = json.loads(body)["choices"][0]["message"]["content"]
        query = urllib.parse.urlencode({"prompt": prompt, "max_tokens": n, "temperature": 0,
                                        "method": method})
        url = "http://127.0.0.1:%d/?%s" % (srv.port, query)
        # As root (CI) chromium needs --no-sandbox; the virtual time budget lets the page's
        # fetch stream finish before the DOM is dumped.
        base = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--user-data-dir=" + profile, "--virtual-time-budget=20000"]
        dom = subprocess.run(base + ["--dump-dom", url], capture_output=True, text=True,
                             timeout=90).stdout
        texts = [html.unescape(t) for t in re.findall(r'<span class="text">([^<]*)</span>', dom)]
        done = re.search(r'data-done="(\d+)"', dom)
        gauge = re.search(r'class="gauge" id="g-(s\d+)" data-kv-bytes="(\d+)" '
                          r'data-kv-full-bytes="(\d+)"', dom)
        label = re.search(r'<span class="label">([^<]*)</span>', dom)
        print("page reply: %r" % (texts[1] if len(texts) > 1 else None))
        print("API reply:  %r" % want)
        print("gauge: %s" % (label.group(1) if label else None))
        if not (done and done.group(1) == "1"):
            failures.append("the page did not finish its reply")
        if len(texts) != 2 or texts[0] != prompt or texts[1] != want or not want:
            failures.append("the page's streamed reply differs from the API's")
        if not gauge or int(gauge.group(2)) <= 0 or int(gauge.group(3)) <= 0:
            failures.append("no K/V gauge with the session's bytes")
        if not label or "held of" not in label.group(1):
            failures.append("the gauge has no label")
        shot = os.path.join(outdir, "serve_page.png")
        if os.path.exists(shot):
            os.remove(shot)
        subprocess.run(base + ["--window-size=900,700", "--screenshot=" + shot, url],
                       capture_output=True, timeout=90)
        with open(shot, "rb") if os.path.exists(shot) else open(os.devnull, "rb") as f:
            head = f.read(8)
        if head != b"\x89PNG\r\n\x1a\n":
            failures.append("no screenshot written")
        else:
            print("screenshot: %s (%d bytes)" % (shot, os.path.getsize(shot)))
    finally:
        srv.stop()
        shutil.rmtree(profile, ignore_errors=True)
    for f in failures:
        print("FAIL " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
