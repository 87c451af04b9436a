"""Scenario 5: Python speed, with and without PYTHONMALLOC=malloc.

With bench/out/pyperf-venv (made by `make bench-deps`) it runs pyperformance's
allocation-heavy benchmarks directly through pyperf (the benchmark scripts that
pyperformance ships, one pyperf invocation per benchmark and configuration;
--inherit-environ passes LD_PRELOAD and the allocator settings to pyperf's
worker processes, which drop them otherwise). Without it, and always in the
smoke run, it runs bench/workloads/pymicro.py instead and says so."""

import json
import os
import tempfile

from .configs import ROOT
from .context import table
from .runner import run as run_proc
from .stats import fmt, fmt_ratio, geomean, median, ratio

VENV = os.path.join(ROOT, "bench", "out", "pyperf-venv")
MICRO = os.path.join(ROOT, "bench", "workloads", "pymicro.py")
# (name, benchmark directory, extra args)
PYPERF = [("json_dumps", "bm_json_dumps", []), ("json_loads", "bm_json_loads", []),
          ("pickle_dict", "bm_pickle", ["pickle_dict"]), ("pickle_list", "bm_pickle", ["pickle_list"]),
          ("unpickle_list", "bm_pickle", ["unpickle_list"]), ("deepcopy", "bm_deepcopy", []),
          ("float", "bm_float", []), ("pidigits", "bm_pidigits", []),
          ("xml_etree_parse", "bm_xml_etree", ["parse"])]


def bench_dir():
    import glob
    hits = glob.glob(os.path.join(VENV, "lib", "python3*", "site-packages", "pyperformance", "data-files",
                                  "benchmarks"))
    return hits[0] if hits else None


def run_pyperf(ctx, c, env, name, bdir, args, p):
    keys = ",".join(sorted(set(c.environ(env)) & set(list(c.env) + list(env) + ["LD_PRELOAD"])))
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        cmd = [os.path.join(VENV, "bin", "python"), os.path.join(bench_dir(), bdir, "run_benchmark.py"),
               "-p", str(p["processes"]), "-n", str(p["values"]), "-w", "1", "-q", "-o", out] + (
            ["--inherit-environ", keys] if keys else []) + args
        run_proc(cmd, c, env, label=f"pyperf {name}")
        with open(out) as f:
            data = json.load(f)
    times = {}
    for b in data["benchmarks"]:
        vals = [v for r in b["runs"] for v in r.get("values", [])]
        bname = b.get("metadata", {}).get("name") or data.get("metadata", {}).get("name") or name
        times[bname] = sum(vals) / len(vals)
    return times


def run(ctx):
    p = ctx.p["s5"]
    use_pyperf = p["pyperf"] and bench_dir() is not None
    configs = [c for c in ctx.configs if c.name in p["configs"]]
    results = {}  # (pymalloc_mode, bench, config) -> [seconds]
    for rep in range(ctx.reps["s5"]):
        for mode in ("pymalloc", "malloc"):
            env = {"PYTHONMALLOC": "malloc"} if mode == "malloc" else {}
            if use_pyperf:
                for name, bdir, args in PYPERF:
                    ctx.log(f"s5 pyperf {name} PYTHONMALLOC={mode} rep {rep + 1}")
                    for c in configs:
                        for b, t in run_pyperf(ctx, c, env, name, bdir, args, p).items():
                            results.setdefault((mode, b, c.name), []).append(t)
            else:
                ctx.log(f"s5 pymicro PYTHONMALLOC={mode} rep {rep + 1}")
                for c in configs:
                    r = run_proc([ctx.python, MICRO, str(p["micro_scale"]), str(p["micro_repeat"])], c, env,
                                 label="pymicro")
                    for e in r.all("result"):
                        results.setdefault((mode, e["name"], c.name), []).append(e["s"])
    res = {"geomean": {}, "tool": "pyperf" if use_pyperf else "micro"}
    what = ("pyperformance 1.14 benchmark scripts run through pyperf (`-p %d -n %d -w 1`, mean of the values)"
            % (p["processes"], p["values"]) if use_pyperf else
            "NOT pyperformance: our allocation-heavy pure-Python micro workloads (bench/workloads/pymicro.py, "
            "best of %d)" % p["micro_repeat"])
    md = [f"{what}; times in ms; ratio = glibc time / config time in the same PYTHONMALLOC mode (> 1 = faster "
          f"than glibc). Repetitions: {ctx.reps['s5']}."]
    for mode in ("pymalloc", "malloc"):
        benches = sorted({b for (m, b, _) in results if m == mode})
        headers = ["benchmark"] + [c.name for c in configs] + [f"{c.name} vs glibc" for c in configs
                                                                if c.name != "glibc"]
        rows, gm = [], {c.name: [] for c in configs}
        for b in benches:
            base = median(results.get((mode, b, "glibc"), []))
            row = [b] + [fmt(None if median(results.get((mode, b, c.name), [])) is None else
                             median(results[(mode, b, c.name)]) * 1000) for c in configs]
            for c in configs:
                rt = ratio(base, median(results.get((mode, b, c.name), [])))
                gm[c.name].append(rt)
                if c.name != "glibc":
                    row.append(fmt_ratio(rt))
            rows.append(row)
        res["geomean"][mode] = {n: geomean(v) for n, v in gm.items()}
        rows.append(["**geomean speed vs glibc**"] + ["" for _ in configs] +
                    [f"**{fmt_ratio(res['geomean'][mode][c.name])}**" for c in configs if c.name != "glibc"])
        title = "PYTHONMALLOC unset (pymalloc for objects ≤ 512 B)" if mode == "pymalloc" else "PYTHONMALLOC=malloc"
        md.append(f"#### {title}\n\n" + table(headers, rows))
    res["md"] = "\n\n".join(md)
    return res
