"""Run CPython's own regression tests without the shim and under it, and
compare the failures (docs/reliability.md, "CPython's test suite").

    python3.11 regrtest_compare.py --shim target/release/libmemshim.so \
        --modes base,on,off --jobs 2 test_gc test_threading ...

Modes: `base` (no LD_PRELOAD), `on` (MEMSHIM_CONTROL=on: the shim's thread
and control socket in every process), `off` (MEMSHIM_CONTROL=off), `auto`
(the default), `ptrace` (no LD_PRELOAD, and every second `memshim-ctl
release PID` (--ctl) on every process of the run, by ptrace: docs/attach.md;
the JSON counts those releases by exit code), `attach` (no LD_PRELOAD, and
every second `memshim-ctl attach PID --idle-return` then `release PID`, over
the attached bridge's socket, on every process of the run: the bridge
stays in each process from its first second on). Every mode runs `python -m test` on the same modules; a
failing test case (`FAIL:`/`ERROR:` line, or a module that crashed or timed
out) that fails under the shim but not in `base` is re-run alone, twice,
in both modes; it counts as a new failure only if it fails again under the
shim and passes without it. Prints one JSON document on stdout.
"""

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import threading
import time

# Differences that are the documented cost of a mode, not bugs: reported
# as "expected", never as new failures. Keep this list short and explained.
# (It is empty: test_subprocess.test_pass_fds_redirected, which lists every
# descriptor of a fresh child, was here until the shim's thread kept its
# descriptors in a table of its own.)
EXPECTED = {}

CASE = re.compile(r"^(FAIL|ERROR): (\S+) \((\S+?)\)", re.M)
# "test_x failed", "test_x crashed (Exit code -9)", "test_x timed out", ...
# (test_asyncio.test_events: a module of a test package)
MODULE = re.compile(r"^\S.*?\[[ \d/]+\] (test_[\w.]+) (failed|crashed|timed out|.*?env changed)", re.M)
TOTAL = re.compile(r"Total tests: run=([\d,]+)")


def env_for(mode, shim):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSHIM_")}
    env.pop("LD_PRELOAD", None)
    if mode not in ("base", "ptrace", "attach"):
        env["LD_PRELOAD"] = shim
        env["MEMSHIM_CONTROL"] = mode
    return env


def descendants(pid):
    """The processes below `pid` now."""
    children = collections.defaultdict(list)
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children[ppid].append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


