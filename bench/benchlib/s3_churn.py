"""Scenario 3: long-running request-like churn, then idle; RSS over time.

The churn is paced (a busy, not saturated server), so every configuration of
a repetition runs at the same time, side by side; CPU use stays low."""

from .context import table
from .runner import Run
from .stats import fmt, fmt_ratio, mb, median, ratio
from .svg import line_plot


def run(ctx):
    p = ctx.p["s3"]
    configs = ctx.configs + [v for v in ctx.variants if v.name in p.get("variants", ())]
    cmd = [ctx.programs["churn"], str(p["threads"]), str(p["rate"]), str(p["seconds"]), str(p["idle"]),
           str(p["idle_step"])]
    runs = {c.name: [] for c in configs}
    for rep in range(ctx.reps["s3"]):
        ctx.log(f"s3 rep {rep + 1}: {len(configs)} configurations side by side, {p['seconds']} s + {p['idle']} s")
        live = [(Run(cmd, c, label="churn"), c.name) for c in configs]
        for r, n in live:
            runs[n].append(r.finish())
    steps = [e["idle_s"] for e in runs[configs[0].name][0].all("idle")]
    res = {"final": {}, "peak": {}, "end": {}, "base": {}}
    for c in configs:
        rs = runs[c.name]
        res["final"][c.name] = median([mb(r.all("idle")[-1]["rss_kb"]) for r in rs])
        res["peak"][c.name] = median([mb(r.peak_kb) for r in rs])
        res["base"][c.name] = median([mb(r.event("start")["rss_kb"]) for r in rs])
        res["end"][c.name] = median([mb(r.event("churn_done")["rss_kb"]) for r in rs])
    headers = ["config", "requests/s", "peak MB", "end of churn"] + [f"idle {s:g} s" for s in steps] + [
        "final vs glibc", "final vs jemalloc", "peak vs glibc"]
    rows = []
    for c in configs:
        rs = runs[c.name]
        rows.append([c.name, fmt(median([r.event("churn_done")["requests_per_s"] for r in rs])),
                     fmt(res["peak"][c.name]), fmt(res["end"][c.name])] +
                    [fmt(median([mb(r.event("idle", idle_s=s)["rss_kb"]) for r in rs])) for s in steps] +
                    [fmt_ratio(ratio(res["final"][c.name], res["final"].get("glibc"))),
                     fmt_ratio(ratio(res["final"][c.name], res["final"].get("jemalloc"))),
                     fmt_ratio(ratio(res["peak"][c.name], res["peak"].get("glibc")))])
    path, rel = ctx.plot("s3_churn.svg")
    series = [(c.name, [(t, kb / 1024) for t, kb in runs[c.name][0].samples]) for c in configs]
    line_plot(path, f"Scenario 3: {p['seconds']} s request churn, then {p['idle']} s idle", series,
              "seconds since start", "VmRSS (MB)", marks=[(p["seconds"], "idle")])
    res["md"] = (f"{p['threads']} threads × {p['rate']} requests/s each for {p['seconds']} s. A request allocates 40 "
                 f"objects of 32–512 B, 4 buffers of 4–64 KB, one in 20 also a 256 KB–4 MB buffer (pages "
                 f"touched), and frees them; one in five replaces a random entry of a shared 4096-entry response "
                 f"cache (256 B–16 KB; freed by whichever thread evicts it). Then {p['idle']} s idle with the "
                 f"cache alive. All configurations of a repetition run at the same time (paced load, low CPU). "
                 f"Repetitions: {ctx.reps['s3']}.\n\n" + table(headers, rows) +
                 f"\n\n![RSS over time, scenario 3]({rel})")
    return res
