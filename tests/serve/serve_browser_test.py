#!/usr/bin/env python3
"""The chat page in a real headless browser (Debian's chromium): the server runs on 127.0.0.1
with stories260K; the page, loaded with ?prompt=..., sends the prompt, streams the reply and
draws the session's K/V gauge. The DOM must hold the same reply the API gives for the same
request; the gauge compares the session's K/V payload with the full fp16 cache's for the same
tokens (a compressed method below 100%, the full cache at 100%) and shows the overhead on its
own line. Against a server with --api-key the page says it needs the key, and with the key
typed into its field gets the API's reply. A screenshot is kept in OUTDIR as an artefact.
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

    def open(self, url):
        """Opens url in a new 900x700 page, which later calls address."""
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

    def evaluate(self, expression):
        """The JavaScript expression's value in the page (JSON-able values)."""
        r = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        return r.get("result", {}).get("value")

    def wait(self, condition, deadline_s):
        """Polls until the JavaScript condition holds; False when the deadline passes."""
        end = time.time() + deadline_s
        while time.time() < end:
            if self.evaluate("!!(%s)" % condition) is True:
                return True
            time.sleep(0.1)
        return False

    def snapshot(self):
        """(the DOM as HTML, a PNG screenshot)."""
        dom = self.evaluate("document.documentElement.outerHTML") or ""
        png = base64.b64decode(self.call("Page.captureScreenshot", {"format": "png"})["data"])
        return dom, png

    def load_until(self, url, condition, deadline_s):
        """Opens url, waits until the JavaScript condition holds (or the deadline passes) and
        returns (the DOM as HTML, a PNG screenshot)."""
        self.open(url)
        self.wait(condition, deadline_s)
        return self.snapshot()


# The gauges' numbers, read from their data attributes (one entry per session).
GAUGES_JS = """Array.from(document.querySelectorAll('.gauge')).map(g => ({
  id: g.id, bytes: +g.dataset.kvBytes, payload: +g.dataset.kvPayloadBytes,
  full: +g.dataset.kvFullBytes, pct: +g.dataset.pct, overhead: +g.dataset.overheadBytes,
  label: g.querySelector('.label').textContent, over: g.querySelector('.over').textContent}))"""


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def api_reply(srv, prompt, n, method, headers=None):
    """The API's reply and `veloxquant` extension for the request the page makes."""
    st, _, body = srv.request("POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": prompt}], "max_tokens": n, "temperature": 0,
        "veloxquant": {"method": method}}, headers=headers)
    if st != 200:
        raise SystemExit("the API answered %d: %s" % (st, body))
    j = json.loads(body)
    return j["choices"][0]["message"]["content"], j["veloxquant"]


def page_url(srv, prompt, n, method):
    query = urllib.parse.urlencode({"prompt": prompt, "max_tokens": n, "temperature": 0,
                                    "method": method})
    return "http://127.0.0.1:%d/?%s" % (srv.port, query)


def replies(dom):
    return [html.unescape(t) for t in re.findall(r'<span class="text">([^<]*)</span>', dom)]


def check_gauge(g, method, failures):
    """A gauge compares the K/V payload with the full cache's for the same tokens, and shows
    the overhead (resident minus payload) on its own line."""
    print("gauge (%s): %s | %s" % (method, g["label"], g["over"]))
    if g["payload"] <= 0 or g["full"] <= 0 or g["bytes"] < g["payload"]:
        failures.append("%s: the gauge's bytes are wrong: %s" % (method, g))
    if abs(g["pct"] - round(100 * g["payload"] / g["full"], 1)) > 0.05:
        failures.append("%s: the gauge's percentage is not payload / full: %s" % (method, g))
    if g["overhead"] != g["bytes"] - g["payload"] or not g["over"].startswith("overhead: "):
        failures.append("%s: no overhead line of resident minus payload: %s" % (method, g))
    if "of" not in g["label"] or "%" not in g["label"]:
        failures.append("%s: the gauge has no label" % method)


