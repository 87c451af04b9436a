#!/usr/bin/env python3
"""What Python frames in native samples cost (issue 47): CPU per sample, and allocation throughput
at the sampling interval, against a build whose samples carry native frames only.

  python3 bench/pyframes.py --base BASE.so [--python PY ...] [--allocs N] [--depth D] [--runs R]

A CPython program (below) allocates N bytearrays of 512 KiB (jemalloc's sampling interval: about one
sample each) at D Python frames of depth, keeping none, on its main thread; and the same through
ctypes' malloc (the GIL released). Each library runs it with MEMSHIM_PROFILE=on, once not sampling
and once sampling (`memshim-ctl profile PID --seconds 0 --keep` before the work), R interleaved
runs, medians of the CPU time of the work (time.process_time in the program). Per sample:
(sampling - not sampling) / samples, with N (1 - 1/e) samples expected (jemalloc samples an
allocation of the mean interval's size with that chance). BASE.so is a libmemshim.so built before Python frames
(`git worktree add /tmp/base fa7187f && cargo build --release -p memshim` there). Prints Markdown
(bench/FINDINGS-profiling.md has a run). Run on a quiet machine."""

import argparse
import math
import os
import resource
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIB = os.path.join(ROOT, "target/release/libmemshim.so")
CTL = os.path.join(ROOT, "target/release/memshim-ctl")

PROGRAM = r'''
import ctypes, sys, time
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
N, DEPTH, KIND = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
def work(n):
    if KIND == "bytearray":
        for _ in range(n):
            bytearray(1 << 19)
    else:
        for _ in range(n):
            libc.free(libc.malloc(1 << 19))
print("waiting", flush=True)
sys.stdin.readline()
def at_depth(d):
    if d == 0:
        t0 = time.process_time()
        work(N)
        return time.process_time() - t0
    return at_depth(d - 1)
print(at_depth(DEPTH), flush=True)
sys.stdin.readline()
'''


def env(lib):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("LD_PRELOAD", "MEMSHIM_", "MALLOC_CONF"))}
    e.update(LD_PRELOAD=lib, MEMSHIM_CONTROL="on", MEMSHIM_PROFILE="on")
    return e


def run(py, lib, sample, n, depth, kind):
    """(CPU seconds of the work, samples in the profile or 0)."""
    p = subprocess.Popen([py, "-c", PROGRAM, str(n), str(depth), kind], env=env(lib), stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "waiting"
    if sample:
        for _ in range(60):
            r = subprocess.run([CTL, "profile", str(p.pid), "--seconds", "0", "--keep", "--format", "folded"],
                               capture_output=True, text=True)
            if r.returncode == 0:
                break
            __import__("time").sleep(0.2)
        else:
            sys.exit("pyframes: could not switch sampling on: " + r.stderr)
    p.stdin.write("go\n")
    p.stdin.flush()
    cpu = float(p.stdout.readline())
    # Nothing is kept, so the profile holds no sample: jemalloc samples an
    # allocation of 512 KiB at a mean interval of 512 KiB with chance 1 - 1/e.
    samples = n * (1 - math.exp(-1)) if sample else 0
    p.stdin.write("quit\n")
    p.stdin.flush()
    p.communicate(timeout=60)
    return cpu, samples


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True)
    ap.add_argument("--python", nargs="+", default=[sys.executable])
    ap.add_argument("--allocs", type=int, default=20000)
    ap.add_argument("--depth", type=int, default=30)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    print(f"{a.allocs} allocations of 512 KiB at {a.depth} Python frames, medians of {a.runs} interleaved runs\n")
    print("| CPython | allocations | build | CPU not sampling | CPU sampling | samples | per sample | throughput sampling / not |")
    print("|---|---|---|---|---|---|---|---|")
    for py in a.python:
        ver = subprocess.run([py, "-c", "import platform; print(platform.python_version())"],
                             capture_output=True, text=True).stdout.strip()
        for kind in ("bytearray", "ctypes malloc"):
            k = kind.split()[0]
            res = {lib: ([], [], []) for lib in (a.base, LIB)}
            for _ in range(a.runs):
                for lib in (a.base, LIB):
                    off, _ = run(py, lib, False, a.allocs, a.depth, k)
                    on, n = run(py, lib, True, a.allocs, a.depth, k)
                    res[lib][0].append(off)
                    res[lib][1].append(on)
                    res[lib][2].append(n)
            for lib, name in ((a.base, "native frames only (base)"), (LIB, "with Python frames")):
                off, on, n = (statistics.median(x) for x in res[lib])
                per = (on - off) / max(n, 1) * 1e6
                print(f"| {ver} | {kind} | {name} | {off:.3f} s | {on:.3f} s | {n:.0f} | {per:.1f} us | {off / on:.2f} |")


if __name__ == "__main__":
    main()
