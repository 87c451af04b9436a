#!/usr/bin/env python3
"""What jemalloc's heap profiler costs, in instructions (callgrind: a noisy machine cannot move them).

  python3 bench/profcost.py [--base LIB] [--small OPS] [--medium OPS]

For `churnops small` and `churnops medium` (bench/workloads/churnops.c, fixed work, one thread), the
user-space instructions of the whole run under:
  base        --base LIB: a build without profiling compiled in (optional)
  off         this checkout's libmemshim.so, MEMSHIM_PROFILE unset (profiling compiled in, not ready)
  ready       MEMSHIM_PROFILE=on: prof:true, prof_active:false (ready, not sampling)
  sampling    MEMSHIM_PROFILE=on and `memshim-ctl profile PID --keep` before the work: one sample per
              512 KiB allocated, each a call stack taken with libgcc's unwinder
Each run waits (CHURNOPS_WAIT=1) until the profiler is switched on, so the figures count the same work.
The shim's thread does not serve under valgrind, so `sampling` is measured in CPU time (a second
table, five times the work, medians of --runs interleaved runs).
Prints a Markdown table (bench/FINDINGS-profiling.md has a run; bench/execcost.py gives the
per-exec cost). Needs valgrind; `make build` and `python3 bench/harness.py --smoke` (builds bench/out/) first."""

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIB = os.path.join(ROOT, "target/release/libmemshim.so")
CTL = os.path.join(ROOT, "target/release/memshim-ctl")
CHURN = os.path.join(ROOT, "bench/out/churnops")


def env(lib, profile):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("LD_PRELOAD", "MEMSHIM_", "MALLOC_CONF"))}
    e.update(LD_PRELOAD=lib, MEMSHIM_CONTROL="on", CHURNOPS_WAIT="1", PYTHONHASHSEED="0")
    if profile:
        e["MEMSHIM_PROFILE"] = "on"
    return e


def churn(lib, profile, sample, kind, ops, valgrind):
    """(instructions under callgrind, or user+system CPU seconds without it) of one run."""
    pre = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"] if valgrind else []
    p = subprocess.Popen(pre + [CHURN, kind, str(ops)],
                         env=env(lib, profile), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    assert "waiting" in line, line
    if sample:
        deadline = time.time() + 30
        while True:
            r = subprocess.run([CTL, "profile", str(p.pid), "--seconds", "0", "--keep", "--format", "folded"],
                               capture_output=True, text=True)
            if r.returncode == 0:
                break
            if time.time() > deadline:
                p.kill()
                sys.exit("profcost: could not switch the profiler on: " + r.stderr)
            time.sleep(0.5)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p.stdin.write("go\n")
    p.stdin.flush()
    out, err = p.communicate(timeout=3600)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        sys.exit("profcost: churnops failed: " + err[-2000:])
    if not valgrind:
        # The child's CPU from its start; the wait before "go" is idle.
        return (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    m = re.search(r"refs:\s+([\d,]+)", err)
    if not m:
        sys.exit("profcost: no instruction count: " + err[-2000:])
    return int(m.group(1).replace(",", ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", help="a libmemshim.so built without profiling, for the first column")
    ap.add_argument("--small", type=int, default=1_000_000)
    ap.add_argument("--medium", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=7, help="interleaved runs for the CPU-time table")
    a = ap.parse_args()
    configs = ([("base", a.base, False, False)] if a.base else []) + [
        ("off", LIB, False, False), ("ready", LIB, True, False)]
    print("Instructions (callgrind):\n")
    print("| churnops | " + " | ".join(c[0] for c in configs) + " | off vs base | ready vs off |")
    print("|---" * (len(configs) + 3) + "|")
    for kind, ops in (("small", a.small), ("medium", a.medium)):
        n = {c[0]: churn(c[1], c[2], c[3], kind, ops, True) for c in configs}
        vs_base = f"{100 * (n['off'] / n['base'] - 1):+.2f} %" if a.base else "–"
        print(f"| {kind} {ops:,} | " + " | ".join(f"{n[c[0]]:,}" for c in configs) +
              f" | {vs_base} | {100 * (n['ready'] / n['off'] - 1):+.2f} % |", flush=True)
    # Sampling needs the shim's thread, which does not serve under valgrind: CPU time instead,
    # interleaved runs, medians (other load on the machine moves these; the ratios less).
    cpu = [("off", LIB, False, False), ("ready", LIB, True, False), ("sampling", LIB, True, True)]
    print(f"\nCPU seconds (user + system), median of {a.runs} interleaved runs:\n")
    print("| churnops | off | ready | sampling | ready vs off | sampling vs off |")
    print("|---|---|---|---|---|---|")
    for kind, ops in (("small", a.small * 5), ("medium", a.medium * 5)):
        t = {c[0]: [] for c in cpu}
        for _ in range(a.runs):
            for c in cpu:
                t[c[0]].append(churn(c[1], c[2], c[3], kind, ops, False))
        m = {k: statistics.median(v) for k, v in t.items()}
        print(f"| {kind} {ops:,} | {m['off']:.3f} | {m['ready']:.3f} | {m['sampling']:.3f} | "
              f"{100 * (m['ready'] / m['off'] - 1):+.1f} % | {100 * (m['sampling'] / m['off'] - 1):+.1f} % |",
              flush=True)

if __name__ == "__main__":
    main()
