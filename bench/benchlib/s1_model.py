"""Scenario 1: bert-base-sized model load/unload cycles, main thread and fresh worker thread."""

import os
import subprocess

from .configs import ROOT
from .context import table
from .runner import Run
from .stats import fmt, fmt_ratio, mb, median, ratio, spread
from .svg import line_plot

SCRIPT = os.path.join(ROOT, "bench", "workloads", "model_cycles.py")
KIND_LABEL = {
    "torch": "real PyTorch + transformers `BertModel(BertConfig())` built from its config (random init, 110 M "
             "parameters), 3 forward passes of (2, 128) tokens",
    "numpy": "FALLBACK (torch/transformers not importable): numpy float32 arrays with bert-base's tensor "
             "shapes (110 M parameters, filled), 3 matmul forward passes, plus Python-object churn with "
             "2 % survivors per cycle",
    "bytes": "FALLBACK (neither torch nor numpy importable): bytearrays with bert-base's tensor sizes plus "
             "Python-object churn",
}


def pick_kind(python, want):
    if want != "auto":
        return want
    for kind, mod in (("torch", "import torch, transformers"), ("numpy", "import numpy")):
        if subprocess.run([python, "-c", mod], capture_output=True).returncode == 0:
            return kind
    return "bytes"


def run(ctx):
    p = ctx.p["s1"]
    kind = pick_kind(ctx.python, p["kind"])
    configs = ctx.configs + [v for v in ctx.variants if v.name in p.get("variants", ())]
    res = {"kind": kind, "modes": {}}
    sections = [f"Workload: {KIND_LABEL[kind]}. {p['cycles']} cycles; after each unload "
                f"(`del`, `gc.collect()`) the process idles {p['idle']} s; final idle {p['final_idle']} s. "
                f"RSS = VmRSS in MB, read by the process itself at each event; peak = VmHWM. "
                f"Repetitions: {ctx.reps['s1']}."]
    for mode in p["modes"]:
        # The main-thread case (where glibc has no problem) runs a subset to fit the time budget.
        cs = [c for c in configs if mode != "main" or not p.get("main_configs") or c.name in p["main_configs"]]
        runs = {c.name: [] for c in cs}
        for rep in range(ctx.reps["s1"]):
            for c in cs:
                ctx.log(f"s1 {kind} {mode} {c.name} rep {rep + 1}")
                cmd = [ctx.python, SCRIPT, "--kind", kind, "--mode", mode, "--cycles", str(p["cycles"]),
                       "--idle", str(p["idle"]), "--final-idle", str(p["final_idle"]), "--scale", str(p["scale"])]
                runs[c.name].append(Run(cmd, c, label="model_cycles.py").finish())
        res["modes"][mode] = summarize(ctx, mode, cs, runs, p["cycles"])
        sections.append(res["modes"][mode]["md"])
    res["md"] = "\n\n".join(sections)
    return res


def summarize(ctx, mode, configs, runs, cycles):
    final = {n: median([mb(r.event("final")["rss_kb"]) for r in rs]) for n, rs in runs.items()}
    base = {n: median([mb(r.event("base")["rss_kb"]) for r in rs]) for n, rs in runs.items()}
    peak = {n: median([mb(r.peak_kb) for r in rs]) for n, rs in runs.items()}
    load = {n: median([e["load_s"] for r in rs for e in r.all("loaded")]) for n, rs in runs.items()}
    headers = ["config", "base"] + [f"c{i} loaded/idle" for i in range(1, cycles + 1)] + [
        "final", "final − base", "peak", "load s", "final vs glibc", "final vs jemalloc"]
    rows = []
    for c in configs:
        rs = runs[c.name]
        cells = [c.name, fmt(base[c.name])]
        for i in range(1, cycles + 1):
            lo = median([mb(r.event("loaded", cycle=i)["rss_kb"]) for r in rs])
            idle = median([mb(r.event("idle", cycle=i)["rss_kb"]) for r in rs])
            cells.append(f"{fmt(lo)}/{fmt(idle)}")
        sp = spread([mb(r.event("final")["rss_kb"]) for r in rs])
        cells += [fmt(final[c.name]) + (f" ({sp})" if sp else ""), fmt(final[c.name] - base[c.name]),
                  fmt(peak[c.name]), fmt(load[c.name]),
                  fmt_ratio(ratio(final[c.name], final.get("glibc"))),
                  fmt_ratio(ratio(final[c.name], final.get("jemalloc")))]
        rows.append(cells)
    title = "fresh worker thread per cycle" if mode == "thread" else "main thread"
    path, rel = ctx.plot(f"s1_model_{mode}.svg")
    series = [(c.name, [(t, kb / 1024) for t, kb in runs[c.name][0].samples]) for c in configs]
    line_plot(path, f"Scenario 1: bert-base load/unload, {title}", series, "seconds since start", "VmRSS (MB)")
    md = (f"#### Scenario 1, {title}\n\n" + table(headers, rows) +
          f"\n\n![RSS over time, scenario 1, {title}]({rel})")
    return {"final": final, "base": base, "peak": peak, "md": md}
