#!/usr/bin/env python3
"""Issue 36, fault 5's leftover: under transparent huge pages `always`, RSS climbs back after the shim's idle
return (docs/design.md, "Transparent huge pages"). Runs tests/fixtures/idle_heap.c (512 MiB fragmented heap,
4 threads, freed, then idle) with the shim in the tests' VM (bench/benchlib/vm.py) under THP `always`, and
samples for 10 s after the free: VmRSS, AnonHugePages, the allocator's resident bytes (memshim-ctl stats) and
the kernel's THP counters (/proc/vmstat: thp_fault_alloc, thp_collapse_alloc, thp_split_pmd, ...), in cases
that take one suspect away at a time.

  python3 bench/thp_idle_study.py [--kernel newest] [--cases default,nokhugepaged,...] [--seconds 10.5]"""

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchlib import vm  # noqa: E402
from benchlib.configs import ROOT, SHIM  # noqa: E402

CTL = os.path.join(ROOT, "target", "release", "memshim-ctl")
EXE = os.path.join(ROOT, "bench", "out", "idle_heap")
KH = "/sys/kernel/mm/transparent_hugepage/khugepaged/"
# case: (THP mode, khugepaged settings, shim environment)
CASES = {
    "default": ("always", {}, {}),
    "nokhugepaged": ("always", {"scan_sleep_millisecs": "3600000", "alloc_sleep_millisecs": "3600000"}, {}),
    "max_ptes_none0": ("always", {"max_ptes_none": "0"}, {}),
    "thp_never": ("always", {}, {"MEMSHIM_MALLOC_CONF": "thp:never"}),
    "madvise": ("madvise", {}, {}),
}
VMSTAT = ("thp_fault_alloc", "thp_collapse_alloc", "thp_split_pmd", "thp_deferred_split_page", "thp_split_page",
          "thp_fault_fallback")
SAMPLES = (0, 0.25, 0.5, 1, 2, 3, 4, 5, 6, 8, 10)  # then every 5 s up to --seconds


def vmstat():
    d = dict(line.split() for line in open("/proc/vmstat"))
    return {k: int(d.get(k, 0)) for k in VMSTAT}


def status(pid):
    rss = ahp = 0
    for line in open(f"/proc/{pid}/smaps_rollup"):
        if line.startswith("Rss:"):
            rss = int(line.split()[1])
        elif line.startswith("AnonHugePages:"):
            ahp = int(line.split()[1])
    return rss // 1024, ahp // 1024


def resident(pid):
    o = subprocess.run([CTL, "stats", str(pid), "--json"], capture_output=True, text=True,
                       env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"})
    try:
        a = json.loads(o.stdout)["allocator"]
        return a.get("resident", 0) >> 20, a.get("dirty", 0) >> 20
    except (ValueError, KeyError):
        return None, None


def top_vmas(pid, n=6):
    """The VMAs with the most RSS: (range, size MiB, Rss MiB, AnonHugePages MiB)."""
    out, cur = [], None
    for line in open(f"/proc/{pid}/smaps"):
        f = line.split()
        if "-" in f[0] and ":" not in f[0]:
            lo, hi = (int(x, 16) for x in f[0].split("-"))
            cur = [f[0] + (" " + f[5] if len(f) > 5 else ""), (hi - lo) >> 20, 0, 0]
            out.append(cur)
        elif f[0] == "Rss:":
            cur[2] = int(f[1]) >> 10
        elif f[0] == "AnonHugePages:":
            cur[3] = int(f[1]) >> 10
    return sorted(out, key=lambda v: -v[2])[:n]


KH_DEFAULTS = {}


def guest_case(name, seconds):
    thp, kh, env = CASES[name]
    with open("/sys/kernel/mm/transparent_hugepage/enabled", "w") as f:
        f.write(thp)
    if not KH_DEFAULTS:  # the kernel's, read before the first case changes them
        KH_DEFAULTS.update({k: open(KH + k).read().strip() for k in ("scan_sleep_millisecs",
                                                                   "alloc_sleep_millisecs", "max_ptes_none")})
    defaults = KH_DEFAULTS
    for k, v in dict(defaults, **kh).items():
        with open(KH + k, "w") as f:
            f.write(v)
    e = {k: v for k, v in os.environ.items() if not k.startswith(("MEMSHIM_", "MALLOC_"))}
    e.update(LD_PRELOAD=SHIM, **env)
    p = subprocess.Popen([EXE, "512"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=e, text=True)
    p.stdout.readline()
    base = status(p.pid)
    p.stdin.write("alloc\n")
    p.stdin.flush()
    p.stdout.readline()
    peak = status(p.pid)
    v0 = vmstat()
    p.stdin.write("free\n")
    p.stdin.flush()
    p.stdout.readline()
    t0 = time.monotonic()
    rows = []
    for s in [x for x in SAMPLES if x < seconds] + list(range(15, int(seconds) + 1, 5)):
        time.sleep(max(0.0, t0 + s - time.monotonic()))
        t = time.monotonic() - t0
        rss, ahp = status(p.pid)
        res, dirty = resident(p.pid)
        v = vmstat()
        rows.append({"t": round(t, 2), "rss": rss, "ahp": ahp, "resident": res, "dirty": dirty,
                     **{k: v[k] - v0[k] for k in VMSTAT}})
    vmas = top_vmas(p.pid)
    p.stdin.close()
    p.wait()
    return {"case": name, "thp": thp, "khugepaged": dict(defaults, **kh), "env": env, "base": base, "peak": peak,
            "rows": rows, "vmas": vmas}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernel", default="newest")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--seconds", type=float, default=10.5, help="how long to sample after the free")
    ap.add_argument("--guest", action="store_true")
    a = ap.parse_args()
    cases = [c for c in a.cases.split(",") if c]
    if a.guest:
        for c in cases:
            print(json.dumps(guest_case(c, a.seconds)), flush=True)
        return 0
    kdir, why = vm.kernel(a.kernel)
    if kdir is None:
        print(f"SKIP: {why}")
        return 0
    os.makedirs(os.path.dirname(EXE), exist_ok=True)
    subprocess.run(["gcc", "-O2", "-pthread", "-o", EXE, os.path.join(ROOT, "tests", "fixtures", "idle_heap.c")],
                   check=True)
    r = vm.run(kdir, [sys.executable, os.path.abspath(__file__), "--guest", "--cases", ",".join(cases),
                         "--seconds", str(a.seconds)],
               vcpus=1, mem_mib=1536, thp="always", timeout=1200)
    print(f"# kernel {why}, 1 vCPU, {r['accel']}; exit {r['code']}", file=sys.stderr)
    sys.stderr.write(r["stderr"][-2000:])
    for line in r["stdout"].splitlines():
        if not line.startswith("{"):
            continue
        c = json.loads(line)
        print(f"\n## {c['case']}: THP {c['thp']}, khugepaged {c['khugepaged']}, env {c['env']}")
        print(f"baseline RSS {c['base'][0]} MiB, peak {c['peak'][0]} MiB ({c['peak'][1]} MiB in huge pages)")
        print("t s | RSS-base MiB | AnonHuge MiB | jemalloc resident/dirty MiB | " + " | ".join(VMSTAT))
        for w in c["rows"]:
            print(f"{w['t']} | {w['rss'] - c['base'][0]} | {w['ahp']} | {w['resident']}/{w['dirty']} | "
                  + " | ".join(str(w[k]) for k in VMSTAT))
        print("top VMAs at the end (range, size, Rss, AnonHugePages MiB):", c["vmas"])
    return r["code"]


if __name__ == "__main__":
    sys.exit(main())
