#!/usr/bin/env python3
"""Reaching a CPython started without the preload (issue 46): memshim-ctl's roads (ptrace, attach) against gdb.

  python3 bench/attach.py [--runs N] [--only 3.11,3.14] [--no-gdb]

For each CPython (pyenv's 3.8 to 3.13 under ~/.pyenv/versions, Debian sid's 3.13 to 3.15 in the
root scripts/test-deps.sh builds, where it exists) the fixture tests/fixtures/py_unshimmed.py
makes garbage (reference cycles, its collector off) and free glibc heap, then waits in a `read`
of stdin (an idle server's main thread). Each road runs on a fresh process of its own:

  in-process      the fixture's own gc.collect(); malloc_trim(0): the figure to reach
  memshim-ctl     `release PID` (gc.collect(), torch's caches, malloc_trim(0)) by ptrace, then
                  N x `stats PID --json` and N x `release PID --json`: round trips, median and p95
  memshim-ctl attach  `attach PID` (the first command's time), then the first `release PID`
                  (the RSS kept) and N x `stats`/`release` over the attached bridge's socket,
                  no ptrace; `detach PID` before the target goes on
  gdb trim        `gdb -p PID -batch -ex 'call (int)malloc_trim(0)'`: what users run by hand
  gdb gc+trim     gdb calling PyGILState_Ensure, PyRun_SimpleString("import gc; gc.collect()"),
                  PyGILState_Release and malloc_trim(0)
  ..., sysroot    where the target sees another root (sid's chroot, as a container would): the
                  same with `set sysroot /proc/PID/root`, gdb's way to read the target's own files

Columns: the wall time of one command (ms; gdb's includes reading the symbols), the RSS the
process keeps after the first one (MiB), that RSS against the in-process figure (1.00: as much
given back), and whether the target survived unchanged: it then reads its line, prints its
"after" line with that line and no garbage left where gc ran, exits 5 with an empty stderr.
Stdlib only; needs root (ptrace of another process, the sid root's chroot) and gdb for its rows."""

import argparse
import glob
import os
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from benchlib import sidroot  # noqa: E402

CTL = os.environ.get("BENCH_CTL") or os.path.join(ROOT, "target", "release", "memshim-ctl")
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "py_unshimmed.py")
MIB = 1 << 20


def cpythons(only):
    out = []
    for exe in sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.*/bin/python3.*"))):
        if exe.endswith("-config"):
            continue
        minor = os.path.basename(exe)[len("python"):]
        if minor in ("3.6", "3.7") or not minor.replace(".", "").isdigit():
            continue
        ver = os.path.basename(os.path.dirname(os.path.dirname(exe)))
        out.append((minor, f"{ver} (pyenv)", [exe]))
    out.sort(key=lambda c: tuple(int(x) for x in c[0].split(".")))
    sid, why = sidroot.interpreters()
    for label, argv in sid:
        out.append((".".join(label.split()[0].split(".")[:2]), label, argv))
    if not sid:
        print(f"note: no sid CPythons: {why}", file=sys.stderr)
    return [c for c in out if not only or c[0] in only]


def rss(pid):
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def in_process(argv):
    out = subprocess.run(argv + [FIXTURE, "inproc", "0"], capture_output=True, text=True, timeout=120).stdout
    return int(out.split("rss=")[1].split()[0])


