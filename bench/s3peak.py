#!/usr/bin/env python3
"""Where scenario 3's peak RSS goes under memshim (issue 48, item 3).

  python3 bench/s3peak.py [--reps R] [--seconds S] [--hz H] [--configs NAME[=LIB],...] [--out FILE]

Runs scenario 3's workload (bench/workloads/churn.c; the full run's 4 threads x 200 requests/s
for S seconds, default 60) under glibc and each named memshim configuration of
bench/benchlib/configs.py (default: memshim,ms-narenas1x; NAME=LIB names another build of
libmemshim.so, with its defaults), all side by side as the harness
does, R times (default 3). While each memshim process runs, a sampler asks its control socket
for `stats` H times a second (default 100) and reads VmRSS from /proc at the same moment, so
every sample splits the resident set into what jemalloc reports:

  live       allocated - tcache: bytes in the program's live blocks (jemalloc counts the blocks
             parked in thread caches as allocated)
  dirty      pages freed and not yet returned: what the decay (dirty_decay_ms) still holds
  tcache     blocks parked in the threads' caches
  slack      active - allocated: the unused rest of partly used slabs and pages
  metadata   jemalloc's own (base allocations, radix tree)

Reported per configuration (medians over the repetitions):
  peak        VmHWM at the end, the harness's figure
  at peak     the split at the sample with the highest VmRSS
  peak - dirty  the highest (VmRSS - dirty) of any sample: the peak had every freed page been
              returned at once, with the program's timing unchanged
  live peak   the highest `live` of any sample
  dirty median/max over the churn
glibc's peak comes from the same repetitions. The sampler costs the shim's thread about 0.3 ms
per request (docs/protocol.md), so it runs on the CPU the churn leaves idle. Stdlib only."""

import argparse
import json
import os
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from benchlib.build import build_all  # noqa: E402
from benchlib.configs import Config, by_name  # noqa: E402
from benchlib.runner import Run, read_status  # noqa: E402
from benchlib.s7_control import connect, find_socket, request  # noqa: E402
from benchlib.stats import median  # noqa: E402

MB = 1e6


class Sampler(threading.Thread):
    """Asks one process's control socket for stats until the process ends."""

    def __init__(self, run, sdir, hz):
        super().__init__(daemon=True)
        self.proc, self.sdir, self.period = run.proc, sdir, 1.0 / hz
        self.samples = []  # (rss bytes, allocator dict)
        self.error = None
        self.reconnects = 0

    def _connect(self):
        path = find_socket(self.sdir, self.proc.pid)
        if path is None:
            raise RuntimeError(f"no control socket for pid {self.proc.pid} in {self.sdir}")
        return connect(path)

    def run(self):
        pid = self.proc.pid
        conn = None
        while self.proc.poll() is None:
            t = time.monotonic()
            try:
                if conn is None:
                    sock, f = conn = self._connect()
                st = read_status(pid)
                a = request(f, sock, {"op": "stats", "arenas": False, "pss": False})[1]["allocator"]
            except (OSError, ValueError, RuntimeError) as e:
                # The shim closes a connection it finds idle or that a newer one displaced
                # (docs/protocol.md): connect again, and give up after 20 such errors.
                # The process closes its socket as it exits, before it can be reaped.
                conn = None
                time.sleep(0.1)
                if self.proc.poll() is not None:
                    break
                self.reconnects += 1
                if self.reconnects > 20 and self.proc.poll() is None:
                    self.error = e
                    return
                continue
            if st and "VmRSS" in st:
                self.samples.append((st["VmRSS"] * 1024, a))
            time.sleep(max(0.0, self.period - (time.monotonic() - t)))


def split(rss, a):
    return {"rss": rss, "live": a["allocated"] - a["tcache"], "dirty": a["dirty"] + a["muzzy"], "tcache": a["tcache"],
            "slack": a["active"] - a["allocated"], "metadata": a["metadata"]}


