"""Whole-program runs under several allocators, interleaved (bench/bigblocks.py, scenario 9 and bench/patterns.py).

A configuration is (name, preload or None, extra environment). Every round runs each configuration
once, in an order rotated by one per round, so that drift in the machine's load spreads over all of
them; figures are medians over rounds."""

import json
import os
import statistics
import subprocess
import time

from .configs import CONTROLLED_PREFIXES


def parse_config(text):
    """NAME=LIB[:ENV=V,...] (LIB empty: no preload)."""
    name, _, rest = text.partition("=")
    lib, _, envs = rest.partition(":")
    env = dict(kv.split("=", 1) for kv in envs.split(",") if kv)
    return (name, lib or None, env)


def run_once(argv, lib, env):
    """One run: its JSON event lines by event name (common.h's emit), and minor faults, CPU seconds
    (user + system) and wall seconds from wait4. Raises RuntimeError if the program fails (the harness
    reports it as the scenario's error and goes on; bench/bigblocks.py and bench/patterns.py exit)."""
    e = {k: v for k, v in os.environ.items() if not k.startswith(CONTROLLED_PREFIXES)}
    e.update(env)
    if lib:
        e["LD_PRELOAD"] = lib
    t = time.monotonic()
    p = subprocess.Popen(argv, env=e, stdout=subprocess.PIPE)
    out = p.stdout.read().decode()
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.monotonic() - t
    if status != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({status}) under {lib} {env}")
    events = {j["event"]: j for j in map(json.loads, out.split("\n")[:-1])}
    # Not wait4's ru_maxrss: it counts the forked copy of this Python process before the exec.
    return {"events": events, "faults": ru.ru_minflt, "cpu": ru.ru_utime + ru.ru_stime, "wall": wall}


def rounds(configs, runs, measure):
    """measure(name, lib, env) -> dict of figures, for every configuration in each of `runs`
    rotated rounds; returns {name: [dict, ...]}."""
    res = {c[0]: [] for c in configs}
    for r in range(runs):
        order = configs[r % len(configs):] + configs[:r % len(configs)]
        for name, lib, env in order:
            res[name].append(measure(name, lib, env))
    return res


def medians(res, keys):
    return {n: {k: statistics.median(x[k] for x in rs) for k in keys} for n, rs in res.items()}


def spreads(res, keys):
    return {n: {k: (min(x[k] for x in rs), max(x[k] for x in rs)) for k in keys} for n, rs in res.items()}
