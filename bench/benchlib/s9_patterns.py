"""Scenario 9: the patterns of mimalloc-bench where memshim trailed (issue 48, item 5), as the
project's own workloads, beside the peers.

Kernels (bench/workloads/patterns.c and bigblocks.c, fixed work, so that time and memory compare):
  simple   one thread, 1000 blocks of one small size allocated then freed, six sizes (glibc-simple)
  stress   threads that come and go, blocks of mixed lifetimes and sizes that migrate (mstress)
  xmalloc  threads that only allocate, threads that only free what they are handed (xmalloc-test):
           T/2 producer/consumer pairs (at least one), 8M blocks in all (the pairs' shares rounded down). With more threads than
           CPUs, threads that wait on each other's ring with sched_yield make the time bimodal
           (0.15 or 0.35 s for one library, by how the scheduler pairs them), so T is the thread
           count, not the pair count.
  big      one thread freeing and allocating 5-25 MiB blocks, every page written (malloc-large)
larson (blocks freed by a successor thread) is scenario 4's `larson` kernel.

Every configuration runs each kernel once per round, rounds rotated (interleaved.py); medians of
the wall time and of the peak RSS (VmHWM at the end). Ratios: time against glibc and against the
best peer (the fastest configuration that is not memshim), peak RSS against glibc and Debian's
jemalloc. The summary gives each memshim build's figures against the targets issue 48 sets on
the suite: geomean time at most the best peer's x 1.05, no kernel slower than glibc's x 1.1,
geomean peak RSS at most jemalloc's. bench/patterns.py runs this scenario alone."""

import os

from . import interleaved
from .configs import competitors
from .context import table
from .stats import geomean

# Blocks of the xmalloc kernel at scale 1, in millions, shared among its pairs.
XMALLOC_MBLOCKS = 8
# Targets issue 48 sets on the suite (item 5).
TARGET_BEST = 1.05
TARGET_GLIBC = 1.1
TARGET_PEAK_JEMALLOC = 1.0


