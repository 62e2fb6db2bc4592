#!/usr/bin/env python3
"""`veloxquant serve` against slow and abusive clients on 127.0.0.1 (issue 32, item 2), bounded
in count and time: 150 connections sending a request head a byte a second and 20 sending a body
a byte a second while /health and a chat request are timed (each must answer within 1 s);
--header-timeout / --body-timeout ending such connections with 408; --max-connections and
--max-connections-per-address answering 503 + close past the cap without reading the request;
--keep-alive-requests and --keep-alive-timeout closing a connection; a client that stops
reading a long stream dropped after --write-timeout and its request cancelled.

Usage: serve_abuse_test.py VELOXQUANT_BINARY PROJECT_ROOT"""
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Server, check, summary  # noqa: E402



MSGS = [{"role": "user", "content": "Once upon a time"}]


class Drip:
    """Connections that each send `data` one byte a second (all from one thread)."""

    def __init__(self, port, data, count, source="127.0.0.1"):
        self.socks, self.data, self.sent = [], data, []
        self.replies, self.closed_at = {}, {}
        self.t0 = time.time()
        for _ in range(count):
            s = socket.create_connection(("127.0.0.1", port), timeout=5,
                                         source_address=(source, 0))
            s.setblocking(False)
            self.socks.append(s)
            self.sent.append(0)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run)
        self.thread.start()

    def poll_replies(self):
        for i, s in enumerate(self.socks):
            if i in self.closed_at:
                continue
            try:
                got = s.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                got = b""
            if got:
                self.replies[i] = self.replies.get(i, b"") + got
            else:
                self.closed_at[i] = time.time() - self.t0

    def run(self):
        while not self.stop.is_set():
            for i, s in enumerate(self.socks):
                if i in self.closed_at or self.sent[i] >= len(self.data):
                    continue
                try:
                    s.send(self.data[self.sent[i]:self.sent[i] + 1])
                    self.sent[i] += 1
                except OSError:
                    pass  # closed by the server: seen by poll_replies
            end = time.time() + 1.0
            while time.time() < end and not self.stop.is_set():
                self.poll_replies()
                time.sleep(0.05)

    def close(self):
        self.stop.set()
        self.thread.join(10)
        for s in self.socks:
            s.close()


SLOW_HEAD = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             b"Content-Length: 60\r\n\r\n")


def slow_body_head():
    return SLOW_HEAD  # the head at once, then the 60-byte body a byte a second


def timed(fn):
    t0 = time.time()
    out = fn()
    return time.time() - t0, out


def attack(binary, model):
    """150 slow heads and 20 slow bodies: /health and chat still answer within 1 s."""
    srv = Server(binary, model, "--kv-memory", "16M", "--threads", "1")
    try:
        heads = Drip(srv.port, SLOW_HEAD, 150)
        bodies = Drip(srv.port, b"x" * 60, 20)
        for s in bodies.socks:
            s.setblocking(True)
            s.sendall(slow_body_head())
            s.setblocking(False)
        time.sleep(1.5)
        m = srv.metrics()
        check(m["veloxquant_http_connections"] >= 171,
              "attack: 170 slow connections are open (%d with the metrics request)"
              % m["veloxquant_http_connections"])
        health, chat = [], []
        for _ in range(5):
            t, (st, _, body) = timed(lambda: srv.request("GET", "/health", timeout=10))
            health.append((t, st))
            t, (st, _, body) = timed(lambda: srv.request(
                "POST", "/v1/chat/completions",
                {"messages": MSGS, "max_tokens": 8, "temperature": 0}, timeout=10))
            chat.append((t, st))
            time.sleep(0.5)
        m = srv.metrics()
        still = m["veloxquant_http_connections"]
        heads.close()
        bodies.close()
        ht = [t for t, _ in health]
        ct = [t for t, _ in chat]
        print("figure: under 150 slow-head + 20 slow-body connections: /health median %.1f ms, "
              "max %.1f ms; chat (8 tokens) median %.1f ms, max %.1f ms"
              % (1000 * statistics.median(ht), 1000 * max(ht), 1000 * statistics.median(ct),
                 1000 * max(ct)), flush=True)
        check(all(st == 200 for _, st in health) and max(ht) < 1.0,
              "attack: /health answers within 1 s each (max %.3f s)" % max(ht))
        check(all(st == 200 for _, st in chat) and max(ct) < 1.0,
              "attack: a chat request answers within 1 s each (max %.3f s)" % max(ct))
        check(still >= 171, "attack: the slow connections were still open while measured (%d)"
              % still)
    finally:
        srv.stop()


