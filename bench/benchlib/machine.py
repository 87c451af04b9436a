"""Facts about the machine and the software a run measured."""

import os
import platform
import subprocess

from .configs import ROOT


def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def facts(python):
    cpu = sh("lscpu | sed -n 's/^Model name: *//p' | head -1")
    mem = sh("awk '/MemTotal/ {printf \"%.1f GiB\", $2/1048576}' /proc/meminfo")
    pkgs = sh("dpkg-query -W -f='${Package} ${Version}\\n' libjemalloc2 libtcmalloc-minimal4 libmimalloc2.0 "
              "2>/dev/null")
    torch = sh(f"{python} -c 'import torch, transformers; print(torch.__version__, transformers.__version__)' "
               "2>/dev/null")
    return [
        ("kernel", platform.release()),
        ("CPU", f"{cpu}, {os.cpu_count()} CPUs"),
        ("memory", mem),
        ("OS", sh(". /etc/os-release; echo $PRETTY_NAME")),
        ("glibc", sh("ldd --version | head -1")),
        ("gcc", sh("gcc --version | head -1")),
        ("python", f"{python} ({sh(python + ' -VV')})"),
        ("torch, transformers", torch or "not importable"),
        ("comparison allocators", "; ".join(pkgs.splitlines()) or "none installed"),
        ("memshim", sh(f"git -C {ROOT} describe --always --dirty") + " (target/release/libmemshim.so)"),
        ("load average at start", sh("cut -d' ' -f1-3 /proc/loadavg")),
    ]
