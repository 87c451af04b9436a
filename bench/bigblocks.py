#!/usr/bin/env python3
"""Big blocks in one thread (issue 48, item 4): bench/workloads/bigblocks.c under each allocator.

  python3 bench/bigblocks.py [--ops N] [--slots S] [--wait W] [--runs R] [NAME=LIB[:ENV=V,...] ...]

Default configurations: glibc, this checkout's libmemshim.so (MEMSHIM_CONTROL=auto, so no shim
thread in this single-threaded program), the same with MEMSHIM_CONTROL=on (the shim's thread from
the start), Debian's jemalloc and mimalloc where installed. R interleaved rounds (every
configuration once per round, in a rotated order); medians of:
  faults    minor page faults of the run (wait4): the pages faulted in again after a purge;
            deterministic up to the allocator's own timing (decay)
  cpu s     user + system time (wait4); other load on the machine moves it
  wall s    elapsed; the same caveat
  peak MB   VmHWM at the end of the loop
  idle MB   VmRSS W seconds (default 0) after every block is freed, with no call into malloc
            in between: what a process that then idles keeps (a shim thread returns its pages
            within the decay time, 1 s; nothing else runs without one)
Ratios are against glibc's median. Stdlib only."""

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from benchlib import interleaved  # noqa: E402
from benchlib.build import build_all  # noqa: E402

LIBDIR = "/usr/lib/x86_64-linux-gnu"
SHIM = os.environ.get("BENCH_SHIM") or os.path.join(ROOT, "target", "release", "libmemshim.so")


def default_configs():
    c = [("glibc", None, {}), ("memshim", SHIM, {}), ("memshim-thread", SHIM, {"MEMSHIM_CONTROL": "on"})]
    for name, lib in (("jemalloc", "libjemalloc.so.2"), ("mimalloc", "libmimalloc.so.2")):
        if os.path.exists(os.path.join(LIBDIR, lib)):
            c.append((name, os.path.join(LIBDIR, lib), {}))
    return c


def run_once(exe, args, lib, env):
    r = interleaved.run_once([exe, *args], lib, env)
    ev = r["events"]
    return {"faults": r["faults"], "cpu": r["cpu"], "wall": r["wall"],
            "peak": ev["done"]["hwm_kb"] / 1024, "idle": ev["idle"]["rss_kb"] / 1024}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", type=int, default=400)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--wait", type=float, default=0.0)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("configs", nargs="*")
    a = ap.parse_args()
    configs = [interleaved.parse_config(c) for c in a.configs] or default_configs()
    exe = build_all()["bigblocks"]
    args = [str(a.ops), str(a.slots), str(a.wait)]
    try:
        res = interleaved.rounds(configs, a.runs, lambda _n, lib, env: run_once(exe, args, lib, env))
    except RuntimeError as e:
        sys.exit(f"bigblocks.py: {e}")
    med = interleaved.medians(res, ("faults", "cpu", "wall", "peak", "idle"))
    spread = interleaved.spreads(res, ("cpu", "wall"))
    base = med.get("glibc") or next(iter(med.values()))
    print(f"bigblocks {a.ops} ops, {a.slots} slots, idle after {a.wait:g} s, medians of {a.runs} interleaved runs; ratios against glibc")
    print("| config | faults | × | cpu s | × | wall s (min–max) | × | peak MB | × | idle MB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n, m in med.items():
        lo, hi = spread[n]["wall"]
        print(f"| {n} | {m['faults']:.0f} | {m['faults'] / base['faults']:.2f} | {m['cpu']:.2f} | "
              f"{m['cpu'] / base['cpu']:.2f} | {m['wall']:.2f} ({lo:.2f}–{hi:.2f}) | {m['wall'] / base['wall']:.2f} | "
              f"{m['peak']:.0f} | {m['peak'] / base['peak']:.2f} | {m['idle']:.0f} |")


if __name__ == "__main__":
    main()
