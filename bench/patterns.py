#!/usr/bin/env python3
"""Scenario 9 of the harness alone: the patterns of mimalloc-bench where memshim trailed (issue 48,
item 5), as the project's own workloads, with the configurations and repetitions given here.

  python3 bench/patterns.py [--runs R] [--threads T] [--configs a,b,...]

What each kernel does, and how the figures are read: bench/benchlib/s9_patterns.py. Configurations
by name from bench/benchlib/configs.py (default: those of the full run's scenario 9); those whose
library is missing are left out, with a line saying so. Prints the scenario's tables. Stdlib only."""

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from benchlib import s9_patterns  # noqa: E402
from benchlib.build import build_all  # noqa: E402
from benchlib.configs import by_name  # noqa: E402
from benchlib.params import FULL  # noqa: E402


def main():
    p = FULL["s9"]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=p["runs"])
    ap.add_argument("--threads", type=int, default=p["threads"],
                    help="threads of stress and of xmalloc (half of them producers)")
    ap.add_argument("--configs", default=",".join(p["configs"]))
    a = ap.parse_args()
    if a.runs < 1 or a.threads < 1:
        ap.error("--runs and --threads must be at least 1")
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
    print(f"medians of {a.runs} interleaved runs, {a.threads} threads (stress, xmalloc); "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}\n")
    try:
        measured = s9_patterns.measure(configs, build_all(), a.runs, a.threads, p["scale"],
                                       lambda m: print(m, file=sys.stderr, flush=True))
    except RuntimeError as e:
        sys.exit(f"patterns.py: {e}")
    print(s9_patterns.render(measured)[0])


if __name__ == "__main__":
    main()
