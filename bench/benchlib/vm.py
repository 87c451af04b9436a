"""A QEMU VM on live cgroup v2 for the benchmarks: the tests' VM (tests/src/vm.rs, tests/vm/README.md),
booted the same way from Python.

The kernels, the initramfs and its init come from the cache of scripts/vm-image.sh (`make test-deps`
runs it). The guest mounts this machine's root read-only over 9p under a tmpfs overlay (every program,
library and build output is at the same path), cgroup2 on /sys/fs/cgroup with +memory +cpu +cpuset,
tmpfs on /tmp, /run, /dev/shm, and the THP mode asked for; it runs one command and powers off. Unlike the
tests' VM there is no ext4 scratch disk: the benchmarks write no files that page cache would charge.
The command's stdout, stderr and status come back through a read-write 9p share, which the command may
also write files into (its path, the same in the guest as here, is in the command's $VM_SHARE).

Acceleration: TCG (software emulation, code runs 5 to 50 times slower) unless MEMSHIM_VM_ACCEL=kvm: the
development and CI machines' /dev/kvm cannot run a stock kernel (tests/src/vm.rs probes it; not here)."""

import hashlib
import os
import sys
import shutil
import subprocess
import time

from .configs import ROOT

KERNEL_CMDLINE = "console=ttyS0 panic=-1 quiet mitigations=off no_timer_check"  # = vm::KERNEL_CMDLINE
PASSED_ENV = ("PATH", "HOME", "USER", "LANG", "LC_ALL", "TERM")