class Target:
    """The fixture, waiting in a read of stdin."""

    def __init__(self, argv):
        self.p = subprocess.Popen(argv + [FIXTURE, "read", "0"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.p.stdout.readline()
        self.pid = int(line.split("pid=")[1])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # in its read, asleep in the kernel
            with open(f"/proc/{self.pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "S":
                    break
            time.sleep(0.01)

    def survived(self, gc_ran):
        """It reads its line and ends as it would have."""
        try:
            out, err = self.p.communicate("hello\n", timeout=30)
        except (subprocess.TimeoutExpired, BrokenPipeError):
            self.p.kill()
            self.p.wait()
            return "hung"
        ok = self.p.returncode == 5 and err == "" and "got=hello" in out
        if ok and gc_ran and "garbage=0" not in out:
            return "garbage left"
        return "yes" if ok else f"no (exit {self.p.returncode}, stderr {len(err)} B)"


def timed(argv):
    t = time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    return (time.monotonic() - t) * 1000, r


def pct(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def memshim_road(argv, runs):
    t = Target(argv)
    ms, r = timed([CTL, "release", str(t.pid)])
    ok = r.returncode == 0
    kept = rss(t.pid)
    stats = [timed([CTL, "stats", str(t.pid), "--json"])[0] for _ in range(runs)]
    rel = [timed([CTL, "release", str(t.pid), "--json"])[0] for _ in range(runs)]
    alive = t.survived(True) if ok else f"no (release exit {r.returncode}: {r.stderr.strip()[:80]})"
    return {"first_ms": ms, "kept": kept, "stats": stats, "release": rel, "survived": alive}


def attached_road(argv, runs):
    """`attach PID` (the first command), then the first `release` and the
    round trips over the bridge's socket, no ptrace; `detach` before the
    target goes on."""
    t = Target(argv)
    ms, r = timed([CTL, "attach", str(t.pid)])
    if r.returncode != 0:
        t.survived(False)
        return {"first_ms": ms, "kept": None, "survived": f"no (attach exit {r.returncode})"}
    _, r = timed([CTL, "release", str(t.pid)])
    ok = r.returncode == 0
    kept = rss(t.pid)
    stats = [timed([CTL, "stats", str(t.pid), "--json"])[0] for _ in range(runs)]
    rel = [timed([CTL, "release", str(t.pid), "--json"])[0] for _ in range(runs)]
    d = timed([CTL, "detach", str(t.pid)])[1].returncode
    alive = t.survived(True) if ok and d == 0 else f"no (release exit {r.returncode}, detach exit {d})"
    return {"first_ms": ms, "kept": kept, "stats": stats, "release": rel, "survived": alive}


GDB_GC = ["-ex", "call (int)PyGILState_Ensure()",
          "-ex", "call (int)PyRun_SimpleString(\"import gc; gc.collect()\")",
          "-ex", "call (void)PyGILState_Release($1)"]


def other_root(pid):
    """The process sees another root than ours (a container, the sid root's chroot)."""
    return os.stat(f"/proc/{pid}/root") != os.stat("/")


def gdb_road(argv, with_gc, sysroot=False):
    t = Target(argv)
    where = ["-iex", f"set sysroot /proc/{t.pid}/root"] if sysroot else []
    cmd = ["gdb", "-nx", "-q"] + where + ["-p", str(t.pid), "-batch"] + (GDB_GC if with_gc else []) + \
        ["-ex", "call (int)malloc_trim(0)"]
    ms, r = timed(cmd)
    kept = rss(t.pid) if os.path.exists(f"/proc/{t.pid}") else None
    return {"first_ms": ms, "kept": kept, "survived": t.survived(with_gc)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--only", default="")
    ap.add_argument("--no-gdb", action="store_true")
    a = ap.parse_args()
    gdb = shutil.which("gdb") and not a.no_gdb
    only = [m for m in a.only.split(",") if m]
    rows = []
    for minor, label, argv in cpythons(only):
        base = in_process(argv)
        m = memshim_road(argv, a.runs)
        rows.append((label, "memshim-ctl (ptrace)", m, base))
        rows.append((label, "memshim-ctl attach (socket)", attached_road(argv, a.runs), base))
        if gdb:
            rows.append((label, "gdb trim", gdb_road(argv, False), base))
            rows.append((label, "gdb gc+trim", gdb_road(argv, True), base))
            probe = Target(argv)
            if other_root(probe.pid):
                # As run from the host into a container: told where the target's files are.
                rows.append((label, "gdb trim, sysroot /proc/PID/root", gdb_road(argv, False, True), base))
                rows.append((label, "gdb gc+trim, sysroot /proc/PID/root", gdb_road(argv, True, True), base))
            probe.survived(False)
        print(f"{label}: done", file=sys.stderr)
    print(f"In-process figure: the fixture's own gc.collect(); malloc_trim(0). {a.runs} round trips "
          "per figure for memshim-ctl; gdb once per process.\n")
    print("| CPython | road | first command ms | stats ms median / p95 | release ms median / p95 "
          "| RSS kept MiB | against in-process | survived unchanged |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for label, road, r, base in rows:
        mp = (lambda v: f"{statistics.median(v):.0f} / {pct(v, 0.95):.0f}") if "stats" in r else (lambda v: "-")
        kept = "-" if r["kept"] is None else f"{r['kept'] / MIB:.1f}"
        ratio = "-" if r["kept"] is None else f"{r['kept'] / base:.2f}"
        print(f"| {label} | {road} | {r['first_ms']:.0f} | {mp(r.get('stats'))} | {mp(r.get('release'))} "
              f"| {kept} | {ratio} (in-process {base / MIB:.1f}) | {r['survived']} |")


if __name__ == "__main__":
    main()
