#!/usr/bin/env python3
"""`veloxquant serve` over HTTP on 127.0.0.1 (bounded in count and time): endpoints, OpenAI
errors with their statuses, streaming, batched streams equal to one alone, a client that
disconnects mid-stream, non-streamed or while queued, a flood of idle and garbage connections, and SIGTERM mid-generation.

Usage: serve_http_test.py VELOXQUANT_BINARY PROJECT_ROOT"""
import json
import os
import struct
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Server, stream_text, check, summary  # noqa: E402



def error_of(body):
    try:
        return json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return {}


def hostile_requests(srv, chat, msgs, key):
    """Issue 33: the request parser's depth limit, the body limit whatever the content type,
    multipart, the float minimum, and the per-client method-spec budget."""
    deep = "[" * 52000 + "]" * 52000
    for field in ("max_tokens", "max_completion_tokens", "n", "seed"):
        body = '{"messages":[{"role":"user","content":"hi"}],"%s":%s}' % (field, deep)
        st, _, resp = srv.request("POST", chat, body, key)
        check(st == 400 and "deeper than 32 levels" in error_of(resp).get("message", ""),
              "%s nested 52,000 deep: 400 naming the limit (%s)" % (field, st))
    st, _, _ = srv.request("GET", "/health")
    check(st == 200, "the server is alive after the deep bodies")
    # curl's default content type with a body past cpp-httplib's 8 KiB form limit.
    form = dict(key, **{"Content-Type": "application/x-www-form-urlencoded"})
    body = json.dumps({"messages": msgs, "max_tokens": 2, "user": "y" * 9000})
    st, _, resp = srv.request("POST", chat, body, form)
    check(st == 200, "a 9 KiB JSON body with the form-encoded content type: 200 (%s %s)" %
          (st, error_of(resp).get("message", "")[:80]))
    multipart = dict(key, **{"Content-Type": "multipart/form-data; boundary=XyZ"})
    part = ('--XyZ\r\nContent-Disposition: form-data; name="a"\r\n\r\n%s\r\n--XyZ--\r\n'
            % json.dumps({"messages": msgs}))
    st, _, resp = srv.request("POST", chat, part, multipart)
    check(st == 415 and "multipart" in error_of(resp).get("message", ""), "multipart: 415 (%s)" % st)
    st, _, _ = srv.request("GET", "/health")
    check(st == 200, "served after the multipart body")
    st, _, resp = srv.request("POST", chat, {"messages": msgs, "temperature": 1e-45}, key)
    check(st == 400 and error_of(resp).get("param") == "temperature"
          and "at least 1e-30" in error_of(resp).get("message", ""),
          "temperature 1e-45: 400 with the CLI's rule")
    # One client (127.0.0.1) asks for 33 method specs, more than the cache holds; each is
    # served (its own least recently used is dropped), then another client (127.0.0.2) is too.
    codes = []
    for b in range(16, 49):
        st, _, resp = srv.request("POST", chat, {"messages": msgs, "max_tokens": 1,
                                                 "veloxquant": {"method": "h2o:budget=%d" % b}}, key)
        codes.append(st)
    check(all(c == 200 for c in codes), "one client's 33 method specs are each served (%s)" %
          sorted(set(codes)))
    st, _, resp = srv.request("POST", chat, {"messages": msgs, "max_tokens": 1,
                                             "veloxquant": {"method": "h2o:budget=12"}}, key,
                              source="127.0.0.2")
    check(st == 200, "a second client is served after the first used 33 specs (%s %s)" %
          (st, error_of(resp).get("message", "")[:80]))


def no_exception_header(headers):
    return not any(k.lower() == "exception_what" for k in headers)


