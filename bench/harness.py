#!/usr/bin/env python3
"""memshim benchmark harness: every scenario under every allocator configuration.

  python3 bench/harness.py --full    the full run (make bench): writes BENCHMARKS.md and bench/plots/*.svg
  python3 bench/harness.py --smoke   every scenario once with tiny parameters (make bench-smoke, CI):
                                     writes bench/out/smoke/; checks that each scenario produced numbers
Options: --only s1,s4 (scenarios), --configs glibc,memshim,... (subset), --out DIR (report elsewhere).
  python3 bench/harness.py --full --only s8 --update
                                     reruns the scenarios of --only and replaces their sections in the
                                     existing BENCHMARKS.md, each headed by the command, commit and date that
                                     made it; the rest of the file stays as the last full run wrote it
Stdlib only. Missing comparison allocators are reported as missing, never as failures."""

import argparse
import copy
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchlib import (s1_model, s2_serve, s3_churn, s4_tput, s5_python, s6_startup,  # noqa: E402
                      s7_control, s8_pressure, s9_patterns)
from benchlib.build import build_all  # noqa: E402
from benchlib.configs import ROOT, competitors, variants  # noqa: E402
from benchlib.context import Context, table  # noqa: E402
from benchlib.machine import facts  # noqa: E402
from benchlib.params import FULL, SMOKE  # noqa: E402
from benchlib.runner import real_python  # noqa: E402
from benchlib.targets import ANCHOR_NAMES, evaluate, standings, tradeoff  # noqa: E402