def summarize(samples):
    if not samples:
        return None
    rss, a = max(samples, key=lambda s: s[0])
    return {"at_peak": split(rss, a),
            "peak_minus_dirty": max(r - a["dirty"] - a["muzzy"] for r, a in samples),
            "live_peak": max(a["allocated"] - a["tcache"] for _, a in samples),
            "dirty_median": median([a["dirty"] + a["muzzy"] for _, a in samples]),
            "dirty_max": max(a["dirty"] + a["muzzy"] for _, a in samples),
            "n": len(samples)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--hz", type=float, default=100)
    ap.add_argument("--configs", default="memshim,ms-narenas1x")
    ap.add_argument("--out", help="also write the JSON of every repetition here")
    a = ap.parse_args()
    known = by_name()
    names = []
    for item in filter(None, a.configs.split(",")):
        name, _, lib = item.partition("=")
        if lib:
            known[name] = Config(name, f"memshim built at {lib}", preload=lib)
        names.append(name)
    bad = [n for n in names if n not in known or not known[n].preload]
    if bad:
        sys.exit(f"s3peak: not a memshim configuration of bench/benchlib/configs.py: {', '.join(bad)}")
    churn = build_all()["churn"]
    cmd = [churn, "4", "200", f"{a.seconds:g}", "0", "1"]
    reps = []
    for rep in range(a.reps):
        print(f"rep {rep + 1}/{a.reps}: glibc, {', '.join(names)} side by side, {a.seconds:g} s", file=sys.stderr)
        with tempfile.TemporaryDirectory(prefix="s3peak-") as sdir:
            live = [("glibc", Run(cmd, known["glibc"], label="churn"), None)]
            for n in names:
                r = Run(cmd, known[n], {"MEMSHIM_SOCKET_DIR": sdir, "MEMSHIM_CONTROL": "on"}, label="churn")
                s = Sampler(r, sdir, a.hz)
                s.start()
                live.append((n, r, s))
            out = {}
            for n, r, s in live:
                r.finish()
                if s:
                    s.join(timeout=10)
                    if s.error or not s.samples:
                        sys.exit(f"s3peak: sampling {n}: {s.error or 'no sample'}")
                out[n] = {"peak": r.peak_kb * 1024, **(summarize(s.samples) if s else {})}
                if s and s.reconnects:
                    print(f"  {n}: connected again {s.reconnects} times", file=sys.stderr)
            reps.append(out)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(reps, f, indent=1)

    def med(n, *path):
        vals = []
        for r in reps:
            v = r[n]
            for p in path:
                v = v[p]
            vals.append(v)
        return median(vals)

    g = med("glibc", "peak")
    print(f"scenario 3's workload, 4 threads x 200 requests/s for {a.seconds:g} s; medians of {a.reps} "
          f"repetitions side by side; MB\n")
    print("| config | peak | vs glibc | at peak: RSS | live | dirty | tcache | slack | metadata | "
          "peak - dirty | vs glibc | live peak | dirty median / max |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    print(f"| glibc | {g / MB:.1f} | 1.00x | | | | | | | | | | |")
    for n in names:
        p, pd = med(n, "peak"), med(n, "peak_minus_dirty")
        at = {k: med(n, "at_peak", k) for k in ("rss", "live", "dirty", "tcache", "slack", "metadata")}
        print(f"| {n} | {p / MB:.1f} | {p / g:.2f}x | {at['rss'] / MB:.1f} | {at['live'] / MB:.1f} | "
              f"{at['dirty'] / MB:.1f} | {at['tcache'] / MB:.1f} | {at['slack'] / MB:.1f} | "
              f"{at['metadata'] / MB:.1f} | {pd / MB:.1f} | {pd / g:.2f}x | {med(n, 'live_peak') / MB:.1f} | "
              f"{med(n, 'dirty_median') / MB:.1f} / {med(n, 'dirty_max') / MB:.1f} |")
    counts = ", ".join(f"{n} {med(n, 'n'):.0f}" for n in names)
    print(f"\nsamples per run: {counts}")


if __name__ == "__main__":
    main()
