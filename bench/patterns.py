#!/usr/bin/env python3
"""The patterns of mimalloc-bench where memshim trailed (issue 48, item 5), as the project's own workloads.

  python3 bench/patterns.py [--runs R] [--threads T] [--configs a,b,...]

Kernels (bench/workloads/patterns.c and bigblocks.c, fixed work, so that time and memory compare):
  simple   one thread, 1000 blocks of one small size allocated then freed, six sizes (glibc-simple)
  stress   threads that come and go, blocks of mixed lifetimes and sizes that migrate (mstress)
  xmalloc  threads that only allocate, threads that only free what they are handed (xmalloc-test):
           T/2 producer/consumer pairs (at least one), 8M blocks in all. With more threads than
           CPUs, threads that wait on each other's ring with sched_yield make the time bimodal
           (0.15 or 0.35 s for one library, by how the scheduler pairs them), so T is the thread
           count, not the pair count.
  big      one thread freeing and allocating 5-25 MiB blocks, every page written (malloc-large)
larson (blocks freed by a successor thread) is scenario 4's `larson` kernel (BENCHMARKS.md section 4).

Configurations by name from bench/benchlib/configs.py (default: glibc, jemalloc, tcmalloc, mimalloc,
jemalloc531, mimalloc3, memshim, memshim-wheel, memshim-wheel217; those whose library is missing are left out, with a
line saying so). R interleaved rounds; medians of the wall time and of the peak RSS (VmHWM at the end).
Ratios: time against glibc and against the best peer (the fastest configuration that is not memshim),
peak RSS against glibc and jemalloc. The summary gives memshim's geometric means against the targets
set on the suite: time at most the best peer's x 1.05, no kernel slower than glibc's x 1.1, peak RSS
at most jemalloc's. Stdlib only."""

import argparse
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from benchlib import interleaved  # noqa: E402
from benchlib.build import build_all  # noqa: E402
from benchlib.configs import by_name  # noqa: E402

DEFAULT_CONFIGS = ("glibc,jemalloc,tcmalloc,mimalloc,jemalloc531,mimalloc3,"
                   "memshim,memshim-wheel,memshim-wheel217")
# Blocks of the xmalloc kernel, in millions, shared among its pairs.
XMALLOC_MBLOCKS = 8


def kernels(exe, threads):
    """(name, argv) of each kernel, each about a second under glibc on the 2-CPU development VM."""
    pairs = max(1, threads // 2)
    return [
        ("simple", [exe["patterns"], "simple", "1", "4000"]),
        ("stress", [exe["patterns"], "stress", str(threads), "40"]),
        ("xmalloc", [exe["patterns"], "xmalloc", str(pairs), str(max(1, XMALLOC_MBLOCKS // pairs))]),
        ("big", [exe["bigblocks"], "300", "4", "0"]),
    ]


def measure(argv, lib, env):
    r = interleaved.run_once(argv, lib, env)
    return {"wall": r["wall"], "peak": r["events"]["done"]["hwm_kb"] / 1024}


def gmean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="threads of stress and of xmalloc (half of them producers)")
    ap.add_argument("--configs", default=DEFAULT_CONFIGS)
    a = ap.parse_args()
    known = by_name()
    configs = []
    for n in a.configs.split(","):
        c = known.get(n)
        if c is None:
            sys.exit(f"patterns.py: no configuration {n!r} (bench/benchlib/configs.py)")
        if c.missing():
            print(f"(left out: {n}, {c.preload} is not there)")
            continue
        configs.append((n, c.preload or None, c.env))
    exe = build_all()
    names = [c[0] for c in configs]
    peers = [n for n in names if not n.startswith(("memshim", "ms-"))]
    print(f"medians of {a.runs} interleaved runs, {a.threads} threads (stress, xmalloc); "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    summary = {}
    for kname, argv in kernels(exe, a.threads):
        res = interleaved.rounds(configs, a.runs, lambda _n, lib, env: measure(argv, lib, env))
        med = interleaved.medians(res, ("wall", "peak"))
        spread = interleaved.spreads(res, ("wall",))
        best = min(peers, key=lambda n: med[n]["wall"]) if peers else None
        g = med.get("glibc")
        print(f"\n{kname}: {' '.join(os.path.basename(x) for x in argv)} (best peer: {best})\n")
        print("| config | time s (min–max) | × glibc | × best peer | peak MB | × glibc | × jemalloc |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for n in names:
            m = med[n]
            lo, hi = spread[n]["wall"]
            ratio = lambda k, ref: f"{m[k] / med[ref][k]:.2f}" if ref in med else "–"  # noqa: E731
            print(f"| {n} | {m['wall']:.2f} ({lo:.2f}–{hi:.2f}) | {ratio('wall', 'glibc')} | "
                  f"{ratio('wall', best) if best else '–'} | {m['peak']:.1f} | {ratio('peak', 'glibc')} | "
                  f"{ratio('peak', 'jemalloc')} |")
        for n in names:
            if n.startswith("memshim"):
                summary.setdefault(n, []).append((
                    med[n]["wall"] / med[best]["wall"] if best else None,
                    med[n]["wall"] / g["wall"] if g else None,
                    med[n]["peak"] / med["jemalloc"]["peak"] if "jemalloc" in med else None))
    print("\n| build | geomean time × best peer (target ≤ 1.05) | worst time × glibc (target ≤ 1.1) | "
          "geomean peak × jemalloc (target ≤ 1.00) |")
    print("|---|---:|---:|---:|")
    for n, rows in summary.items():
        cols = []
        for i, f in ((0, gmean), (1, max), (2, gmean)):
            xs = [r[i] for r in rows if r[i] is not None]
            cols.append(f"{f(xs):.2f}" if xs else "–")
        print(f"| {n} | {' | '.join(cols)} |")


if __name__ == "__main__":
    main()
