"""A model server in the FastAPI style that loads and unloads a model on
request, to watch what memshim does to the process's memory.

Standard library only (http.server), so it runs in a bare python image and in
CI without network access; the routes are the ones a FastAPI app would have:

  GET  /health   -> {"ok": true}
  GET  /stats    -> backend, whether a model is loaded, RSS, whether the shim is mapped
  POST /load     -> builds the model, reports RSS before and after
  POST /unload   -> drops it, collects garbage, waits settle_ms (query, default 0),
                    reports RSS before and after

The model: a real transformers BertModel built from a BertConfig (random
weights, nothing downloaded) when torch and transformers import; otherwise a
stand-in with the same parameter shapes, as numpy float32 arrays or, without
numpy, as bytearrays. The backend in every response says which one ran.
Size: DEMO_LAYERS (default 12) and DEMO_HIDDEN (default 768), i.e. BERT-base.
"""

import argparse
import gc
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

LAYERS = int(os.environ.get("DEMO_LAYERS", "12"))
HIDDEN = int(os.environ.get("DEMO_HIDDEN", "768"))
VOCAB = 30522


def pick_backend():
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401

        return "torch-bert"
    except Exception:
        pass
    try:
        import numpy  # noqa: F401

        return "numpy-standin"
    except Exception:
        return "bytes-standin"


BACKEND = os.environ.get("DEMO_BACKEND") or pick_backend()


def param_shapes():
    """Parameter shapes of a BERT encoder with LAYERS layers of width HIDDEN."""
    h, ff = HIDDEN, 4 * HIDDEN
    shapes = [(VOCAB, h), (512, h), (2, h), (h,), (h,)]
    for _ in range(LAYERS):
        shapes += [(h, h), (h,)] * 4  # q, k, v, attention output
        shapes += [(h,), (h,), (ff, h), (ff,), (h, ff), (h,), (h,), (h,)]
    shapes += [(h, h), (h,)]  # pooler
    return shapes


def import_backend():
    """Imports what build_model needs, at startup, so that the RSS figures of
    /load and /unload measure the model rather than module imports."""
    if BACKEND == "torch-bert":
        from transformers import BertConfig, BertModel  # noqa: F401
    elif BACKEND == "numpy-standin":
        import numpy  # noqa: F401


def model_bytes():
    """Bytes of parameters of the model (same for every backend)."""
    n = 0
    for s in param_shapes():
        k = 4
        for d in s:
            k *= d
        n += k
    return n


def build_model():
    if BACKEND == "torch-bert":
        from transformers import BertConfig, BertModel

        cfg = BertConfig(
            hidden_size=HIDDEN,
            num_hidden_layers=LAYERS,
            num_attention_heads=max(1, HIDDEN // 64),
            intermediate_size=4 * HIDDEN,
        )
        return BertModel(cfg).eval()
    if BACKEND == "numpy-standin":
        import numpy as np

        rng = np.random.default_rng(0)
        return [rng.standard_normal(s, dtype=np.float32) for s in param_shapes()]
    out = []
    for s in param_shapes():
        n = 4
        for d in s:
            n *= d
        out.append(bytearray(os.urandom(64)) * (n // 64 + 1))
    return out


def rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def shim_mapped():
    with open("/proc/self/maps") as f:
        return any("libmemshim" in line for line in f)


class State:
    lock = threading.Lock()
    model = None


def stats():
    return {
        "backend": BACKEND,
        "layers": LAYERS,
        "hidden": HIDDEN,
        "loaded": State.model is not None,
        "model_bytes": model_bytes(),
        "rss_bytes": rss_bytes(),
        "shim_mapped": shim_mapped(),
        "pid": os.getpid(),
    }


def load():
    with State.lock:
        before = rss_bytes()
        if State.model is None:
            State.model = build_model()
        return {**stats(), "rss_before": before}


def unload(settle_ms):
    with State.lock:
        before = rss_bytes()
        State.model = None
        gc.collect()
        if settle_ms > 0:
            time.sleep(settle_ms / 1000)
        return {**stats(), "rss_before": before}


class Handler(BaseHTTPRequestHandler):
    def reply(self, code, body):
        data = (json.dumps(body) + "\n").encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def route(self, method):
        url = urlparse(self.path)
        q = parse_qs(url.query)
        try:
            if method == "GET" and url.path == "/health":
                return self.reply(200, {"ok": True})
            if method == "GET" and url.path == "/stats":
                return self.reply(200, stats())
            if method == "POST" and url.path == "/load":
                return self.reply(200, load())
            if method == "POST" and url.path == "/unload":
                settle = int(q.get("settle_ms", ["0"])[0])
                return self.reply(200, unload(max(0, min(settle, 60000))))
        except ValueError as e:
            return self.reply(400, {"error": str(e)})
        return self.reply(404, {"error": f"no route {method} {url.path}"})

    def do_GET(self):
        self.route("GET")

    def do_POST(self):
        self.route("POST")

    def log_message(self, fmt, *args):
        if not QUIET:
            sys.stderr.write("%s %s\n" % (self.address_string(), fmt % args))


QUIET = False


def main():
    global QUIET
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    ap.add_argument("--quiet", action="store_true", help="no request log on stderr")
    a = ap.parse_args()
    QUIET = a.quiet
    import_backend()
    srv = ThreadingHTTPServer((a.host, a.port), Handler)
    print(f"listening on {srv.server_address[0]}:{srv.server_address[1]} backend={BACKEND}", flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
