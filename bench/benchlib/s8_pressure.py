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

Needs root and a writable memory controller; reports "skipped" otherwise.

Then the A/B again on live cgroup v2, inside the tests' VM (bench/benchlib/vm.py; params "v2"): under
`memory.max`, and under `memory.high` with `memory.max` twice it (Kubernetes memory QoS), where B is throttled
rather than anyone killed and what counts is B's load time and the cgroup's `high` events. The harness boots
the VM and runs this module in it (`python3 -m benchlib.s8_pressure --guest PARAMS`), which prints its results
as one JSON line. Where QEMU or a kernel is missing (scripts/vm-image.sh, `make test-deps`), it says SKIP and
the host's part stands alone."""

import json
import os
import subprocess
import sys
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
        return self.event("oom_kill")

    def event(self, key):
        """A count of memory.events (v2) or memory.oom_control (v1: oom_kill)."""
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        for line in open(os.path.join(self.dir, name)):
            if line.startswith(key + " "):
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


def ab_once(h, exes, cfg, env, p, tag, high=False):
    """One A/B run. With `high` (v2), the limit is memory.high, and memory.max is twice it (Kubernetes memory
    QoS: the kubelet sets high below the limit): B is throttled rather than A killed, and what is measured is
    how long B takes to load and how many `high` events the cgroup counts."""
    limit = p["limit_mib"] * MIB
    threshold = limit * 90 // 100
    cg = Cgroup(h, tag, 2 * limit if high else limit)
    if high:
        cg.write("memory.high", limit)
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
        b = cg.start([exes["pressure_load"], str(p["b_mib"]), str(p.get("step_mib", 8)), str(p.get("step_ms", 20))],
                     by_name()["glibc"].environ(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        t0 = time.perf_counter()
        onset = dropped = None
        peak = 0
        while b.poll() is None:
            now = time.perf_counter() - t0
            u = cg.usage()
            peak = max(peak, u)
            if onset is None and u >= threshold:
                onset = now
            r = rss(a.pid)
            if dropped is None and r is not None and before and r <= before - freed // 2:
                dropped = now
            time.sleep(p.get("poll_s", 0.0002))
        out = b.stdout.read()
        b_ok = b.returncode == 0 and "loaded" in out
        load_ms = next((float(line.split()[3]) for line in out.splitlines() if line.startswith("loaded ")), None)
        time.sleep(0.3)
        alive = a.poll() is None
        res = {"b_ok": b_ok, "a_alive": alive, "oom": cg.oom_kills(), "before": before, "peak_pct": peak * 100 / limit,
               "after": rss(a.pid) if alive else None,
               # A's RSS also "drops" when the OOM killer ends it: timed only where A lived.
               "onset_to_drop_ms": (dropped - onset) * 1000 if alive and onset is not None and dropped is not None
               and dropped >= onset else None,
               "last_purge_ms": shim_pressure(a.pid).get("last_purge_ms") if alive and cfg.name == "memshim"
               else None,
               "b_load_ms": load_ms if b_ok else None, "high_events": cg.event("high") if high else None}
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


AB_HEADERS = ["configuration", "B finished", "A alive", "OOM kills", "A RSS before (MiB)", "A RSS after (MiB)",
              "peak usage (% of limit)", "onset → A's RSS drop (ms)", "shim: signal → purge done (ms)"]


def ab_rows(results, high=False):
    rows = []
    for name, rs in results.items():
        n = len(rs)
        row = [name, f"{sum(r['b_ok'] for r in rs)}/{n}", f"{sum(r['a_alive'] for r in rs)}/{n}",
               str(sum(r["oom"] for r in rs))]
        if high:
            row += [fmt(median([r["b_load_ms"] / 1000 for r in rs if r.get("b_load_ms") is not None])),
                    fmt(median([r["high_events"] for r in rs if r.get("high_events") is not None]))]
        rows.append(row + [fmt(median([r["before"] / MIB for r in rs if r["before"]])),
                           fmt(median([r["after"] / MIB for r in rs if r["after"]])),
                           fmt(median([r["peak_pct"] for r in rs if r.get("peak_pct") is not None])),
                           fmt(median([r["onset_to_drop_ms"] for r in rs])),
                           fmt(median([r["last_purge_ms"] for r in rs]))])
    return rows


def run_ab(h, exes, configs, p, reps, log, high=False):
    results = {n: [] for n, _, _ in configs}
    for rep in range(reps):
        for i, (name, cfg, env) in enumerate(configs):
            log(f"  A/B{' (memory.high)' if high else ''} {name} (rep {rep + 1})")
            results[name].append(ab_once(h, exes, cfg, env, p, f"{'high' if high else 'ab'}{i}", high))
    return results


def describe(p, reps, limit="Limit"):
    return (f"{limit} {p['limit_mib']} MiB, no swap; A: {p['a_mib']} MiB heap in 16..512 KiB blocks, every other "
            f"block freed, 60 s decay; B: {p['b_mib']} MiB in {p.get('step_mib', 8)} MiB steps, "
            f"{p.get('step_ms', 20)} ms apart. {reps} run(s) per configuration; medians.")


def run(ctx):
    p = ctx.p.get("s8", {})
    if not os.path.exists(SHIM):
        return {"md": "skipped: no libmemshim.so"}
    h = hierarchy()
    why = None
    if h is None:
        why = "needs root and a writable memory cgroup controller"
    else:
        try:
            Cgroup(h, "probe", 64 * MIB).remove()
        except OSError as e:
            why = f"cannot make a limited memory cgroup ({e})"
    exes = build()
    res = {}
    md = []
    if why:
        ctx.log(f"SKIP: scenario 8 on this machine: {why}")
        md += [f"On this machine: skipped: {why}.", ""]
    else:
        configs = [c for c in ab_configs() if not p.get("configs") or c[0] in p["configs"]]
        results = run_ab(h, exes, configs, p, p.get("reps", 1), ctx.log)
        md += [f"### On this machine (cgroup v{h[0]}, `memory.{'limit_in_bytes' if h[0] == 1 else 'max'}`)", "",
               describe(p, p.get("reps", 1)), "", table(AB_HEADERS, ab_rows(results)), ""]
        idle = idle_cost(h, exes, p.get("idle_seconds", 60))
        md += [f"Cost of watching, idle ({p.get('idle_seconds', 60)} s, 512 MiB limit, default decay 1 s; CPU "
               "time of all the process's threads, main thread asleep):", "",
               table(["memshim", "CPU ms per hour idle", "shim thread wake-ups/s"],
                     [[n, fmt(c), fmt(w)] for n, c, w in idle]), ""]
        res.update(ab=results, idle=idle)
    if p.get("v2"):
        v2md, v2 = run_v2(ctx, p["v2"], exes, p)
        md += v2md
        res["v2"] = v2
    res["md"] = "\n".join(md)
    return res


# --- cgroup v2, live, in the tests' VM ------------------------------------------------------------------

V2_NOTE = (
    "The same A/B on live **cgroup v2**, in the tests' QEMU VM (bench/benchlib/vm.py; tests/vm/README.md): "
    "Debian's kernel, this machine's root read-only over 9p (the same library, fixtures and harness code), "
    "cgroup2 with `nsdelegate,memory_recursiveprot`, THP `madvise`. Under software emulation (TCG) code runs "
    "5 to 50 times slower than here, so the scenario is smaller (the pressure tests' sizes, "
    "tests/tests/cgroup/pressure.rs), B loads in smaller steps further apart ({steps} steps, {window} ms, from "
    "the threshold to the limit for A's thread to wake and purge at emulated speed, against {host_steps} "
    "steps, {host_window} ms, here), usage and A's RSS are polled every {poll_ms} ms instead of every 0.2 ms, "
    "and there are fewer repetitions. Compare the rows with each other, not the times with the host's.")


def window(p):
    """B's steps from 90 % of the limit to the limit, and the milliseconds they take."""
    steps = p["limit_mib"] / 10 / p.get("step_mib", 8)
    return f"{steps:.0f}", f"{steps * p.get('step_ms', 20):.0f}"


def run_v2(ctx, p, exes, host_p):
    """Scenario 8's A/B under memory.max and memory.high inside a VM on cgroup v2: (markdown lines, results)."""
    from . import vm
    kdir, kver = vm.kernel(p.get("kernel", "newest"))
    if kdir is None:
        ctx.log(f"SKIP: scenario 8 on cgroup v2: {kver}")
        return [f"### On cgroup v2 (VM)", "", f"SKIP: {kver}", ""], None
    if not os.path.exists(CTL):
        ctx.log(f"SKIP: scenario 8 on cgroup v2: no {CTL}")
        return [f"### On cgroup v2 (VM)", "", f"SKIP: no {os.path.relpath(CTL, ROOT)} (`make`)", ""], None
    ctx.log(f"  cgroup v2: booting {kver} ({p.get('vcpus', 2)} vCPUs) for the A/B")
    r = vm.run(kdir, [sys.executable, "-m", "benchlib.s8_pressure", "--guest", json.dumps(p)],
               cwd=os.path.join(ROOT, "bench"), vcpus=p.get("vcpus", 2), mem_mib=p.get("mem_mib", 1536),
               thp=p.get("thp", "madvise"), timeout=p.get("timeout_s", 1200))
    lines = [ln for ln in r["stdout"].splitlines() if ln.startswith("{")]
    if r["code"] != 0 or not lines:
        raise RuntimeError(f"scenario 8 in the VM exited {r['code']}: {r['stderr'][-2000:]}")
    v2 = json.loads(lines[-1])
    ctx.log(f"  cgroup v2: boot {r['boot_s']:.1f} s, A/B {r['run_s']:.0f} s ({r['accel']})")
    maxp = dict(p, **p.get("max", {}))
    highp = dict(p, **p.get("high", {}))
    md = [f"### On cgroup v2 (VM: kernel {v2['kernel']}, {r['vcpus']} vCPUs, {r['accel'].upper()}, "
          f"THP {v2['thp']})", "",
          V2_NOTE.format(poll_ms=fmt(p.get("poll_s", 0.001) * 1000), steps=window(p)[0], window=window(p)[1],
                         host_steps=window(host_p)[0], host_window=window(host_p)[1]), "",
          "Under `memory.max`: " + describe(maxp, maxp.get("reps", 1)), "",
          table(AB_HEADERS, ab_rows(v2["max"])), "",
          "Under `memory.high` (`memory.max` twice it): the kernel throttles whoever allocates over `high` "
          "(reclaim finds nothing to take without swap), so B is slowed, not killed: how long B takes to load, "
          "and the cgroup's `high` events. " + describe(highp, highp.get("reps", 1), "memory.high"), "",
          table(AB_HEADERS[:4] + ["B's load time (s)", "`high` events"] + AB_HEADERS[4:],
                ab_rows(v2["high"], high=True)), "",
          f"VM boot {r['boot_s']:.0f} s, A/B runs {r['run_s']:.0f} s. \"onset\": usage over 90 % of the limit "
          "(of `memory.high` in the second table), as seen by the poller; \"–\" where A's RSS fell before the "
          "poller saw usage cross it (the shim's watcher acted first), or where A did not live. \"shim: signal → "
          "purge done\": the shim's own `pressure.last_purge_ms`.", ""]
    return md, v2


def guest(p):
    """In the VM: the A/B under memory.max and under memory.high; one JSON line on stdout."""
    h = hierarchy()
    assert h and h[0] == 2, f"no writable cgroup v2 memory controller in the VM: {h}"
    exes = build()
    configs = ab_configs()
    out = {"kernel": os.uname().release,
           "thp": open("/sys/kernel/mm/transparent_hugepage/enabled").read().split("[")[1].split("]")[0]}
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    for kind in ("max", "high"):
        q = dict(p, **p.get(kind, {}))
        cs = [c for c in configs if c[0] in q["configs"]]
        out[kind] = run_ab(h, exes, cs, q, q.get("reps", 1), log, high=kind == "high")
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--guest"]:
        guest(json.loads(sys.argv[2]))
