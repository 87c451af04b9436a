#!/usr/bin/env python3
"""Issue 36, fault 5: what a purge that covers huge pages in part gives the memory cgroup back, with and
without the split the shim's madvise wrapper makes first (docs/design.md, "RSS is not the charge";
shim/src/os/thp.rs). Runs bench/workloads/thp_split.c in a memory cgroup of its own: 200 MiB touched, every
other range of 64 or 512 KiB given back with MADV_DONTNEED, with and without MADV_FREE on the parts of huge
pages each range covers in part first. On this machine (huge pages where the program asks, as jemalloc's
thp:always does, and small pages, where the split costs without returning anything), and with --vm in the
tests' VM under THP `always` (bench/benchlib/vm.py; both kernels).

  python3 bench/thp_split_study.py [--runs 5] [--vm]

Prints a Markdown table: medians of the runs (purge time; the cgroup's usage before and after; RSS after)."""

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchlib import vm  # noqa: E402
from benchlib.configs import ROOT  # noqa: E402

EXE = os.path.join(ROOT, "bench", "out", "thp_split")
CASES = [(huge, split, kib) for huge in (True, False) for kib in (64, 512) for split in (0, 1)]

# One shell script runs every case `runs` times in a fresh memory cgroup per run, on v2 or v1.
SCRIPT = r"""
set -e
exe=$1; runs=$2; shift 2
if [ -f /sys/fs/cgroup/cgroup.controllers ] && grep -qw memory /sys/fs/cgroup/cgroup.controllers; then
  base=/sys/fs/cgroup; usage=memory.current
  echo +memory > $base/cgroup.subtree_control 2>/dev/null || true
else
  base=/sys/fs/cgroup/memory; usage=memory.usage_in_bytes
fi
n=0
for r in $(seq $runs); do
  for c in "$@"; do
    n=$((n+1)); cg=$base/memshim-thp-split-$$-$n; mkdir $cg
    set -- $(echo $c | tr , ' ') "$@"
    sh -c "echo \$\$ > $cg/cgroup.procs; exec $exe $cg/$usage $2 $3 $1"
    shift 3
    rmdir $cg
  done
done
"""


def run_cases(runner, runs):
    args = [f"{'hugepage' if h else 'small'},{s},{k}" for h, s, k in CASES]
    out = runner(["/bin/sh", "-c", SCRIPT, "sh", EXE, str(runs)] + args)
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return rows


def host(argv):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if p.returncode:
        sys.exit(f"the study failed on this machine: {p.stderr}")
    return p.stdout


def in_vm(kdir):
    def runner(argv):
        o = vm.run(kdir, argv, thp="always", timeout=900)
        if o["code"]:
            sys.exit(f"the study failed in the VM: {o['stderr']}\n{o['console']}")
        return o["stdout"]
    return runner


def table(title, rows):
    print(f"\n{title}\n")
    print("| pages | range | split first | purge ms | cgroup usage before → after (MiB) | RSS after (MiB) |")
    print("|---|---|---|---|---|---|")
    by = {}
    for r in rows:
        key = (r["huge_before_mib"] > 100, r["range_kib"], r["split"])
        by.setdefault(key, []).append(r)
    for (huge, kib, split), rs in sorted(by.items(), key=lambda kv: (not kv[0][0], kv[0][1], kv[0][2])):
        med = lambda k: statistics.median(r[k] for r in rs)  # noqa: E731
        print(f"| {'huge' if huge else 'small'} | {kib} KiB | {'yes' if split else 'no'} | {med('purge_ms'):.1f} "
              f"| {med('usage_before_mib'):.0f} → {med('usage_after_mib'):.0f} | {med('rss_after_mib'):.0f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--vm", action="store_true", help="also in the tests' VM under THP always, both kernels")
    a = ap.parse_args()
    os.makedirs(os.path.dirname(EXE), exist_ok=True)
    subprocess.run(["gcc", "-O2", "-o", EXE, os.path.join(ROOT, "bench", "workloads", "thp_split.c")], check=True)
    mode = open("/sys/kernel/mm/transparent_hugepage/enabled").read().split("[")[1].split("]")[0]
    table(f"This machine ({os.uname().release}, THP `{mode}`; 'huge': MADV_HUGEPAGE), {a.runs} runs",
          run_cases(host, a.runs))
    if a.vm:
        for role in ("newest", "bookworm"):
            try:
                kdir, version = vm.kernel(role)
            except Exception as e:  # noqa: BLE001
                print(f"\nSKIP the VM ({role}): {e}")
                continue
            table(f"VM ({version}, TCG, 1 vCPU, THP `always`), {a.runs} runs", run_cases(in_vm(kdir), a.runs))


if __name__ == "__main__":
    main()