def kernels(exe, threads, scale):
    """(name, argv) of each kernel: fixed work, `scale` times the full run's (the smoke run passes a
    small one)."""
    pairs = max(1, threads // 2)
    n = lambda x: max(1, round(x * scale))  # noqa: E731
    return [
        ("simple", [exe["patterns"], "simple", "1", str(n(4000))]),
        ("stress", [exe["patterns"], "stress", str(threads), str(n(40))]),
        # XMALLOC_MBLOCKS million blocks in all, shared among the pairs.
        ("xmalloc", [exe["patterns"], "xmalloc", str(pairs), str(max(1, n(XMALLOC_MBLOCKS) // pairs))]),
        ("big", [exe["bigblocks"], str(n(300)), "4", "0"]),
    ]


def is_memshim(name):
    return name.startswith(("memshim", "ms-"))


def f2(x):
    return "–" if x is None else f"{x:.2f}"


def measure(configs, exe, runs, threads, scale, log=lambda _m: None):
    """{kernel: (argv, medians {name: {wall, peak}}, spreads {name: {wall: (lo, hi)}})} for
    configurations given as (name, preload or None, environment)."""

    def once(argv, lib, env):
        r = interleaved.run_once(argv, lib, env)
        return {"wall": r["wall"], "peak": r["events"]["done"]["hwm_kb"] / 1024}

    out = {}
    for kname, argv in kernels(exe, threads, scale):
        log(f"s9 {kname}: {runs} × {len(configs)}")
        res = interleaved.rounds(configs, runs, lambda _n, lib, env, argv=argv: once(argv, lib, env))
        out[kname] = (argv, interleaved.medians(res, ("wall", "peak")), interleaved.spreads(res, ("wall",)))
    return out


def summarize(measured):
    """(kernel rows for the table, {memshim build: (geomean time × best peer, worst time × glibc,
    geomean peak × jemalloc)}); a figure without its reference (no peer, no glibc, no jemalloc) is
    None."""
    rows, per_build = [], {}
    for kname, (_argv, med, spread) in measured.items():
        names = list(med)
        peers = [n for n in names if not is_memshim(n)]
        best = min(peers, key=lambda n: med[n]["wall"]) if peers else None
        rel = lambda n, k, ref: med[n][k] / med[ref][k] if ref in med else None  # noqa: E731
        for n in names:
            lo, hi = spread[n]["wall"]
            rows.append([f"{kname} (best peer {best})", n, f"{med[n]['wall']:.2f} ({lo:.2f}–{hi:.2f})",
                         f2(rel(n, "wall", "glibc")), f2(rel(n, "wall", best)),
                         f"{med[n]['peak']:.1f}", f2(rel(n, "peak", "glibc")), f2(rel(n, "peak", "jemalloc"))])
            if is_memshim(n):
                per_build.setdefault(n, []).append((rel(n, "wall", best), rel(n, "wall", "glibc"),
                                                    rel(n, "peak", "jemalloc")))
    summary = {}
    for n, xs in per_build.items():
        cols = []
        for i, f in ((0, geomean), (1, max), (2, geomean)):
            v = [x[i] for x in xs if x[i] is not None]
            cols.append(f(v) if v else None)
        summary[n] = tuple(cols)
    return rows, summary


def render(measured):
    """(markdown: the kernels' table and the targets' table, summary as summarize gives it)."""
    rows, summary = summarize(measured)
    md = table(["kernel", "config", "time s (min–max)", "× glibc", "× best peer", "peak MB", "× glibc",
                "× jemalloc"], rows)
    md += ("\n\nAgainst the targets issue 48 sets on the suite itself (over the four kernels):\n\n" +
           table(["build", f"geomean time × best peer (target ≤ {TARGET_BEST})",
                  f"worst time × glibc (target ≤ {TARGET_GLIBC})",
                  f"geomean peak × jemalloc (target ≤ {TARGET_PEAK_JEMALLOC:.2f})"],
                 [[n] + [f2(x) for x in cols] for n, cols in summary.items()]))
    return md, summary


def configs_of(ctx):
    """The scenario's configurations: those its parameters name, and (in a run that names no
    configurations) the wheels' builds where they are built, as in scenario 6."""
    p = ctx.p["s9"]
    configs = [c for c in ctx.configs + ctx.variants if c.name in p["configs"]]
    if not ctx.named_configs:
        configs += [c for c in competitors() if c.name in p.get("builds", ()) and not c.missing()
                    and all(c.name != x.name for x in configs)]
    return configs


def run(ctx):
    p = ctx.p["s9"]
    configs = [(c.name, c.preload or None, c.env) for c in configs_of(ctx)]
    if not configs:
        return {"md": "Skipped: --configs names none of this scenario's configurations.", "summary": {}}
    measured = measure(configs, ctx.programs, p["runs"], p["threads"], p["scale"], ctx.log)
    md, summary = render(measured)
    doc = (f"`bench/workloads/patterns.c` and `bigblocks.c` (this scenario's docstring, "
           f"bench/benchlib/s9_patterns.py, says what each kernel does): the patterns where mimalloc-bench "
           f"found memshim trailing, written for this project as fixed amounts of work, so that time and peak "
           f"RSS compare. larson's shape is scenario 4's `larson` kernel. Interleaved runs: {p['runs']} "
           f"(medians; spread = min–max), {p['threads']} threads for stress and xmalloc, on {os.cpu_count()} "
           f"CPUs.")
    if any(c[0].startswith("memshim-wheel") for c in configs):
        doc += (" `memshim-wheel` is the manylinux_2_34 wheel's build, `memshim-wheel217` the manylinux_2_17 "
                "one's.")
    return {"md": doc + "\n\n" + md, "summary": summary,
            "wall": {k: {n: m["wall"] for n, m in med.items()} for k, (_a, med, _s) in measured.items()}}
