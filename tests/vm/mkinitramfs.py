#!/usr/bin/env python3
"""Writes the initramfs of the test VMs (tests/vm/README.md): a newc cpio
archive holding the static init (tests/vm/init.c) and the kernel modules
that it loads, in dependency order, before it mounts the host's root over
9p and the tests' ext4 disk.

    mkinitramfs.py init INIT OUT                  the init (one archive for all kernels)
    mkinitramfs.py modules LIB/MODULES/KVER OUT MODULE...   one kernel's modules

The kernel unpacks concatenated archives one after the other, so the
initramfs of a kernel is the init's archive followed by its modules'.

The kernel packages ship no modules.dep, so dependencies are read from each
module's own .modinfo (`depends=` and `softdep=pre:`). A module that is not
in the tree is taken to be built into the kernel (packages from Debian 13
on ship no modules.builtin either); a soft dependency that is found nowhere
is left out. Compressed modules (.ko.xz, .ko.zst, .ko.gz) are stored
decompressed: the init loads them with finit_module and no flags, which
works whatever the kernel's CONFIG_MODULE_DECOMPRESS.

No cpio program is needed: the archive is written here.
"""

import argparse
import gzip
import lzma
import os
import subprocess
import sys


def die(msg):
    print(f"mkinitramfs: {msg}", file=sys.stderr)
    sys.exit(1)


def norm(name):
    return name.replace("-", "_")


def index(tree):
    """Module name -> (path, path relative to `tree`) of every module file."""
    out = {}
    for d, _, files in os.walk(tree):
        for f in files:
            for ext in (".ko", ".ko.xz", ".ko.zst", ".ko.gz"):
                if f.endswith(ext):
                    p = os.path.join(d, f)
                    out.setdefault(norm(f[: -len(ext)]), (p, os.path.relpath(p, tree)))
    return out


def read_module(path):
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith(".xz"):
        return lzma.decompress(data)
    if path.endswith(".gz"):
        return gzip.decompress(data)
    if path.endswith(".zst"):
        try:
            return subprocess.run(
                ["zstd", "-dc", path], check=True, capture_output=True
            ).stdout
        except (OSError, subprocess.CalledProcessError) as e:
            die(f"{path}: zstd -dc failed ({e}); install zstd")
    return data


def modinfo(blob):
    """The key=value strings of a module's .modinfo (found by scanning:
    they are NUL-separated and no other section holds `depends=`)."""
    info = {}
    for part in blob.split(b"\0"):
        for key in (b"depends=", b"softdep=", b"alias=", b"name="):
            if part.startswith(key):
                info.setdefault(key[:-1].decode(), []).append(
                    part[len(key):].decode("utf-8", "replace")
                )
    return info


def resolve(mods, wanted):
    """The modules to load, dependencies first, as (name, blob, optional)."""
    blobs = {}
    order = []
    state = {}
    aliases = None

    def by_alias(alias):
        nonlocal aliases
        if aliases is None:
            aliases = {}
            # Soft dependencies name crypto algorithms: look only where
            # those live (scanning all modules would decompress thousands).
            for name, (path, rel) in mods.items():
                if rel.startswith(("kernel/crypto/", "kernel/arch/x86/crypto/")):
                    for a in modinfo(read_module(path)).get("alias", []):
                        aliases.setdefault(a, []).append(name)
        return aliases.get(alias, [])

    def visit(given, optional, chain):
        name = norm(given)
        if state.get(name) == "done":
            return
        if state.get(name) == "visiting":
            die(f"dependency cycle: {' -> '.join(chain + [name])}")
        path = mods.get(name, (None,))[0]
        if path is None:
            if optional:
                # A soft dependency may be an alias (crypto-crc32c).
                names = by_alias(given)
                if not names:
                    print(f"mkinitramfs: soft dependency {name} not found, left out")
                for n in names:
                    visit(n, True, chain + [name])
            else:
                print(f"mkinitramfs: {name}: no module file, taken as built in")
            state[name] = "done"
            return
        state[name] = "visiting"
        blob = read_module(path)
        info = modinfo(blob)
        for sd in info.get("softdep", []):
            words = sd.split()
            if words[:1] == ["pre:"]:
                for w in words[1:]:
                    if w.endswith(":"):
                        break
                    visit(w, True, chain + [name])
        for dep in ",".join(info.get("depends", [])).split(","):
            if dep:
                visit(dep, optional, chain + [name])
        state[name] = "done"
        blobs[name] = blob
        order.append((name, optional))

    for w in wanted:
        visit(w, False, [])
    return [(n, blobs[n], opt) for n, opt in order]


class Cpio:
    """A newc archive (the format the kernel unpacks; `cpio -H newc`)."""

    def __init__(self):
        self.out = bytearray()
        self.ino = 1

    def add(self, name, mode, data=b"", rdev=(0, 0)):
        name_b = name.encode() + b"\0"
        fields = [
            self.ino, mode, 0, 0, 1, 0, len(data), 0, 0, rdev[0], rdev[1],
            len(name_b), 0,
        ]
        self.ino += 1
        self.out += b"070701" + b"".join(b"%08X" % f for f in fields)
        self.out += name_b
        self.out += b"\0" * (-len(self.out) % 4)
        self.out += data
        self.out += b"\0" * (-len(self.out) % 4)

    def dir(self, name):
        self.add(name, 0o040755)

    def file(self, name, data, perm=0o644):
        self.add(name, 0o100000 | perm, data)

    def finish(self):
        self.add("TRAILER!!!", 0)
        self.out += b"\0" * (-len(self.out) % 512)
        return bytes(self.out)


def write(out, cpio):
    tmp = out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(cpio.finish())
    os.replace(tmp, out)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="what", required=True)
    i = sub.add_parser("init", help="the init and the directories it mounts on")
    i.add_argument("init")
    i.add_argument("out")
    m = sub.add_parser("modules", help="modules and their dependencies, and modules/order")
    m.add_argument("tree", help="the kernel's lib/modules/<version>")
    m.add_argument("out")
    m.add_argument("wanted", nargs="+")
    a = ap.parse_args()

    c = Cpio()
    if a.what == "init":
        for d in ("dev", "proc", "sys", "share", "lower", "rw", "newroot"):
            c.dir(d)
        c.add("dev/console", 0o020600, rdev=(5, 1))
        with open(a.init, "rb") as f:
            c.file("init", f.read(), 0o755)
        write(a.out, c)
        print(f"mkinitramfs: {a.out}: {a.init}")
        return

    mods = index(a.tree)
    if not mods:
        die(f"no modules under {a.tree}")
    load = resolve(mods, a.wanted)
    c.dir("modules")
    listing = []
    for i, (name, blob, optional) in enumerate(load):
        fname = f"modules/{i:02d}-{name}.ko"
        c.file(fname, blob)
        # The init loads them in this order; a `?` marks a soft dependency,
        # whose failure (an instruction set this CPU lacks) is not fatal.
        listing.append(("?" if optional else "") + "/" + fname)
    c.file("modules/order", ("\n".join(listing) + "\n").encode())
    write(a.out, c)
    print(f"mkinitramfs: {a.out}: {len(load)} modules: {' '.join(n for n, _, _ in load)}")


if __name__ == "__main__":
    main()