def deadlines(binary, model):
    """--header-timeout 2 and --body-timeout 2: slow connections get 408 and are closed at ~2 s;
    --keep-alive-timeout 1 closes an idle keep-alive connection at ~1 s."""
    srv = Server(binary, model, "--kv-memory", "16M", "--threads", "1", "--header-timeout", "2",
                 "--body-timeout", "2", "--keep-alive-timeout", "1")
    try:
        heads = Drip(srv.port, SLOW_HEAD, 20)
        bodies = Drip(srv.port, b"x" * 60, 5)
        for s in bodies.socks:
            s.setblocking(True)
            s.sendall(slow_body_head())
            s.setblocking(False)
        end = time.time() + 6
        while time.time() < end and (len(heads.closed_at) < 20 or len(bodies.closed_at) < 5):
            time.sleep(0.1)
        heads.close()
        bodies.close()
        for name, d, flag in (("head", heads, "--header-timeout"), ("body", bodies, "--body-timeout")):
            got408 = [i for i, r in d.replies.items() if r.startswith(b"HTTP/1.1 408")
                      and b"Connection: close" in r and flag.encode() in r]
            times = sorted(d.closed_at.values())
            check(len(got408) == len(d.socks) and len(times) == len(d.socks)
                  and 1.8 <= times[0] and times[-1] <= 3.5,
                  "slow %s: all %d get 408 naming %s and are closed at %.2f-%.2f s (2 s deadline)"
                  % (name, len(d.socks), flag, times[0] if times else -1,
                     times[-1] if times else -1))
        m = srv.metrics()
        check(m['veloxquant_http_timeouts_total{phase="header"}'] == 20
              and m['veloxquant_http_timeouts_total{phase="body"}'] == 5,
              "deadlines counted in /metrics (header %d, body %d)" %
              (m['veloxquant_http_timeouts_total{phase="header"}'],
               m['veloxquant_http_timeouts_total{phase="body"}']))
        # Keep-alive idle: one request, then silence; closed after ~1 s.
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        got = s.recv(4096)
        t0 = time.time()
        rest = s.recv(4096)
        idle = time.time() - t0
        s.close()
        check(got.startswith(b"HTTP/1.1 200") and rest == b"" and 0.8 <= idle <= 2.5,
              "--keep-alive-timeout 1: an idle keep-alive connection is closed after %.2f s" % idle)
    finally:
        srv.stop()


def read_reply(s, limit_s=3):
    """Reads until the peer closes or limit_s passes; returns (bytes, closed)."""
    s.settimeout(0.2)
    out, end = b"", time.time() + limit_s
    while time.time() < end:
        try:
            got = s.recv(65536)
        except socket.timeout:
            continue
        except OSError:
            return out, True
        if not got:
            return out, True
        out += got
    return out, False