def openai_surface(srv, chat, msgs, key):
    """Issue 32: the fields real clients send, in OpenAI's response shapes."""
    full = {"messages": [{"role": "developer", "content": [{"type": "text", "text": "Be kind."}]}]
            + msgs, "max_tokens": 6, "temperature": 0.9, "seed": 0, "n": 2, "logprobs": True,
            "top_logprobs": 3, "presence_penalty": 0, "frequency_penalty": 0, "logit_bias": {},
            "response_format": {"type": "text"}, "tools": [], "tool_choice": None, "user": None,
            "stop": None, "top_p": None}
    st, _, body = srv.request("POST", chat, full, key)
    j = json.loads(body) if st == 200 else {}
    ch = j.get("choices", [])
    ok = st == 200 and [c["index"] for c in ch] == [0, 1]
    for c in ch if ok else []:
        content = c["logprobs"]["content"]
        ok = ok and "".join(e["token"] for e in content) == c["message"]["content"]
        ok = ok and all(e["logprob"] <= 0 and len(e["top_logprobs"]) == 3
                        and bytes(e["bytes"]).decode("utf-8", "replace") == e["token"]
                        and e["top_logprobs"][0]["logprob"] >= e["top_logprobs"][2]["logprob"]
                        for e in content)
    check(ok and j["usage"]["completion_tokens"] == 12,
          "n=2 with logprobs, penalties, logit_bias, seed 0, response_format text: two choices "
          "with per-token logprobs (%s %s)" % (st, error_of(body).get("message", "")))
    one = dict(full, n=1)
    st, _, body = srv.request("POST", chat, one, key)
    check(st == 200 and ok and json.loads(body)["choices"][0]["message"]["content"]
          == ch[0]["message"]["content"], "choice 0 of n=2 is the n=1 reply for the same seed")
    # Streamed: the same tokens and logprobs, chunk by chunk, and include_usage's last chunk.
    st, ev = srv.stream(chat, dict(full, stream=True, stream_options={"include_usage": True}), key)
    per = {0: [], 1: []}
    usage = None
    for e in ev:
        if e == "[DONE]":
            continue
        c = json.loads(e)
        if c.get("usage"):
            usage = c
        for x in c["choices"]:
            if x.get("logprobs"):
                per[x["index"]] += x["logprobs"]["content"]
    check(st == 200 and ok and all(
        [(e["token"], e["logprob"]) for e in per[i]] ==
        [(e["token"], e["logprob"]) for e in ch[i]["logprobs"]["content"]] for i in (0, 1))
        and usage is not None and usage["choices"] == [] and usage["usage"]["completion_tokens"] == 12
        and ev[-1] == "[DONE]",
        "streamed n=2: the same logprobs per choice; include_usage ends with a choices-less chunk")
    # Completions: logprobs is an integer; tokens, token_logprobs, top_logprobs, text_offset.
    st, _, body = srv.request("POST", "/v1/completions", {"prompt": "Once upon a time",
                                                           "max_tokens": 5, "logprobs": 2,
                                                           "temperature": 0}, key)
    c = json.loads(body)["choices"][0] if st == 200 else {}
    lp = c.get("logprobs") or {}
    check(st == 200 and "".join(lp["tokens"]) == c["text"] and len(lp["token_logprobs"]) == 5
          and all(len(t) <= 2 for t in lp["top_logprobs"])
          and lp["text_offset"] == [len("".join(lp["tokens"][:i])) for i in range(5)],
          "completions logprobs: tokens, token_logprobs, top_logprobs, text_offset")
    # top_p 0 is greedy.
    st, _, body = srv.request("POST", chat, {"messages": msgs, "max_tokens": 12, "top_p": 0,
                                             "temperature": 1, "seed": 3}, key)
    st2, _, body2 = srv.request("POST", chat, {"messages": msgs, "max_tokens": 12,
                                               "temperature": 0}, key)
    check(st == 200 and st2 == 200 and json.loads(body)["choices"][0]["message"]["content"]
          == json.loads(body2)["choices"][0]["message"]["content"], "top_p 0 is greedy")
    # Refusals in OpenAI's shape.
    for field, value, param, code in (
            ("response_format", {"type": "json_object"}, "response_format", "unsupported_value"),
            ("tools", [{"type": "function", "function": {"name": "f"}}], "tools",
             "unsupported_parameter"),
            ("tool_choice", "auto", "tool_choice", "unsupported_parameter")):
        st, _, body = srv.request("POST", chat, {"messages": msgs, field: value}, key)
        e = error_of(body)
        check(st == 400 and e.get("param") == param and e.get("code") == code
              and "not supported" in e.get("message", ""),
              "%s %s: 400 %s (%s)" % (field, json.dumps(value)[:30], code, e.get("message")))
    st, _, body = srv.request("POST", chat, {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}, key)
    check(st == 400 and error_of(body).get("param") == "messages[0].content[0].type"
          and "image_url" in error_of(body).get("message", ""), "an image part: 400 naming it")
    # Numbers past double's range: 400 naming the field, no exception text in a header.
    for raw, param in (('{"messages":[{"role":"user","content":"x"}],"temperature":1e400}',
                        "temperature"),
                       ('{"messages":[{"role":"user","content":"x"}],"logit_bias":{"3":-1e400}}',
                        "logit_bias.3")):
        st, headers, body = srv.request("POST", chat, raw, key)
        check(st == 400 and error_of(body).get("param") == param and no_exception_header(headers),
              "%s out of double range: 400 naming it (%s %s)" % (param, st, body[:80]))


