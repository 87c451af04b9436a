#!/usr/bin/env python3
"""Issue 36, item 6: jemalloc's per-CPU arenas (percpu_arena:percpu) measured in a VM with 8 vCPUs
(bench/benchlib/vm.py: the tests' VM on live cgroup v2), under no CPU limit, a cpuset (4-7) and a
cpu.max quota. Writes bench/out/percpu/: each setting's arena counts and a harness report of scenarios
2, 3 and 4 (medium, large) for glibc, memshim, ms-percpu and ms-narenas1x, at reduced size (below).
bench/FINDINGS-percpu.md is the write-up.

  python3 bench/percpu_study.py [--vcpus 8] [--settings none,cpuset,quota] [--quick]

Under TCG, 8 vCPUs share this machine's cores: peak RSS is meaningful, throughput only roughly so."""

import argparse
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchlib import vm  # noqa: E402
from benchlib.build import build_all  # noqa: E402
from benchlib.configs import ROOT, SHIM  # noqa: E402

CTL = os.path.join(ROOT, "target", "release", "memshim-ctl")
OUT = os.path.join(ROOT, "bench", "out", "percpu")

# What each setting does to the cgroup the benchmark runs in.
SETTINGS = {
    "none": [],
    "cpuset": [("cpuset.cpus", "4-7"), ("cpuset.mems", "0")],
    "quota": [("cpu.max", "400000 100000")],
}
# Arena counts: (label, cgroup files), each with and without percpu_arena.
ARENA_CASES = [
    ("no limit", []),
    ("cpuset 4-7", [("cpuset.cpus", "4-7"), ("cpuset.mems", "0")]),
    ("cpu.max 2 CPUs", [("cpu.max", "200000 100000")]),
    ("cpuset 4-7 + cpu.max 2 CPUs", [("cpuset.cpus", "4-7"), ("cpuset.mems", "0"), ("cpu.max", "200000 100000")]),
]
VARIANTS = "ms-percpu,ms-narenas1x"


def harness_args(quick):
    a = ["--full", "--only", "s2,s3,s4", "--configs", "glibc,memshim," + VARIANTS,
         "--set", f"s2.variants={VARIANTS}", "--set", f"s3.variants={VARIANTS}", "--set", f"s4.variants={VARIANTS}",
         "--set", "s4.kernels=medium,large", "--set", "s4.variant_kernels=medium,large",
         "--set", "reps.s2=2", "--set", "reps.s3=2", "--set", "reps.s4=1",
         "--set", "s2.ops=100000", "--set", "s3.seconds=20", "--set", "s3.idle=6"]
    if quick:
        a += ["--set", "s2.ops=5000", "--set", "s3.seconds=2", "--set", "s3.idle=1", "--set", "s3.idle_step=0.5",
              "--set", "s4.threads=1,2"]
    return a


def guest_script(settings, quick):
    q = lambda s: "'" + s.replace("'", "'\\''") + "'"  # noqa: E731
    py = sys.executable
    lines = ["set -u", "CG=/sys/fs/cgroup", f"SHIM={q(SHIM)}", f"CTL={q(CTL)}", 'OUT="$VM_SHARE"',
             "enter() { d=$CG/$1; mkdir -p $d; shift; while [ $# -gt 1 ]; do echo \"$2\" > $d/$1 || "
             "echo \"cannot write $2 to $1\" >&2; shift 2; done; }",
             "probe() {",
             # A Python process with 8 threads allocating; its arenas are read from outside by memshim-ctl.
             "  MEMSHIM_MALLOC_CONF=$2 MEMSHIM_CONTROL=on LD_PRELOAD=$SHIM " + py + " -c 'import os,sys,time,"
             "threading\nts=[threading.Thread(target=lambda: [bytearray(100000) for _ in range(200)]) for _ in "
             "range(8)]\n[t.start() for t in ts]\n[t.join() for t in ts]\nprint(os.getpid(),len(os.sched_getaffinity"
             "(0)),flush=True)\ntime.sleep(8)' > /tmp/probe.out 2>/tmp/probe.err &",
             "  for _ in $(seq 300); do [ -s /tmp/probe.out ] && break; sleep 0.2; done; sleep 0.5",
             "  set -- \"$1\" \"$2\" $(cat /tmp/probe.out) 0 0",
             "  echo \"{\\\"case\\\": \\\"$1\\\", \\\"conf\\\": \\\"$2\\\", \\\"affinity\\\": $4, \\\"stats\\\": "
             "$($CTL stats $3 --json --arenas), \\\"stderr\\\": $(" + py +
             " -c 'import json,sys; print(json.dumps(open(\"/tmp/probe.err\").read()))')}\" >> $OUT/arenas.jsonl",
             "  wait", "}"]
    for i, (label, files) in enumerate(ARENA_CASES):
        args = " ".join(f"{k} {q(v)}" for k, v in files)
        lines += [f"( enter a{i} {args}; echo $BASHPID > $CG/a{i}/cgroup.procs; "
                  f"probe {q(label)} ''; probe {q(label)} percpu_arena:percpu )"]
    for s in settings:
        args = " ".join(f"{k} {q(v)}" for k, v in SETTINGS[s])
        hargs = " ".join(q(a) for a in harness_args(quick))
        lines += [f"echo \"== {s} $(date +%T)\" >&2",
                  f"( enter s-{s} {args}; echo $BASHPID > $CG/s-{s}/cgroup.procs; cat $CG/s-{s}/cpu.max "
                  f"$CG/s-{s}/cpuset.cpus.effective > $OUT/{s}.cgroup; "
                  f"timeout 1500 {py} bench/harness.py {hargs} --out $OUT/{s} > $OUT/{s}.log 2>&1; "
                  f"echo \"exit $?\" >> $OUT/{s}.log )"]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vcpus", type=int, default=8)
    ap.add_argument("--mem", type=int, default=4096)
    ap.add_argument("--settings", default="none,cpuset,quota")
    ap.add_argument("--kernel", default="newest")
    ap.add_argument("--quick", action="store_true", help="tiny parameters: checks that the study runs")
    a = ap.parse_args()
    kdir, why = vm.kernel(a.kernel)
    if kdir is None:
        print(f"SKIP: {why}")
        return 0
    build_all()
    script = guest_script([s for s in a.settings.split(",") if s], a.quick)
    r = vm.run(kdir, ["bash", "-c", script], vcpus=a.vcpus, mem_mib=a.mem, timeout=3600 * 2, keep_share=True)
    shutil.rmtree(OUT, ignore_errors=True)
    shutil.copytree(r["share"], OUT)
    shutil.rmtree(os.path.dirname(r["share"]), ignore_errors=True)
    with open(os.path.join(OUT, "vm.json"), "w") as f:
        json.dump({k: r[k] for k in ("code", "boot_s", "run_s", "vcpus", "accel")} | {"kernel": why}, f)
    print(f"VM ({why}, {a.vcpus} vCPUs, {r['accel']}): boot {r['boot_s']:.1f} s, run {r['run_s']:.0f} s, "
          f"exit {r['code']}; {OUT}")
    sys.stdout.write(r["stderr"][-3000:])
    return r["code"]


if __name__ == "__main__":
    sys.exit(main())
