"""Scenario 1: load and unload a bert-base-sized model in cycles, as a model server does.

Each cycle builds the model (in the main thread, or in a fresh worker thread
with --mode thread), runs a few forward passes, deletes it in the main thread,
collects, optionally calls malloc_trim(0) (BENCH_MALLOC_TRIM=1: the
"glibc + malloc_trim after every unload" configuration) and idles. One JSON
line per event on stdout: base, loaded, unloaded, idle (per cycle), final.

--kind torch   transformers.BertModel(BertConfig()) built from its config (no download)
--kind numpy   numpy float32 arrays with bert-base's tensor shapes, plus Python-object
               churn with a few survivors per cycle (fallback when torch is missing)
--kind bytes   the same with bytearrays (fallback when numpy is missing too)
"""

import argparse
import ctypes
import gc
import json
import os
import sys
import threading
import time

T0 = time.monotonic()


def status():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM", "RssAnon"):
                out[k] = int(v.split()[0])
    return out


def emit(event, **extra):
    s = status()
    rec = {"event": event, "t": round(time.monotonic() - T0, 3), "rss_kb": s["VmRSS"],
           "hwm_kb": s["VmHWM"], "anon_kb": s.get("RssAnon", -1)}
    rec.update(extra)
    print(json.dumps(rec), flush=True)


# bert-base: vocab 30522, hidden 768, 12 layers, intermediate 3072, 512 positions.
def bert_shapes(scale):
    h = max(8, int(768 * scale))
    inter, vocab, layers = 4 * h, max(64, int(30522 * scale)), 12
    shapes = [(vocab, h), (512, h), (2, h), (h,), (h,)]
    for _ in range(layers):
        for _ in range(4):
            shapes += [(h, h), (h,)]
        shapes += [(h,), (h,), (h, inter), (inter,), (inter, h), (h,), (h,), (h,)]
    shapes += [(h, h), (h,)]
    return shapes, h


class ArrayModel:
    """bert-base-sized weights as numpy arrays or bytearrays, plus object churn."""

    def __init__(self, kind, scale, survivors, cycle):
        shapes, self.h = bert_shapes(scale)
        self.kind = kind
        self.weights = []
        churn = []
        for i, shp in enumerate(shapes):
            n = 1
            for d in shp:
                n *= d
            if kind == "numpy":
                import numpy as np
                a = np.empty(shp, dtype=np.float32)
                a.fill(1.0 / shp[0])
            else:
                a = bytearray(4 * n)
            self.weights.append(a)
            # Python-level state created while loading: config dicts, names, tuples.
            for j in range(400):
                churn.append({"name": f"layer.{i}.{j}", "shape": shp, "c": cycle})
        # A few objects outlive the model (caches, registries): the floor rises slowly.
        survivors.extend(churn[:: 50])
        del churn

    def forward(self, batch=8, seq=128):
        if self.kind != "numpy":
            for w in self.weights[:40]:
                bytes(w[: 1 << 16])
            return
        import numpy as np
        x = np.full((batch * seq, self.h), 0.01, dtype=np.float32)
        for w in self.weights[5:]:
            if w.ndim == 2 and w.shape[0] == x.shape[1]:
                y = x @ w
                x = y[:, : self.h] if y.shape[1] != self.h else y
        return float(x[0, 0])


def build(kind, scale, survivors, cycle):
    if kind == "torch":
        import torch
        from transformers import BertConfig, BertModel
        model = BertModel(BertConfig())
        model.eval()
        with torch.no_grad():
            ids = torch.randint(0, 30000, (2, 128))
            for _ in range(3):
                model(input_ids=ids)
        return model
    m = ArrayModel(kind, scale, survivors, cycle)
    for _ in range(3):
        m.forward()
    return m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", choices=["torch", "numpy", "bytes"], required=True)
    ap.add_argument("--mode", choices=["main", "thread"], required=True)
    ap.add_argument("--cycles", type=int, default=5)
    ap.add_argument("--idle", type=float, default=2.0)
    ap.add_argument("--final-idle", type=float, default=2.0)
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of bert-base's hidden size (arrays only)")
    a = ap.parse_args()
    if a.kind == "torch":
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch  # noqa: F401  (import cost is part of the base line)
        import transformers  # noqa: F401
        torch.manual_seed(0)
    elif a.kind == "numpy":
        import numpy  # noqa: F401
    trim = os.environ.get("BENCH_MALLOC_TRIM") == "1"
    libc = ctypes.CDLL(None)
    survivors = []
    holder = []
    emit("base")
    for c in range(1, a.cycles + 1):
        t = time.monotonic()
        if a.mode == "thread":
            th = threading.Thread(target=lambda: holder.append(build(a.kind, a.scale, survivors, c)))
            th.start()
            th.join()
        else:
            holder.append(build(a.kind, a.scale, survivors, c))
        emit("loaded", cycle=c, load_s=round(time.monotonic() - t, 3))
        holder.clear()
        gc.collect()
        if trim:
            libc.malloc_trim(0)
        emit("unloaded", cycle=c)
        time.sleep(a.idle)
        emit("idle", cycle=c)
    time.sleep(a.final_idle)
    emit("final")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
