"""Scenario 8: memory pressure in a limited cgroup (issue 13; docs/design.md, "Memory comes back
under pressure").

A v1 (or v2) memory cgroup made here, limited, without swap. Process A (tests/fixtures/control_heap.c,
shared with the tests) allocates a heap in blocks of 16..512 KiB, frees every other block and idles
with a 60 s decay (jemalloc: MALLOC_CONF=dirty_decay_ms:60000; memshim: MEMSHIM_DIRTY_DECAY_MS=60000);
process B (tests/fixtures/pressure_load.c, no preload) then loads memory in 8 MiB steps, 20 ms apart,
more than the limit minus all of A's pages but less than the limit minus A's live memory. Reported per
configuration: whether B finished, whether A lived, OOM kills, A's RSS before and after, and the time
from the onset of pressure (the cgroup's usage crossing 90 % of the limit, polled here every ~0.2 ms)
to A's RSS falling by half of what it freed (polled likewise), with memshim's own figure from `stats`
(`pressure.last_purge_ms`: from its wake-up on the signal to the end of its purge).

Then the cost of watching: three idle shimmed processes in limited cgroups side by side (pressure on
with the kernel's notifications, pressure on with the 100 ms check only, pressure off); the CPU time
of all their threads (/proc/<pid>/task/*/schedstat) over the idle period, as ms per hour, and the
shim thread's wake-ups per second.

Needs root and a writable memory controller; reports "skipped" otherwise."""

import json
import os
import subprocess
import time

from .configs import ROOT, SHIM, by_name
from .context import table
from .stats import fmt, median

MIB = 1 << 20
FIX = os.path.join(ROOT, "tests", "fixtures")
OUT = os.path.join(ROOT, "bench", "out")
CTL = os.path.join(ROOT, "target", "release", "memshim-ctl")


def build():
    exes = {}
    for name, flags in (("control_heap", ["-pthread", "-ldl"]), ("pressure_load", [])):
        src, exe = os.path.join(FIX, f"{name}.c"), os.path.join(OUT, name)
        if not os.path.exists(exe) or os.path.getmtime(exe) < os.path.getmtime(src):
            subprocess.run(["gcc", "-O2", "-Wall", "-Wno-stringop-truncation", "-o", exe, src] + flags, check=True)
        exes[name] = exe
    return exes


def hierarchy():
    if os.geteuid() != 0:
        return None
    if os.path.exists("/sys/fs/cgroup/memory/memory.usage_in_bytes"):
        return 1, "/sys/fs/cgroup/memory"
    for m in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        try:
            if "memory" in open(os.path.join(m, "cgroup.subtree_control")).read().split():
                return 2, m
        except OSError:
            pass
    return None


class Cgroup:
    def __init__(self, h, tag, limit):
        self.version, mount = h
        self.dir = os.path.join(mount, f"memshim-bench-{os.getpid()}-{tag}")
        os.mkdir(self.dir)
        v1 = self.version == 1
        self.write("memory.limit_in_bytes" if v1 else "memory.max", limit)
        try:
            self.write("memory.swappiness" if v1 else "memory.swap.max", 0)
        except OSError:
            pass
        self.usage_file = os.path.join(self.dir, "memory.usage_in_bytes" if v1 else "memory.current")

    def write(self, name, v):
        with open(os.path.join(self.dir, name), "w") as f:
            f.write(str(v))

    def usage(self):
        with open(self.usage_file) as f:
            return int(f.read())

    def oom_kills(self):
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        for line in open(os.path.join(self.dir, name)):
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0

    def start(self, argv, env, **kw):
        procs = os.path.join(self.dir, "cgroup.procs")
        return subprocess.Popen(["sh", "-c", f"echo $$ > {procs} && exec \"$@\"", "sh"] + argv, env=env, **kw)

    def remove(self):
        procs = os.path.join(self.dir, "cgroup.procs")
        for _ in range(100):
            pids = open(procs).read().split()
            if not pids:
                break
            for p in pids:
                try:
                    os.kill(int(p), 9)
                except OSError:
                    pass
            time.sleep(0.05)
        for _ in range(50):
            try:
                os.rmdir(self.dir)
                return
            except OSError:
                time.sleep(0.1)


def rss(pid):
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * 4096
    except OSError:
        return None