def http_methods(srv, key):
    """405 with Allow for a known path's wrong method; OPTIONS; no CORS unless asked."""
    for method, path, allow in (("GET", "/v1/chat/completions", "POST, OPTIONS"),
                                ("PUT", "/v1/completions", "POST, OPTIONS"),
                                ("POST", "/health", "GET, HEAD, OPTIONS"),
                                ("DELETE", "/v1/models", "GET, HEAD, OPTIONS")):
        st, headers, body = srv.request(method, path, "{}" if method != "GET" else None, key)
        check(st == 405 and headers.get("Allow") == allow and error_of(body).get("message"),
              "%s %s: 405 with Allow: %s (%s %s)" % (method, path, allow, st, headers.get("Allow")))
    st, _, _ = srv.request("GET", "/health")
    check(st == 200, "served after the 405s")
    st, headers, _ = srv.request("OPTIONS", "/v1/chat/completions", headers={
        "Origin": "http://app.example", "Access-Control-Request-Method": "POST"})
    check(st == 204 and headers.get("Allow") == "POST, OPTIONS"
          and "Access-Control-Allow-Origin" not in headers,
          "OPTIONS without --cors-origin: 204 with Allow and no CORS headers")
    st, headers, _ = srv.request("GET", "/health", headers={"Origin": "http://app.example"})
    check(st == 200 and "Access-Control-Allow-Origin" not in headers, "no CORS by default")


def cors_and_port(binary, model):
    """--cors-origin answers preflights and listed origins; a second server on a port in use
    fails at startup."""
    srv = Server(binary, model, "--kv-memory", "16M", "--threads", "1", "--api-key", "k3y",
                 "--cors-origin", "http://app.example", "--cors-origin", "http://two.example")
    try:
        pre = {"Origin": "http://app.example", "Access-Control-Request-Method": "POST",
               "Access-Control-Request-Headers": "authorization, content-type"}
        st, h, _ = srv.request("OPTIONS", "/v1/chat/completions", headers=pre)
        check(st == 204 and h.get("Access-Control-Allow-Origin") == "http://app.example"
              and "POST" in h.get("Access-Control-Allow-Methods", "")
              and "authorization" in h.get("Access-Control-Allow-Headers", "").lower(),
              "CORS preflight (no API key needed): 204 with the allowed origin, methods, headers")
        body = {"messages": [{"role": "user", "content": "Once"}], "max_tokens": 2}
        st, h, _ = srv.request("POST", "/v1/chat/completions", body,
                               {"Authorization": "Bearer k3y", "Origin": "http://two.example"})
        check(st == 200 and h.get("Access-Control-Allow-Origin") == "http://two.example",
              "CORS: a listed origin's request carries Access-Control-Allow-Origin")
        st, h, _ = srv.request("POST", "/v1/chat/completions", body,
                               {"Authorization": "Bearer k3y", "Origin": "http://evil.example"})
        check("Access-Control-Allow-Origin" not in h, "CORS: an unlisted origin gets no CORS header")
        st, h, _ = srv.request("POST", "/v1/chat/completions", body,
                               {"Origin": "http://app.example"})
        check(st == 401 and h.get("Access-Control-Allow-Origin") == "http://app.example",
              "CORS: a 401 is readable by the listed page (%s)" % st)
        # Two servers on one port: the second must fail at startup, not share the port.
        second = subprocess.run([binary, "serve", "--model", model, "--host", "127.0.0.1",
                                 "--port", str(srv.port), "--kv-memory", "16M", "--threads", "1"],
                                capture_output=True, text=True, timeout=60)
        check(second.returncode != 0 and "already in use" in second.stderr
              and "listening on" not in second.stdout,
              "a second server on the same port fails at startup (rc %s: %s)" %
              (second.returncode, second.stderr.strip().splitlines()[-1:]))
        st, _, _ = srv.request("GET", "/health")
        check(st == 200, "the first server still answers")
    finally:
        srv.stop()