def cache_dir():
    c = os.environ.get("MEMSHIM_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.environ.get("HOME") or "/root", ".cache"), "memshim")
    return os.path.join(c, "vm")


def _first_line(p):
    try:
        with open(p) as f:
            return (f.readline() or "").strip()
    except OSError:
        return None


def kernel(role):
    """(directory, version) of the cached kernel `role` (`newest`, `bookworm`), or (None, why not)."""
    if not shutil.which("qemu-system-x86_64"):
        return None, "qemu-system-x86_64 is not installed (make test-deps installs qemu-system-x86)"
    cache = cache_dir()
    for skip in ("all.skip", f"{role}.skip"):
        why = _first_line(os.path.join(cache, skip))
        if why is not None:
            return None, f"no {role} kernel: {why}"
    d = os.path.join(cache, role)
    if not os.path.exists(os.path.join(d, "ready")):
        return None, f"no {role} kernel in {cache}: run scripts/vm-image.sh (make test-deps runs it)"
    # scripts/vm-image.sh stamps each kernel's initramfs with a hash of the sources of its init (a content
    # hash, not times: a fresh checkout or worktree has new times and the same init).
    h = hashlib.sha256()
    for src in ("tests/vm/init.c", "tests/vm/mkinitramfs.py", "scripts/vm-image.sh"):
        with open(os.path.join(ROOT, src), "rb") as f:
            h.update(f.read())
    if _first_line(os.path.join(d, "stamp")) != h.hexdigest()[:16]:
        return None, f"{d}/initramfs was built from other sources of its init: run scripts/vm-image.sh"
    return os.path.realpath(d), _first_line(os.path.join(d, "kernel")) or role


# Boots of a kernel that panicked before the command started (seen once on Debian's 7.2 kernel under
# TCG: an int3 of the kernel's own text patching in sched_clock_cpu, 2.8 s into boot) are tried again,
# this many times: nothing of the command ran, so nothing of what it measures is repeated.
BOOT_RETRIES = 2


class _PanickedAtBoot(RuntimeError):
    pass


def run(kdir, argv, env=None, cwd=ROOT, vcpus=1, mem_mib=1536, thp="madvise", timeout=900, keep_share=False):
    """Boots the kernel in `kdir`, runs `argv` and powers off. Returns a dict: code, stdout, stderr,
    boot_s, run_s, console, share (the share's directory, kept only with keep_share). Raises RuntimeError
    when the VM does not power off in `timeout` seconds or ends without the command's status. A kernel
    that panics before the command starts is booted again (BOOT_RETRIES times at most), and the harness says so."""
    for attempt in range(BOOT_RETRIES + 1):
        try:
            return _run_once(kdir, argv, env, cwd, vcpus, mem_mib, thp, timeout, keep_share,
                             last=attempt == BOOT_RETRIES)
        except _PanickedAtBoot as e:
            print(f"vm: the kernel panicked before the command started; booting again\n{e}",
                  file=sys.stderr, flush=True)
    raise AssertionError("unreachable")


def _run_once(kdir, argv, env, cwd, vcpus, mem_mib, thp, timeout, keep_share, last):
    d = os.path.join(ROOT, "target", "vm", f"bench-{os.getpid()}-{time.monotonic_ns()}")
    share = os.path.join(d, "share")
    os.makedirs(share)
    job = [f"arg={a}" for a in argv]
    env = dict(env or {})
    job += [f"env={k}={os.environ[k]}" for k in PASSED_ENV if k in os.environ and k not in env]
    job += [f"env={k}={v}" for k, v in env.items()] + [f"env=VM_SHARE={share}"]
    # A fresh /tmp, unless what the VM must see lies under it (a checkout in /tmp, as CI's fresh
    # clone): the overlay makes it writable all the same (tests/src/vm.rs does the same).
    tmp = [] if any(p.startswith("/tmp/") for p in (ROOT, cwd, share)) else ["tmpfs=/tmp"]
    job += [f"cwd={cwd}", f"share={share}"] + tmp + ["tmpfs=/run", "tmpfs=/dev/shm",
            "cgroup2=nsdelegate,memory_recursiveprot", "controllers=+memory +cpu +cpuset", f"thp={thp}",
            "hostname=memshim-vm"]
    with open(os.path.join(share, "job"), "wb") as f:
        for r in job:
            f.write(r.encode() + b"\0")
    accel = ["-accel", "kvm", "-cpu", "host"] if os.environ.get("MEMSHIM_VM_ACCEL") == "kvm" else \
        ["-accel", "tcg,thread=multi", "-cpu", "max"]
    console = os.path.join(d, "console.log")
    q = ["qemu-system-x86_64", "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
         "-machine", "pc", "-monitor", "none"] + accel + [
        "-smp", str(vcpus), "-m", str(mem_mib), "-kernel", os.path.join(kdir, "vmlinux"),
        "-initrd", os.path.join(kdir, "initramfs"), "-append", KERNEL_CMDLINE, "-serial", f"file:{console}",
        "-fsdev", "local,id=hostroot,path=/,readonly=on,security_model=none,multidevs=remap",
        "-device", "virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot",
        "-fsdev", f"local,id=share,path={share.replace(',', ',,')},security_model=none",
        "-device", "virtio-9p-pci,fsdev=share,mount_tag=share"]
    t0 = time.monotonic()
    started = None
    with open(os.path.join(d, "qemu.log"), "w") as log:
        p = subprocess.Popen(q, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        while p.poll() is None:
            if started is None and os.path.exists(os.path.join(share, "started")):
                started = time.monotonic()
            if time.monotonic() - t0 > timeout:
                p.kill()
                p.wait()
                raise RuntimeError(f"the VM did not power off within {timeout} s; console:\n"
                                   + _tail(console, 30) + "\nstderr:\n" + _tail(os.path.join(share, "stderr"), 30))
            time.sleep(0.05)
    end = time.monotonic()
    status = (_first_line(os.path.join(share, "status")) or "").split()
    if len(status) != 2:
        if started is None and not last and "Kernel panic" in _read(console):
            raise _PanickedAtBoot(_tail(console, 12))
        raise RuntimeError(f"the VM ended (qemu exit {p.returncode}) without the command's status; console:\n"
                           + _tail(console, 30) + "\n" + _tail(os.path.join(d, "qemu.log"), 5))
    code = int(status[1]) + (128 if status[0] == "signal" else 0)
    started = started or end
    out = {"code": code, "stdout": _read(os.path.join(share, "stdout")),
           "stderr": _read(os.path.join(share, "stderr")), "boot_s": started - t0, "run_s": end - started,
           "console": _read(console), "share": share, "vcpus": vcpus, "accel": accel[1].split(",")[0]}
    if not keep_share and not os.environ.get("MEMSHIM_VM_KEEP"):
        shutil.rmtree(d, ignore_errors=True)
    return out


def _read(p):
    try:
        with open(p, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _tail(p, n):
    return "\n".join(_read(p).splitlines()[-n:])
