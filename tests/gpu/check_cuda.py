#!/usr/bin/env python3
"""GPU checks of memshim's PyTorch bridge (issue 4). Run: make test-gpu.

Needs an NVIDIA GPU, nvidia-smi, and torch with CUDA for this python.
Without them it prints SKIP and exits 0 (CI has no GPU).

It starts target processes under LD_PRELOAD=libmemshim.so and talks to
their control sockets with the real protocol (newline-delimited JSON):

1. stats: the torch section of a process that uses one device D (cuda:1
   if there are two GPUs or more, else cuda:0) matches
   torch.cuda.memory_stats(D) read by the process's own main thread, and
   lists only devices that have a context.
2. empty-cache on that process creates no new CUDA context: nvidia-smi
   --query-compute-apps shows the process on the same GPUs before and
   after (with D=1, never on GPU 0).
3. release after the process freed its tensors: the empty_cache step
   brings reserved bytes down to what the main thread then reads.
4. a process that imported torch but never used CUDA: stats, empty-cache
   and release leave CUDA uninitialised and the process off nvidia-smi.
5. the newer figures: fragmentation = inactive_split / reserved, the
   device UUID is nvidia-smi's, the pinned host cache equals
   torch.cuda.host_memory_stats(), and `memshim-ctl stats --json` puts the
   driver's per-process figure (NVML) beside torch's reserved bytes, equal
   to nvidia-smi's used_memory.
6. release empties the pinned host cache, and the process's VRAM as
   nvidia-smi sees it drops.
7. a real transformer (BertModel from its config) loaded on the GPU,
   deleted, released: reserved and nvidia-smi's figure drop to near the
   CUDA context's fixed cost.
8. idle return (MEMSHIM_CUDA_IDLE_MS): after the idle time the cache is
   emptied by itself, and never while a loop keeps the GPU busy.

Exit status 0 when every check passed (or SKIP), 1 otherwise.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIB = os.environ.get("MEMSHIM_TEST_LIB", os.path.join(ROOT, "target/release/libmemshim.so"))

TARGET = r'''
import json, os, select, sys, time, torch
dev = int(sys.argv[1])
tensors = []
model = None
if dev >= 0:
    tensors = [torch.empty(64 << 20, dtype=torch.uint8, device=f"cuda:{dev}") for _ in range(8)]
    small = torch.ones(1000, device=f"cuda:{dev}") * 2  # splits a block
    pinned = torch.empty(32 << 20, dtype=torch.uint8, pin_memory=True)
    del pinned  # back to the pinned host cache
def stats():
    s = torch.cuda.memory_stats(dev)
    keys = ["allocated_bytes.all.current", "reserved_bytes.all.current", "active_bytes.all.current",
            "inactive_split_bytes.all.current", "allocated_bytes.all.peak", "num_alloc_retries", "num_ooms"]
    return {k: s.get(k, 0) for k in keys}
print("ready", flush=True)
buf = b""
while True:
    r, _, _ = select.select([0], [], [], 0.01)
    if not r:
        continue
    chunk = os.read(0, 4096)
    if not chunk:
        break
    buf += chunk
    while b"\n" in buf:
        line, buf = buf.split(b"\n", 1)
        cmd = line.decode().strip()
        if cmd == "stats":
            out = stats()
        elif cmd == "free":
            tensors.clear()
            out = stats()
        elif cmd == "cuda":
            out = {"initialized": torch.cuda.is_initialized()}
        elif cmd == "host":
            out = dict(torch.cuda.host_memory_stats())
        elif cmd == "bert":
            from transformers import BertConfig, BertModel
            model = BertModel(BertConfig()).to(f"cuda:{dev}")
            out = stats()
        elif cmd == "unbert":
            model = None
            out = stats()
        elif cmd.startswith("busy"):
            # Keep the GPU busy for N seconds (matmuls, synchronised).
            end = time.monotonic() + float(cmd.split()[1])
            a = torch.ones(2048, 2048, device=f"cuda:{dev}")
            while time.monotonic() < end:
                (a @ a).sum().item()
            out = stats()
        else:
            sys.exit(0)
        print(json.dumps(out), flush=True)
'''

failures = []


def skip(why):
    print(f"SKIP check_cuda: {why}")
    sys.exit(0)


def check(ok, what):
    print(("PASS " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def used_memory(pid):
    """{gpu_uuid: bytes} the driver says `pid` uses (nvidia-smi)."""
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=True,
    ).stdout
    used = {}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3 and parts[0] == str(pid) and parts[2].isdigit():
            used[parts[1]] = int(parts[2]) << 20
    return used


def ctl_stats(pid, sockdir):
    ctl = os.environ.get("MEMSHIM_TEST_CTL", os.path.join(ROOT, "target/release/memshim-ctl"))
    out = subprocess.run([ctl, "stats", str(pid), "--json"], capture_output=True, text=True,
                         env=dict(os.environ, MEMSHIM_SOCKET_DIR=sockdir))
    return json.loads(out.stdout) if out.returncode == 0 else {}


def compute_apps():
    """{pid: set(gpu_uuid)} from nvidia-smi."""
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader"],
        capture_output=True, text=True, check=True,
    ).stdout
    apps = {}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2 and parts[0].isdigit():
            apps.setdefault(int(parts[0]), set()).add(parts[1])
    return apps


def gpu_uuids():
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"],
        capture_output=True, text=True, check=True,
    ).stdout
    return {int(i): u.strip() for i, u in (l.split(",") for l in out.splitlines() if l.strip())}


class Target:
    def __init__(self, dev, sockdir, extra_env=None):
        self.script = os.path.join(sockdir, "target.py")
        with open(self.script, "w") as f:
            f.write(TARGET)
        env = dict(os.environ, LD_PRELOAD=LIB, MEMSHIM_CONTROL="on", MEMSHIM_SOCKET_DIR=sockdir,
                   MEMSHIM_DIRTY_DECAY_MS="-1", **(extra_env or {}))
        self.p = subprocess.Popen([sys.executable, self.script, str(dev)], env=env, text=True,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        line = self.p.stdout.readline()
        if "ready" not in line:
            raise RuntimeError(f"target did not start: {line!r} {self.p.stderr.read()}")
        self.sock = None
        for _ in range(500):
            names = [n for n in os.listdir(sockdir) if n.startswith(f"{self.p.pid}-") and n.endswith(".sock")]
            if names:
                self.sock = os.path.join(sockdir, names[0])
                break
            time.sleep(0.02)
        if not self.sock:
            raise RuntimeError("no control socket appeared")

    def ask(self, cmd):
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()
        return json.loads(self.p.stdout.readline())

    def request(self, op):
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(60)
        s.connect(self.sock)
        f = s.makefile("rwb")
        f.write(b'{"op":"hello","version":1}\n')
        f.flush()
        f.readline()
        f.write((json.dumps({"op": op}) + "\n").encode())
        f.flush()
        r = json.loads(f.readline())
        s.close()
        if "error" in r:
            raise RuntimeError(f"{op}: {r['error']}")
        return r["ok"]

    def close(self):
        try:
            self.p.stdin.write("quit\n")
            self.p.stdin.flush()
            self.p.wait(timeout=30)
        except Exception:
            self.p.kill()
        err = self.p.stderr.read()
        check(err == "", f"target {self.p.pid} stderr empty ({err[:200]!r})")


FIELDS = {
    "allocated": "allocated_bytes.all.current",
    "reserved": "reserved_bytes.all.current",
    "active": "active_bytes.all.current",
    "inactive_split": "inactive_split_bytes.all.current",
    "peak_allocated": "allocated_bytes.all.peak",
    "num_alloc_retries": "num_alloc_retries",
    "num_ooms": "num_ooms",
}


def main():
    if shutil.which("nvidia-smi") is None:
        skip("nvidia-smi not found (no NVIDIA GPU on this machine)")
    try:
        import torch
    except ImportError:
        skip(f"torch is not installed for {sys.executable}")
    if not torch.cuda.is_available():
        skip("torch.cuda.is_available() is False")
    if not os.path.exists(LIB):
        print(f"FAIL {LIB} is missing: run make first")
        sys.exit(1)
    n = torch.cuda.device_count()
    dev = 1 if n >= 2 else 0
    uuids = gpu_uuids()
    print(f"check_cuda: {n} GPU(s), target uses only cuda:{dev}; torch {torch.__version__}", flush=True)

    sockdir = tempfile.mkdtemp(prefix="memshim-gpu-")
    os.chmod(sockdir, 0o700)
    t = Target(dev, sockdir)
    try:
        # 1. stats against the main thread's own figures.
        s = t.request("stats")
        mine = t.ask("stats")
        torch_s = s.get("torch") or {}
        check(torch_s.get("cuda_initialized") is True, "stats: torch section says CUDA is initialized")
        devs = {d["index"]: d for d in torch_s.get("devices", [])}
        check(dev in devs, f"stats: device {dev} is listed")
        if n >= 2:
            check(0 not in devs, "stats: device 0 (no context) is not listed")
        if dev in devs:
            for ours, theirs in FIELDS.items():
                check(devs[dev][ours] == mine[theirs],
                      f"stats: {ours} = {devs[dev][ours]} matches memory_stats({dev})[{theirs!r}] = {mine[theirs]}")

        # 5. the newer figures.
        if dev in devs:
            d = devs[dev]
            want = mine["inactive_split_bytes.all.current"] / max(mine["reserved_bytes.all.current"], 1)
            check(abs(d["fragmentation"] - want) < 1e-9, f"stats: fragmentation {d['fragmentation']:.3f} = {want:.3f}")
            check(d.get("uuid") == uuids[dev], f"stats: uuid {d.get('uuid')} is nvidia-smi's {uuids[dev]}")
        host = t.ask("host")
        hp = torch_s.get("host_pinned") or {}
        check(hp.get("allocated") == host.get("allocated_bytes.current", -1),
              f"stats: pinned host allocated {hp.get('allocated')} = host_memory_stats {host.get('allocated_bytes.current')}")
        check(hp.get("cached", 0) > 0, f"stats: the freed pinned tensor sits in the cache ({hp.get('cached')})")
        check(torch_s.get("allocator_backend") in ("native", "cudaMallocAsync"), f"stats: backend {torch_s.get('allocator_backend')}")
        cs = ctl_stats(t.p.pid, sockdir)
        gpu = {g["index"]: g for g in cs.get("gpu") or []}
        smi = used_memory(t.p.pid).get(uuids[dev])
        check(dev in gpu and gpu[dev].get("driver_used") is not None,
              f"memshim-ctl stats: driver figure for cuda:{dev} ({cs.get('gpu')}, {cs.get('gpu_unavailable')})")
        if dev in gpu and gpu[dev].get("driver_used") is not None and smi is not None:
            check(abs(gpu[dev]["driver_used"] - smi) <= 2 << 20,
                  f"memshim-ctl stats: NVML {gpu[dev]['driver_used']} = nvidia-smi {smi} (within 2 MiB)")
            print(f"context and other on cuda:{dev}: {gpu[dev]['context_and_other'] / 2**20:.0f} MiB", flush=True)

        # 2. empty-cache creates no new context.
        before = compute_apps().get(t.p.pid, set())
        check(before == {uuids[dev]}, f"nvidia-smi: target on GPU {dev} only before empty-cache ({before})")
        e = t.request("empty_cache")
        print(f"empty_cache: {e}", flush=True)
        time.sleep(0.5)
        after = compute_apps().get(t.p.pid, set())
        check(after == before, f"nvidia-smi: no new context after empty-cache ({after})")

        # 3. release after the tensors were freed.
        freed = t.ask("free")
        check(freed["reserved_bytes.all.current"] > freed["allocated_bytes.all.current"],
              "free: the cache holds memory no tensor uses")
        r = t.request("release")
        step = [x for x in r["steps"] if x["step"] == "empty_cache"][0]
        now = t.ask("stats")
        print("release: " + "; ".join(
            f"{x['step']} {x['before'] / 2**20:.1f}->{x['after'] / 2**20:.1f} MiB {x['elapsed_ms']:.1f} ms"
            + (f" (skipped: {x['skipped']})" if x.get("skipped") else "") for x in r["steps"]), flush=True)
        check(step.get("skipped") is None, "release: the empty_cache step ran")
        check(step["before"] >= freed["reserved_bytes.all.current"] and step["after"] < step["before"],
              f"release: reserved went down ({step['before']} -> {step['after']})")
        check(step["after"] == now["reserved_bytes.all.current"],
              f"release: reported reserved after ({step['after']}) = main thread's ({now['reserved_bytes.all.current']})")
        after = compute_apps().get(t.p.pid, set())
        check(after == {uuids[dev]}, f"nvidia-smi: still GPU {dev} only after release ({after})")
        # 6. the pinned host cache, and the driver's figure.
        hc = [x for x in r["steps"] if x["step"] == "host_cache"]
        check(bool(hc) and hc[0]["outcome"] == "done" and hc[0]["after"] < hc[0]["before"],
              f"release: host_cache step emptied the pinned cache ({hc})")
        check(t.ask("host").get("allocated_bytes.current", 1) == t.ask("host").get("active_bytes.current", 0),
              "release: the pinned host cache holds nothing cached")
        # 7. a real transformer.
        base = used_memory(t.p.pid).get(uuids[dev], 0)
        loaded = t.ask("bert")
        t.ask("unbert")
        high = used_memory(t.p.pid).get(uuids[dev], 0)
        r = t.request("release")
        low = used_memory(t.p.pid).get(uuids[dev], 0)
        print(f"bert: nvidia-smi {base >> 20} -> {high >> 20} (loaded, deleted) -> {low >> 20} MiB (release); "
              f"reserved when loaded {loaded['reserved_bytes.all.current'] >> 20} MiB", flush=True)
        check(high - base > 300 << 20, "bert: the model took more than 300 MiB of VRAM")
        check(low <= base + (32 << 20), f"bert: release brought the driver's figure back ({low >> 20} <= {base >> 20} + 32 MiB)")
    finally:
        t.close()

    # 8. idle return: off by default; on with MEMSHIM_CUDA_IDLE_MS.
    idle = Target(dev, sockdir, {"MEMSHIM_CUDA_IDLE_MS": "2000", "MEMSHIM_CUDA_IDLE_MIN_MB": "64"})
    try:
        freed = idle.ask("free")
        held = freed["reserved_bytes.all.current"]
        busy = idle.ask("busy 5")
        check(busy["reserved_bytes.all.current"] >= held,
              f"idle return: nothing emptied while a loop kept the GPU busy ({busy['reserved_bytes.all.current']} >= {held})")
        deadline = time.monotonic() + 15
        now = busy
        while time.monotonic() < deadline:
            time.sleep(0.5)
            now = idle.ask("stats")
            if now["reserved_bytes.all.current"] < held:
                break
        check(now["reserved_bytes.all.current"] < held,
              f"idle return: reserved fell by itself after the idle time ({held} -> {now['reserved_bytes.all.current']})")
        check(compute_apps().get(idle.p.pid, set()) == {uuids[dev]}, "idle return: no new context")
    finally:
        idle.close()

    # 4. torch imported, CUDA never used.
    cpu = Target(-1, sockdir)
    try:
        s = cpu.request("stats")
        check((s.get("torch") or {}).get("cuda_initialized") is False, "cpu-only: stats says CUDA is not initialized")
        cpu.request("empty_cache")
        cpu.request("release")
        check(cpu.ask("cuda")["initialized"] is False, "cpu-only: CUDA still not initialized after the requests")
        check(cpu.p.pid not in compute_apps(), "cpu-only: the process has no CUDA context (nvidia-smi)")
    finally:
        cpu.close()
    shutil.rmtree(sockdir, ignore_errors=True)

    if failures:
        print(f"check_cuda: {len(failures)} check(s) FAILED")
        sys.exit(1)
    print("check_cuda: all checks passed")


if __name__ == "__main__":
    main()
