"""Compiles the C workloads into bench/out/ with gcc."""

import os
import subprocess

from .configs import ROOT

SRC = os.path.join(ROOT, "bench", "workloads")
OUT = os.path.join(ROOT, "bench", "out")
# churnops, idlecache, forkloop: measurement tools of bench/FINDINGS-issue15.md, not harness scenarios;
# bigblocks: bench/bigblocks.py (issue 48, item 4) and scenario 9; patterns: scenario 9 (item 5).
PROGRAMS = ("serve", "churn", "tput", "dirty", "churnops", "idlecache", "forkloop", "bigblocks", "patterns")


def build_all():
    os.makedirs(OUT, exist_ok=True)
    paths = {}
    for name in PROGRAMS:
        src = os.path.join(SRC, f"{name}.c")
        exe = os.path.join(OUT, name)
        deps = [src, os.path.join(SRC, "common.h")]
        if not os.path.exists(exe) or os.path.getmtime(exe) < max(os.path.getmtime(d) for d in deps):
            subprocess.run(["gcc", "-O2", "-g", "-Wall", "-Wextra", "-Werror", "-pthread", "-o", exe, src, "-lm"],
                           check=True)
        paths[name] = exe
    return paths
