"""Scenario 4: C allocator throughput, ops/s at 1, 2 and 4 threads, interleaved repetitions."""

from .context import table
from .runner import run as run_proc
from .stats import fmt, fmt_ratio, median, ratio, spread

KERNELS = {
    "prodcons": "producer/consumer: T producers fill batches of 1024 objects (16–256 B), T consumers free "
                "them (every free is remote; 2T threads)",
    "larson": "larson-like: T threads replace random slots of a 4000-slot slice with 8–1000 B blocks; every "
              "50 k operations the slice passes to a fresh successor thread (frees of a dead thread's blocks)",
    "small": "same-thread churn, 1000 live slots of 16–256 B",
    "medium": "same-thread churn, 200 live slots of 1–64 KiB (first 64 B written)",
    "large": "tensor-like buffers: 8 live slots per thread of 1–64 MiB (log-uniform), each new buffer "
             "written completely, the replaced one freed",
}


def multi_threaded(kernel, t):
    return kernel == "prodcons" or t >= 2


def run(ctx):
    p = ctx.p["s4"]
    configs = ctx.configs
    var = [v for v in ctx.variants if v.name in p.get("variants", ())]
    cases = [(k, t) for k in p["kernels"] for t in p["threads"]]
    results = {}  # (kernel, threads, config) -> [ops/s]
    for rep in range(ctx.reps["s4"]):
        ctx.log(f"s4 rep {rep + 1}: {len(cases)} cases × configurations")
        for k, t in cases:
            cs = configs + (var if k in p.get("variant_kernels", ()) else [])
            for c in cs:
                secs = p["seconds_large"] if k == "large" else p["seconds"]
                r = run_proc([ctx.programs["tput"], k, str(t), str(secs)], c, label=f"tput {k}")
                results.setdefault((k, t, c.name), []).append(r.event("result")["ops_per_s"])
    res = {"ops": {key: median(v) for key, v in results.items()}, "cases": cases}
    md = [f"ops/s, median of {ctx.reps['s4']} interleaved repetitions (spread = min–max); runs of "
          f"{p['seconds']} s ({p['seconds_large']} s for large). T = threads (4 threads on this 2-core machine "
          f"oversubscribe it, as busy servers do)."]
    for k in p["kernels"]:
        cs = configs + (var if k in p.get("variant_kernels", ()) else [])
        headers = ["config"] + [f"T={t}" for t in p["threads"]] + [f"T={t} vs glibc" for t in p["threads"]] + [
            f"T={t} vs jemalloc" for t in p["threads"]]
        rows = []
        for c in cs:
            row = [c.name]
            for t in p["threads"]:
                v = results.get((k, t, c.name), [])
                sp = spread(v)
                row.append(fmt(median(v)) + (f" ({sp})" if sp else ""))
            for base in ("glibc", "jemalloc"):
                for t in p["threads"]:
                    row.append(fmt_ratio(ratio(res["ops"].get((k, t, c.name)), res["ops"].get((k, t, base)))))
            rows.append(row)
        md.append(f"#### {k}\n\n{KERNELS[k]}.\n\n" + table(headers, rows))
    res["md"] = "\n\n".join(md)
    return res
