#!/usr/bin/env python3
"""Extracts the uncompressed kernel (an ELF vmlinux) from an x86 bzImage,
for QEMU's `-kernel`: QEMU boots an ELF kernel through its PVH entry point
(the Xen note XEN_ELFNOTE_PHYS32_ENTRY, CONFIG_PVH=y) and skips the
decompressor and the real-mode setup, which under software emulation takes
seconds (tests/vm/README.md).

    vmlinux.py BZIMAGE OUT

The compressed payload is found through the boot protocol header
(Documentation/arch/x86/boot.rst): `setup_sects` at 0x1f1, then
`payload_offset` and `payload_length` at 0x248, counted from the start of
the protected-mode code. Its last 4 bytes are the uncompressed size, which
the kernel's build appends; the rest is one stream of gzip, bzip2, xz,
lzma, lzo, lz4 or zstd, told by its magic. Fails (exit 1, reason on stderr)
unless the result is an ELF x86-64 executable with the PVH note.
"""

import bz2
import gzip
import lzma
import os
import struct
import subprocess
import sys


def die(msg):
    print(f"vmlinux: {msg}", file=sys.stderr)
    sys.exit(1)


def tool(argv, data):
    try:
        return subprocess.run(argv, input=data, check=True, capture_output=True).stdout
    except OSError as e:
        die(f"{argv[0]} is needed for this kernel's compression: {e}")
    except subprocess.CalledProcessError as e:
        die(f"{' '.join(argv)}: {e.stderr.decode(errors='replace').strip()}")


def decompress(p):
    if p.startswith(b"\x1f\x8b"):
        return gzip.decompress(p)
    if p.startswith(b"\xfd7zXZ\x00"):
        return lzma.decompress(p, format=lzma.FORMAT_XZ)
    if p.startswith(b"BZh"):
        return bz2.decompress(p)
    if p.startswith(b"\x28\xb5\x2f\xfd"):
        return tool(["zstd", "-dc"], p)
    if p.startswith(b"\x02\x21\x4c\x18"):
        return tool(["lz4", "-dc", "-l"], p)
    if p.startswith(b"\x89LZO"):
        return tool(["lzop", "-dc"], p)
    if p.startswith(b"\x5d\x00\x00"):
        return lzma.decompress(p, format=lzma.FORMAT_ALONE)
    die(f"unknown compression (payload starts {p[:6].hex()})")


def pvh_entry(elf):
    """The PVH entry address from the ELF notes, or None."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        die("the payload is not a 64-bit little-endian ELF file")
    (e_type, e_machine) = struct.unpack_from("<HH", elf, 16)
    if e_machine != 62:
        die(f"the payload is an ELF file for machine {e_machine}, not x86-64")
    e_phoff, = struct.unpack_from("<Q", elf, 32)
    e_phentsize, e_phnum = struct.unpack_from("<HH", elf, 54)
    for i in range(e_phnum):
        off = e_phoff + i * e_phentsize
        p_type, = struct.unpack_from("<I", elf, off)
        if p_type != 4:  # PT_NOTE
            continue
        p_offset, = struct.unpack_from("<Q", elf, off + 8)
        p_filesz, = struct.unpack_from("<Q", elf, off + 32)
        n = p_offset
        end = p_offset + p_filesz
        while n + 12 <= end:
            namesz, descsz, ntype = struct.unpack_from("<III", elf, n)
            name = elf[n + 12:n + 12 + namesz].rstrip(b"\0")
            desc_off = n + 12 + ((namesz + 3) & ~3)
            if name == b"Xen" and ntype == 18:  # XEN_ELFNOTE_PHYS32_ENTRY
                size = 8 if descsz >= 8 else 4
                return struct.unpack_from("<Q" if size == 8 else "<I", elf, desc_off)[0]
            n = desc_off + ((descsz + 3) & ~3)
    return None


def main():
    if len(sys.argv) != 3:
        die("usage: vmlinux.py BZIMAGE OUT")
    with open(sys.argv[1], "rb") as f:
        img = f.read()
    if img[0x202:0x206] != b"HdrS":
        die(f"{sys.argv[1]} is not a bzImage (no HdrS boot header)")
    setup_sects = img[0x1F1] or 4
    version, = struct.unpack_from("<H", img, 0x206)
    if version < 0x208:
        die(f"boot protocol {version:#x} has no payload fields")
    off, length = struct.unpack_from("<II", img, 0x248)
    start = (setup_sects + 1) * 512 + off
    payload = img[start:start + length - 4]
    elf = decompress(payload)
    entry = pvh_entry(elf)
    if entry is None:
        die("the kernel has no PVH entry note (CONFIG_PVH): QEMU cannot boot it uncompressed")
    tmp = sys.argv[2] + ".tmp"
    with open(tmp, "wb") as f:
        f.write(elf)
    os.replace(tmp, sys.argv[2])
    print(f"vmlinux: {sys.argv[2]}: {len(elf) >> 20} MiB ELF, PVH entry {entry:#x}")


if __name__ == "__main__":
    main()
