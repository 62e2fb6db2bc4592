#!/usr/bin/env python3
"""`veloxquant serve --session-dir` (issue 32, item 5), on 127.0.0.1, bounded in count and time:
sessions dropped for room are restored from their files, a restarted server picks them up, an
edited reply resumes from the turn before, a damaged file is removed and the request still
served, and the directory stays within --session-dir-bytes.

Expected replies come from a reference server without --session-dir and with room for every
session, which continues each conversation from the session it holds in memory: a restored
session must give the same greedy tokens and the same cached-token count.

Usage: serve_persist_test.py VELOXQUANT_BINARY PROJECT_ROOT"""
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Server, check, summary  # noqa: E402

CHAT = "/v1/chat/completions"
METHOD = "h2o:budget=32"
N_CONV = 10


def ask(srv, messages, max_tokens=12):
    st, _, body = srv.request("POST", CHAT, {"messages": messages, "max_tokens": max_tokens,
                                             "temperature": 0,
                                             "veloxquant": {"method": METHOD}})
    if st != 200:
        return st, "", -1
    j = json.loads(body)
    return (st, j["choices"][0]["message"]["content"],
            j["usage"]["prompt_tokens_details"]["cached_tokens"])


def first_message(i):
    animals = ["cat", "dog", "bird", "fish", "frog", "bear", "fox", "duck", "owl", "mouse"]
    return [{"role": "user", "content": "Once upon a time there was a little %s named Tim %d."
             % (animals[i % len(animals)], i)}]


def turn(conv, reply, user):
    return conv + [{"role": "assistant", "content": reply}, {"role": "user", "content": user}]


