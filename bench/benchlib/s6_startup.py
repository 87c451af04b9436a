"""Scenario 6: start-up cost per exec, with and without the preload.

Own timing rather than hyperfine so that configurations interleave at the
finest grain (A B A B ... per exec), which cancels the drift of a shared
machine: os.posix_spawn + wait4, wall clock per exec. wait4 also gives the
child's minor page faults, a figure a noisy machine cannot move (for the bash
loop it is the loop's total / the loop's length, bash's own faults included)."""

import os
import time

from .configs import competitors
from .context import table
from .stats import fmt, median, percentile


def spawn_wait(argv, env):
    """(wall seconds, minor page faults of the child and its waited-for children)."""
    t = time.perf_counter()
    pid = os.posix_spawn(argv[0], argv, env)
    _, status, ru = os.wait4(pid, 0)
    d = time.perf_counter() - t
    if status != 0:
        raise RuntimeError(f"{argv} exited with status {status}")
    return d, ru.ru_minflt


def run(ctx):
    p = ctx.p["s6"]
    configs = [c for c in ctx.configs if c.name in p["configs"]]
    # The wheels' builds (study configurations) join a run that names no configurations, where they are
    # built: the start-up table shows every build users preload.
    if not ctx.named_configs:
        configs += [c for c in competitors() if c.name in p.get("builds", ()) and not c.missing()]
    cases = [("/bin/true", ["/bin/true"], p["n_true"], 1),
             ("python3 -c pass", [ctx.python, "-c", "pass"], p["n_python"], 1),
             (f"bash loop of {p['loop']} /bin/true", ["/bin/bash", "-c", f"for i in $(seq {p['loop']}); do /bin/true; done"],
              p["n_loop"], p["loop"])]
    envs = {c.name: c.environ() for c in configs}
    for c in configs:
        spawn_wait(["/bin/true"], envs[c.name])  # warm the page cache
    res = {"per_exec_ms": {}}
    rows = []
    for label, argv, n, per in cases:
        ctx.log(f"s6 {label}: {n} × {len(configs)}")
        times = {c.name: [] for c in configs}
        faults = {c.name: [] for c in configs}
        for _ in range(n):
            for c in configs:
                d, flt = spawn_wait(argv, envs[c.name])
                times[c.name].append(d / per * 1000)
                faults[c.name].append(flt / per)
        base = median(times.get("glibc", []))
        base_f = median(faults.get("glibc", []))
        for c in configs:
            m, f = median(times[c.name]), median(faults[c.name])
            res["per_exec_ms"][(label, c.name)] = m
            rows.append([label, c.name, fmt(m), fmt(percentile(times[c.name], 90)),
                         "–" if base is None else f"{(m - base) * 1000:+.0f} µs", fmt(f),
                         "–" if base_f is None else f"{f - base_f:+.0f}"])
    res["cases"] = [c[0] for c in cases]
    res["md"] = (f"Wall time per exec in ms (median and p90 of {p['n_true']} / {p['n_python']} / {p['n_loop']} "
                 f"interleaved runs; for the bash loop, the loop's time / {p['loop']}). `python3` is the real "
                 f"binary `{ctx.python}`, not pyenv's shim script. Page faults: minor faults per exec (median), "
                 f"from wait4.\n\n" +
                 table(["command", "config", "median ms/exec", "p90 ms/exec", "vs glibc", "page faults",
                        "faults vs glibc"], rows))
    if any(c.name.startswith("memshim-wheel") for c in configs):
        res["md"] += (
            "\n\n`memshim-wheel` and `memshim-wheel217` are the wheels' builds of the same checkout (`make "
            "wheel`: zig), what pip users preload: the manylinux_2_34 wheel's library, which pip installs "
            "wherever glibc is 2.34 or newer, and the manylinux_2_17 one's, for older glibc. The 2.17 build's "
            "extra cost is the two libraries that glibc before 2.34 needs for the symbols it imports, "
            "`libpthread.so.0` and `libdl.so.2`: empty stubs from 2.34 on, but the loader still opens and maps "
            "them in every exec (about 19 system calls and 10 page faults; `python3 bench/execcost.py glibc "
            "target/release/libmemshim.so target/glibc2.34/x86_64-unknown-linux-gnu/release/libmemshim.so "
            "target/x86_64-unknown-linux-gnu/release/libmemshim.so` counts them). docs/design.md, "
            "\"Portability\", says why there are two wheels.")
    res["md"] += (
        "\n\nWhere the page faults of a `/bin/true` under memshim come from, section by section of the "
        "library, and what issue 48 (item 1) changed and left: "
        "[bench/FINDINGS-startup.md](bench/FINDINGS-startup.md).")
    return res