SCENARIOS = [
    ("s1", "1. Model load and unload cycles", s1_model.run),
    ("s2", "2. Fragmenting serving workload", s2_serve.run),
    ("s3", "3. Long-running churn, then idle", s3_churn.run),
    ("s4", "4. Allocator throughput (C)", s4_tput.run),
    ("s5", "5. Python speed", s5_python.run),
    ("s6", "6. Start-up cost", s6_startup.run),
    ("s7", "7. Control plane", s7_control.run),
    ("s8", "8. Memory pressure in a limited cgroup", s8_pressure.run),
    ("s9", "9. The suite's patterns, as the project's own workloads", s9_patterns.run),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--full", action="store_true")
    g.add_argument("--smoke", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated scenario ids (s1..s9)")
    ap.add_argument("--configs", default="", help="comma-separated configuration names")
    ap.add_argument("--out", default="", help="directory for the report (default: repo root / bench/out/smoke)")
    ap.add_argument("--update", action="store_true",
                    help="with --only: replace those scenarios' sections in the existing report, keep the rest")
    ap.add_argument("--set", action="append", default=[], metavar="S.KEY=VALUE",
                    help="override a parameter, e.g. --set s4.kernels=large,medium --set reps.s4=1 (JSON or a "
                         "comma list)")
    a = ap.parse_args()
    if a.update and not a.only:
        ap.error("--update needs --only (the scenarios whose sections to replace)")

    params = copy.deepcopy(SMOKE if a.smoke else FULL)
    for item in a.set:
        path, _, val = item.partition("=")
        sec, _, key = path.partition(".")
        old = params[sec][key]
        try:
            new = json.loads(val)
        except ValueError:
            new = val
        if isinstance(old, list) and not isinstance(new, list):
            new = [type(old[0])(x) if old else x for x in str(val).split(",") if x] if old else val.split(",")
        params[sec][key] = new
    mode = "smoke" if a.smoke else "full"
    if a.out:
        out_dir = os.path.abspath(a.out)
        plot_dir = os.path.join(out_dir, "plots")
    elif a.smoke:
        out_dir = os.path.join(ROOT, "bench", "out", "smoke")
        plot_dir = os.path.join(out_dir, "plots")
    else:
        out_dir, plot_dir = ROOT, os.path.join(ROOT, "bench", "plots")
    os.makedirs(out_dir, exist_ok=True)

    want = set(filter(None, a.configs.split(",")))
    all_configs = [c for c in competitors() if (c.name in want if want else not c.study)]
    all_variants = [v for v in variants() if (v.name in want if want else not v.study)]
    missing = [c for c in all_configs + all_variants if c.missing()]
    configs = [c for c in all_configs if not c.missing()]
    vars_ = [v for v in all_variants if not v.missing()]
    if any(c.name == "memshim" for c in missing):
        print("harness: target/release/libmemshim.so is missing; run `make` first", file=sys.stderr)
        return 2
    python = real_python()
    if params["s1"]["kind"] == "smoke":
        params["s1"]["kind"] = "numpy" if s1_model.pick_kind(python, "auto") in ("torch", "numpy") else "bytes"

    programs = build_all()
    ctx = Context(mode, params, configs, vars_, params["reps"], out_dir, plot_dir, programs, python, want)
    machine = facts(python)
    only = set(filter(None, a.only.split(",")))
    results, errors, durations = {}, [], {}
    for sid, title, fn in SCENARIOS:
        if only and sid not in only:
            continue
        t = time.monotonic()
        ctx.log(f"== {title}")
        try:
            results[sid] = fn(ctx)
        except Exception as e:  # noqa: BLE001 - report every scenario, fail at the end
            traceback.print_exc()
            errors.append(f"{sid}: {e}")
            results[sid] = {"md": f"**harness error:** `{e}`"}
        durations[sid] = time.monotonic() - t
    total = time.monotonic() - ctx.t_start
    if a.update:
        report = update_report(ctx, results, durations, errors)
    else:
        report = write_report(ctx, a, machine, missing, results, durations, total, errors)
    ctx.log(f"wrote {report}")
    if a.smoke:
        errors += smoke_checks(results, only)
    for e in errors:
        print(f"harness: error: {e}", file=sys.stderr)
    return 1 if errors else 0


def smoke_checks(r, only):
    """The smoke run asserts that every scenario ran and produced numbers (never speed)."""
    errs = []

    def need(cond, what):
        if not cond:
            errs.append(f"smoke: {what}")
    sel = lambda s: not only or s in only  # noqa: E731
    if sel("s1"):
        need(all(d["final"].get("memshim") and d["final"].get("glibc") for d in r["s1"].get("modes", {}).values())
             and r["s1"].get("modes"), "s1 produced no final RSS for glibc and memshim")
    if sel("s2"):
        need(r["s2"].get("ops", {}).get("memshim", 0) > 0 and r["s2"].get("idle", {}).get("glibc"),
             "s2 produced no throughput / idle RSS")
    if sel("s3"):
        need(r["s3"].get("final", {}).get("memshim", 0) > 0, "s3 produced no final RSS")
    if sel("s4"):
        ops = r["s4"].get("ops", {})
        need(ops and all(v and v > 0 for v in ops.values()), "s4 has a kernel without ops/s")
    if sel("s5"):
        need(r["s5"].get("geomean", {}).get("malloc", {}).get("memshim"), "s5 produced no geomean")
    if sel("s6"):
        need(r["s6"].get("per_exec_ms"), "s6 produced no start-up times")
    if sel("s7"):
        need("md" in r.get("s7", {}), "s7 did not report")
    if sel("s8"):
        need("md" in r.get("s8", {}), "s8 did not report")
        v2 = r.get("s8", {}).get("v2")  # None where the VM said SKIP
        need(v2 is None or all(rs and all(x["before"] for x in rs) for k in ("max", "high") for rs in v2[k].values()),
             "s8 on cgroup v2 produced no numbers")
    if sel("s9"):
        # Time against the best peer and against glibc; the peak against Debian jemalloc only where it ran.
        need(all(x is not None for x in r.get("s9", {}).get("summary", {}).get("memshim", (None,))[:2]),
             "s9 produced no figures for memshim")
    return errs


DEFAULTS_NOTE = (
    "How the defaults follow from this table: **dirty_decay_ms 1000** is the shortest decay that keeps "
    "large-buffer and medium-size throughput (purging at once, decay 0, collapses both, and the serving "
    "workload's throughput with them), and the only setting whose idle RSS is back at its floor within the "
    "1–2 s idles of scenarios 1 and 2; 5 s and 10 s return the same memory only after 6 s and 30 s, and "
    "decay off (the PyTorch tuning-guide setting) never. **muzzy_decay_ms 0**: pages leave through one "
    "decay stage, so RSS falls when dirty pages are purged rather than a second delay later. "
    "**oversize_threshold 0** (no dedicated huge arena): jemalloc's 8 MiB default purges large extents "
    "eagerly and loses the large-buffer case to glibc. **cache_oblivious off**: jemalloc's layout (ms-oblivious) "
    "puts each block of 16 KiB and more at a random cache-line offset in one extra page, which scenario 2's "
    "peak and idle RSS pay for, and which keeps buffers grown by realloc from growing in place "
    "(docs/configuration.md). **tcache_max** stays jemalloc's (32 KiB): 4 KiB "
    "roughly halves what parked threads keep in scenario 2 but costs small- and medium-size throughput; "
    "larger values cannot be set in jemalloc 5.3.1 with 4 KiB pages (it caps tcache_max at 8 pages, "
    "TCACHE_LG_MAXCLASS_LIMIT = LG_USIZE_GROW_SLOW_THRESHOLD, and clips larger values silently; Debian's "
    "5.3.0 allows 8 MiB). **Arena count** stays jemalloc's 4 per CPU (capped under a CPU quota): ms-narenas1x, one "
    "per CPU, lowers peak RSS in scenarios 2 and 3 (one thread reuses what another freed before it decays), "
    "but threads share arenas once busy threads outnumber CPUs, and allocations of 32-64 KiB, which bypass "
    "the thread caches, then contend for the shared arena's locks: medium sizes at T=4 on two arenas ran 4x "
    "slower in some runs, large buffers at T=2 and T=4 15-20 % slower; the reuse that matters for scenario 3's "
    "peak, of blocks of 1 MiB and more, the shim gets from one arena that only those blocks share, while its "
    "thread runs (docs/design.md). jemalloc's per-CPU arenas (`percpu_arena:percpu`, measured with 8 vCPUs, a cpuset and a CPU quota in a VM for issue 36) are not the default either: scenario 3's peak stayed 1.27-1.38x glibc's, and under a cpuset jemalloc turns them off and says so on stderr ([bench/FINDINGS-percpu.md](bench/FINDINGS-percpu.md)). These readings were taken on a shared 2-core VM; when a row of this run contradicts them, the "
    "table wins.")


def provenance():
    """The commit this checkout is at, and whether files differ from it (the report itself aside)."""
    import subprocess
    git = lambda *a: subprocess.run(["git", "-C", ROOT] + list(a), capture_output=True, text=True).stdout.strip()  # noqa: E731
    head = git("rev-parse", "--short=12", "HEAD") or "unknown"
    dirty = [ln for ln in git("status", "--porcelain", "--untracked-files=no").splitlines()
             if not ln.endswith("BENCHMARKS.md")]
    return head + (" with uncommitted changes" if dirty else "")


def update_report(ctx, results, durations, errors):
    """Replaces the sections of the scenarios in `results` in the existing report (--update)."""
    path = os.path.join(ctx.out_dir, "BENCHMARKS.md")
    with open(path) as f:
        lines = f.read().split("\n")
    cmd = "python3 bench/harness.py " + " ".join(sys.argv[1:])
    for sid, title, _ in SCENARIOS:
        if sid not in results:
            continue
        head = f"## {title}"
        if head not in lines:
            raise SystemExit(f"harness: --update: no section '{head}' in {path}; run --full first")
        i = lines.index(head)
        j = next((k for k in range(i + 1, len(lines)) if lines[k].startswith("## ")), len(lines))
        note = (f"*This section was rerun on its own by `{cmd}` at commit {provenance()}, "
                f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, in {durations[sid] / 60:.1f} min "
                f"(load average at end {' '.join(open('/proc/loadavg').read().split()[:3])}); the other sections are "
                "the full run's.*")
        if errors:
            note += " **This rerun had harness errors:** " + "; ".join(errors)
        lines[i:j] = [head, "", note, "", results[sid]["md"], ""]
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return path


# What heap profiling costs is measured by its own tools and run, not by every full run (two more
# configurations on every scenario would add a third to its time): bench/FINDINGS-profiling.md.
MEDIUM_NOTE = (
    "Same-thread churn of 1 to 64 KiB (scenario 4, `medium`) is slower than glibc's at one thread because "
    "jemalloc 5.3.1 caches freed blocks per thread only up to 8 of its pages (32 KiB with 4 KiB pages), so "
    "half of the kernel's blocks take the arena's path. A build with 8 KiB jemalloc pages may cache up to "
    "64 KiB and runs at glibc's speed or better, but scenario 2's idle figure rises by 10 MB or more; with "
    "one-page slabs (jemalloc's `slab_sizes`) the idle figure stays, and scenario 2's peak rises past its "
    "1.1x target instead. The curve, the study's commands and why the defaults keep 4 KiB pages: "
    "[bench/FINDINGS-medium.md](bench/FINDINGS-medium.md). `BENCH_PAGE8K_SHIM` and `--configs "
    "ms-page8k,...` rerun the study.")

PEAK_NOTE = (
    "Scenario 3's peak was 1.14x to 1.4x glibc's with memshim's defaults in full runs before big blocks "
    "shared an arena, against the issue's 1.1x; this run's figure is in the closing table. The reason, "
    'measured apart (`python3 bench/s3peak.py`, [bench/FINDINGS-peak.md](bench/FINDINGS-peak.md)): at '
    'the highest sample about 28 of 49 MB were dirty pages, blocks already freed that waited for the 1 '
    's decay in the arena of the thread that freed them, most of them the 256 KiB to 4 MiB buffers; '
    "without them no sample rose above 0.66x glibc's peak, and slab and page slack was 2 MB. Each of "
    'the 4 threads had an arena of its own, so a buffer one thread freed waited there while another '
    "thread faulted in a new one. So while the shim's thread runs, blocks of 1 MiB up to 32 MiB now "
    'share one arena, and one thread reuses what another freed (docs/design.md, "Big blocks share one '
    'arena while the thread runs"): 1.00x glibc\'s peak in s3peak.py\'s run, against 1.27x for the '
    'build before, with 18 MB of freed pages waiting at the peak instead of 30. Sharing from 256 KiB '
    "up, the first version, reached 0.92x in the same run, but scenario 9's `stress`, whose blocks of "
    'up to 1 MiB have only their first and last bytes written, then peaked at 35 MB instead of 23 '
    "(FINDINGS-peak.md). The trade-off table's other roads cost more: one arena per CPU (ms-narenas1x) "
    'shares every size, and busy threads then contend on the 32-64 KiB blocks and large buffers; '
    'purging at once (ms-decay0) cuts throughput to a tenth or less.')

BIGBLOCKS_NOTE = (
    "One thread frees a block of 5 to 25 MiB and allocates another of a similar size, writing every page "
    "(mimalloc-bench's malloc-large pattern, in the project's own `bench/workloads/bigblocks.c`). This "
    "run's time and peak are scenario 9's `big` rows. `python3 bench/bigblocks.py` measures it apart, with "
    "page faults, CPU time and the RSS left after an idle (interleaved runs, medians; command, tables and "
    "the two roads weighed in [bench/FINDINGS-bigblocks.md](bench/FINDINGS-bigblocks.md)): on the shared "
    "2-CPU development VM, 300 steps, memshim took 0.18x glibc's page faults, where the build before "
    "issue 48 took 5.74x, Debian jemalloc 5.74x and Debian mimalloc 4.78x. No thread is added: arena 0 "
    "keeps freed blocks below 32 MiB from the first big allocation on and its inline decay returns them "
    "while the program allocates; one that then makes no calls keeps them (147 MB after that run, glibc "
    "85 MB)."
)


PATTERNS_NOTE = (
    "Read with scenario 9's tables; where a figure below disagrees with them, the tables are this "
    "run's. The time target (geomean at most the best peer's x 1.05) is missed mostly on two kernels, "
    "both jemalloc's own behaviour: memshim takes about jemalloc 5.3.1's time on each (the "
    "`jemalloc531` row, jemalloc with its own defaults and no shim). **simple**: jemalloc's thread "
    "cache holds at most 200 blocks of a small size class (fewer for the larger classes: twice a slab's "
    'blocks, at least 20), so 1000 blocks overflow to the arena on every round. Raising it '
    '(`MEMSHIM_MALLOC_CONF=tcache_nslots_small_max:2048,lg_tcache_nslots_mul:4`, the study '
    "configuration `ms-slots`) cut memshim's `simple` by a third when measured apart at 66f3733 (0.40 "
    "to 0.25 s, against mimalloc's 0.11 s there) and raised scenario 2's idle figure from 46.1 to 57.6 "
    "MB (what parked threads' caches keep, which the idle return cannot reach), with no gain in "
    "scenario 2's throughput or scenario 4's medium sizes (`harness.py --full --only s2,s4,s9 --configs "
    'glibc,memshim,ms-slots --set s2.variants=ms-slots --set s4.variants=ms-slots --set '
    "s9.configs=glibc,memshim,ms-slots` reruns it). The rest is jemalloc's free path (the block's size "
    "class looked up in its radix tree), not the shim's forwarding. **stress**: mimalloc and tcmalloc "
    "run faster at about twice memshim's peak RSS or more; how much faster moves between runs (1.1x to "
    '1.9x), as threads that come and go on two CPUs are scheduled. **xmalloc** runs at about jemalloc '
    "5.3.1's time, a few percent either side of the target's line. The defaults stay. The peak target "
    "(geomean at most Debian jemalloc's) is decided by **big**: memshim peaks at 1.3x jemalloc's there, "
    "the price of issue 48's item 4 (arena 0 keeps freed blocks below 32 MiB, so the next big block "
    "reuses their pages instead of faulting in fresh ones, at a fraction of glibc's time where jemalloc "
    "takes several times glibc's); `stress`, whose blocks of up to 1 MiB are written only at their "
    "ends, peaked at 1.45x jemalloc's when blocks from 256 KiB up shared one arena, and at jemalloc's "
    'own from 1 MiB up, as before the sharing (FINDINGS-peak.md); on the other kernels memshim peaks at '
    "or near jemalloc. **xmalloc**'s peak is largely what the producer runs ahead of the consumer (the "
    'ring holds up to 8192 blocks), so it moves with scheduling, for jemalloc 5.3.1 and memshim alike '
    "(single runs of either have peaked between 4.3 and 8.8 MB). The wheels' builds compile jemalloc "
    "with zig's clang rather than gcc, which shows on `simple`. The suite itself (mimalloc-bench) is "
    "not rerun here: these are the project's own versions of its patterns.")


# Sections measured by their own scripts, not by the harness: a full run keeps them from the existing
# report as they are (each says its command and when it was measured).
APART_SECTIONS = ("A process started without memshim, against gdb",)


def kept_sections(path, titles):
    """The lines of the sections `titles` of the report at `path` (none if it has no such section)."""
    try:
        with open(path) as f:
            lines = f.read().split("\n")
    except OSError:
        return []
    out = []
    for t in titles:
        head = f"## {t}"
        if head in lines:
            i = lines.index(head)
            j = next((k for k in range(i + 1, len(lines)) if lines[k].startswith("## ")), len(lines))
            out += lines[i:j]
    return out


PROFILING_NOTE = (
    "What jemalloc's heap profiler (`memshim-ctl profile`, docs/profile.md) costs is measured apart, in "
    "[bench/FINDINGS-profiling.md](bench/FINDINGS-profiling.md): compiled in (every build) and off, ready "
    "(`MEMSHIM_PROFILE=on`) and sampling at 512 KiB (`MEMSHIM_PROFILE=start`), on scenarios 4 to 6 side by "
    "side with the build before profiling (`harness.py --full --only s4,s5,s6 --configs "
    "glibc,memshim,memshim-base,ms-profile,ms-sampling`), in instructions (`bench/profcost.py`, "
    "`bench/execcost.py`), and what tracemalloc (`profile --python`) costs while on. In short: compiled in "
    "and off stays within 1 % on the allocation path; ready costs 1-64 KiB allocations about 4 % of "
    "instructions, which is why it is a setting; sampling and tracemalloc are switched off after each "
    "profile.")


def write_report(ctx, a, machine, missing, results, durations, total, errors):
    path = os.path.join(ctx.out_dir, "BENCHMARKS.md")
    cmd = "python3 bench/harness.py " + " ".join(sys.argv[1:])
    o = ["# memshim benchmarks", "",
         f"Generated by `{cmd}` — do not edit by hand; rerun `make bench` (after `make bench-deps`)."
         if ctx.mode == "full" else f"SMOKE RUN (tiny parameters; numbers are not meaningful). Command: `{cmd}`.", ""]
    if errors:
        o += ["**This run had harness errors:** " + "; ".join(errors), ""]
    o += ["## Machine", "", table(["", ""], machine + [("load average at end",
                                                          " ".join(open("/proc/loadavg").read().split()[:3]))]), "",
          f"Total run time: {total / 60:.1f} min (" +
          ", ".join(f"{s} {d:.0f} s" for s, d in durations.items()) + ").", "",
          "## How to run", "",
          "```sh\nmake bench-deps   # Debian libjemalloc2 libtcmalloc-minimal4 libmimalloc2.0 hyperfine; pip numpy;"
          "\n                  # pyperformance in bench/out/pyperf-venv\nmake bench        # = python3 bench/harness.py --full"
          " (writes BENCHMARKS.md, bench/plots/)\nmake bench-smoke  # = python3 bench/harness.py --smoke "
          "(CI; writes bench/out/smoke/)\n```", "",
          "Runs are interleaved (every configuration once, then again), medians over repetitions, spread = "
          "min–max. RSS = VmRSS from /proc (the workloads read their own at each event; the harness polls "
          "/proc/<pid>/status every 50 ms for the plots and the peak). C workloads: `bench/workloads/*.c`, "
          "built with `gcc -O2` into bench/out/.", "",
          "## Configurations", "",
          table(["name", "what", "environment"],
                [[c.name, c.label, " ".join(f"`{k}={v}`" for k, v in
                                           ([("LD_PRELOAD", ctx.rel(c.preload) if c.preload.startswith(ROOT) else c.preload)]
                                            if c.preload else []) + list(c.env.items())) or "–"]
                 for c in ctx.configs + ctx.variants] +
                [[c.name, c.label, "**missing** (not installed; `make bench-deps`)"] for c in missing]),
          "", "`BENCH_MALLOC_TRIM=1` makes the workloads call `malloc_trim(0)` where an unload happens "
          "(scenario 1: `ctypes.CDLL(None).malloc_trim(0)` after each unload; scenarios 2 and 3: when the work "
          "ends), i.e. the code change users make for glibc. memshim-* variants differ from the defaults in "
          "the one knob named.", ""]
    o += ["The verdict on each target is in the [closing note](#closing-note-targets) at the end.", ""]
    for sid, title, _ in SCENARIOS:
        if sid in results:
            o += [f"## {title}", "", results[sid]["md"], ""]
    if ctx.variants and any(s in results for s in ("s1", "s2", "s4")):
        o += ["## Choosing the defaults: trade-offs", "",
              "Each row is memshim with one knob changed from its defaults (dirty_decay_ms 1000, muzzy_decay_ms 0, "
              "oversize_threshold 0, cache_oblivious off, jemalloc's tcache_max); the decisive cases are idle return (scenario 1 "
              "threaded, scenario 2 idle) against large-buffer and medium-size throughput (scenario 4). "
              "Throughput columns are ratios to glibc in the same run.", "",
              tradeoff(results, ctx.variants), "", DEFAULTS_NOTE, ""]
    present = [n for n in ANCHOR_NAMES if any(c.name == n for c in ctx.configs)]
    if present and any(s in results for s in ("s1", "s2", "s3", "s4", "s6")):
        o += ["## Where memshim stands against each comparison allocator", "",
              "memshim with its defaults divided by each allocator in this run: memory columns < 1.00× mean "
              "memshim holds less, speed columns > 1.00× mean memshim is faster; start-up is memshim's "
              "µs/exec minus the other's. jemalloc531, mimalloc3 and mimalloc2 are the newest releases on "
              "crates.io (bench/anchors, built by `make bench-deps`).", "",
              standings(results, present), ""]
    if ctx.mode == "full":
        o += ["## Heap profiling", "", PROFILING_NOTE, ""]
        o += ["## Big blocks in one thread", "", BIGBLOCKS_NOTE, ""]
        o += ["## Medium sizes: speed against idle memory", "", MEDIUM_NOTE, ""]
        o += ["## Peak RSS in scenario 3", "", PEAK_NOTE, ""]
        if "s9" in results:
            o += ["## The suite's patterns: where memshim trails", "", PATTERNS_NOTE, ""]
        o += kept_sections(path, APART_SECTIONS)
    if any(s in results for s in ("s1", "s2", "s3", "s4", "s5", "s6", "s9")):
        o += ["## Closing note: targets", "",
              "memshim with its defaults against the issue's targets, in this run. \"floor\" = the lowest "
              "final RSS any configuration reached (scenario 2: start RSS + the long-lived set).", "",
              evaluate(results)[0], ""]
    with open(path, "w") as f:
        f.write("\n".join(str(x) for x in o) + "\n")
    return path


if __name__ == "__main__":
    sys.exit(main())
