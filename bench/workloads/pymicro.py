"""Scenario 5 fallback: allocation-heavy pure-Python micro workloads (used when
pyperformance is not installed, and always by the smoke run). Prints one JSON
line per workload with the best of REPEAT timings in seconds."""

import copy
import json
import pickle
import sys
import time


def dicts(n):
    out = []
    for i in range(n):
        out.append({"id": i, "name": "item%d" % i, "tags": [i, i + 1, str(i)], "score": i * 0.5})
        if len(out) > 2000:
            out = out[1000:]


def strings(n):
    parts = []
    for i in range(n):
        parts.append(("x" * (i % 300)) + str(i))
        if len(parts) > 5000:
            "".join(parts)
            parts.clear()


def json_roundtrip(n):
    doc = {"k%d" % i: [i, str(i) * 5, {"a": i, "b": [1.5] * 10}] for i in range(200)}
    for _ in range(n):
        json.loads(json.dumps(doc))


def pickle_roundtrip(n):
    doc = [{"x": i, "y": [str(i)] * 8, "z": (i, i * 2.0)} for i in range(300)]
    for _ in range(n):
        pickle.loads(pickle.dumps(doc))


def deepcopy(n):
    doc = {"a": [list(range(50)) for _ in range(20)], "b": {"c": [{"d": i} for i in range(100)]}}
    for _ in range(n):
        copy.deepcopy(doc)


def bigints(n):
    x = 1
    for i in range(n):
        x = x * 3 + i
        if x.bit_length() > 200000:
            x = 1


WORKLOADS = [("dicts", dicts, 200000), ("strings", strings, 300000), ("json_roundtrip", json_roundtrip, 100),
             ("pickle_roundtrip", pickle_roundtrip, 300), ("deepcopy", deepcopy, 300), ("bigints", bigints, 60000)]


def main():
    scale = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
    repeat = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    for name, fn, n in WORKLOADS:
        n = max(1, int(n * scale))
        best = None
        for _ in range(repeat):
            t = time.perf_counter()
            fn(n)
            d = time.perf_counter() - t
            best = d if best is None else min(best, d)
        print(json.dumps({"event": "result", "name": name, "s": best}), flush=True)


if __name__ == "__main__":
    main()
