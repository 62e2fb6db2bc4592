#!/usr/bin/env python3
"""Load test and benchmark of `veloxquant serve` (traffic to 127.0.0.1 only; every loop bounded).

For each method and each client count K, starts a server (same --kv-memory for every method) and
runs K concurrent streaming clients, each holding a conversation of --turns turns (each turn
appends the reply and a new user message, so later turns continue the session's cache) of
--tokens tokens a turn. Records aggregate generated tokens/s (all clients' tokens over the wall
time of the run), time to first token and inter-token latency (p50, p99 over all clients), the
most sessions live at once and the K/V bytes (resident, full-cache equivalent, reserved) polled
from /metrics, the server's peak RSS (VmHWM), the per-session reservation the server printed, and how many turns
after the first resumed a cached session (usage.prompt_tokens_details.cached_tokens > 0), from
memory or, with --session-dir, from disk.

Usage: serve_load.py --binary build/veloxquant --model M [--tokenizer T] --label NAME
         [--method full --method h2o:budget=512] [--clients 1,2,4,8,16] [--tokens 32]
         [--turns 2] [--kv-memory 2G] [--max-context 4096] [--threads 0] [--out results/serve]
         [--max-sessions N] [--session-dir DIR]
Writes OUT/NAME.json and OUT/NAME.svg.
"""
import argparse
import http.client
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import threading
import time

WORDS = ("the little dog ran to the park and saw a big red ball so he played with his friend "
         "all day until the sun went down and then they went home to eat").split()


def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