def overflowing_model(src, dst):
    """stories260K.bin with its final RMSNorm weight FLT_MAX: finite weights, non-finite logits.
    Offsets from llama2.c's layout (run.c's memory_map_weights)."""
    data = bytearray(open(src, "rb").read())
    dim, hidden, layers, heads, kv, vocab, _ = struct.unpack("<7i", data[:28])
    kv_dim = dim * kv // heads
    floats = (abs(vocab) * dim + layers * dim + 2 * layers * dim * dim + 2 * layers * dim * kv_dim
              + layers * dim + 3 * layers * dim * hidden)
    at = 28 + 4 * floats
    data[at:at + 4 * dim] = struct.pack("<%df" % dim, *([3.4028234663852886e38] * dim))
    open(dst, "wb").write(bytes(data))


def raw_request(port, body, path="/v1/chat/completions"):
    """Sends a POST with the test's API key on a socket of its own and returns the socket (the
    test closes it to play a client that goes away)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    b = json.dumps(body).encode()
    s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k3y\r\n"
              b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (path.encode(), len(b))
              + b)
    return s


def wait_metric(srv, pred, limit_s):
    """Polls /metrics until pred(metrics) holds or limit_s passes; returns (held, metrics,
    seconds waited)."""
    t0 = time.time()
    m = srv.metrics()
    while not pred(m) and time.time() - t0 < limit_s:
        time.sleep(0.05)
        m = srv.metrics()
    return pred(m), m, time.time() - t0


def nonstream_disconnect(srv):
    """A client that goes away while its non-streamed reply is generated: the request is
    cancelled within a step or so (the server polls the socket every 100 ms while it waits),
    its session freed, and no token is generated for it afterwards."""
    gen = "veloxquant_generated_tokens_total"
    m0 = srv.metrics()
    s = raw_request(srv.port, {"messages": [{"role": "user", "content": "Lily"}], "max_tokens": 900})
    started, m1, _ = wait_metric(srv, lambda m: m[gen] >= m0[gen] + 3, 20)
    check(started, "the non-streamed request generates (%d tokens)" % (m1[gen] - m0[gen]))
    time.sleep(0.3)
    before = srv.metrics()[gen]
    s.close()
    cancelled, m2, waited = wait_metric(
        srv, lambda m: m["veloxquant_requests_cancelled_total"] == m0["veloxquant_requests_cancelled_total"] + 1
        and m['veloxquant_sessions{state="active"}'] == 0, 5)
    check(cancelled, "a non-streamed request whose client left is cancelled and its session "
          "freed (%.2f s after close, %d tokens meanwhile)" % (waited, m2[gen] - before))
    time.sleep(0.5)
    m3 = srv.metrics()
    check(m3[gen] == m2[gen] and m3[gen] - m0[gen] < 900,
          "no token is generated for it after the cancel (%d then %d of 900)" %
          (m2[gen] - m0[gen], m3[gen] - m0[gen]))


def queue_ghosts(binary, tmp, tokenizer):
    """Clients that leave while queued (streamed or not) give their places back: a live client
    is then queued, not refused with 503 \"queue full\", and served once the session frees."""
    srv = Server(binary, tmp, "--tokenizer", tokenizer, "--kv-memory", "256M", "--max-context",
                 "1024", "--threads", "1", "--max-sessions", "1", "--max-queue", "2",
                 "--shutdown-grace", "0.5", "--api-key", "k3y")
    try:
        q = "veloxquant_queued_requests"
        active = 'veloxquant_sessions{state="active"}'
        blocker = raw_request(srv.port, {"messages": [{"role": "user", "content": "Tom"}],
                                         "max_tokens": 900})
        ok, _, _ = wait_metric(srv, lambda m: m[active] == 1, 20)
        check(ok, "queue test: the blocking request runs")
        ghosts = [raw_request(srv.port, {"messages": [{"role": "user", "content": "Ann %d" % i}],
                                         "max_tokens": 50, "stream": i == 1}) for i in range(2)]
        ok, m0, _ = wait_metric(srv, lambda m: m[q] == 2, 10)
        check(ok, "queue test: the queue (of 2) is full")
        st, _, body = srv.request("POST", "/v1/chat/completions",
                                  {"messages": msgs_of("Sue"), "max_tokens": 5}, KEY, timeout=30)
        check(st == 503 and "queue" in error_of(body).get("message", ""),
              "queue test: a third request is refused while the queue is full (%s)" % st)
        for g in ghosts:
            g.close()
        ok, m1, waited = wait_metric(srv, lambda m: m[q] == 0, 5)
        check(ok and m1["veloxquant_requests_cancelled_total"] ==
              m0["veloxquant_requests_cancelled_total"] + 2,
              "queued clients that left leave the queue (%.2f s) counted as cancelled" % waited)
        result = {}

        def live():
            result["r"] = srv.request("POST", "/v1/chat/completions",
                                      {"messages": msgs_of("Sue"), "max_tokens": 5}, KEY, timeout=30)

        t = threading.Thread(target=live)
        t.start()
        ok, _, _ = wait_metric(srv, lambda m: m[q] == 1 or "r" in result, 10)
        check(ok and "r" not in result, "queue test: the live client is queued, not refused (%s)" %
              (result.get("r", ("queued",))[0],))
        blocker.close()  # its session frees: the live client gets in
        t.join(30)
        st = result.get("r", (None,))[0]
        check(st == 200 and json.loads(result["r"][2])["usage"]["completion_tokens"] == 5,
              "queue test: the live client is served after the ghosts left (%s)" % st)
        m = srv.metrics()
        check(m["veloxquant_requests_rejected_total"] == m0["veloxquant_requests_rejected_total"] + 1,
              "queue test: only the request made while the queue was really full was refused")
    finally:
        srv.stop()


