"""Run-wide settings shared by the scenarios: mode parameters, configurations, output paths."""

import os
import sys
import time

from .configs import ROOT


class Context:
    def __init__(self, mode, params, configs, variants, reps, out_dir, plot_dir, programs, python,
                 named_configs=frozenset()):
        self.mode, self.p, self.configs, self.variants = mode, params, configs, variants
        # The configurations --configs named (empty: the run's defaults).
        self.named_configs = named_configs
        self.reps, self.out_dir, self.plot_dir = reps, out_dir, plot_dir
        self.programs, self.python = programs, python
        self.t_start = time.monotonic()
        os.makedirs(plot_dir, exist_ok=True)

    def plot(self, name):
        """(absolute path, path relative to the report) of a plot file."""
        path = os.path.join(self.plot_dir, name)
        return path, os.path.relpath(path, self.out_dir)

    def rel(self, path):
        return os.path.relpath(path, ROOT)

    def log(self, msg):
        el = time.monotonic() - self.t_start
        print(f"[{el:7.1f}s] {msg}", file=sys.stderr, flush=True)


def table(headers, rows):
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(c) for c in r) + " |")
    return "\n".join(out)