def caps(binary, model):
    """--max-connections 6 and --max-connections-per-address 3: 503 + Retry-After + close past
    the cap, written without waiting for the request; a connection under the caps is served."""
    srv = Server(binary, model, "--kv-memory", "16M", "--threads", "1", "--max-connections", "6",
                 "--max-connections-per-address", "3")
    try:
        held = [socket.create_connection(("127.0.0.1", srv.port), timeout=5,
                                         source_address=("127.0.0.2", 0)) for _ in range(3)]
        time.sleep(0.3)
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=5,
                                     source_address=("127.0.0.2", 0))
        reply, closed = read_reply(s)  # nothing sent
        s.close()
        head, _, body = reply.partition(b"\r\n\r\n")
        try:
            msg = json.loads(body)["error"]["message"]
        except (ValueError, KeyError):
            msg = ""
        check(head.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in head
              and b"Connection: close" in head and "--max-connections-per-address 3" in msg
              and closed,
              "a 4th connection from one address: 503 naming the cap, Retry-After, closed (%r)"
              % head[:40])
        st, _, _ = srv.request("GET", "/health", source="127.0.0.3")
        check(st == 200, "another address is served meanwhile (%s)" % st)
        held += [socket.create_connection(("127.0.0.1", srv.port), timeout=5,
                                          source_address=("127.0.0.%d" % (4 + i), 0))
                 for i in range(3)]
        time.sleep(0.3)
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=5,
                                     source_address=("127.0.0.9", 0))
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        reply, closed = read_reply(s)
        s.close()
        check(reply.startswith(b"HTTP/1.1 503") and b"--max-connections 6" in reply and closed,
              "a 7th connection in total: 503 naming --max-connections, closed (%r)" % reply[:40])
        for h in held:
            h.close()
        time.sleep(0.3)
        st, _, _ = srv.request("GET", "/health", source="127.0.0.2")
        check(st == 200, "once the held connections close, their address is served again")
        m = srv.metrics()
        check(m['veloxquant_http_connections_refused_total{cap="per_address"}'] == 1
              and m['veloxquant_http_connections_refused_total{cap="total"}'] == 1,
              "refusals counted by cap in /metrics")
    finally:
        srv.stop()


def keep_alive_cap(binary, model):
    """--keep-alive-requests 3: the third response says Connection: close and the connection
    closes; pipelined requests are answered in order."""
    srv = Server(binary, model, "--kv-memory", "16M", "--threads", "1", "--keep-alive-requests",
                 "3")
    try:
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
        replies = []
        for _ in range(2):
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            replies.append(s.recv(4096))
        # The third pipelined with a fourth: the fourth is never answered.
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        rest, closed = read_reply(s)
        s.close()
        check(all(r.startswith(b"HTTP/1.1 200") and b"Connection: close" not in r
                  for r in replies),
              "keep-alive: the first two responses keep the connection")
        check(rest.startswith(b"HTTP/1.1 200") and b"Connection: close" in rest
              and rest.count(b"HTTP/1.1") == 1 and b"stories260K" in rest and closed,
              "--keep-alive-requests 3: the third response closes the connection (%d responses "
              "in the last read, closed %s)" % (rest.count(b"HTTP/1.1"), closed))
        m = srv.metrics()
        check(m["veloxquant_http_keep_alive_limit_total"] == 1, "the keep-alive cap is counted")
    finally:
        srv.stop()


def stalled_reader(binary, root, model_dir):
    """A client that stops reading a long stream: dropped after --write-timeout 1, its request
    cancelled and its sessions freed long before its tokens are all generated."""
    srv = Server(binary, model_dir, "--tokenizer",
                 os.path.join(root, "data", "ggml-vocab-llama-spm.gguf"), "--kv-memory", "256M",
                 "--max-context", "1024", "--threads", "1", "--write-timeout", "1")
    try:
        m0 = srv.metrics()
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window fills soon
        s.settimeout(10)
        s.connect(("127.0.0.1", srv.port))
        body = json.dumps({"messages": [{"role": "user", "content": "Lily"}], "max_tokens": 900,
                           "n": 4, "logprobs": True, "top_logprobs": 20, "stream": True}).encode()
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                  b"application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        first = s.recv(1024)  # the stream has started; then nothing more is read
        active = 'veloxquant_sessions{state="active"}'
        t0 = time.time()
        m = srv.metrics()
        # The server's send buffer (autotuned up to tcp_wmem's 4 MiB) fills after ~1,600 tokens
        # of 1.4 KB events: seconds in Release, about a minute under ASan.
        while time.time() - t0 < 150 and not (
                m['veloxquant_http_timeouts_total{phase="write"}'] == 1 and m[active] == 0):
            time.sleep(0.2)
            m = srv.metrics()
        took = time.time() - t0
        generated = m["veloxquant_generated_tokens_total"] - m0["veloxquant_generated_tokens_total"]
        s.close()
        check(first.startswith(b"HTTP/1.1 200") and b"text/event-stream" in first,
              "stalled reader: its stream started")
        check(m['veloxquant_http_timeouts_total{phase="write"}'] == 1 and m[active] == 0
              and m["veloxquant_requests_cancelled_total"] == m0["veloxquant_requests_cancelled_total"] + 4,
              "stalled reader: dropped at the write deadline, its 4 choices cancelled and their "
              "sessions freed (%.1f s)" % took)
        check(generated < 4 * 900, "stalled reader: %d of 3600 tokens generated" % generated)
        time.sleep(0.5)
        check(srv.metrics()["veloxquant_generated_tokens_total"] == m["veloxquant_generated_tokens_total"],
              "stalled reader: no token generated after the drop")
        st, _, _ = srv.request("POST", "/v1/chat/completions", {"messages": MSGS, "max_tokens": 3})
        check(st == 200, "the next request is served")
    finally:
        srv.stop()