def footprint_off_path(binary, model_dir, tokenizer):
    """Issue 32: a new method spec's footprint is measured off the request path. While a slow
    one is measured (h2o with a 6000-row budget at --max-context 6144: several seconds), a
    request with the default method completes (in a bounded time, and before the measurement
    ends); two requests naming the slow spec share one measurement; with --max-method-specs 2
    a third spec, new, gets 429 (the only free slot is being measured)."""
    srv = Server(binary, model_dir, "--tokenizer", tokenizer, "--kv-memory", "256M",
                 "--max-context", "6144", "--threads", "1", "--max-method-specs", "2",
                 "--client-methods", "2", "--shutdown-grace", "0.5",
                 # the slow measurement takes seconds here but minutes under ASan on a busy CI
                 # machine: the two requests waiting for it must not reach --queue-timeout
                 "--queue-timeout", "600")
    try:
        meas, specs = "veloxquant_footprint_measurements_total", "veloxquant_method_specs"
        m0 = srv.metrics()
        check(m0[meas] == 1 and m0[specs] == 1, "footprint: --method measured at startup (%s, %s)"
              % (m0[meas], m0[specs]))
        slow = {"messages": msgs_of("Tom"), "max_tokens": 2,
                "veloxquant": {"method": "h2o:budget=6000"}}
        results = []

        def ask():
            results.append(srv.request("POST", "/v1/chat/completions", slow, timeout=600))

        threads = [threading.Thread(target=ask) for _ in range(2)]
        threads[0].start()
        ok, _, _ = wait_metric(srv, lambda m: m[specs] == 2, 10)
        check(ok, "footprint: the new spec is being measured")
        threads[1].start()
        t0 = time.time()
        st, _, body = srv.request("POST", "/v1/chat/completions",
                                  {"messages": msgs_of("Sue"), "max_tokens": 2}, timeout=60)
        took = time.time() - t0
        st2, h2, body2 = srv.request("POST", "/v1/chat/completions",
                                     {"messages": msgs_of("Ann"), "max_tokens": 2,
                                      "veloxquant": {"method": "h2o:budget=64"}}, timeout=60)
        m1 = srv.metrics()
        still = m1[meas] == 1 and not results
        check(st == 200 and took < 3.0 and still,
              "footprint: a default-method request is served in %.2f s (< 3 s) while the new "
              "spec is still measured (%s; status %s)" % (took, still, st))
        err = error_of(body2)
        check(st2 == 429 and err.get("code") == "method_specs_full" and h2.get("Retry-After") == "1"
              and "--max-method-specs 2" in err.get("message", "") and still,
              "footprint: a further new spec past --max-method-specs gets 429 (%s: %s)" %
              (st2, err.get("message")))
        for t in threads:
            t.join(600)
        m2 = srv.metrics()
        check(len(results) == 2 and all(r[0] == 200 for r in results) and m2[meas] == 2,
              "footprint: both requests naming the slow spec are served after one measurement "
              "(%s, %d measurements)" % ([r[0] for r in results], m2[meas] - 1))
    finally:
        srv.stop()


