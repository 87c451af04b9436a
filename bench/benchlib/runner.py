"""Runs one workload process under one configuration and watches its memory.

A sampler thread polls /proc/<pid>/status (VmRSS, VmHWM) every SAMPLE_S
while the process lives; a reader thread collects the JSON event lines the
workloads print on stdout. start() returns a handle so that a scenario can
overlap one process's idle phase with the next process's work (wait_event)."""

import json
import os
import subprocess
import threading
import time

SAMPLE_S = 0.05


def read_status(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "VmHWM", "RssAnon"):
                    out[k] = int(v.split()[0])
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return None
    return out


class Run:
    def __init__(self, cmd, config, extra_env=None, label=""):
        self.cmd, self.config, self.label = cmd, config, label
        self.events, self.samples, self.stderr = [], [], ""
        self.peak_kb = 0
        self.rc = None
        self._cv = threading.Condition()
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=config.environ(extra_env))
        self._threads = [threading.Thread(target=f, daemon=True) for f in (self._read, self._sample, self._err)]
        for t in self._threads:
            t.start()

    def _read(self):
        for line in self.proc.stdout:
            line = line.strip()
            if line.startswith("{"):
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                with self._cv:
                    self.events.append(ev)
                    self._cv.notify_all()

    def _err(self):
        self.stderr = self.proc.stderr.read()

    def _sample(self):
        pid = self.proc.pid
        while self.proc.poll() is None:
            s = read_status(pid)
            if s and "VmRSS" in s:
                self.samples.append((time.monotonic() - self.t0, s["VmRSS"]))
                self.peak_kb = max(self.peak_kb, s.get("VmHWM", 0), s["VmRSS"])
            time.sleep(SAMPLE_S)

    def wait_event(self, name, timeout=600):
        end = time.monotonic() + timeout
        with self._cv:
            while not any(e.get("event") == name for e in self.events):
                if self.proc.poll() is not None and not self._threads[0].is_alive():
                    return False
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(min(left, 0.2))
        return True

    def finish(self, timeout=900):
        try:
            self.rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.rc = self.proc.wait()
        for t in self._threads:
            t.join(timeout=5)
        self.wall = time.monotonic() - self.t0
        for e in self.events:
            self.peak_kb = max(self.peak_kb, e.get("hwm_kb", 0))
        if self.rc != 0:
            raise HarnessError(f"{self.label or self.cmd[0]} under {self.config.name} exited {self.rc}: "
                               f"{self.stderr.strip()[-800:]}")
        return self

    def event(self, name, **match):
        for e in self.events:
            if e.get("event") == name and all(e.get(k) == v for k, v in match.items()):
                return e
        return None

    def all(self, name):
        return [e for e in self.events if e.get("event") == name]


class HarnessError(RuntimeError):
    pass


def run(cmd, config, extra_env=None, label="", timeout=900):
    return Run(cmd, config, extra_env, label).finish(timeout)


def real_python():
    """The real CPython binary behind python3 (pyenv's python3 is a bash script)."""
    import sys
    return os.path.realpath(sys.executable)
