"""Scenario 6: start-up cost per exec, with and without the preload.

Own timing rather than hyperfine so that configurations interleave at the
finest grain (A B A B ... per exec), which cancels the drift of a shared
machine: os.posix_spawn + waitpid, wall clock per exec."""

import os
import time

from .context import table
from .stats import fmt, median, percentile


def spawn_wait(argv, env):
    t = time.perf_counter()
    pid = os.posix_spawn(argv[0], argv, env)
    _, status = os.waitpid(pid, 0)
    d = time.perf_counter() - t
    if status != 0:
        raise RuntimeError(f"{argv} exited with status {status}")
    return d


def run(ctx):
    p = ctx.p["s6"]
    configs = [c for c in ctx.configs if c.name in p["configs"]]
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
        for _ in range(n):
            for c in configs:
                times[c.name].append(spawn_wait(argv, envs[c.name]) / per * 1000)
        base = median(times.get("glibc", []))
        for c in configs:
            m = median(times[c.name])
            res["per_exec_ms"][(label, c.name)] = m
            rows.append([label, c.name, fmt(m), fmt(percentile(times[c.name], 90)),
                         "–" if base is None else f"{(m - base) * 1000:+.0f} µs"])
    res["cases"] = [c[0] for c in cases]
    res["md"] = (f"Wall time per exec in ms (median and p90 of {p['n_true']} / {p['n_python']} / {p['n_loop']} "
                 f"interleaved runs; for the bash loop, the loop's time / {p['loop']}). `python3` is the real "
                 f"binary `{ctx.python}`, not pyenv's shim script.\n\n" +
                 table(["command", "config", "median ms/exec", "p90 ms/exec", "vs glibc"], rows))
    return res
