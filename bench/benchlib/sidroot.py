"""Debian sid's CPythons (3.13, 3.14, 3.15), in the root filesystem that
scripts/test-deps.sh builds (the tests' tests/src/sid.rs says the same in
Rust): this machine cannot run sid's binaries, so they run chrooted into
it, in a mount namespace of their own with /proc, /dev, /sys, /tmp and the
checkout bound at the same paths, so that LD_PRELOAD, scripts and socket
directories mean the same on both sides. Needs root; without the root or
root rights, `interpreters()` says why."""

import os
import shlex
import subprocess

from .configs import ROOT

MINORS = ["3.13", "3.14", "3.15"]


def root_path():
    """MEMSHIM_TEST_SID_ROOT, else test-deps' cache directory rule."""
    if os.environ.get("MEMSHIM_TEST_SID_ROOT"):
        return os.environ["MEMSHIM_TEST_SID_ROOT"]
    cache = os.environ.get("MEMSHIM_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.environ.get("HOME") or "/root", ".cache"), "memshim")
    return os.path.join(cache, "debian-sid")


def wrap(argv):
    """argv (a program inside the root, and its arguments) as a command run
    there; the pid of the process started is the program's own (exec all
    the way)."""
    root = root_path()
    binds = " ".join(f"mount --rbind {d} {shlex.quote(root + d)};" for d in ("/proc", "/dev", "/sys"))
    script = (f"{binds} mount --bind /tmp {shlex.quote(root + '/tmp')}; "
              f"mkdir -p {shlex.quote(root + ROOT)} && mount --bind {shlex.quote(ROOT)} {shlex.quote(root + ROOT)}; "
              f"cd / && exec chroot {shlex.quote(root)} \"$@\"")
    return ["unshare", "-m", "--propagation", "private", "--", "sh", "-c", script, "sid"] + list(argv)


def interpreters():
    """([(label, argv prefix)], why-not): sid's interpreters that run here."""
    root = root_path()
    if os.geteuid() != 0:
        return [], "not root (the sid root is entered with unshare and chroot)"
    if not os.path.isdir(os.path.join(root, "usr", "bin")):
        why = os.path.join(os.path.dirname(root), "debian-sid.unavailable")
        reason = open(why).read().strip() if os.path.exists(why) else "make test-deps builds it"
        return [], f"no Debian sid root at {root} ({reason})"
    out = []
    for m in MINORS:
        exe = f"/usr/bin/python{m}"
        if not os.path.exists(root + exe):
            continue
        try:
            v = subprocess.run(wrap([exe, "-c", "import sys; print(sys.version.split()[0])"]),
                               capture_output=True, text=True, timeout=60).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            continue
        if v:
            out.append((f"{v} (sid)", wrap([exe])))
    return out, ("" if out else f"no interpreter of {MINORS} runs in {root}")
