"""Starting a `veloxquant serve` on 127.0.0.1 with a free port, and plain HTTP helpers (stdlib
only). Every wait here is bounded."""
import http.client
import json
import re
import subprocess
import time

# The checks of one test script: each printed as it runs, the failed ones kept for the summary.
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def summary():
    """The script's exit status: 1 (with the failed checks listed) when any failed, else 0."""
    if failures:
        print("%d failed: %s" % (len(failures), "; ".join(failures)))
        return 1
    print("all passed")
    return 0


class Server:
    def __init__(self, binary, model, *args):
        self.proc = subprocess.Popen(
            [binary, "serve", "--model", model, "--host", "127.0.0.1", "--port", "0", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = ""
        deadline = time.time() + 30
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if "listening on" in line or line == "":
                break
        m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        if not m:
            self.proc.kill()
            raise SystemExit("server did not start: %r %s" % (line, self.proc.stderr.read()))
        self.port = int(m.group(1))

    def request(self, method, path, body=None, headers=None, timeout=60, source=None):
        """`source`: the client's address (another loopback address is another client)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout,
                                          source_address=(source, 0) if source else None)
        data = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
        conn.request(method, path, body=data, headers=headers or {})
        r = conn.getresponse()
        out = (r.status, dict(r.getheaders()), r.read().decode("utf-8", "replace"))
        conn.close()
        return out

    def stream(self, path, body, headers=None, timeout=60):
        """POST a streaming request; returns (status, [event data strings])."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        conn.request("POST", path, body=json.dumps(body), headers=headers or {})
        r = conn.getresponse()
        if r.status != 200:
            out = (r.status, [r.read().decode()])
            conn.close()
            return out
        events, buf = [], b""
        while True:
            chunk = r.read1(65536) if hasattr(r, "read1") else r.read(1)
            if not chunk:
                break
            buf += chunk
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                if ev.startswith(b"data: "):
                    events.append(ev[6:].decode("utf-8", "replace"))
        conn.close()
        return 200, events

    def metrics(self):
        _, _, text = self.request("GET", "/metrics")
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def stop(self, sig=None):
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def stream_text(events):
    text, finish, done = "", None, False
    for e in events:
        if e == "[DONE]":
            done = True
            continue
        j = json.loads(e)
        if "error" in j:
            raise AssertionError("stream error: %s" % j["error"])
        c = j["choices"][0]
        text += c.get("delta", {}).get("content", "") if "delta" in c else c.get("text", "")
        finish = c.get("finish_reason") or finish
    return text, finish, done