def workers_cap(binary, root, model_dir):
    """--http-workers 1: while a generation request holds the one worker, another gets 503 with
    Retry-After naming the flag, /health and /metrics still answer (the I/O thread), and once
    the first client leaves (its request cancelled) the next one is served."""
    srv = Server(binary, model_dir, "--tokenizer",
                 os.path.join(root, "data", "ggml-vocab-llama-spm.gguf"), "--kv-memory", "256M",
                 "--max-context", "1024", "--threads", "1", "--http-workers", "1")
    try:
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        body = json.dumps({"messages": [{"role": "user", "content": "Tom"}],
                           "max_tokens": 900}).encode()
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                  b"application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        t0 = time.time()
        while time.time() - t0 < 10 and srv.metrics()["veloxquant_http_workers_busy"] != 1:
            time.sleep(0.05)
        st, h, text = srv.request("POST", "/v1/chat/completions",
                                  {"messages": MSGS, "max_tokens": 2}, timeout=10)
        try:
            msg = json.loads(text)["error"]["message"]
        except (ValueError, KeyError):
            msg = ""
        check(st == 503 and h.get("Retry-After") == "1" and "--http-workers 1" in msg,
              "--http-workers 1: a second generation request gets 503 naming the flag (%s: %s)"
              % (st, msg))
        t, (st, _, _) = timed(lambda: srv.request("GET", "/health", timeout=10))
        check(st == 200 and t < 1.0, "--http-workers 1: /health answers meanwhile (%.3f s)" % t)
        s.close()
        t0 = time.time()
        while time.time() - t0 < 10 and srv.metrics()["veloxquant_http_workers_busy"] != 0:
            time.sleep(0.05)
        st, _, _ = srv.request("POST", "/v1/chat/completions", {"messages": MSGS, "max_tokens": 2},
                               timeout=30)
        m = srv.metrics()
        check(st == 200 and m["veloxquant_http_workers_refused_total"] == 1,
              "--http-workers 1: served once the first client left (%s)" % st)
    finally:
        srv.stop()


def main():
    binary, root = sys.argv[1], sys.argv[2]
    model = os.path.join(root, "data", "stories260K.bin")
    attack(binary, model)
    deadlines(binary, model)
    caps(binary, model)
    keep_alive_cap(binary, model)
    # A slower model for a stream that lasts: llama-110m's shape with 2 layers and random
    # weights (make-model), the llama vocabulary from data/.
    tmp = tempfile.mkdtemp(prefix="vq_serve_abuse_")
    try:
        subprocess.run([binary, "make-model", "--shape", "llama-110m", "--layers", "2", "--out",
                        tmp], check=True, capture_output=True, timeout=60)
        stalled_reader(binary, root, tmp)
        workers_cap(binary, root, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    # --http-threads no longer means anything: refused, naming its replacement.
    p = subprocess.run([binary, "serve", "--model", model, "--port", "0", "--http-threads", "8"],
                       capture_output=True, text=True, timeout=60)
    check(p.returncode != 0 and "--http-workers" in p.stderr,
          "--http-threads is refused naming --http-workers (rc %s: %s)" %
          (p.returncode, p.stderr.strip()[-160:]))
    return summary()


if __name__ == "__main__":
    sys.exit(main())