class Server:
    def __init__(self, a, method):
        cmd = [a.binary, "serve", "--model", a.model, "--host", "127.0.0.1", "--port", "0",
               "--method", method, "--kv-memory", a.kv_memory, "--max-context",
               str(a.max_context), "--max-sessions", str(a.max_sessions or 64), "--threads", str(a.threads),
               "--queue-timeout", "600"]
        if a.session_dir:
            # A fresh directory per server: one run's files never serve another's.
            Server.runs = getattr(Server, "runs", 0) + 1
            d = os.path.join(a.session_dir, "run%d" % Server.runs)
            cmd += ["--session-dir", d]
        if a.tokenizer:
            cmd += ["--tokenizer", a.tokenizer]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        m = re.search(r":(\d+)$", line.strip())
        if not m:
            raise SystemExit("server failed: " + line + self.proc.stderr.read())
        self.port = int(m.group(1))
        self.banner = ""
        deadline = time.time() + 5
        while "reserves" not in self.banner and time.time() < deadline:
            self.banner += self.proc.stderr.readline()
        m = re.search(r"reserves (\d+) bytes; --kv-memory (\d+) holds (\d+)", self.banner)
        self.reserve, self.capacity = int(m.group(1)), int(m.group(3))

    def metrics(self):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        c.request("GET", "/metrics")
        out = {}
        for line in c.getresponse().read().decode().splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        c.close()
        return out

    def peak_rss(self):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        return 0

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class LlamaServer:
    """llama.cpp's llama-server on the same GGUF at the same K/V memory: its slots (--parallel)
    are the conversations --kv-memory holds at --max-context positions each with its cache type
    (f16: 2 x layers x kv_dim x 2 bytes a position; q8_0 / q4_0: ggml's 34 / 18 bytes per 32
    values, flash attention on), its context --parallel x --max-context; a request past the
    slots waits in its queue."""

    def __init__(self, a, cache_type):
        meta = gguf_shape(a.gguf)
        per_value = {"f16": 2.0, "q8_0": 34 / 32.0, "q4_0": 18 / 32.0}[cache_type]
        per_pos = 2 * meta["n_layers"] * meta["kv_dim"] * per_value
        self.capacity = max(1, int(parse_bytes(a.kv_memory) // (per_pos * a.max_context)))
        self.reserve = int(per_pos * a.max_context)
        port = free_port()
        cmd = [a.peer_llama_server, "-m", a.gguf, "--host", "127.0.0.1", "--port", str(port),
               "-c", str(self.capacity * a.max_context), "--parallel", str(self.capacity),
               "-t", str(a.threads or os.cpu_count()), "-ctk", cache_type, "-ctv", cache_type,
               "-fa", "on" if cache_type != "f16" else "auto", "--no-webui"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.port = port
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit("llama-server failed: " + self.proc.stderr.read()[-2000:])
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                c.request("GET", "/health")
                ok = c.getresponse().status == 200
                c.close()
                if ok:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        else:
            self.stop()
            raise SystemExit("llama-server did not become healthy within 120 s")

    def peak_rss(self):
        return Server.peak_rss(self)

    def stop(self):
        Server.stop(self)


def free_port():
    import socket
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        return sk.getsockname()[1]


def parse_bytes(text):
    m = re.fullmatch(r"(\d+)([KMG]?)", text.strip().upper())
    if not m:
        raise SystemExit("--kv-memory: expected N, NK, NM or NG, got " + text)
    return int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2)]


def gguf_shape(path):
    """n_layers and kv_dim (n_kv_heads x head_dim) from a GGUF file's metadata (version 2/3)."""
    import struct
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise SystemExit("--gguf %s: not a GGUF file" % path)
        _version, _n_tensors, n_kv = struct.unpack("<IQQ", f.read(20))
        sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

        def read_str():
            (n,) = struct.unpack("<Q", f.read(8))
            return f.read(n).decode("utf-8", "replace")

        def read_val(t):
            if t == 8:
                return read_str()
            if t == 9:
                et, n = struct.unpack("<IQ", f.read(12))
                return [read_val(et) for _ in range(n)] if et == 8 else f.read(sizes[et] * n)
            fmt = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                   10: "<Q", 11: "<q", 12: "<d"}[t]
            return struct.unpack(fmt, f.read(sizes[t]))[0]

        kv = {}
        for _ in range(n_kv):
            key = read_str()
            (t,) = struct.unpack("<I", f.read(4))
            kv[key] = read_val(t)
    arch = kv["general.architecture"]
    heads = kv["%s.attention.head_count" % arch]
    kv_heads = kv.get("%s.attention.head_count_kv" % arch, heads)
    dim = kv["%s.embedding_length" % arch]
    head_dim = kv.get("%s.attention.key_length" % arch, dim // heads)
    return {"n_layers": kv["%s.block_count" % arch], "kv_dim": kv_heads * head_dim}


def client(port, idx, a, out):
    msgs, ttft, itl, tokens, errors = [], [], [], 0, 0
    later, resumed = 0, 0  # turns after the first, and those that resumed a cache
    for turn in range(a.turns):
        words = [WORDS[(idx * 7 + turn * 3 + i) % len(WORDS)] for i in range(a.prompt_words)]
        msgs.append({"role": "user", "content": " ".join(words)})
        body = json.dumps({"messages": msgs, "max_tokens": a.tokens, "temperature": 0.8,
                           "seed": idx + 1, "stream": True,
                           "stream_options": {"include_usage": True}})
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        t0 = time.perf_counter()
        c.request("POST", "/v1/chat/completions", body=body,
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            errors += 1
            r.read()
            c.close()
            break
        reply, last, buf, done = "", None, b"", False
        while not done:
            chunk = r.read1(65536)
            if not chunk:
                break
            buf += chunk
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                data = ev[6:]
                if data == b"[DONE]":
                    done = True
                    break
                j = json.loads(data)
                choices = j.get("choices") or [{}]
                piece = choices[0].get("delta", {}).get("content", "") or ""
                if piece:
                    now = time.perf_counter()
                    if last is None:
                        ttft.append(now - t0)
                    else:
                        itl.append(now - last)
                    last = now
                    reply += piece
                u = j.get("usage")
                if u:
                    tokens += u["completion_tokens"]
                    if turn > 0:
                        later += 1
                        resumed += u.get("prompt_tokens_details", {}).get("cached_tokens", 0) > 0
        c.close()
        if not done:
            errors += 1
            break
        msgs.append({"role": "assistant", "content": reply})
    out[idx] = (ttft, itl, tokens, errors, later, resumed)


def run_level(a, method, k):
    peer = method.startswith("llama-server:")
    srv = LlamaServer(a, method.split(":", 1)[1]) if peer else Server(a, method)
    try:
        results, peak = {}, {"sessions": 0, "kv": 0, "full": 0, "reserved": 0}
        stop = threading.Event()

        def poll():
            while not stop.is_set() and not peer:
                m = srv.metrics()
                live = m['veloxquant_sessions{state="active"}'] + m['veloxquant_sessions{state="idle"}']
                peak["sessions"] = max(peak["sessions"], int(live))
                peak["kv"] = max(peak["kv"], int(m["veloxquant_kv_resident_bytes"]))
                peak["full"] = max(peak["full"], int(m["veloxquant_kv_full_bytes"]))
                peak["reserved"] = max(peak["reserved"], int(m["veloxquant_kv_reserved_bytes"]))
                stop.wait(0.2)

        poller = threading.Thread(target=poll)
        poller.start()
        threads = [threading.Thread(target=client, args=(srv.port, i, a, results)) for i in range(k)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join(1800)
        wall = time.perf_counter() - t0
        stop.set()
        poller.join()
        m = {} if peer else srv.metrics()
        if peer:  # its slots hold their conversations for the whole run
            peak["sessions"] = min(k, srv.capacity)
            peak["reserved"] = peak["sessions"] * srv.reserve
        ttft = [x for r in results.values() for x in r[0]]
        itl = [x for r in results.values() for x in r[1]]
        tokens = sum(r[2] for r in results.values())
        errors = sum(r[3] for r in results.values()) + (k - len(results))
        later = sum(r[4] for r in results.values())
        resumed = sum(r[5] for r in results.values())
        row = {"method": method, "clients": k, "tokens": tokens, "wall_s": round(wall, 3),
               "tokens_per_s": round(tokens / wall, 2),
               "ttft_p50_ms": round(1000 * pct(ttft, 50), 1), "ttft_p99_ms": round(1000 * pct(ttft, 99), 1),
               "itl_p50_ms": round(1000 * pct(itl, 50), 2) if itl else None,
               "itl_p99_ms": round(1000 * pct(itl, 99), 2) if itl else None,
               "sessions_peak": peak["sessions"],
               "kv_resident_peak_bytes": int(m.get("veloxquant_kv_peak_resident_bytes", peak["reserved"])),
               "kv_full_peak_bytes": peak["full"], "kv_reserved_peak_bytes": peak["reserved"],
               "session_reservation_bytes": srv.reserve, "sessions_capacity": srv.capacity,
               "footprint_exceeded": int(m.get("veloxquant_kv_footprint_exceeded_total", 0)),
               "rss_peak_bytes": srv.peak_rss(), "errors": errors,
               "later_turns": later, "later_turns_resumed": resumed,
               "sessions_evicted": int(m.get("veloxquant_sessions_evicted_total", 0)),
               "sessions_restored": int(m.get("veloxquant_sessions_restored_total", 0)),
               "session_dir": bool(a.session_dir)}
        print(json.dumps(row), flush=True)
        return row
    finally:
        srv.stop()


def svg(rows, path, title):
    methods = sorted({r["method"] for r in rows})
    ks = sorted({r["clients"] for r in rows})
    w, h, l, b = 560, 320, 60, 40
    ymax = max(r["tokens_per_s"] for r in rows) * 1.15
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    x = lambda k: l + (ks.index(k) + 0.5) * (w - l - 20) / len(ks)
    y = lambda v: h - b - v / ymax * (h - b - 30)
    s = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">' % (w, h),
         '<text x="%d" y="16" font-size="13">%s</text>' % (l, title),
         '<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#000"/>' % (l, h - b, w - 20, h - b),
         '<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#000"/>' % (l, h - b, l, 24)]
    for i in range(5):
        v = ymax * i / 4
        s.append('<text x="%d" y="%.1f" text-anchor="end">%.0f</text>' % (l - 4, y(v) + 4, v))
    for k in ks:
        s.append('<text x="%.1f" y="%d" text-anchor="middle">%d</text>' % (x(k), h - b + 14, k))
    s.append('<text x="%d" y="%d" text-anchor="middle">concurrent streaming clients</text>' % ((l + w) // 2, h - 8))
    s.append('<text x="14" y="%d" transform="rotate(-90 14 %d)" text-anchor="middle">aggregate tokens/s</text>' % (h // 2, h // 2))
    for mi, m in enumerate(methods):
        pts = sorted((r["clients"], r["tokens_per_s"]) for r in rows if r["method"] == m)
        s.append('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>' % (
            colors[mi % 4], " ".join("%.1f,%.1f" % (x(k), y(v)) for k, v in pts)))
        for k, v in pts:
            s.append('<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>' % (x(k), y(v), colors[mi % 4]))
        s.append('<text x="%d" y="%d" fill="%s">%s</text>' % (l + 10, 36 + 14 * mi, colors[mi % 4], m))
    s.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(s) + "\n")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--binary", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--tokenizer", default="")
    p.add_argument("--label", required=True)
    p.add_argument("--method", action="append")
    p.add_argument("--clients", default="1,2,4,8,16")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--turns", type=int, default=2)
    p.add_argument("--prompt-words", type=int, default=40)
    p.add_argument("--kv-memory", default="2G")
    p.add_argument("--max-context", type=int, default=4096)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out", default="results/serve")
    p.add_argument("--peer-llama-server", default="", help="llama.cpp's llama-server binary: "
                   "each --peer-cache type runs it on --gguf at --kv-memory beside the methods")
    p.add_argument("--gguf", default="", help="the GGUF file llama-server serves (--model should "
                   "be the same file)")
    p.add_argument("--peer-cache", action="append", help="llama-server cache types (f16, q8_0, "
                   "q4_0; default f16)")
    p.add_argument("--max-sessions", type=int, default=0, help="the server's --max-sessions "
                   "(default 64)")
    p.add_argument("--session-dir", default="", help="give every server --session-dir "
                   "DIR/runN (sessions dropped for room are restored from disk)")
    a = p.parse_args()
    methods = a.method or ["full", "h2o:budget=512"]
    if a.peer_llama_server:
        if not a.gguf:
            raise SystemExit("--peer-llama-server needs --gguf (the file both servers run)")
        methods += ["llama-server:" + t for t in (a.peer_cache or ["f16"])]
    ks = [int(k) for k in a.clients.split(",")]
    if max(ks) > 64 or a.turns > 50 or a.tokens > 4096:
        raise SystemExit("bounded: at most 64 clients, 50 turns, 4096 tokens a turn")
    load_at_start = os.getloadavg()[0]
    rows = []
    # Alternate methods at each client count, so both see the same machine load.
    for k in ks:
        for m in methods:
            rows.append(run_level(a, m, k))
    flags = open("/proc/cpuinfo").read()
    feats = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni") if re.search(r"\b%s\b" % f, flags)]
    doc = {"command": " ".join(sys.argv), "model": a.model, "kv_memory": a.kv_memory,
           "max_context": a.max_context, "tokens_per_turn": a.tokens, "turns": a.turns,
           "cpu_features": feats, "cpus": os.cpu_count(), "machine": platform.machine(),
           "load_average_at_start": load_at_start, "load_average_at_end": os.getloadavg()[0],
           "note": "compare ratios within this file; the load averages say how busy the machine "
                   "was (the servers under test count in the one at the end)",
           "rows": rows}
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, a.label + ".json"), "w") as f:
        json.dump(doc, f, indent=1)
    svg(rows, os.path.join(a.out, a.label + ".svg"), "veloxquant serve, %s: aggregate decode throughput" % a.label)


if __name__ == "__main__":
    main()