def main():
    binary, root, outdir = sys.argv[1], sys.argv[2], sys.argv[3]
    browser = chromium()
    if browser is None:
        print("chromium is not installed (scripts/setup.sh installs it): skipped")
        return 77
    os.makedirs(outdir, exist_ok=True)
    model = os.path.join(root, "data", "stories260K.bin")
    srv = Server(binary, model, "--kv-memory", "16M")
    keyed = None
    profile = tempfile.mkdtemp(prefix="vq_chromium_")
    failures = []
    prompt, n = "Once upon a time", 30
    try:
        # 1. A compressed method: the streamed reply equals the API's; the gauge is below 100%
        # with an overhead line.
        method = "h2o:budget=16"
        want, _ = api_reply(srv, prompt, n, method)
        # The browser is driven over the DevTools protocol on a pipe (no virtual time: the page
        # is polled in real time until it marks its reply done, or the deadline passes).
        with DevTools(browser, profile) as dt:
            dom, png = dt.load_until(page_url(srv, prompt, n, method),
                                     "document.body.dataset.done === '1'", deadline_s=60)
            gauges = dt.evaluate(GAUGES_JS) or []
            texts = replies(dom)
            done = re.search(r'data-done="(\d+)"', dom)
            print("page reply: %r" % (texts[1] if len(texts) > 1 else None))
            print("API reply:  %r" % want)
            if not (done and done.group(1) == "1"):
                failures.append("the page did not finish its reply")
            if len(texts) != 2 or texts[0] != prompt or texts[1] != want or not want:
                failures.append("the page's streamed reply differs from the API's")
            if len(gauges) != 1:
                failures.append("%s: %d gauges, not 1" % (method, len(gauges)))
            else:
                check_gauge(gauges[0], method, failures)
                if not gauges[0]["pct"] < 100:
                    failures.append("%s: the gauge is not below 100%%" % method)
            shot = os.path.join(outdir, "serve_page.png")
            if png[:8] != b"\x89PNG\r\n\x1a\n":
                failures.append("no screenshot taken")
            else:
                with open(shot, "wb") as f:
                    f.write(png)
                print("screenshot: %s (%d bytes)" % (shot, len(png)))

            # 2. The full cache reads 100% (its payload is what the full cache holds).
            want_full, ext = api_reply(srv, prompt, n, "full")
            if ext.get("kv_payload_bytes") != ext.get("kv_full_bytes"):
                failures.append("full: the API's kv_payload_bytes differs from kv_full_bytes: %s"
                                % ext)
            dt.open(page_url(srv, prompt, n, "full"))
            if not dt.wait("document.body.dataset.done === '1'", 60):
                failures.append("full: the page did not finish its reply")
            gauges = dt.evaluate(GAUGES_JS) or []
            if len(gauges) != 1:
                failures.append("full: %d gauges, not 1" % len(gauges))
            else:
                check_gauge(gauges[0], "full", failures)
                if gauges[0]["pct"] != 100 or "(100%)" not in gauges[0]["label"]:
                    failures.append("full: the gauge does not read 100%%: %s" % gauges[0])
            if (replies(dt.snapshot()[0]) or [None])[-1] != want_full:
                failures.append("full: the page's reply differs from the API's")

            # 3. A server with --api-key: without the key the page says it needs one; with the
            # key entered in its field, the same prompt gets the API's reply.
            key = "vq-browser-test-key"
            keyed = Server(binary, model, "--kv-memory", "16M", "--api-key", key)
            st, _, _ = keyed.request("POST", "/v1/chat/completions", {
                "messages": [{"role": "user", "content": prompt}], "max_tokens": 1})
            if st != 401:
                failures.append("--api-key: a request without the key got %d, not 401" % st)
            want_key, _ = api_reply(keyed, prompt, n, method,
                                    headers={"Authorization": "Bearer " + key})
            dt.open(page_url(keyed, prompt, n, method))
            if not dt.wait("document.body.dataset.done === '1'", 60):
                failures.append("--api-key: the page did not end its keyless request")
            msg = dt.evaluate("document.getElementById('err').textContent") or ""
            print("without the key: %r" % msg)
            if "requires an API key" not in msg or "API key field" not in msg:
                failures.append("--api-key: no message asking for the key: %r" % msg)
            if dt.evaluate(GAUGES_JS):
                failures.append("--api-key: a gauge drawn for a refused request")
            dt.evaluate("""(() => {const k = document.getElementById('key');
                k.value = %s; k.dispatchEvent(new Event('input'));
                document.getElementById('text').value = %s;
                document.getElementById('f').requestSubmit(); return true;})()"""
                        % (json.dumps(key), json.dumps(prompt)))
            if not dt.wait("document.body.dataset.done === '2'", 60):
                failures.append("--api-key: the page did not finish its reply with the key")
            msg = dt.evaluate("document.getElementById('err').textContent") or ""
            stored = dt.evaluate("sessionStorage.getItem('vq_api_key')")
            got = (replies(dt.snapshot()[0]) or [None])[-1]
            print("with the key: %r (error %r)" % (got, msg))
            if msg or got != want_key or not want_key:
                failures.append("--api-key: with the key the page's reply differs from the "
                                "API's (%r, error %r)" % (got, msg))
            if stored != key:
                failures.append("--api-key: the key is not kept in sessionStorage: %r" % stored)
            gauges = dt.evaluate(GAUGES_JS) or []
            if len(gauges) != 1:
                failures.append("--api-key: %d gauges after the keyed reply" % len(gauges))
    finally:
        srv.stop()
        if keyed is not None:
            keyed.stop()
        shutil.rmtree(profile, ignore_errors=True)
    for f in failures:
        print("FAIL " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
