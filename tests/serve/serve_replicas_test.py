#!/usr/bin/env python3
"""Three `veloxquant serve` replicas behind HAProxy (issue 32, item 6), all on 127.0.0.1, with
deploy/haproxy.cfg as shipped and one shared --session-dir. Conversations run concurrently
through HAProxy (half of them streamed); once a third of the turns are done, the replica
holding the most sessions is killed (SIGKILL). Every conversation must finish, none needing
more than one retry, and every reply and cached-token count must equal a reference server's,
which holds every session in memory: a conversation that moved kept its compressed cache (it
was restored from the shared directory), it was not recomputed.

Skipped (77) when haproxy is not installed (scripts/setup.sh installs it).

Usage: serve_replicas_test.py VELOXQUANT_BINARY PROJECT_ROOT"""
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Server, check, summary  # noqa: E402

CHAT = "/v1/chat/completions"
N_CONV = 9
TURNS = 4
MAX_TOKENS = 24


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def body_of(messages, stream):
    return {"messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": stream,
            "stream_options": {"include_usage": True} if stream else None}


def call(port, messages, stream, timeout=60):
    """One request; returns (reply, cached_tokens, server) or raises on any failure (connection
    error, a status other than 200, a stream that does not end with [DONE])."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", CHAT, body=json.dumps(body_of(messages, stream)),
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read().decode("utf-8", "replace")
        if r.status != 200:
            raise RuntimeError("status %d: %s" % (r.status, data[:200]))
        if not stream:
            j = json.loads(data)
            return (j["choices"][0]["message"]["content"],
                    j["usage"]["prompt_tokens_details"]["cached_tokens"],
                    j.get("veloxquant", {}).get("session", ""))
        text, cached, done = "", None, False
        for ev in data.split("\n\n"):
            if not ev.startswith("data: "):
                continue
            payload = ev[6:]
            if payload == "[DONE]":
                done = True
                continue
            j = json.loads(payload)
            if "error" in j:
                raise RuntimeError("stream error: %s" % j["error"])
            for c in j.get("choices", []):
                text += c.get("delta", {}).get("content", "") or ""
            if j.get("usage"):
                cached = j["usage"]["prompt_tokens_details"]["cached_tokens"]
        if not done or cached is None:
            raise RuntimeError("the stream ended without [DONE] and usage")
        return text, cached, ""
    finally:
        conn.close()


def first_message(i):
    return [{"role": "system", "content": "You tell short stories."},
            {"role": "user", "content": "Once upon a time a girl named Lily had %d red balloons." % (i + 2)}]


def follow_up(k):
    return ["Then what happened?", "Who came to help?", "And at the end?"][k % 3]


def main():
    binary, root = sys.argv[1], sys.argv[2]
    haproxy = shutil.which("haproxy")
    if haproxy is None:
        print("skipped: haproxy is not installed (scripts/setup.sh installs it)")
        sys.exit(77)
    model = os.path.join(root, "data", "stories260K.bin")
    common = ["--threads", "1", "--max-context", "512", "--method", "h2o:budget=48",
              "--kv-memory", "64M", "--shutdown-grace", "0.2"]
    tmp = tempfile.mkdtemp(prefix="vq-replicas-")
    shared = os.path.join(tmp, "sessions")

    # The reference: one server, every session in memory.
    want = []
    ref = Server(binary, model, *common)
    try:
        for i in range(N_CONV):
            conv, turns = first_message(i), []
            for k in range(TURNS):
                reply, cached, _ = call(ref.port, conv, False)
                turns.append((reply, cached))
                conv = conv + [{"role": "assistant", "content": reply},
                               {"role": "user", "content": follow_up(k)}]
            want.append(turns)
    finally:
        ref.stop()

    replicas = [Server(binary, model, *common, "--session-dir", shared) for _ in range(3)]
    front = free_port()
    env = dict(os.environ, VQ_LISTEN="127.0.0.1:%d" % front,
               **{"VQ_R%d" % (j + 1): "127.0.0.1:%d" % r.port for j, r in enumerate(replicas)})
    cfg = os.path.join(root, "deploy", "haproxy.cfg")
    hp = subprocess.Popen([haproxy, "-db", "-f", cfg], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", front), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        time.sleep(1.5)  # the first health checks pass (rise 3 x 500 ms)

        lock = threading.Lock()
        done_turns = [0]
        results = {}

        def conversation(i):
            conv, got, retries, error = first_message(i), [], 0, None
            for k in range(TURNS):
                for attempt in range(3):
                    try:
                        reply, cached, _ = call(front, conv, stream=i % 2 == 1)
                        break
                    except Exception as e:  # noqa: BLE001 - any failure is retried, counted
                        retries += 1
                        error = str(e)
                        time.sleep(0.2)
                else:
                    results[i] = (got, retries, "gave up: " + str(error))
                    return
                got.append((reply, cached))
                with lock:
                    done_turns[0] += 1
                conv = conv + [{"role": "assistant", "content": reply},
                               {"role": "user", "content": follow_up(k)}]
            results[i] = (got, retries, error)

        threads = [threading.Thread(target=conversation, args=(i,)) for i in range(N_CONV)]
        for t in threads:
            t.start()
        # Mid-load: kill the replica holding the most sessions.
        while time.time() < deadline + 120:
            with lock:
                if done_turns[0] >= N_CONV * TURNS // 3:
                    break
            time.sleep(0.01)
        held = []
        for r in replicas:
            m = r.metrics()
            held.append(m.get('veloxquant_sessions{state="active"}', 0)
                        + m.get('veloxquant_sessions{state="idle"}', 0))
        victim = max(range(3), key=lambda j: held[j])
        with lock:
            at = done_turns[0]
        replicas[victim].proc.send_signal(signal.SIGKILL)
        replicas[victim].proc.wait(timeout=10)
        print("killed replica r%d (%d sessions held; replicas held %s) after %d of %d turns"
              % (victim + 1, held[victim], held, at, N_CONV * TURNS), flush=True)
        for t in threads:
            t.join(timeout=300)
        check(held[victim] > 0, "the killed replica held sessions (%d)" % held[victim])
        finished = [i for i in range(N_CONV) if i in results and len(results[i][0]) == TURNS]
        check(len(finished) == N_CONV, "every conversation finished its %d turns (%d of %d)"
              % (TURNS, len(finished), N_CONV))
        worst = max((results[i][1] for i in results), default=99)
        check(worst <= 1, "no conversation needed more than one retry (most: %d; %s)"
              % (worst, [results[i][2] for i in results if results[i][1] > 0]))
        same = sum(1 for i in finished if [t[0] for t in results[i][0]] == [t[0] for t in want[i]])
        cached_same = sum(1 for i in finished
                          if [t[1] for t in results[i][0]] == [t[1] for t in want[i]])
        check(same == N_CONV and cached_same == N_CONV,
              "every reply equals the reference's (%d/%d) and every turn resumed the same cache "
              "(%d/%d cached-token counts equal)" % (same, N_CONV, cached_same, N_CONV))
        restored = sum(r.metrics().get("veloxquant_sessions_restored_total", 0)
                       for j, r in enumerate(replicas) if j != victim)
        check(restored >= 1, "the surviving replicas restored %d sessions from the shared "
              "directory" % restored)
    finally:
        hp.terminate()
        try:
            hp.wait(timeout=10)
        except subprocess.TimeoutExpired:
            hp.kill()
        for r in replicas:
            r.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(summary())


if __name__ == "__main__":
    main()