def shim_pressure(pid):
    o = subprocess.run([CTL, "stats", str(pid), "--json"], capture_output=True, text=True,
                       env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"})
    try:
        return json.loads(o.stdout).get("pressure") or {}
    except ValueError:
        return {}


def ab_configs():
    c = by_name()
    decay = {"MEMSHIM_DIRTY_DECAY_MS": "60000"}
    rows = [("glibc", c["glibc"], {}),
            ("jemalloc", c["jemalloc"], {"MALLOC_CONF": "dirty_decay_ms:60000"}),
            ("memshim", c["memshim"], decay),
            ("memshim, check only", c["memshim"], dict(decay, MEMSHIM_FD_TABLE="shared")),
            ("memshim, MEMSHIM_PRESSURE=off", c["memshim"], dict(decay, MEMSHIM_PRESSURE="off"))]
    return [(n, cfg, env) for n, cfg, env in rows if not cfg.missing()]


def ab_once(h, exes, cfg, env, p, tag):
    limit = p["limit_mib"] * MIB
    threshold = limit * 90 // 100
    cg = Cgroup(h, tag, limit)
    try:
        a = cg.start([exes["control_heap"]], cfg.environ(env), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                     stderr=subprocess.DEVNULL, text=True)
        a.stdout.readline()  # started
        a.stdin.write(f"alloc {p['a_mib']}\n")
        a.stdin.flush()
        ready = a.stdout.readline().split()
        freed = int(ready[2].split("=")[1]) if len(ready) == 3 else 0
        time.sleep(1.0)  # the shim's thread has found the cgroup
        before = rss(a.pid)
        b = cg.start([exes["pressure_load"], str(p["b_mib"]), "8", "20"], by_name()["glibc"].environ(),
                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        t0 = time.perf_counter()
        onset = dropped = None
        while b.poll() is None:
            now = time.perf_counter() - t0
            if onset is None and cg.usage() >= threshold:
                onset = now
            r = rss(a.pid)
            if dropped is None and r is not None and before and r <= before - freed // 2:
                dropped = now
            time.sleep(0.0002)
        out = b.stdout.read()
        b_ok = b.returncode == 0 and "loaded" in out
        time.sleep(0.3)
        alive = a.poll() is None
        res = {"b_ok": b_ok, "a_alive": alive, "oom": cg.oom_kills(), "before": before,
               "after": rss(a.pid) if alive else None,
               # A's RSS also "drops" when the OOM killer ends it: timed only where A lived.
               "onset_to_drop_ms": (dropped - onset) * 1000 if alive and onset is not None and dropped is not None
               and dropped >= onset else None,
               "last_purge_ms": shim_pressure(a.pid).get("last_purge_ms") if alive and cfg.name == "memshim"
               else None}
        if alive:
            a.kill()
        a.wait()
        return res
    finally:
        cg.remove()


def cpu_ns(pid):
    total = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            total += int(open(f"/proc/{pid}/task/{t}/schedstat").read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


def shim_wakeups(pid):
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            if open(f"/proc/{pid}/task/{t}/comm").read().strip() == "memshim":
                for line in open(f"/proc/{pid}/task/{t}/status"):
                    if line.startswith("voluntary_ctxt_switches"):
                        return int(line.split()[1])
        except OSError:
            pass
    return None


def idle_cost(h, exes, seconds):
    shim = by_name()["memshim"]
    cases = [("pressure on (notifications + 1 s check)", {}),
             ("pressure on, check only (shared fd table: 100 ms check)", {"MEMSHIM_FD_TABLE": "shared"}),
             ("MEMSHIM_PRESSURE=off", {"MEMSHIM_PRESSURE": "off"})]
    running = []
    try:
        for i, (name, env) in enumerate(cases):
            cg = Cgroup(h, f"idle{i}", 512 * MIB)
            a = cg.start([exes["control_heap"]], shim.environ(env), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)
            a.stdout.readline()
            a.stdin.write("alloc 64\n")
            a.stdin.flush()
            a.stdout.readline()
            running.append((name, cg, a))
        time.sleep(3.0)  # the 1 s decay has returned the freed pages; the loops are idle
        start = [(cpu_ns(a.pid), shim_wakeups(a.pid)) for _, _, a in running]
        time.sleep(seconds)
        rows = []
        for (name, _, a), (c0, w0) in zip(running, start):
            c1, w1 = cpu_ns(a.pid), shim_wakeups(a.pid)
            rows.append((name, (c1 - c0) / seconds * 3600 / 1e6,
                         (w1 - w0) / seconds if w0 is not None and w1 is not None else None))
        return rows
    finally:
        for _, cg, a in running:
            a.kill()
            a.wait()
            cg.remove()


def run(ctx):
    p = ctx.p.get("s8", {})
    h = hierarchy()
    if h is None:
        return {"md": "skipped: needs root and a writable memory cgroup controller"}
    if not os.path.exists(SHIM):
        return {"md": "skipped: no libmemshim.so"}
    try:
        Cgroup(h, "probe", 64 * MIB).remove()
    except OSError as e:
        return {"md": f"skipped: cannot make a limited memory cgroup ({e})"}
    exes = build()
    configs = [c for c in ab_configs() if not p.get("configs") or c[0] in p["configs"]]
    results = {n: [] for n, _, _ in configs}
    for rep in range(p.get("reps", 1)):
        for i, (name, cfg, env) in enumerate(configs):
            ctx.log(f"  A/B {name} (rep {rep + 1})")
            results[name].append(ab_once(h, exes, cfg, env, p, f"ab{i}"))
    rows = []
    for name, rs in results.items():
        n = len(rs)
        rows.append([name, f"{sum(r['b_ok'] for r in rs)}/{n}", f"{sum(r['a_alive'] for r in rs)}/{n}",
                     str(sum(r["oom"] for r in rs)),
                     fmt(median([r["before"] / MIB for r in rs if r["before"]])),
                     fmt(median([r["after"] / MIB for r in rs if r["after"]])),
                     fmt(median([r["onset_to_drop_ms"] for r in rs])),
                     fmt(median([r["last_purge_ms"] for r in rs]))])
    md = [f"Limit {p['limit_mib']} MiB, no swap; A: {p['a_mib']} MiB heap in 16..512 KiB blocks, every other "
          f"block freed, 60 s decay; B: {p['b_mib']} MiB in 8 MiB steps, 20 ms apart. {p.get('reps', 1)} "
          "run(s) per configuration; medians.", "",
          table(["configuration", "B finished", "A alive", "OOM kills", "A RSS before (MiB)",
                 "A RSS after (MiB)", "onset → A's RSS drop (ms)", "shim: signal → purge done (ms)"], rows), ""]
    idle = idle_cost(h, exes, p.get("idle_seconds", 60))
    md += [f"Cost of watching, idle ({p.get('idle_seconds', 60)} s, 512 MiB limit, default decay 1 s; CPU time "
           "of all the process's threads, main thread asleep):", "",
           table(["memshim", "CPU ms per hour idle", "shim thread wake-ups/s"],
                 [[n, fmt(c), fmt(w)] for n, c, w in idle]), ""]
    return {"md": "\n".join(md), "ab": results, "idle": idle}