def main():
    binary, root = sys.argv[1], sys.argv[2]
    model = os.path.join(root, "data", "stories260K.bin")
    common = ["--threads", "1", "--max-context", "256", "--shutdown-grace", "0.2"]
    tmp = tempfile.mkdtemp(prefix="vq-persist-")
    sdir = os.path.join(tmp, "sessions")
    ref = Server(binary, model, *common, "--kv-memory", "64M")
    srv = None
    try:
        # Turns 1-3 of every conversation on the reference server (in memory, nothing dropped).
        convs = [first_message(i) for i in range(N_CONV)]
        want = {}
        for i, c in enumerate(convs):
            st, r1, _ = ask(ref, c)
            c2 = turn(c, r1, "Then what happened?")
            st2, r2, k2 = ask(ref, c2)
            c3 = turn(c2, r2, "And at the end?")
            st3, r3, k3 = ask(ref, c3)
            want[i] = dict(r1=r1, c2=c2, r2=r2, k2=k2, c3=c3, r3=r3, k3=k3,
                           ok=st == st2 == st3 == 200 and k2 > 0 and k3 > k2)
        check(all(w["ok"] for w in want.values()), "reference: three turns of %d conversations, "
              "each continuing its session" % N_CONV)

        # The persistent server holds at most 2 sessions: running turn 1 of 10 conversations
        # drops 8 of them for room (spilled: their files remain).
        srv = Server(binary, model, *common, "--kv-memory", "64M", "--max-sessions", "2",
                     "--session-dir", sdir)
        same1 = 0
        for i, c in enumerate(convs):
            st, r1, _ = ask(srv, c)
            same1 += st == 200 and r1 == want[i]["r1"]
        check(same1 == N_CONV, "turn 1 of %d conversations: the reference's replies (%d same)"
              % (N_CONV, same1))
        resumed = same2 = 0
        for i in range(N_CONV):
            st, r2, k2 = ask(srv, want[i]["c2"])
            resumed += st == 200 and k2 == want[i]["k2"]
            same2 += st == 200 and r2 == want[i]["r2"]
        m = srv.metrics()
        check(resumed == N_CONV and same2 == N_CONV,
              "turn 2 under memory pressure: %d/%d resume their cache (the reference's cached "
              "tokens), %d/%d give the reference's reply" % (resumed, N_CONV, same2, N_CONV))
        check(m.get("veloxquant_sessions_spilled_total", 0) >= N_CONV - 2
              and m.get("veloxquant_sessions_restored_total", 0) >= N_CONV - 2
              and m.get("veloxquant_session_restore_errors_total", -1) == 0,
              "metrics: %d spilled, %d restored, 0 restore errors"
              % (m.get("veloxquant_sessions_spilled_total", 0),
                 m.get("veloxquant_sessions_restored_total", 0)))
        check(srv.stop() == 0, "SIGTERM: the server exits 0 (queued session files written)")

        # A restart picks the files up: turn 3 resumes every conversation.
        srv = Server(binary, model, *common, "--kv-memory", "64M", "--max-sessions", "2",
                     "--session-dir", sdir)
        resumed = same3 = 0
        for i in range(N_CONV):
            st, r3, k3 = ask(srv, want[i]["c3"])
            resumed += st == 200 and k3 == want[i]["k3"]
            same3 += st == 200 and r3 == want[i]["r3"]
        check(resumed == N_CONV and same3 == N_CONV,
              "after a restart, turn 3: %d/%d resume their cache, %d/%d the reference's reply"
              % (resumed, N_CONV, same3, N_CONV))

        # An edited reply: conversation 0's second reply changed. The session resumes from the
        # turn before (the file of turn 1), as the reference does from its turn-1 session.
        edited = turn(turn(first_message(0), want[0]["r1"], "Then what happened?"),
                      "They went home and had soup.", "And at the end?")
        ref2 = Server(binary, model, *common, "--kv-memory", "64M")
        try:
            ask(ref2, first_message(0))
            st_ref, r_ref, k_ref = ask(ref2, edited)
        finally:
            ref2.stop()
        before = srv.metrics().get("veloxquant_session_snapshot_hits_total", 0)
        st, r_e, k_e = ask(srv, edited)
        hits = srv.metrics().get("veloxquant_session_snapshot_hits_total", 0) - before
        check(st == st_ref == 200 and k_e == k_ref > 0 and r_e == r_ref and hits == 1,
              "an edited reply resumes from the turn before: %d cached tokens (reference %d), "
              "same reply: %s, snapshot hits +%d" % (k_e, k_ref, r_e == r_ref, hits))

        # A damaged file: conversation 1's turn-3 file cut in half. The request is served
        # (restored from its turn-2 file), the damaged file removed and counted.
        c4 = turn(want[1]["c3"], want[1]["r3"], "What did they learn?")
        files = sorted(glob.glob(os.path.join(sdir, "*.vqsession")), key=os.path.getmtime)
        errors0 = srv.metrics().get("veloxquant_session_restore_errors_total", 0)
        # Two other conversations go on, so the server's 2 sessions are not conversation 1's.
        ask(srv, turn(want[2]["c3"], want[2]["r3"], "More?"))
        ask(srv, turn(want[3]["c3"], want[3]["r3"], "More?"))
        newest_c1 = None
        for f in reversed(files):
            with open(f, "rb") as fh:
                data = fh.read()
            hlen = int.from_bytes(data[8:12], "little")
            head = json.loads(data[12:12 + hlen])
            if head["history"] == want[1]["c3"] + [{"role": "assistant", "content": want[1]["r3"]}]:
                newest_c1 = f
                break
        check(newest_c1 is not None, "conversation 1's turn-3 file is found by its header")
        if newest_c1:
            with open(newest_c1, "r+b") as fh:
                fh.truncate(os.path.getsize(newest_c1) // 2)
            st, _, k4 = ask(srv, c4)
            m = srv.metrics()
            check(st == 200 and k4 > 0 and not os.path.exists(newest_c1)
                  and m.get("veloxquant_session_restore_errors_total", 0) == errors0 + 1,
                  "a file cut in half: the request is served (%s, %d cached from an earlier turn), "
                  "the file removed, 1 restore error counted" % (st, k4))
        srv.stop()

        # Bad flags: a regular file as --session-dir, the bound without the directory.
        plain = os.path.join(tmp, "plain")
        open(plain, "w").close()
        for args, needle in ((["--session-dir", plain], "--session-dir"),
                             (["--session-dir-bytes", "1M"], "--session-dir")):
            p = subprocess.run([binary, "serve", "--model", model, "--port", "0", *common, *args],
                               capture_output=True, text=True, timeout=60)
            check(p.returncode != 0 and needle in p.stderr,
                  "%s: refused at startup naming %s (%s)" % (" ".join(args), needle,
                                                             p.stderr.strip()[:120]))

        # The bound: about three files' worth of bytes; ten conversations later the directory
        # holds at most that, the oldest removed.
        size = max(os.path.getsize(f) for f in glob.glob(os.path.join(sdir, "*.vqsession")))
        bound = 3 * size + size // 2
        bdir = os.path.join(tmp, "bounded")
        srv = Server(binary, model, *common, "--kv-memory", "64M", "--session-dir", bdir,
                     "--session-dir-bytes", str(bound))
        for c in convs:
            ask(srv, c)
        srv.stop()
        total = sum(os.path.getsize(f) for f in glob.glob(os.path.join(bdir, "*.vqsession")))
        left = glob.glob(os.path.join(bdir, "*"))
        check(0 < total <= bound and all(f.endswith(".vqsession") for f in left),
              "--session-dir-bytes %d: the directory holds %d bytes in %d files, no temporary "
              "file left" % (bound, total, len(left)))
    finally:
        ref.stop()
        if srv is not None:
            srv.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(summary())


if __name__ == "__main__":
    main()