def methods_allowed(binary, model):
    """--methods-allowed: every spec measured at startup, others refused with 400 naming
    veloxquant.method; a bad spec fails startup naming the flag and the spec."""
    srv = Server(binary, model, "--kv-memory", "16M", "--threads", "1", "--max-context", "256",
                 "--methods-allowed", "h2o:budget=64; snapkv:budget=48,obs_window=8")
    try:
        m = srv.metrics()
        check(m["veloxquant_footprint_measurements_total"] == 3
              and m["veloxquant_method_specs"] == 3,
              "--methods-allowed: --method and both specs measured at startup")
        st, _, _ = srv.request("POST", "/v1/chat/completions",
                               {"messages": msgs_of("Tom"), "max_tokens": 2,
                                "veloxquant": {"method": "h2o:budget=64"}})
        check(st == 200, "--methods-allowed: an allowed spec is served (%s)" % st)
        st, _, body = srv.request("POST", "/v1/chat/completions",
                                  {"messages": msgs_of("Tom"), "max_tokens": 2,
                                   "veloxquant": {"method": "h2o:budget=65"}})
        err = error_of(body)
        check(st == 400 and err.get("param") == "veloxquant.method"
              and err.get("type") == "invalid_request_error"
              and "--methods-allowed" in err.get("message", ""),
              "--methods-allowed: another spec gets 400 naming veloxquant.method (%s: %s)" %
              (st, err.get("message")))
        check(srv.metrics()["veloxquant_footprint_measurements_total"] == 3,
              "--methods-allowed: a refused spec is not measured")
    finally:
        srv.stop()
    p = subprocess.run([binary, "serve", "--model", model, "--port", "0", "--kv-memory", "16M",
                        "--methods-allowed", "h2o:budget=64;h2o:nope=1"],
                       capture_output=True, text=True, timeout=60)
    check(p.returncode != 0 and "--methods-allowed" in p.stderr and "h2o:nope=1" in p.stderr,
          "--methods-allowed: a bad spec fails startup naming the flag and the spec (rc %s: %s)" %
          (p.returncode, p.stderr.strip()[-200:]))


KEY = {"Authorization": "Bearer k3y"}


def msgs_of(text):
    return [{"role": "user", "content": text}]


