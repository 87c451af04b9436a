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
Prints a Markdown table (bench/FINDINGS-profiling.md has a run; bench/execcost.py gives the
per-exec cost). Needs valgrind; `make build` and `python3 bench/harness.py --smoke` (builds bench/out/) first."""

import argparse
import os
import re
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


def churn_instructions(lib, profile, sample, kind, ops):
    p = subprocess.Popen(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", CHURN, kind, str(ops)],
                         env=env(lib, profile), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    assert "waiting" in line, line
    if sample:
        # The endpoint starts with the shim's thread; under valgrind that takes a while.
        deadline = time.time() + 120
        while True:
            r = subprocess.run([CTL, "profile", str(p.pid), "--seconds", "0", "--keep", "--format", "folded"],
                               capture_output=True, text=True)
            if r.returncode == 0:
                break
            if time.time() > deadline:
                p.kill()
                sys.exit("profcost: could not switch the profiler on: " + r.stderr)
            time.sleep(0.5)
    p.stdin.write("go\n")
    p.stdin.flush()
    out, err = p.communicate(timeout=3600)
    m = re.search(r"refs:\s+([\d,]+)", err)
    if p.returncode != 0 or not m:
        sys.exit("profcost: churnops failed: " + err[-2000:])
    return int(m.group(1).replace(",", ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", help="a libmemshim.so built without profiling, for the first column")
    ap.add_argument("--small", type=int, default=1_000_000)
    ap.add_argument("--medium", type=int, default=200_000)
    a = ap.parse_args()
    configs = ([("base", a.base, False, False)] if a.base else []) + [
        ("off", LIB, False, False), ("ready", LIB, True, False), ("sampling", LIB, True, True)]
    print("| churnops | " + " | ".join(c[0] for c in configs) + " | ready vs off | sampling vs off |")
    print("|---" * (len(configs) + 3) + "|")
    for kind, ops in (("small", a.small), ("medium", a.medium)):
        n = {c[0]: churn_instructions(c[1], c[2], c[3], kind, ops) for c in configs}
        cells = [f"{n[c[0]]:,}" for c in configs]
        print(f"| {kind} {ops:,} | " + " | ".join(cells) +
              f" | {100 * (n['ready'] / n['off'] - 1):+.2f} % | {100 * (n['sampling'] / n['off'] - 1):+.2f} % |",
              flush=True)


if __name__ == "__main__":
    main()
