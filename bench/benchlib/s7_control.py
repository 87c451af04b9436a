"""Scenario 7: control plane latency, decay off: the `stats` round trip and the
`purge` of 1 GiB of dirty pages (median and p99), spoken directly over the
shim's Unix socket (newline-delimited JSON, docs/protocol.md: hello first,
then one request line and one response line at a time).

The target (bench/workloads/dirty.c) runs under memshim with
MEMSHIM_DIRTY_DECAY_MS=-1 and MEMSHIM_MUZZY_DECAY_MS=-1 and its socket in a
private MEMSHIM_SOCKET_DIR. If no socket appears (the control plane is not in
this build), the scenario reports "skipped: control plane not available"."""

import glob
import json
import os
import socket
import subprocess
import tempfile
import time

from .configs import by_name
from .context import table
from .runner import read_status
from .stats import fmt, median, percentile


def request(f, sock, obj):
    t = time.perf_counter()
    sock.sendall((json.dumps(obj) + "\n").encode())
    line = f.readline()
    d = time.perf_counter() - t
    reply = json.loads(line)
    if "ok" not in reply:
        raise RuntimeError(f"control request {obj} failed: {line.strip()[:300]}")
    return d, reply["ok"]


def run(ctx):
    p = ctx.p["s7"]
    shim = by_name()["memshim"]
    with tempfile.TemporaryDirectory(prefix="memshim-bench-") as sdir:
        env = {"MEMSHIM_DIRTY_DECAY_MS": "-1", "MEMSHIM_MUZZY_DECAY_MS": "-1", "MEMSHIM_SOCKET_DIR": sdir}
        proc = subprocess.Popen([ctx.programs["dirty"]], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=shim.environ(env))
        try:
            proc.stdout.readline()
            end, path = time.monotonic() + 3, None
            while time.monotonic() < end and path is None:
                hits = glob.glob(os.path.join(sdir, "**", f"{proc.pid}-*.sock"), recursive=True)
                path = hits[0] if hits else None
                time.sleep(0.05)
            if path is None:
                why = "no control socket appeared (control plane not in this build of libmemshim.so)"
                return {"skipped": why, "md": f"**skipped: control plane not available** ({why})."}
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(path)
            f = sock.makefile("r")
            request(f, sock, {"op": "hello", "version": 1, "client": "memshim-bench"})
            stats_t = [request(f, sock, {"op": "stats"})[0] for _ in range(p["n_stats"])]
            purge_t, freed = [], []
            for _ in range(p["n_purge"]):
                proc.stdin.write("fill\n")
                proc.stdin.flush()
                proc.stdout.readline()
                before = read_status(proc.pid)["VmRSS"]
                d, _ = request(f, sock, {"op": "purge"})
                purge_t.append(d)
                freed.append((before - read_status(proc.pid)["VmRSS"]) / 1024)
            sock.close()
        finally:
            proc.stdin.close()
            proc.wait(timeout=30)
    rows = [["stats round trip", len(stats_t), fmt(median(stats_t) * 1000), fmt(percentile(stats_t, 99) * 1000), "–"],
            ["purge of 1 GiB dirty", len(purge_t), fmt(median(purge_t) * 1000), fmt(percentile(purge_t, 99) * 1000),
             fmt(median(freed))]]
    res = {"stats_ms": median(stats_t) * 1000, "purge_ms": median(purge_t) * 1000,
           "md": "Target: bench/workloads/dirty.c under memshim with decay off; each purge follows a fresh "
                 "1 GiB (1024 × 1 MiB) allocate-touch-free. Times in ms, over one connection (hello once).\n\n" +
                 table(["request", "n", "median ms", "p99 ms", "RSS returned MB (median)"], rows)}
    return res