def main():
    binary, root = sys.argv[1], sys.argv[2]
    model = os.path.join(root, "data", "stories260K.bin")
    key = {"Authorization": "Bearer k3y"}
    srv = Server(binary, model, "--kv-memory", "16M", "--max-body", "262144", "--api-key", "k3y",
                 "--threads", "1", "--shutdown-grace", "0.2")
    try:
        chat = "/v1/chat/completions"
        msgs = [{"role": "user", "content": "Once upon a time"}]
        st, _, body = srv.request("GET", "/health")
        check(st == 200 and json.loads(body)["status"] == "ok", "GET /health is ok")
        st, _, body = srv.request("GET", "/v1/models", headers=key)
        check(st == 200 and json.loads(body)["data"][0]["id"] == "stories260K.bin", "GET /v1/models")
        st, _, body = srv.request("POST", chat, {"messages": msgs})
        check(st == 401 and "API key" in error_of(body).get("message", ""), "no API key: 401")
        st, _, body = srv.request("POST", chat, "{\"messages\": [", key)
        check(st == 400 and "not valid JSON" in error_of(body).get("message", ""),
              "malformed JSON: 400 (%s)" % error_of(body).get("message", body)[:60])
        st, _, body = srv.request("POST", chat, json.dumps({"messages": msgs, "pad": "x" * 300000}), key)
        check(st == 413 and "--max-body" in error_of(body).get("message", ""),
              "oversized body: 413 naming --max-body")
        hostile_requests(srv, chat, msgs, key)
        openai_surface(srv, chat, msgs, key)
        http_methods(srv, key)
        st, _, body = srv.request("POST", chat, {"messages": msgs, "frobnicate": 1}, key)
        check(st == 400 and error_of(body).get("param") == "frobnicate", "unknown field: 400")
        for field, value in (("temperature", 5), ("max_tokens", "ten"), ("top_p", -0.1),
                             ("seed", 1.5), ("stop", [1]), ("n", 9), ("presence_penalty", 3),
                             ("logit_bias", {"x": 1})):
            st, _, body = srv.request("POST", chat, {"messages": msgs, field: value}, key)
            check(st == 400 and error_of(body).get("param") == field,
                  "invalid %s: 400 naming it" % field)
        st, _, body = srv.request("POST", chat, {"messages": msgs, "veloxquant": {"method": "h2o:budget=-3"}}, key)
        check(st == 400 and error_of(body).get("param") == "veloxquant.method", "invalid method: 400")
        st, _, body = srv.request("GET", "/nope", headers=key)
        check(st == 404 and error_of(body).get("message"), "unknown path: 404 with a message")

        st, _, body = srv.request("POST", chat, {"messages": msgs, "max_tokens": 20, "temperature": 0}, key)
        j = json.loads(body) if st == 200 else {}
        greedy = j.get("choices", [{}])[0].get("message", {}).get("content", "")
        check(st == 200 and len(greedy) > 20 and j["usage"]["completion_tokens"] == 20,
              "chat completion: 20 tokens")

        # The K/V byte counts of the veloxquant extension: the full cache's payload is, by
        # definition, the full fp16 cache of its tokens; h2o at budget 16 holds 16 rows of the
        # same fp16 width, so its payload is full x 16 / (rows the full cache would hold), which
        # is between prompt_tokens and prompt + completion tokens.
        long_msgs = msgs_of("Once upon a time there was a little dog who liked to run in the park "
                            "with his friends every morning before the sun was up.")
        for spec in ("full", "h2o:budget=16"):
            st, _, body = srv.request("POST", chat, {"messages": long_msgs, "max_tokens": 8, "temperature": 0,
                                                     "veloxquant": {"method": spec}}, key)
            jv = json.loads(body) if st == 200 else {}
            kv, u = jv.get("veloxquant", {}), jv.get("usage", {})
            pay, full, res = kv.get("kv_payload_bytes", -1), kv.get("kv_full_bytes", -1), kv.get("kv_bytes", -1)
            if spec == "full":
                check(st == 200 and pay == full > 0 and res >= pay,
                      "full: payload bytes %s = full-cache bytes %s <= resident %s" % (pay, full, res))
            else:
                rows = full * 16 / pay if pay > 0 else -1
                check(st == 200 and u["prompt_tokens"] > 16 and 0 < pay < full and res >= pay and
                      u["prompt_tokens"] <= rows <= u["prompt_tokens"] + u["completion_tokens"],
                      "h2o:budget=16: payload %s is 16 of %.1f rows of the full cache's %s" % (pay, rows, full))

        # The next turn of that conversation continues the session's cache.
        turn2 = msgs + [{"role": "assistant", "content": greedy}, {"role": "user", "content": "Then"}]
        st, _, body = srv.request("POST", chat, {"messages": turn2, "max_tokens": 5, "temperature": 0}, key)
        j2 = json.loads(body) if st == 200 else {}
        check(st == 200 and j2["veloxquant"]["session"] == j["veloxquant"]["session"]
              and j2["usage"]["prompt_tokens_details"]["cached_tokens"] == j["usage"]["prompt_tokens"] + 19,
              "the second turn continues the session (%s cached)" %
              j2.get("usage", {}).get("prompt_tokens_details"))

        # One streamed alone, then eight at once (one of them the same request): same text.
        req = {"messages": msgs, "max_tokens": 40, "temperature": 0.9, "seed": 5, "stream": True}
        st, ev = srv.stream(chat, req, key)
        alone, finish, done = stream_text(ev)
        check(st == 200 and done and finish == "length" and alone, "stream ends with [DONE]")
        results = {}

        def run(i):
            r = dict(req, seed=5 if i == 0 else 100 + i,
                     veloxquant={"method": "full" if i % 2 == 0 else "h2o:budget=16"})
            results[i] = srv.stream(chat, r, key)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        ok = all(i in results and results[i][0] == 200 and stream_text(results[i][1])[2] for i in range(8))
        check(ok, "eight concurrent streams all end with [DONE]")
        check(ok and stream_text(results[0][1])[0] == alone,
              "a stream's text in a batch of eight equals its text alone")

        # A flood: 100 idle connections and 20 sending garbage; the server keeps answering.
        socks = []
        for i in range(120):
            try:
                c = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
                if i >= 100:
                    c.sendall(b"GARBAGE \x00\xff\r\n\r\n")
                socks.append(c)
            except OSError:
                break
        t0 = time.time()
        st, _, body = srv.request("POST", chat, {"messages": msgs, "max_tokens": 20, "temperature": 0},
                                  key, timeout=30)
        check(st == 200 and json.loads(body)["choices"][0]["message"]["content"] == greedy,
              "served during a flood of %d connections (%.1f s), same text" % (len(socks), time.time() - t0))
        for c in socks:
            c.close()

        m = srv.metrics()
        check(m["veloxquant_kv_footprint_exceeded_total"] == 0, "no session above its footprint")
        check(m["veloxquant_kv_peak_resident_bytes"] <= m["veloxquant_kv_memory_bytes"],
              "peak K/V bytes within --kv-memory")

    finally:
        srv.stop()

    cors_and_port(binary, model)
    methods_allowed(binary, model)

    # A slower model for what must happen mid-generation: llama-110m's shape with 2 layers and
    # random weights (make-model), the llama vocabulary from data/.
    tmp = tempfile.mkdtemp(prefix="vq_serve_test_")
    try:
        subprocess.run([binary, "make-model", "--shape", "llama-110m", "--layers", "2", "--out",
                        tmp], check=True, capture_output=True, timeout=60)
        srv = Server(binary, tmp, "--tokenizer", os.path.join(root, "data", "ggml-vocab-llama-spm.gguf"),
                     "--kv-memory", "256M", "--max-context", "1024", "--threads", "1",
                     "--shutdown-grace", "0.5", "--api-key", "k3y")
        try:
            chat = "/v1/chat/completions"
            # A client that goes away mid-stream: its session is freed, others keep being served.
            # The cancelled count is read before the request: the server may notice the closed
            # socket before a metrics request made after close() is answered.
            m0 = srv.metrics()["veloxquant_requests_cancelled_total"]
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
            b = json.dumps({"messages": [{"role": "user", "content": "Lily"}], "max_tokens": 900,
                            "stream": True}).encode()
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k3y\r\n"
                      b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(b) + b)
            got = b""
            while b"data: " not in got and len(got) < 65536:
                more = s.recv(4096)
                if not more:
                    break
                got += more
            s.close()
            check(b"data: " in got, "disconnecting client got its first event")
            active = None
            for _ in range(50):
                m = srv.metrics()
                active = m.get('veloxquant_sessions{state="active"}')
                if active == 0:
                    break
                time.sleep(0.1)
            check(active == 0, "the disconnected client's session is freed")
            check(srv.metrics()["veloxquant_requests_cancelled_total"] == m0 + 1,
                  "the request was ended as cancelled mid-generation")
            st, _, body = srv.request("POST", chat, {"messages": msgs, "max_tokens": 5}, key)
            check(st == 200, "the next request is served")
            nonstream_disconnect(srv)

            # SIGTERM mid-generation: the stream ends cleanly with [DONE], the process exits 0.
            events = []

            def long_stream():
                events.extend(srv.stream(chat, {"messages": [{"role": "user", "content": "Tom"}],
                                                "max_tokens": 900, "temperature": 1.0, "stream": True},
                                         key)[1])

            t = threading.Thread(target=long_stream)
            t.start()
            time.sleep(0.3)
            srv.proc.send_signal(signal.SIGTERM)
            t.join(30)
            # OpenAI has no finish reason for a reply the server cut: an error event, then
            # [DONE]; no chunk says finish_reason "abort".
            errors = [error_of(e) for e in events if e != "[DONE]" and "error" in json.loads(e)]
            finishes = [c.get("finish_reason") for e in events if e != "[DONE]"
                        for c in json.loads(e).get("choices", []) if c.get("finish_reason")]
            check(len(events) > 3 and events[-1] == "[DONE]" and len(errors) == 1
                  and "shut down" in errors[0].get("message", "") and not finishes,
                  "SIGTERM mid-stream: an error event (%s) then [DONE], no finish_reason (%s)" %
                  (errors[0].get("message") if errors else None, finishes))
            rc = srv.proc.wait(timeout=30)
            check(rc == 0, "the server exits 0 after SIGTERM (rc %s)" % rc)

        finally:
            srv.stop()

        queue_ghosts(binary, tmp, os.path.join(root, "data", "ggml-vocab-llama-spm.gguf"))
        footprint_off_path(binary, tmp, os.path.join(root, "data", "ggml-vocab-llama-spm.gguf"))

        # Issue 33: a model whose logits are not finite answers 500, never 200 with text.
        nan_model = os.path.join(tmp, "overflow.bin")
        overflowing_model(model, nan_model)
        srv = Server(binary, nan_model, "--tokenizer", os.path.join(root, "data", "tok512.bin"),
                     "--kv-memory", "16M", "--threads", "1")
        try:
            for stream in (False, True):
                for temp in (0, 1):
                    st, _, body = srv.request("POST", "/v1/chat/completions",
                                              {"messages": msgs, "max_tokens": 8, "temperature": temp,
                                               "stream": stream})
                    check(st == 500 and "not finite" in error_of(body).get("message", ""),
                          "non-finite logits (stream %s, temperature %s): 500 (%s)" % (stream, temp, st))
            m = srv.metrics()
            check(m['veloxquant_sessions{state="active"}'] + m['veloxquant_sessions{state="idle"}'] == 0,
                  "non-finite logits: the sessions are freed")
        finally:
            srv.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
