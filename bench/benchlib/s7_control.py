"""Scenario 7: control plane latency, decay off: the `stats` round trip and the
`purge` of 1 GiB of dirty pages (median and p99), spoken directly over the
shim's Unix socket (newline-delimited JSON, docs/protocol.md: hello first,
then one request line and one response line at a time).

Then the Python bridge: the round trip of `stats` and `gc` to a CPython
whose main thread sits in each of several states (tests/fixtures/py_states.py,
shared with the tests), and what `release` frees in a real BERT process
(tests/fixtures/py_torch.py) while its main thread sleeps.

The target (bench/workloads/dirty.c) runs under memshim with
MEMSHIM_DIRTY_DECAY_MS=-1 and MEMSHIM_MUZZY_DECAY_MS=-1 and its socket in a
private MEMSHIM_SOCKET_DIR. If no socket appears (the control plane is not in
this build), the scenario reports "skipped: control plane not available"."""

import glob
import json
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time

from . import sidroot
from .configs import ROOT, by_name
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


def find_socket(sdir, pid, seconds=10):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        hits = glob.glob(os.path.join(sdir, f"{pid}-*.sock"))
        if hits:
            return hits[0]
        time.sleep(0.02)
    return None


def connect(path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(30)
    sock.connect(path)
    f = sock.makefile("r")
    request(f, sock, {"op": "hello", "version": 1, "client": "memshim-bench"})
    return sock, f


# Main-thread states of tests/fixtures/py_states.py measured here (the test
# python_reach covers all of them on every installed CPython).
PY_STATES = ["sleep", "event", "select", "read", "join", "asyncio", "spin", "ccall"]


def python_states(ctx, n):
    """Median and p99 round trip of stats and gc per main-thread state."""
    rows = []
    for state in PY_STATES:
        st, gc = round_trips([ctx.python], state, n)
        rows.append([state, len(st), fmt(median(st) * 1000), fmt(percentile(st, 99) * 1000),
                     fmt(median(gc) * 1000), fmt(percentile(gc, 99) * 1000)])
    return rows


def _expect(proc, what, errf):
    """Reads one line from proc's stdout; a process that ended instead is an
    error that says how it ended and what it printed on stderr."""
    line = proc.stdout.readline()
    if line:
        return line
    code = proc.wait(timeout=30)
    errf.seek(0)
    raise RuntimeError(f"pid {proc.pid} ended ({code}) before printing {what!r}: {errf.read()[-2000:]!r}")


def _tell(proc, line, errf):
    """Writes a line to proc's stdin; see _expect."""
    try:
        proc.stdin.write(line)
        proc.stdin.flush()
    except BrokenPipeError:
        code = proc.wait(timeout=30)
        errf.seek(0)
        raise RuntimeError(f"pid {proc.pid} ended ({code}) before reading {line!r}: {errf.read()[-2000:]!r}")


def round_trips(argv, state, n):
    """n `stats` then n `gc` round trips, in s, to `argv` running
    tests/fixtures/py_states.py with its main thread in `state`."""
    shim = by_name()["memshim"]
    script = os.path.join(ROOT, "tests", "fixtures", "py_states.py")
    with tempfile.TemporaryDirectory(prefix="ms-bench-", dir="/tmp") as sdir, \
            tempfile.TemporaryFile("w+") as errf:
        env = shim.environ({"MEMSHIM_CONTROL": "on", "MEMSHIM_SOCKET_DIR": sdir})
        proc = subprocess.Popen(argv + [script, state], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=errf, text=True, env=env)
        try:
            _expect(proc, "ready", errf)
            path = find_socket(sdir, proc.pid)
            _tell(proc, "\n", errf)
            _expect(proc, "entering", errf)
            time.sleep(0.2)  # let the main thread settle into the state
            sock, f = connect(path)
            st = [request(f, sock, {"op": "stats"})[0] for _ in range(n)]
            gc = [request(f, sock, {"op": "gc"})[0] for _ in range(n)]
            sock.close()
        finally:
            proc.send_signal(signal.SIGUSR1)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    return st, gc


def interpreters(ctx):
    """[(label, argv prefix)]: the default python, then Debian sid's 3.13,
    3.14 and 3.15 (chrooted, see sidroot.py); and why sid's are missing."""
    v = subprocess.run([ctx.python, "-c", "import sys; print(sys.version.split()[0])"],
                       capture_output=True, text=True).stdout.strip()
    sid, why = sidroot.interpreters()
    return [(f"{v} ({os.path.basename(ctx.python)})", [ctx.python])] + sid, why


def versions_round_trip(ctx, interps, n):
    """Median and p99 of `stats` and `gc` to each interpreter, its main
    thread in time.sleep (py_states.py)."""
    rows = []
    for label, argv in interps:
        st, gc = round_trips(argv, "sleep", n)
        rows.append([label, n, fmt(median(st) * 1000), fmt(percentile(st, 99) * 1000),
                     fmt(median(gc) * 1000), fmt(percentile(gc, 99) * 1000)])
    return rows


def _fire(sdir, pid, stop):
    """`stats` and `gc`, one after the other, at the process until it goes."""
    path = find_socket(sdir, pid, seconds=5)
    if path is None:
        return
    try:
        sock, f = connect(path)
        i = 0
        while not stop.is_set():
            i += 1
            sock.sendall((json.dumps({"op": "gc"} if i % 2 else {"op": "stats"}) + "\n").encode())
            if not f.readline():
                break
    except OSError:
        pass


def exit_times(ctx, interps, rounds):
    """Per interpreter: ms from "exit now" to the process's end, without the
    shim, under it, and under it while `stats`/`gc` requests arrive (from
    its start to its end, so through its last second)."""
    shim = by_name()["memshim"]
    script = os.path.join(ROOT, "tests", "fixtures", "py_exit.py")
    rows = []
    for label, argv in interps:
        times = {"plain": [], "shim": [], "fire": []}
        for _ in range(rounds):
            for mode in times:
                with tempfile.TemporaryDirectory(prefix="ms-bench-", dir="/tmp") as sdir, \
                        tempfile.TemporaryFile("w+") as errf:
                    env = (by_name()["glibc"].environ() if mode == "plain" else
                           shim.environ({"MEMSHIM_CONTROL": "on", "MEMSHIM_SOCKET_DIR": sdir}))
                    proc = subprocess.Popen(argv + [script, "--gc"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            stderr=errf, text=True, env=env)
                    stop = threading.Event()
                    fire = None
                    if mode == "fire":
                        fire = threading.Thread(target=_fire, args=(sdir, proc.pid, stop))
                        fire.start()
                    _expect(proc, "up", errf)
                    if fire is not None:
                        time.sleep(0.3)  # requests arrive before and during the exit
                    t = time.perf_counter()
                    _tell(proc, "exit_at 0\n", errf)
                    proc.wait(timeout=60)
                    times[mode].append((time.perf_counter() - t) * 1000)
                    stop.set()
                    if fire is not None:
                        fire.join()
        row = [label, rounds]
        for mode in ("plain", "shim", "fire"):
            v = times[mode]
            row += [fmt(median(v)), fmt(percentile(v, 99)), fmt(max(v))]
        rows.append(row)
    return rows


def bert_release(ctx):
    """A BERT (built from its config) loaded, deleted, then `release` while
    the main thread sleeps; decay off, so only the release returns memory."""
    shim = by_name()["memshim"]
    script = os.path.join(ROOT, "tests", "fixtures", "py_torch.py")
    with tempfile.TemporaryDirectory(prefix="memshim-bench-") as sdir:
        env = shim.environ({"MEMSHIM_CONTROL": "on", "MEMSHIM_SOCKET_DIR": sdir,
                            "MEMSHIM_DIRTY_DECAY_MS": "-1", "HF_HUB_OFFLINE": "1"})
        proc = subprocess.Popen([ctx.python, script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True, env=env)
        try:
            if not proc.stdout.readline().startswith("ready"):
                return None
            path = find_socket(sdir, proc.pid)
            base = read_status(proc.pid)["VmRSS"]
            for cmd in ("load", "unload"):
                proc.stdin.write(cmd + "\n")
                proc.stdin.flush()
                proc.stdout.readline()
            unloaded = read_status(proc.pid)["VmRSS"]
            proc.stdin.write("sleep 30\n")
            proc.stdin.flush()
            proc.stdout.readline()  # sleeping
            sock, f = connect(path)
            d, r = request(f, sock, {"op": "release"})
            sock.close()
            after = read_status(proc.pid)["VmRSS"]
        finally:
            proc.kill()
            proc.wait()
    steps = {s["step"]: s for s in r["steps"]}
    return {"base": base / 1024, "unloaded": unloaded / 1024, "after": after / 1024, "ms": d * 1000,
            "gc_ms": steps["gc"]["elapsed_ms"], "outcomes": ", ".join(f'{s["step"]} {s.get("outcome", "done")}'
                                                                    for s in r["steps"])}


def run(ctx):
    p = ctx.p["s7"]
    shim = by_name()["memshim"]
    with tempfile.TemporaryDirectory(prefix="memshim-bench-") as sdir, tempfile.TemporaryFile("w+") as errf:
        env = {"MEMSHIM_DIRTY_DECAY_MS": "-1", "MEMSHIM_MUZZY_DECAY_MS": "-1", "MEMSHIM_SOCKET_DIR": sdir}
        proc = subprocess.Popen([ctx.programs["dirty"]], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=errf, text=True, env=shim.environ(env))
        try:
            _expect(proc, "start", errf)
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
                _tell(proc, "fill\n", errf)
                _expect(proc, "ready", errf)
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
    md = ("Target: bench/workloads/dirty.c under memshim with decay off; each purge follows a fresh "
          "1 GiB (1024 × 1 MiB) allocate-touch-free. Times in ms, over one connection (hello once).\n\n" +
          table(["request", "n", "median ms", "p99 ms", "RSS returned MB (median)"], rows))
    py_rows = python_states(ctx, p["n_py"])
    md += ("\n\nThe Python bridge: `stats` and `gc` to " + ctx.python + " (tests/fixtures/py_states.py, "
           "garbage with finalizers, automatic gc off) whose main thread sits in each state; the job runs on "
           "the bridge's own thread, which takes the GIL (docs/python.md). Round trip in ms, over one "
           "connection.\n\n" +
           table(["main thread", "n", "stats median", "stats p99", "gc median", "gc p99"], py_rows))
    interps, why = interpreters(ctx)
    v_rows = versions_round_trip(ctx, interps, p["n_py"])
    md += ("\n\nEvery version the tests run that a user runs today: the default python and Debian sid's "
           "3.13, 3.14 and 3.15 (in the chroot scripts/test-deps.sh builds; 3.15 attaches under a PEP 788 "
           "guard), main thread in `time.sleep`. Round trip in ms, over one connection."
           + (f" Debian sid's: **skipped** ({why})." if why else "") + "\n\n" +
           table(["interpreter", "n", "stats median", "stats p99", "gc median", "gc p99"], v_rows))
    x_rows = exit_times(ctx, interps, p["exit_rounds"])
    md += ("\n\nExit time: ms from the line that tells tests/fixtures/py_exit.py to exit (at once, from a "
           "sleep; the interpreter finalizes fully) until the process has ended, without the shim, under it "
           "(endpoint on), and under it while `gc` and `stats` requests arrive over one connection from its "
           "start to its end. Median / p99 / max of each.\n\n" +
           table(["interpreter", "rounds", "plain med", "p99", "max", "shim med", "p99", "max",
                  "under requests med", "p99", "max"], x_rows))
    res = {"stats_ms": median(stats_t) * 1000, "purge_ms": median(purge_t) * 1000}
    if p["bert"]:
        b = bert_release(ctx)
        if b is None:
            md += "\n\nBERT release: **skipped** (torch or transformers not importable)."
        else:
            res["bert"] = b
            md += (f"\n\nBERT release while the main thread sleeps (tests/fixtures/py_torch.py, "
                   f"BertModel(BertConfig()), decay off so only the release returns memory): RSS "
                   f"{fmt(b['base'])} MB before loading, {fmt(b['unloaded'])} MB after `del model`, "
                   f"{fmt(b['after'])} MB after `release` ({fmt(b['unloaded'] - b['after'])} MB returned) "
                   f"in {fmt(b['ms'])} ms, gc step {fmt(b['gc_ms'])} ms; steps: {b['outcomes']}.")
    res["md"] = md
    return res
