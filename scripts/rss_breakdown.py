#!/usr/bin/env python3
"""Peak resident memory of a command, broken down by mapping (Linux).

Usage: scripts/rss_breakdown.py COMMAND [ARGS...]

Runs the command (its stdout discarded, stderr passed through), reads /proc/PID/smaps every
20 ms, and prints the process's VmHWM (peak RSS, what `/usr/bin/time -v` reports) and, at the
sample with the largest total Rss, the resident MB (10^6 bytes) of each kind of mapping: each
mapped file by path (a model file), [heap] (malloc's main arena), [anon] (anonymous mappings:
large allocations, thread arenas and stacks), [stack], each shared library, and the
executable. A short peak between two samples can be missed by the breakdown, never by VmHWM.
"""
import collections
import os
import subprocess
import sys
import time


def sample(pid, exe):
    rss = collections.Counter()
    name = None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            parts = line.split()
            if not parts[0].endswith(":"):  # a mapping's header line
                path = parts[5] if len(parts) > 5 else "[anon]"
                if path == exe:
                    path = "[executable]"
                elif ".so" in os.path.basename(path):
                    path = "lib " + os.path.basename(path).split(".so")[0]
                name = path
            elif parts[0] == "Rss:":
                rss[name] += int(parts[1]) * 1024
    return rss


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
    exe = os.path.realpath(f"/proc/{proc.pid}/exe") if os.path.exists(f"/proc/{proc.pid}") else ""
    best, hwm = collections.Counter(), 0
    while proc.poll() is None:
        try:
            exe = os.path.realpath(f"/proc/{proc.pid}/exe")
            rss = sample(proc.pid, exe)
            with open(f"/proc/{proc.pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        hwm = max(hwm, int(line.split()[1]) * 1024)
        except (OSError, IndexError, ValueError):  # the process ended between two reads
            time.sleep(0.02)
            continue
        if sum(rss.values()) > sum(best.values()):
            best = rss
        time.sleep(0.02)
    print(f"exit status {proc.returncode}; VmHWM {hwm / 1e6:.2f} MB; "
          f"largest sample {sum(best.values()) / 1e6:.2f} MB:")
    for name, b in best.most_common():
        if b >= 50_000:
            print(f"  {b / 1e6:8.2f} MB  {name}")
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