class Releaser(threading.Thread):
    """Every second, `memshim-ctl release PID` on the run's process and all
    its descendants; counts the exit codes."""

    def __init__(self, ctl, pid, attach=False):
        super().__init__(daemon=True)
        self.ctl, self.pid, self.done = ctl, pid, threading.Event()
        self.attach = attach
        self.codes = collections.Counter()
        self.attached = collections.Counter()
        self.refusals = []

    def run(self):
        while not self.done.wait(1.0):
            for pid in [self.pid] + descendants(self.pid):
                if self.attach:
                    r = subprocess.run([self.ctl, "attach", str(pid), "--idle-return"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                    self.attached[r.returncode] += 1
                    # What refused, other than a process that went (3) or
                    # never idled (21): a few, for the report.
                    if r.returncode not in (0, 3, 21) and len(self.refusals) < 5:
                        self.refusals.append(r.stderr.strip())
                r = subprocess.run([self.ctl, "release", str(pid)], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
                self.codes[r.returncode] += 1


CTL = None


def run_regrtest(mode, shim, modules, jobs, timeout, extra=()):
    # -W: print the unittest output of a failed module, so FAIL:/ERROR: lines
    # name the failing cases even with -j.
    cmd = [sys.executable, "-m", "test", f"-j{jobs}", "-W", f"--timeout={timeout}", *extra, *modules]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, env=env_for(mode, shim), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, errors="replace")
    releaser = None
    if mode in ("ptrace", "attach"):
        releaser = Releaser(CTL, p.pid, attach=mode == "attach")
        releaser.start()
    try:
        out, _ = p.communicate(timeout=timeout * max(1, len(modules)) + 120)
    finally:
        if releaser:
            releaser.done.set()
            releaser.join()
    # 3.11 prints "FAIL: test_y (test.test_x.Class.test_y)": keep the full id.
    cases = {m.group(3) for m in CASE.finditer(out)}
    mods = {m.group(1) for m in MODULE.finditer(out) if "env changed" not in m.group(2)}
    # A module that failed without a FAIL/ERROR case line (crash, timeout,
    # failure in setUpModule) is recorded as the module itself.
    with_cases = {c.split(".")[1] if c.startswith("test.") else c.split(".")[0] for c in cases}
    for m in mods:
        if m not in with_cases:
            cases.add(m)
    total = TOTAL.search(out)
    r = {
        "mode": mode,
        "rc": p.returncode,
        "seconds": round(time.monotonic() - t0, 1),
        "tests_run": int(total.group(1).replace(",", "")) if total else 0,
        "failures": sorted(cases),
        "tail": out[-6000:],
    }
    if releaser:
        r["releases"] = {str(k): v for k, v in sorted(releaser.codes.items())}
        if releaser.attach:
            r["attaches"] = {str(k): v for k, v in sorted(releaser.attached.items())}
            r["attach_refusals"] = releaser.refusals
    return r


def case_fails(mode, shim, case, timeout):
    """Re-runs one case (or a whole module) alone; True if it fails."""
    if "." in case:
        # test.test_x.Class.test_y: module test_x, only that case.
        parts = case.split(".")
        module = parts[1] if parts[0] == "test" else parts[0]
        extra, modules = ["-m", case], [module]
    else:
        extra, modules = [], [case]
    r = run_regrtest(mode, shim, modules, 0, timeout, extra)
    # 0: passed, 4: nothing matched (not a failure); anything else failed.
    return r["rc"] not in (0, 4)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shim", required=True)
    ap.add_argument("--ctl", help="memshim-ctl, for the ptrace mode")
    ap.add_argument("--modes", default="base,on,off")
    ap.add_argument("--jobs", type=int, default=2)
    # Per-module limit of regrtest: a hang (like the pthread_exit bug this
    # suite found, a 300 s stall) becomes a "timed out" failure.
    ap.add_argument("--timeout", type=int, default=120)
    ap.add_argument("modules", nargs="+")
    a = ap.parse_args()
    modes = a.modes.split(",")
    assert modes[0] == "base", "the first mode must be base"
    global CTL
    CTL = a.ctl
    assert CTL or not {"ptrace", "attach"} & set(modes), "the ptrace and attach modes need --ctl"
    runs = {m: run_regrtest(m, a.shim, a.modules, a.jobs, a.timeout) for m in modes}
    base = set(runs["base"]["failures"])
    report = {"python": sys.version.split()[0], "modules": a.modules, "runs": [], "new_failures": []}
    for m in modes:
        r = runs[m]
        suspects = sorted(set(r["failures"]) - base) if m != "base" else []
        expected = [c for c in suspects if c in EXPECTED.get(m, {})]
        suspects = [c for c in suspects if c not in expected]
        confirmed, flaky = [], []
        for case in suspects:
            fails_shim = all(case_fails(m, a.shim, case, a.timeout) for _ in range(2))
            fails_base = case_fails("base", a.shim, case, a.timeout)
            (confirmed if fails_shim and not fails_base else flaky).append(case)
        report["runs"].append({
            "mode": m, "rc": r["rc"], "seconds": r["seconds"], "tests_run": r["tests_run"],
            "releases": r.get("releases"), "attaches": r.get("attaches"),
            "attach_refusals": r.get("attach_refusals"),
            "failures": r["failures"], "new_failures": confirmed, "not_reproduced": flaky,
            "expected": {c: EXPECTED[m][c] for c in expected},
            # A run that failed without naming a case or a module: its
            # output, to be read (the test prints it).
            "unexplained": r["tail"] if r["rc"] not in (0, runs["base"]["rc"]) and not r["failures"] else "",
            "tail": r["tail"] if confirmed else "",
        })
        report["new_failures"] += [f"{m}: {c}" for c in confirmed]
    json.dump(report, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
