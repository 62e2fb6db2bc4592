#!/usr/bin/env python3
"""The chat page in a real headless browser (Debian's chromium): the server runs on 127.0.0.1
with stories260K; the page, loaded with ?prompt=..., sends the prompt, streams the reply and
draws the session's K/V gauge. The DOM must hold the same reply the API gives for the same
request, and a gauge with the session's bytes; a screenshot is kept in OUTDIR as an artefact.
Exit 77 (skipped) when chromium is not installed.

Usage: serve_browser_test.py VELOXQUANT_BINARY PROJECT_ROOT OUTDIR"""
import base64
import fcntl
import html
import json
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Server  # noqa: E402


class DevTools:
    """Headless chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe:
    the browser reads NUL-terminated JSON commands on fd 3 and writes replies on fd 4). Every
    read has a deadline, so a browser that stalls fails the test instead of hanging it."""

    def __init__(self, browser, profile):
        to_browser_r, self._w = os.pipe()
        self._r, from_browser_w = os.pipe()

        def fds():  # in the child: the pipe ends onto fds 3 and 4, inheritable (copied high
            # first, since an end may already sit on 3 or 4 marked close-on-exec)
            high_r = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10)
            high_w = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10)
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        self.proc = subprocess.Popen(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--user-data-dir=" + profile, "--remote-debugging-pipe",
             "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=fds, close_fds=False)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buf, self._id, self._session = b"", 0, None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            if self.proc.poll() is None:
                self.call("Browser.close", timeout=5)
        except Exception:  # noqa: BLE001 -- the browser is killed below regardless
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._w)
        os.close(self._r)

    def call(self, method, params=None, timeout=30, session=True):
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session and self._session:
            msg["sessionId"] = self._session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        end = time.time() + timeout
        while True:
            while b"\0" not in self._buf:
                left = end - time.time()
                ready, _, _ = select.select([self._r], [], [], max(left, 0))
                if not ready:
                    raise TimeoutError("chromium did not answer %s in %d s" % (method, timeout))
                chunk = os.read(self._r, 1 << 20)
                if not chunk:
                    raise RuntimeError("chromium closed its DevTools pipe during " + method)
                self._buf += chunk
            raw, self._buf = self._buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError("%s: %s" % (method, reply["error"]))
                return reply.get("result", {})

    def load_until(self, url, condition, deadline_s):
        """Opens url in a 900x700 page, waits until the JavaScript condition holds (or the
        deadline passes) and returns (the DOM as HTML, a PNG screenshot)."""
        # The first command waits for the browser to start (a fresh machine builds its font
        # cache first).
        target = self.call("Target.createTarget", {"url": "about:blank"}, session=False,
                           timeout=90)
        self._session = self.call("Target.attachToTarget",
                                  {"targetId": target["targetId"], "flatten": True},
                                  session=False)["sessionId"]
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": 900, "height": 700, "deviceScaleFactor": 1, "mobile": False})
        self.call("Page.navigate", {"url": url})
        end = time.time() + deadline_s
        while time.time() < end:
            r = self.call("Runtime.evaluate", {"expression": "!!(%s)" % condition,
                                               "returnByValue": True})
            if r.get("result", {}).get("value") is True:
                break
            time.sleep(0.1)
        dom = self.call("Runtime.evaluate", {"expression": "document.documentElement.outerHTML",
                                             "returnByValue": True})["result"].get("value", "")
        png = base64.b64decode(self.call("Page.captureScreenshot", {"format": "png"})["data"])
        return dom, png


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
        want = json.loads(body)["choices"][0]["message"]["content"]
        query = urllib.parse.urlencode({"prompt": prompt, "max_tokens": n, "temperature": 0,
                                        "method": method})
        url = "http://127.0.0.1:%d/?%s" % (srv.port, query)
        # The browser is driven over the DevTools protocol on a pipe (no virtual time: the page
        # is polled in real time until it marks its reply done, or the deadline passes).
        with DevTools(browser, profile) as dt:
            dom, png = dt.load_until(url, "document.body.dataset.done === '1'", deadline_s=60)
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
        if png[:8] != b"\x89PNG\r\n\x1a\n":
            failures.append("no screenshot taken")
        else:
            with open(shot, "wb") as f:
                f.write(png)
            print("screenshot: %s (%d bytes)" % (shot, len(png)))
    finally:
        srv.stop()
        shutil.rmtree(profile, ignore_errors=True)
    for f in failures:
        print("FAIL " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
