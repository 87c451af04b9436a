"""Scenario 2: fragmenting serving workload (8 threads, 100 B..300 KB, random lifetimes), then idle.

Processes are pipelined: the next configuration starts its work phase when the
previous one has entered its idle phase, so the 30 s idle periods overlap
(idle processes use no CPU; memshim's purge thread wakes a few times a second)."""

from .context import table
from .runner import Run
from .stats import fmt, fmt_ratio, mb, median, ratio, spread
from .svg import line_plot


def run(ctx):
    p = ctx.p["s2"]
    configs = ctx.configs + [v for v in ctx.variants if v.name in p.get("variants", ())]
    checkpoints = p["idle_checkpoints"]
    cmd = [ctx.programs["serve"], str(p["threads"]), str(p["ops"]), str(p["slots"]),
           ",".join(str(c) for c in checkpoints)]
    runs = {c.name: [] for c in configs}
    live = []
    for rep in range(ctx.reps["s2"]):
        for c in configs:
            ctx.log(f"s2 {c.name} rep {rep + 1}")
            r = Run(cmd, c, label="serve")
            r.wait_event("idle_start", timeout=600)
            live.append((r, c.name))
    for r, name in live:
        runs[name].append(r.finish())

    def med(name, fn):
        return median([fn(r) for r in runs[name]])

    res = {"peak": {}, "idle": {}, "ops": {}, "floor": None, "base": {}}
    floor_live = median([mb(r.event("start")["rss_kb"] + r.event("work_done")["live_kb"])
                         for rs in runs.values() for r in rs])
    res["floor"] = floor_live
    last = checkpoints[-1]
    headers = ["config", "ops/s", "peak MB", "end of work"] + [f"idle {c} s" for c in checkpoints] + [
        f"{last} s vs glibc", f"{last} s vs jemalloc", "peak vs glibc", "ops/s vs jemalloc"]
    for c in configs:
        n = c.name
        res["ops"][n] = med(n, lambda r: r.event("work_done")["ops_per_s"])
        res["base"][n] = med(n, lambda r: mb(r.event("start")["rss_kb"]))
        res["peak"][n] = med(n, lambda r: mb(r.peak_kb))
        res["idle"][n] = {cp: med(n, lambda r, cp=cp: mb(r.event("idle", idle_s=cp)["rss_kb"])) for cp in checkpoints}
    rows = []
    for c in configs:
        n = c.name
        sp = spread([r.event("work_done")["ops_per_s"] for r in runs[n]])
        rows.append([n, fmt(res["ops"][n]) + (f" ({sp})" if sp else ""), fmt(res["peak"][n]),
                     fmt(med(n, lambda r: mb(r.event("work_done")["rss_kb"])))] +
                    [fmt(res["idle"][n][cp]) for cp in checkpoints] +
                    [fmt_ratio(ratio(res["idle"][n][last], res["idle"].get("glibc", {}).get(last))),
                     fmt_ratio(ratio(res["idle"][n][last], res["idle"].get("jemalloc", {}).get(last))),
                     fmt_ratio(ratio(res["peak"][n], res["peak"].get("glibc"))),
                     fmt_ratio(ratio(res["ops"][n], res["ops"].get("jemalloc")))])
    path, rel = ctx.plot("s2_serve.svg")
    series = []
    for c in configs:
        r = runs[c.name][0]
        t_idle = r.event("idle_start")["t"]
        series.append((c.name, [(t - t_idle, kb / 1024) for t, kb in r.samples]))
    line_plot(path, "Scenario 2: fragmenting serving workload, then idle", series,
              "seconds since the requests ended (work phase is left of 0)", "VmRSS (MB)",
              marks=[(0, "idle")] + [(cp, f"{cp} s") for cp in checkpoints])
    res["md"] = (f"{p['threads']} threads × {p['ops']:,} operations, {p['slots']} live slots per thread, sizes "
                 f"100 B–300 KB (85 % ≤ 4 KB, 12 % ≤ 64 KB, 3 % ≤ 300 KB, every page touched), one allocation in "
                 f"997 joins a long-lived set (~{fmt(floor_live)} MB floor incl. the process's start RSS). After "
                 f"the work the threads free their working sets and park; RSS is read at "
                 f"{', '.join(str(c) for c in checkpoints)} s of idle. MB = VmRSS. Repetitions: {ctx.reps['s2']} "
                 f"(median; spread = min–max).\n\n" + table(headers, rows) +
                 f"\n\n![RSS over time, scenario 2]({rel})")
    return res
