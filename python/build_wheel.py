#!/usr/bin/env python3
"""Packs libmemshim.so, memshim-ctl and the `memshim` Python package into a
manylinux wheel. Standard library only; `make wheel` runs it twice, after
the glibc-2.17 and glibc-2.34 builds (see docs/deploy.md, "pip").

    python/build_wheel.py --arch x86_64 --glibc 2.17 --bin-dir target/x86_64-unknown-linux-gnu/release
    python/build_wheel.py --arch x86_64 --glibc 2.34 --bin-dir target/x86_64-unknown-linux-gnu/release \
        --lib-dir target/glibc2.34/x86_64-unknown-linux-gnu/release

* The version is the workspace version of Cargo.toml (the one that
  `memshim-ctl --version` and the library's `shim_version` report),
  written as PEP 440.
* The tag is py3-none-manylinux_<glibc>_<arch>: the package has no Python
  extension (the API uses ctypes), so one wheel serves every CPython 3;
  the binaries need that glibc at most, which this script checks with
  `objdump -T` before it writes anything. The 2.34 wheel's libraries
  (--lib-dir) must also name neither libpthread.so.0 nor libdl.so.2, the
  reason it exists; its memshim-ctl is the 2.17 build's (--bin-dir).
* Layout: memshim/lib/libmemshim.so and memshim/bin/memshim-ctl, so that
  memshim-ctl's own rule (../lib/libmemshim.so beside its real path) finds
  the library; the `memshim-ctl` command pip puts on PATH is a console
  script that execs the packaged binary.
* Reproducible: entries sorted, fixed timestamps (SOURCE_DATE_EPOCH if set).
"""

import argparse
import base64
import hashlib
import io
import os
import re
import subprocess
import sys
import time
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "python", "memshim")
ELF_MACHINE = {"x86_64": 62, "aarch64": 183}
# The glibc floors a wheel may have, and the libraries its libraries must not name.
FLOORS = {"2.17": (), "2.34": ("libpthread.so.0", "libdl.so.2")}
SUMMARY = "Malloc that gives memory back: an LD_PRELOAD jemalloc shim and its CLI for Python/PyTorch servers"


def workspace_version():
    """`version` of [workspace.package] in Cargo.toml."""
    with open(os.path.join(ROOT, "Cargo.toml")) as f:
        text = f.read()
    m = re.search(r"^\[workspace\.package\]\s*$(.*?)(?=^\[)", text, re.M | re.S)
    v = m and re.search(r'^version\s*=\s*"([^"]+)"', m.group(1), re.M)
    if not v:
        sys.exit("build_wheel: no version in [workspace.package] of Cargo.toml")
    return v.group(1)


def pep440(semver):
    """0.1.0 -> 0.1.0; 0.2.0-rc.1 -> 0.2.0rc1; 0.2.0-alpha.3 -> 0.2.0a3."""
    m = re.fullmatch(r"(\d+\.\d+\.\d+)(?:-(alpha|beta|rc)\.?(\d+))?", semver)
    if not m:
        sys.exit("build_wheel: version %r has no PEP 440 form (use X.Y.Z or X.Y.Z-alpha|beta|rc.N)" % semver)
    base, pre, n = m.groups()
    return base + ({"alpha": "a", "beta": "b", "rc": "rc"}[pre] + n if pre else "")


def elf_machine(path):
    with open(path, "rb") as f:
        head = f.read(20)
    if head[:4] != b"\x7fELF" or head[4] != 2:
        sys.exit("build_wheel: %s is not a 64-bit ELF file" % path)
    return int.from_bytes(head[18:20], "little")


def glibc_versions(path):
    """Every GLIBC_x.y version `path` needs, from `objdump -T`."""
    out = subprocess.run(["objdump", "-T", path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         universal_newlines=True)
    if out.returncode != 0:
        sys.exit("build_wheel: objdump -T %s failed: %s" % (path, out.stderr.strip()))
    found = set()
    for maj, mnr, _ in re.findall(r"\bGLIBC_(\d+)\.(\d+)(\.\d+)?\b", out.stdout):
        found.add((int(maj), int(mnr)))
    if "GLIBC_PRIVATE" in out.stdout:
        sys.exit("build_wheel: %s needs GLIBC_PRIVATE symbols" % path)
    return sorted(found)


def needed(path):
    """The DT_NEEDED names of `path`, from `objdump -p`."""
    out = subprocess.run(["objdump", "-p", path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         universal_newlines=True)
    if out.returncode != 0:
        sys.exit("build_wheel: objdump -p %s failed: %s" % (path, out.stderr.strip()))
    return re.findall(r"^\s*NEEDED\s+(\S+)", out.stdout, re.M)


def record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (name, digest, len(data))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", required=True, choices=sorted(ELF_MACHINE))
    ap.add_argument("--glibc", default="2.17", choices=sorted(FLOORS),
                    help="the glibc the binaries were linked against: the wheel's manylinux floor")
    ap.add_argument("--bin-dir", required=True,
                    help="directory with memshim-ctl (and the libraries, without --lib-dir)")
    ap.add_argument("--lib-dir", help="directory with libmemshim.so and libmemshim_bridge.so")
    ap.add_argument("--out", default=os.path.join(ROOT, "target", "wheels"))
    a = ap.parse_args()

    version = pep440(workspace_version())
    floor = tuple(int(n) for n in a.glibc.split("."))
    lib_dir = a.lib_dir or a.bin_dir
    lib = os.path.join(lib_dir, "libmemshim.so")
    bridge = os.path.join(lib_dir, "libmemshim_bridge.so")
    ctl = os.path.join(a.bin_dir, "memshim-ctl")
    for p in (lib, bridge, ctl):
        if not os.path.isfile(p):
            sys.exit("build_wheel: %s is missing (build it first: make wheel)" % p)
        if elf_machine(p) != ELF_MACHINE[a.arch]:
            sys.exit("build_wheel: %s is not an %s binary" % (p, a.arch))
        newest = glibc_versions(p)[-1:]
        if newest and newest[0] > floor:
            sys.exit("build_wheel: %s needs GLIBC_%d.%d, newer than the manylinux_%d_%d floor"
                     % (p, newest[0][0], newest[0][1], floor[0], floor[1]))
    for p in (lib, bridge):
        banned = sorted(set(needed(p)) & set(FLOORS[a.glibc]))
        if banned:
            sys.exit("build_wheel: %s names %s, which the glibc %s wheel must not (build it against glibc %s)"
                     % (p, ", ".join(banned), a.glibc, a.glibc))

    tag = "py3-none-manylinux_%d_%d_%s" % (floor[0], floor[1], a.arch)
    dist = "memshim-%s" % version
    info = dist + ".dist-info"
    with open(os.path.join(ROOT, "python", "README.md")) as f:
        readme = f.read()

    files = []  # (name, bytes, executable)
    for name in sorted(os.listdir(PKG)):
        if name.endswith(".py") and name != "_version.py":
            with open(os.path.join(PKG, name), "rb") as f:
                files.append(("memshim/" + name, f.read(), False))
    files.append(("memshim/_version.py", ('__version__ = "%s"\n' % version).encode(), False))
    for src, dst in ((lib, "memshim/lib/libmemshim.so"),
                     (bridge, "memshim/lib/libmemshim_bridge.so"),
                     (ctl, "memshim/bin/memshim-ctl")):
        with open(src, "rb") as f:
            files.append((dst, f.read(), True))
    metadata = (
        "Metadata-Version: 2.1\n"
        "Name: memshim\n"
        "Version: %s\n"
        "Summary: %s\n"
        "License: MIT OR Apache-2.0\n"
        "Requires-Python: >=3.7\n"
        "Classifier: Operating System :: POSIX :: Linux\n"
        "Classifier: Programming Language :: Python :: 3\n"
        "Classifier: Programming Language :: Rust\n"
        "Classifier: Topic :: System :: Monitoring\n"
        "Description-Content-Type: text/markdown\n"
        "\n%s" % (version, SUMMARY, readme)
    )
    files.append((info + "/METADATA", metadata.encode(), False))
    files.append((info + "/WHEEL", (
        "Wheel-Version: 1.0\n"
        "Generator: memshim python/build_wheel.py\n"
        "Root-Is-Purelib: false\n"
        "Tag: %s\n" % tag).encode(), False))
    files.append((info + "/entry_points.txt",
                  b"[console_scripts]\nmemshim-ctl = memshim.__main__:ctl_main\n", False))
    files.append((info + "/top_level.txt", b"memshim\n", False))
    record = "".join(record_line(n, d) + "\n" for n, d, _ in files) + info + "/RECORD,,\n"
    files.append((info + "/RECORD", record.encode(), False))

    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "%s-%s.whl" % (dist, tag))
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "315532800"))  # 1980-01-01
    stamp = time.gmtime(max(epoch, 315532800))[:6]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data, exe in files:
            zi = zipfile.ZipInfo(name, stamp)
            zi.external_attr = ((0o100755 if exe else 0o100644) << 16)
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(buf.getvalue())
    os.replace(tmp, path)
    print("%s (%.1f MiB)" % (os.path.relpath(path), os.path.getsize(path) / 2**20))


if __name__ == "__main__":
    main()
